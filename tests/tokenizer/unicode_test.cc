// Tests of tokenizer/unicode.h: general categories and flags from the generated
// Unicode 15.1 tables, llama.cpp's whitespace set, UTF-8 decoding with llama.cpp's
// treatment of invalid input, and GPT-2's byte <-> code point mapping.
#include "tokenizer/unicode.h"

#include <bit>
#include <cstdint>
#include <ios>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moert::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

using GC = GeneralCategory;

TEST(UnicodeTest, VersionMatchesLlamaCpp) { EXPECT_EQ(UnicodeVersion(), "15.1.0"); }

TEST(UnicodeTest, CategoriesAcrossScripts) {
  const struct {
    uint32_t cp;
    GeneralCategory category;
  } kCases[] = {
      {'A', GC::kLu},
      {'z', GC::kLl},
      {'0', GC::kNd},
      {' ', GC::kZs},
      {'!', GC::kPo},
      {'(', GC::kPs},
      {')', GC::kPe},
      {'-', GC::kPd},
      {'_', GC::kPc},
      {'$', GC::kSc},
      {'+', GC::kSm},
      {'~', GC::kSm},
      {'^', GC::kSk},
      {'`', GC::kSk},
      {'\n', GC::kCc},
      {0x7F, GC::kCc},
      {0x85, GC::kCc},
      {0xA0, GC::kZs},
      {0xAD, GC::kCf},
      {0xBD, GC::kNo},
      {0xE9, GC::kLl},
      {0xC9, GC::kLu},
      {0x0301, GC::kMn},
      {0x01C5, GC::kLt},
      {0x02B0, GC::kLm},
      {0x03A9, GC::kLu},
      {0x03C9, GC::kLl},
      {0x0416, GC::kLu},
      {0x0436, GC::kLl},
      {0x05D0, GC::kLo},
      {0x0627, GC::kLo},
      {0x0663, GC::kNd},
      {0x0915, GC::kLo},
      {0x093E, GC::kMc},
      {0x0E01, GC::kLo},
      {0x0E31, GC::kMn},
      {0x1780, GC::kLo},
      {0x17B6, GC::kMc},
      {0x1FD3, GC::kLl},
      {0x200B, GC::kCf},
      {0x200D, GC::kCf},
      {0x2028, GC::kZl},
      {0x2029, GC::kZp},
      {0x20AC, GC::kSc},
      {0x2126, GC::kLu},
      {0x212A, GC::kLu},
      {0x2160, GC::kNl},
      {0x3000, GC::kZs},
      {0x3002, GC::kPo},
      {0x3042, GC::kLo},
      {0x4E2D, GC::kLo},
      {0xAC00, GC::kLo},
      {0xD800, GC::kCs},
      {0xDFFF, GC::kCs},
      {0xE000, GC::kCo},
      {0xFE0F, GC::kMn},
      {0xFEFF, GC::kCf},
      {0xFF01, GC::kPo},
      {0xFFFD, GC::kSo},
      {0x1F600, GC::kSo},
      {0x1F999, GC::kSo},
      {0x1D400, GC::kLu},
      {0xE0001, GC::kCf},
      {0xF0000, GC::kCo},
      {0x0378, GC::kCn},
      {0xFFFF, GC::kCn},
      {0x10FFFF, GC::kCn},
      // New in Unicode 15.1 (llama.cpp's tables have them) and in 16.0 (they do not).
      {0x2EBF0, GC::kLo},
      {0x2FFC, GC::kSo},
      {0x31EF, GC::kSo},
      {0x1C89, GC::kCn},
      // Above U+10FFFF: only DecodeUtf8 of invalid input produces these.
      {0x110000, GC::kCn},
      {0x1FFFFF, GC::kCn},
      {0xFFFFFFFF, GC::kCn},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(CategoryOf(c.cp), c.category) << "U+" << std::hex << c.cp;
  }
}

TEST(UnicodeTest, AssignedCodepointCountIsUnicode151) {
  // 149,813 characters + 137,468 private use + 2,048 surrogates + 65 controls.
  size_t assigned = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) assigned += CategoryOf(cp) != GC::kCn;
  EXPECT_EQ(assigned, 289394u);
}

