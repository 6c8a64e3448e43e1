// UTF-8 decoding and encoding with llama.cpp's handling of invalid input, code point
// categories from the generated tables, and GPT-2's byte <-> code point mapping.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode_data.h"

namespace moert::tokenizer {
namespace {

constexpr uint32_t kReplacementCharacter = 0xFFFD;

uint16_t MajorFlagOf(GeneralCategory category) {
  switch (category) {
    case GeneralCategory::kCn:
      return CodepointFlags::kUndefined;
    case GeneralCategory::kLu:
      return CodepointFlags::kLetter | CodepointFlags::kUppercase;
    case GeneralCategory::kLl:
      return CodepointFlags::kLetter | CodepointFlags::kLowercase;
    case GeneralCategory::kLt:
    case GeneralCategory::kLm:
    case GeneralCategory::kLo:
      return CodepointFlags::kLetter;
    case GeneralCategory::kMn:
    case GeneralCategory::kMc:
    case GeneralCategory::kMe:
      return CodepointFlags::kAccentMark;
    case GeneralCategory::kNd:
    case GeneralCategory::kNl:
    case GeneralCategory::kNo:
      return CodepointFlags::kNumber;
    case GeneralCategory::kPc:
    case GeneralCategory::kPd:
    case GeneralCategory::kPs:
    case GeneralCategory::kPe:
    case GeneralCategory::kPi:
    case GeneralCategory::kPf:
    case GeneralCategory::kPo:
      return CodepointFlags::kPunctuation;
    case GeneralCategory::kSm:
    case GeneralCategory::kSc:
    case GeneralCategory::kSk:
    case GeneralCategory::kSo:
      return CodepointFlags::kSymbol;
    case GeneralCategory::kZs:
    case GeneralCategory::kZl:
    case GeneralCategory::kZp:
      return CodepointFlags::kSeparator;
    case GeneralCategory::kCc:
    case GeneralCategory::kCf:
    case GeneralCategory::kCs:
    case GeneralCategory::kCo:
      return CodepointFlags::kControl;
  }
  return CodepointFlags::kUndefined;
}

GeneralCategory LookUpCategory(uint32_t cp) {
  const auto ranges = internal::CategoryRanges();
  // The last range whose first code point is <= cp; the table starts at U+0000.
  const auto it = std::upper_bound(
      ranges.begin(), ranges.end(), cp,
      [](uint32_t value, const internal::CategoryRange& range) { return value < range.first; });
  return std::prev(it)->category;
}

bool IsWhiteSpace(uint32_t cp) {
  const auto table = internal::WhiteSpaceCodepoints();
  return std::binary_search(table.begin(), table.end(), cp);
}

// Text is mostly ASCII and Latin-1: answer those from a table built once.
struct Latin1Flags {
  std::array<uint16_t, 256> flags;
  Latin1Flags() {
    for (uint32_t cp = 0; cp < flags.size(); ++cp) {
      flags[cp] =
          MajorFlagOf(LookUpCategory(cp)) | (IsWhiteSpace(cp) ? CodepointFlags::kWhitespace : 0);
    }
  }
};

bool IsContinuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 are
// moved, in byte order, to U+0100 and up so that every byte is a visible character.
constexpr bool ByteIsPrintable(uint32_t byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

constexpr std::array<uint16_t, 256> MakeByteToCodepoint() {
  std::array<uint16_t, 256> table{};
  uint16_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    table[byte] = ByteIsPrintable(byte) ? static_cast<uint16_t>(byte) : next++;
  }
  return table;
}

constexpr std::array<uint16_t, 256> kByteToCodepoint = MakeByteToCodepoint();

// The moved bytes land in U+0100..U+0143; a table covering U+0000..U+0143 inverts all.
constexpr uint32_t kByteCodepointLimit = 256 + 68;

constexpr std::array<int16_t, kByteCodepointLimit> MakeCodepointToByte() {
  std::array<int16_t, kByteCodepointLimit> table{};
  for (auto& entry : table) entry = -1;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    table[kByteToCodepoint[byte]] = static_cast<int16_t>(byte);
  }
  return table;
}

constexpr std::array<int16_t, kByteCodepointLimit> kCodepointToByte = MakeCodepointToByte();

}  // namespace

