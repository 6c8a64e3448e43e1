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

// The flags llama.cpp's unicode_cpt_flags_from_cpt gives `cp`: exactly one major
// category bit for an assigned code point, none for an unassigned one (Cn, and anything
// above U+10FFFF), which llama.cpp calls "undefined" rather than \p{C}. Surrogates and
// private use are kControl. kLowercase/kUppercase mean general category Ll/Lu.
CodepointFlags FlagsOf(uint32_t cp);

// Unicode general categories (the two-letter values of the Unicode Character Database).
// clang-format off
enum class GeneralCategory : uint8_t {
  kCn = 0,  // unassigned
  kLu, kLl, kLt, kLm, kLo,
  kMn, kMc, kMe,
  kNd, kNl, kNo,
  kPc, kPd, kPs, kPe, kPi, kPf, kPo,
  kSm, kSc, kSk, kSo,
  kZs, kZl, kZp,
  kCc, kCf, kCs, kCo,
};
// clang-format on

// kCn for unassigned code points and anything above U+10FFFF.
GeneralCategory CategoryOf(uint32_t cp);

// The Unicode version of the tables, e.g. "15.1.0" (llama.cpp's tables are 15.1 too).
std::string_view UnicodeVersion();

// Decodes UTF-8 like llama.cpp's unicode_cpts_from_utf8: an invalid or truncated
// sequence yields U+FFFD and consumes one byte. Like llama.cpp it does not reject
// overlong forms or surrogates (C0 80 decodes to U+0000, ED A0 80 to U+D800) and reads
// F0..F7 leads as 4-byte sequences even past U+10FFFF (up to U+1FFFFF).
std::vector<uint32_t> DecodeUtf8(std::string_view text);
// Length in bytes of the UTF-8 sequence starting with `lead`, by its high nibble as
// llama.cpp's unicode_len_utf8 reads it: 1 for ASCII and for continuation bytes
// (invalid leads), 2 for C0..DF, 3 for E0..EF, 4 for F0..FF.
size_t Utf8SequenceLength(uint8_t lead);
// Appends the UTF-8 form of `cp` (surrogates as 3 bytes, like llama.cpp). Values above
// U+10FFFF, which only DecodeUtf8 of F4 90.. to F7 leads produces, get the same 4-byte
// form they were decoded from (llama.cpp's unicode_cpt_to_utf8 throws there instead);
// values above U+1FFFFF, which no decoding produces, append U+FFFD.
void AppendUtf8(uint32_t cp, std::string* out);
std::string EncodeUtf8(uint32_t cp);

// GPT-2 byte-level BPE: every byte maps to a printable code point and back.
uint32_t ByteToCodepoint(uint8_t byte);
std::optional<uint8_t> CodepointToByte(uint32_t cp);
// `text` with every byte replaced by the UTF-8 of ByteToCodepoint(byte).
std::string ByteEncode(std::string_view text);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_UNICODE_H_