TEST(UnicodeTest, FlagsOfSamples) {
  using F = CodepointFlags;
  EXPECT_EQ(FlagsOf('A').bits, F::kLetter | F::kUppercase);
  EXPECT_EQ(FlagsOf('a').bits, F::kLetter | F::kLowercase);
  EXPECT_EQ(FlagsOf(0x01C5).bits, F::kLetter);  // titlecase: neither Lu nor Ll
  EXPECT_EQ(FlagsOf(0x4E2D).bits, F::kLetter);
  EXPECT_EQ(FlagsOf('7').bits, F::kNumber);
  EXPECT_EQ(FlagsOf(0x2160).bits, F::kNumber);
  EXPECT_EQ(FlagsOf(' ').bits, F::kSeparator | F::kWhitespace);
  EXPECT_EQ(FlagsOf(0x3000).bits, F::kSeparator | F::kWhitespace);
  EXPECT_EQ(FlagsOf('\n').bits, F::kControl | F::kWhitespace);
  EXPECT_EQ(FlagsOf(0x85).bits, F::kControl | F::kWhitespace);
  EXPECT_EQ(FlagsOf(0x0301).bits, F::kAccentMark);
  EXPECT_EQ(FlagsOf('!').bits, F::kPunctuation);
  EXPECT_EQ(FlagsOf('$').bits, F::kSymbol);
  EXPECT_EQ(FlagsOf(0x1F999).bits, F::kSymbol);
  EXPECT_EQ(FlagsOf(0xD800).bits, F::kControl);
  EXPECT_EQ(FlagsOf(0xE000).bits, F::kControl);
  EXPECT_EQ(FlagsOf(0x200B).bits, F::kControl);  // ZERO WIDTH SPACE is Cf, not \s
  // Unassigned code points are "undefined" in llama.cpp: no category bit at all.
  EXPECT_EQ(FlagsOf(0x0378).bits, F::kUndefined);
  EXPECT_EQ(FlagsOf(0x110000).bits, F::kUndefined);
  EXPECT_TRUE(FlagsOf('x').is(F::kLetter));
  EXPECT_FALSE(FlagsOf('x').is(F::kNumber));
}

TEST(UnicodeTest, FlagsAgreeWithCategoriesEverywhere) {
  constexpr uint16_t kMajor = CodepointFlags::kNumber | CodepointFlags::kLetter |
                              CodepointFlags::kSeparator | CodepointFlags::kAccentMark |
                              CodepointFlags::kPunctuation | CodepointFlags::kSymbol |
                              CodepointFlags::kControl;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const uint16_t major = FlagsOf(cp).bits & kMajor;
    const int bits = std::popcount(major);
    ASSERT_EQ(bits, CategoryOf(cp) == GC::kCn ? 0 : 1) << "U+" << std::hex << cp;
    ASSERT_EQ(FlagsOf(cp).is(CodepointFlags::kUppercase), CategoryOf(cp) == GC::kLu);
    ASSERT_EQ(FlagsOf(cp).is(CodepointFlags::kLowercase), CategoryOf(cp) == GC::kLl);
  }
}

TEST(UnicodeTest, WhitespaceIsLlamaCppSet) {
  const std::set<uint32_t> expected = {
      0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
      0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
      0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
  };
  std::set<uint32_t> found;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (FlagsOf(cp).is(CodepointFlags::kWhitespace)) found.insert(cp);
  }
  EXPECT_EQ(found, expected);
}

TEST(UnicodeTest, DecodesValidUtf8) {
  EXPECT_THAT(DecodeUtf8(""), IsEmpty());
  EXPECT_THAT(DecodeUtf8("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\xA6\x99"),
              ElementsAre('a', 0xE9, 0x4E2D, 0x1F999));
  EXPECT_THAT(DecodeUtf8(std::string("\0x", 2)), ElementsAre(0, 'x'));
  EXPECT_THAT(DecodeUtf8("\xF4\x8F\xBF\xBF"), ElementsAre(0x10FFFF));
}