GeneralCategory CategoryOf(uint32_t cp) {
  if (cp > 0x10FFFF) return GeneralCategory::kCn;
  return LookUpCategory(cp);
}

CodepointFlags FlagsOf(uint32_t cp) {
  static const Latin1Flags kLatin1;
  CodepointFlags result;
  if (cp < kLatin1.flags.size()) {
    result.bits = kLatin1.flags[cp];
  } else {
    result.bits = MajorFlagOf(CategoryOf(cp));
    if (IsWhiteSpace(cp)) result.bits |= CodepointFlags::kWhitespace;
  }
  return result;
}

std::string_view UnicodeVersion() { return internal::kUnicodeVersion; }

size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr uint8_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByHighNibble[lead >> 4];
}

std::vector<uint32_t> DecodeUtf8(std::string_view text) {
  std::vector<uint32_t> result;
  result.reserve(text.size());
  const size_t size = text.size();
  size_t i = 0;
  // The checks mirror llama.cpp's unicode_cpt_from_utf8 one for one: the lead byte
  // alone decides the length, only the continuation bytes' top bits are checked, and
  // any failure costs exactly one byte.
  while (i < size) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
    const uint8_t lead = byte(0);
    if ((lead & 0x80) == 0) {
      result.push_back(lead);
      i += 1;
    } else if ((lead & 0x40) == 0) {
      result.push_back(kReplacementCharacter);
      i += 1;
    } else if ((lead & 0x20) == 0) {
      if (i + 1 >= size || !IsContinuation(byte(1))) {
        result.push_back(kReplacementCharacter);
        i += 1;
        continue;
      }
      result.push_back((uint32_t{lead} & 0x1F) << 6 | (byte(1) & 0x3F));
      i += 2;
    } else if ((lead & 0x10) == 0) {
      if (i + 2 >= size || !IsContinuation(byte(1)) || !IsContinuation(byte(2))) {
        result.push_back(kReplacementCharacter);
        i += 1;
        continue;
      }
      result.push_back((uint32_t{lead} & 0x0F) << 12 | (uint32_t{byte(1)} & 0x3F) << 6 |
                       (byte(2) & 0x3F));
      i += 3;
    } else if ((lead & 0x08) == 0) {
      if (i + 3 >= size || !IsContinuation(byte(1)) || !IsContinuation(byte(2)) ||
          !IsContinuation(byte(3))) {
        result.push_back(kReplacementCharacter);
        i += 1;
        continue;
      }
      result.push_back((uint32_t{lead} & 0x07) << 18 | (uint32_t{byte(1)} & 0x3F) << 12 |
                       (uint32_t{byte(2)} & 0x3F) << 6 | (byte(3) & 0x3F));
      i += 4;
    } else {
      result.push_back(kReplacementCharacter);
      i += 1;
    }
  }
  return result;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  const auto put = [out](uint32_t byte) { out->push_back(static_cast<char>(byte)); };
  if (cp <= 0x7F) {
    put(cp);
  } else if (cp <= 0x7FF) {
    put(0xC0 | (cp >> 6));
    put(0x80 | (cp & 0x3F));
  } else if (cp <= 0xFFFF) {
    put(0xE0 | (cp >> 12));
    put(0x80 | ((cp >> 6) & 0x3F));
    put(0x80 | (cp & 0x3F));
  } else if (cp <= 0x1FFFFF) {
    put(0xF0 | (cp >> 18));
    put(0x80 | ((cp >> 12) & 0x3F));
    put(0x80 | ((cp >> 6) & 0x3F));
    put(0x80 | (cp & 0x3F));
  } else {
    AppendUtf8(kReplacementCharacter, out);
  }
}

std::string EncodeUtf8(uint32_t cp) {
  std::string result;
  AppendUtf8(cp, &result);
  return result;
}

uint32_t ByteToCodepoint(uint8_t byte) { return kByteToCodepoint[byte]; }

std::optional<uint8_t> CodepointToByte(uint32_t cp) {
  if (cp >= kCodepointToByte.size() || kCodepointToByte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(kCodepointToByte[cp]);
}

std::string ByteEncode(std::string_view text) {
  std::string result;
  result.reserve(text.size() * 2);
  for (const char c : text) {
    AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &result);
  }
  return result;
}

}  // namespace moert::tokenizer
