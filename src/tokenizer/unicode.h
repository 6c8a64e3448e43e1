// Unicode support for the tokenizers: UTF-8 decoding and encoding, general-category
// flags from a generated table (tokenizer/unicode_data.cc, made by
// scripts/gen_unicode_data.py from the Unicode Character Database), whitespace as
// llama.cpp defines it, and GPT-2's byte <-> code point mapping for byte-level BPE.
#ifndef MOERT_TOKENIZER_UNICODE_H_
#define MOERT_TOKENIZER_UNICODE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moert::tokenizer {

// Major general categories (one per code point) plus the whitespace property.
struct CodepointFlags {
  enum : uint16_t {
    kUndefined = 0,
    kNumber = 1 << 0,       // \p{N}
    kLetter = 1 << 1,       // \p{L}
    kSeparator = 1 << 2,    // \p{Z}
    kAccentMark = 1 << 3,   // \p{M}
    kPunctuation = 1 << 4,  // \p{P}
    kSymbol = 1 << 5,       // \p{S}
    kControl = 1 << 6,      // \p{C}
    kWhitespace = 1 << 7,   // \s as llama.cpp's unicode tables define it
    kLowercase = 1 << 8,    // \p{Ll}
    kUppercase = 1 << 9,    // \p{Lu}
  };
  uint16_t bits = kUndefined;
  bool is(uint16_t flag) const { return (bits & flag) != 0; }
};

CodepointFlags FlagsOf(uint32_t cp);

// Decodes UTF-8 like llama.cpp's unicode_cpts_from_utf8: an invalid or truncated
// sequence yields U+FFFD and consumes one byte.
std::vector<uint32_t> DecodeUtf8(std::string_view text);
// Length in bytes of the UTF-8 sequence starting with `lead` (1 for invalid leads).
size_t Utf8SequenceLength(uint8_t lead);
void AppendUtf8(uint32_t cp, std::string* out);
std::string EncodeUtf8(uint32_t cp);

// GPT-2 byte-level BPE: every byte maps to a printable code point and back.
uint32_t ByteToCodepoint(uint8_t byte);
std::optional<uint8_t> CodepointToByte(uint32_t cp);
// `text` with every byte replaced by the UTF-8 of ByteToCodepoint(byte).
std::string ByteEncode(std::string_view text);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_UNICODE_H_