TEST(UnicodeTest, InvalidBytesBecomeReplacementOneByteAtATime) {
  constexpr uint32_t kBad = 0xFFFD;
  // A continuation byte where a sequence should start.
  EXPECT_THAT(DecodeUtf8("\x80"), ElementsAre(kBad));
  EXPECT_THAT(DecodeUtf8("a\xBF"
                         "b"),
              ElementsAre('a', kBad, 'b'));
  // Leads that no UTF-8 sequence has.
  EXPECT_THAT(DecodeUtf8("\xF8\x88\x80\x80\x80"), ElementsAre(kBad, kBad, kBad, kBad, kBad));
  EXPECT_THAT(DecodeUtf8("\xFF\xFE"), ElementsAre(kBad, kBad));
  // A lead whose continuation is missing or wrong costs one byte; what follows is
  // decoded afresh.
  EXPECT_THAT(DecodeUtf8("\xC3"
                         "a"),
              ElementsAre(kBad, 'a'));
  EXPECT_THAT(DecodeUtf8("\xE4\x41\xB8"), ElementsAre(kBad, 'A', kBad));
  EXPECT_THAT(DecodeUtf8("\xE4\xB8\xC3\xA9"), ElementsAre(kBad, kBad, 0xE9));
}

TEST(UnicodeTest, TruncatedSequencesAtTheEnd) {
  constexpr uint32_t kBad = 0xFFFD;
  EXPECT_THAT(DecodeUtf8("\xC3"), ElementsAre(kBad));
  EXPECT_THAT(DecodeUtf8("\xE4\xB8"), ElementsAre(kBad, kBad));
  EXPECT_THAT(DecodeUtf8("x\xF0\x9F\xA6"), ElementsAre('x', kBad, kBad, kBad));
}

TEST(UnicodeTest, AcceptsWhatLlamaCppAccepts) {
  // llama.cpp checks only the bit patterns: overlong forms, surrogates and values up
  // to U+1FFFFF decode.
  EXPECT_THAT(DecodeUtf8("\xC0\x80"), ElementsAre(0));
  EXPECT_THAT(DecodeUtf8("\xC1\xBF"), ElementsAre(0x7F));
  EXPECT_THAT(DecodeUtf8("\xE0\x80\xAF"), ElementsAre('/'));
  EXPECT_THAT(DecodeUtf8("\xED\xA0\x80"), ElementsAre(0xD800));
  EXPECT_THAT(DecodeUtf8("\xF4\x90\x80\x80"), ElementsAre(0x110000));
  EXPECT_THAT(DecodeUtf8("\xF7\xBF\xBF\xBF"), ElementsAre(0x1FFFFF));
}

TEST(UnicodeTest, SequenceLengthByLeadNibble) {
  EXPECT_EQ(Utf8SequenceLength(0x00), 1u);
  EXPECT_EQ(Utf8SequenceLength('a'), 1u);
  EXPECT_EQ(Utf8SequenceLength(0x7F), 1u);
  EXPECT_EQ(Utf8SequenceLength(0x80), 1u);
  EXPECT_EQ(Utf8SequenceLength(0xBF), 1u);
  EXPECT_EQ(Utf8SequenceLength(0xC0), 2u);
  EXPECT_EQ(Utf8SequenceLength(0xDF), 2u);
  EXPECT_EQ(Utf8SequenceLength(0xE0), 3u);
  EXPECT_EQ(Utf8SequenceLength(0xEF), 3u);
  EXPECT_EQ(Utf8SequenceLength(0xF0), 4u);
  EXPECT_EQ(Utf8SequenceLength(0xF7), 4u);
  EXPECT_EQ(Utf8SequenceLength(0xFF), 4u);  // as llama.cpp's unicode_len_utf8
}

TEST(UnicodeTest, EncodesUtf8) {
  EXPECT_EQ(EncodeUtf8('a'), "a");
  EXPECT_EQ(EncodeUtf8(0), std::string(1, '\0'));
  EXPECT_EQ(EncodeUtf8(0x7F), "\x7F");
  EXPECT_EQ(EncodeUtf8(0x80), "\xC2\x80");
  EXPECT_EQ(EncodeUtf8(0x7FF), "\xDF\xBF");
  EXPECT_EQ(EncodeUtf8(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(EncodeUtf8(0x4E2D), "\xE4\xB8\xAD");
  EXPECT_EQ(EncodeUtf8(0xD800), "\xED\xA0\x80");
  EXPECT_EQ(EncodeUtf8(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(EncodeUtf8(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(EncodeUtf8(0x1F999), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(EncodeUtf8(0x10FFFF), "\xF4\x8F\xBF\xBF");
  EXPECT_EQ(EncodeUtf8(0x110000), "\xF4\x90\x80\x80");
  EXPECT_EQ(EncodeUtf8(0x1FFFFF), "\xF7\xBF\xBF\xBF");
  EXPECT_EQ(EncodeUtf8(0x200000), "\xEF\xBF\xBD");
  std::string out = "x";
  AppendUtf8(0xE9, &out);
  EXPECT_EQ(out, "x\xC3\xA9");
}

TEST(UnicodeTest, EncodeDecodeRoundTripsEveryDecodableValue) {
  for (uint32_t cp = 0; cp <= 0x1FFFFF; ++cp) {
    const std::vector<uint32_t> decoded = DecodeUtf8(EncodeUtf8(cp));
    ASSERT_EQ(decoded.size(), 1u) << "U+" << std::hex << cp;
    ASSERT_EQ(decoded[0], cp);
  }
}

TEST(UnicodeTest, ByteMappingRoundTripsAllBytes) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    const uint32_t cp = ByteToCodepoint(byte);
    EXPECT_TRUE(seen.insert(cp).second) << "two bytes map to U+" << std::hex << cp;
    EXPECT_LE(cp, 0x143u);
    ASSERT_TRUE(CodepointToByte(cp).has_value());
    EXPECT_EQ(*CodepointToByte(cp), byte);
    // Every image is a visible character: a letter, number, punctuation or symbol.
    EXPECT_FALSE(FlagsOf(cp).is(CodepointFlags::kWhitespace));
    EXPECT_FALSE(FlagsOf(cp).is(CodepointFlags::kControl));
  }
}

TEST(UnicodeTest, ByteMappingIsGpt2s) {
  EXPECT_EQ(ByteToCodepoint('!'), 0x21u);
  EXPECT_EQ(ByteToCodepoint('A'), 0x41u);
  EXPECT_EQ(ByteToCodepoint('~'), 0x7Eu);
  EXPECT_EQ(ByteToCodepoint(0xA1), 0xA1u);
  EXPECT_EQ(ByteToCodepoint(0xFF), 0xFFu);
  // The 68 others move to U+0100.. in byte order: 0x00-0x20, 0x7F-0xA0, 0xAD.
  EXPECT_EQ(ByteToCodepoint(0x00), 0x100u);
  EXPECT_EQ(ByteToCodepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToCodepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToCodepoint(0x7F), 0x121u);
  EXPECT_EQ(ByteToCodepoint(0xA0), 0x142u);
  EXPECT_EQ(ByteToCodepoint(0xAD), 0x143u);
  EXPECT_FALSE(CodepointToByte(' ').has_value());
  EXPECT_FALSE(CodepointToByte(0xAD).has_value());
  EXPECT_FALSE(CodepointToByte(0x144).has_value());
  EXPECT_FALSE(CodepointToByte(0x1F999).has_value());
}

TEST(UnicodeTest, ByteEncode) {
  EXPECT_EQ(ByteEncode(""), "");
  EXPECT_EQ(ByteEncode(" Hello\n"), "\xC4\xA0Hello\xC4\x8A");  // "ĠHelloĊ"
  EXPECT_EQ(ByteEncode("\xC3\xA9"), "\xC3\x83\xC2\xA9");       // "é" -> "Ã©"
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  std::string back;
  for (const uint32_t cp : DecodeUtf8(ByteEncode(all_bytes))) {
    ASSERT_TRUE(CodepointToByte(cp).has_value());
    back.push_back(static_cast<char>(*CodepointToByte(cp)));
  }
  EXPECT_EQ(back, all_bytes);
}

}  // namespace
}  // namespace moert::tokenizer
