// Tests of tokenizer/pretokenizer.h. The expected pieces are derived by hand from
// llama.cpp's expressions (each expression splits every fragment into its matches and
// the gaps between them), so a failure here means we no longer split as llama.cpp
// does. The shared tokenizer inputs (../shared/vocab/*.inp) are run as stress input.
#include "tokenizer/pretokenizer.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr PreTokenizer kAllKinds[] = {
    PreTokenizer::kDefault, PreTokenizer::kGpt2,        PreTokenizer::kLlama3,
    PreTokenizer::kQwen2,   PreTokenizer::kDeepseekLlm, PreTokenizer::kFalcon,
    PreTokenizer::kMpt,     PreTokenizer::kStarcoder,
};

std::vector<std::string> Split(PreTokenizer kind, std::string_view text) {
  return PreTokenize(kind, text);
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string joined;
  for (const std::string& piece : pieces) joined += piece;
  return joined;
}

TEST(PreTokenizerTest, FromName) {
  const struct {
    std::string_view name;
    PreTokenizer kind;
  } kCases[] = {
      {"", PreTokenizer::kDefault},
      {"default", PreTokenizer::kDefault},
      {"gpt-2", PreTokenizer::kGpt2},
      {"phi-2", PreTokenizer::kGpt2},
      {"roberta-bpe", PreTokenizer::kGpt2},
      {"olmo", PreTokenizer::kGpt2},
      {"llama-bpe", PreTokenizer::kLlama3},
      {"llama3", PreTokenizer::kLlama3},
      {"llama-v3", PreTokenizer::kLlama3},
      {"falcon3", PreTokenizer::kLlama3},
      {"dbrx", PreTokenizer::kLlama3},
      {"qwen2", PreTokenizer::kQwen2},
      {"deepseek-r1-qwen", PreTokenizer::kQwen2},
      {"deepseek-llm", PreTokenizer::kDeepseekLlm},
      {"falcon", PreTokenizer::kFalcon},
      {"mpt", PreTokenizer::kMpt},
      {"starcoder", PreTokenizer::kStarcoder},
      {"refact", PreTokenizer::kStarcoder},
      {"command-r", PreTokenizer::kStarcoder},
  };
  for (const auto& c : kCases) {
    const absl::StatusOr<PreTokenizer> kind = PreTokenizerFromName(c.name);
    ASSERT_TRUE(kind.ok()) << c.name << ": " << kind.status();
    EXPECT_EQ(*kind, c.kind) << c.name;
  }
  for (const std::string_view unknown : {"gpt2", "LLAMA-BPE", "deepseek-coder", "tekken"}) {
    const absl::StatusOr<PreTokenizer> kind = PreTokenizerFromName(unknown);
    EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(kind.status().message()), HasSubstr(std::string(unknown)));
  }
}

TEST(PreTokenizerTest, ExpressionsAreLlamaCpps) {
  const std::string_view gpt2 =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kGpt2), ElementsAre(gpt2));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kMpt), ElementsAre(gpt2));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kStarcoder), ElementsAre("\\p{N}", gpt2));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kFalcon),
              ElementsAre("[\\p{P}\\$\\+<=>\\^~\\|`]+", gpt2, "[0-9][0-9][0-9]"));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kDefault),
              ElementsAre("[\\p{P}\\$\\+<=>\\^~\\|]+", gpt2, "\\p{N}+", "[0-9][0-9][0-9]"));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kLlama3),
              ElementsAre("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                          "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
  EXPECT_THAT(PreTokenizerExpressions(PreTokenizer::kQwen2),
              ElementsAre("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                          "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"));
  EXPECT_EQ(PreTokenizerExpressions(PreTokenizer::kDeepseekLlm).size(), 6u);
  for (const PreTokenizer kind : kAllKinds) {
    for (const std::string_view expression : PreTokenizerExpressions(kind)) {
      EXPECT_TRUE(Regex::Compile(expression).ok()) << expression;
    }
  }
}

// The deepseek-llm letter class holds six code points that NFC normalization would
// turn into other letters; check that they are the real ones and that the class has
// only cased letters.
TEST(PreTokenizerTest, DeepseekLetterClassIsExact) {
  const std::string_view expression = PreTokenizerExpressions(PreTokenizer::kDeepseekLlm)[1];
  const absl::StatusOr<Regex> regex = Regex::Compile(expression);
  ASSERT_TRUE(regex.ok());
  const auto matches = [&](uint32_t cp) {
    const std::vector<uint32_t> text = {cp};
    return regex->Search(text).has_value();
  };
  for (const uint32_t cp : {0x1F7Du, 0x1FBEu, 0x1FD3u, 0x1FDBu, 0x2126u, 0x212Au, 0x00B5u, 0x0390u,
                            0x1E943u, uint32_t{'K'}}) {
    EXPECT_TRUE(matches(cp)) << "U+" << std::hex << cp;
  }
  // Were U+212A written as 'K', "K-ℭ" would span U+004B..U+212D, Arabic included.
  for (const uint32_t cp : {0x0645u, 0x2125u, 0x2127u, 0x2129u, 0x1FBDu, 0x4E2Du, 0x30u}) {
    EXPECT_FALSE(matches(cp)) << "U+" << std::hex << cp;
  }
  for (uint32_t cp = 0x80; cp < 0x20000; ++cp) {
    if (!matches(cp)) continue;
    const GeneralCategory category = CategoryOf(cp);
    ASSERT_TRUE(category == GeneralCategory::kLu || category == GeneralCategory::kLl ||
                category == GeneralCategory::kLt)
        << "U+" << std::hex << cp;
  }
}

TEST(PreTokenizerTest, EmptyTextHasNoPieces) {
  for (const PreTokenizer kind : kAllKinds) EXPECT_THAT(Split(kind, ""), IsEmpty());
}

// gpt-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
TEST(PreTokenizerTest, Gpt2Words) {
  const PreTokenizer k = PreTokenizer::kGpt2;
  EXPECT_THAT(Split(k, "Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split(k, "Hello, world!"), ElementsAre("Hello", ",", " world", "!"));
  EXPECT_THAT(Split(k, "I'm can't we'll they're you've he'd it's"),
              ElementsAre("I", "'m", " can", "'t", " we", "'ll", " they", "'re", " you", "'ve",
                          " he", "'d", " it", "'s"));
  // Contractions are lowercase only; an apostrophe before other text is punctuation.
  EXPECT_THAT(Split(k, "IT'S 'twas"), ElementsAre("IT", "'", "S", " '", "twas"));
  EXPECT_THAT(Split(k, "Wait...!? (yes)"), ElementsAre("Wait", "...!?", " (", "yes", ")"));
}

TEST(PreTokenizerTest, Gpt2DigitsStayInOneRun) {
  EXPECT_THAT(Split(PreTokenizer::kGpt2, "1 22 333 4444 55555 666666 7777777"),
              ElementsAre("1", " 22", " 333", " 4444", " 55555", " 666666", " 7777777"));
  EXPECT_THAT(Split(PreTokenizer::kGpt2, "w048 7tuijk"), ElementsAre("w", "048", " 7", "tuijk"));
}

TEST(PreTokenizerTest, Gpt2Scripts) {
  const PreTokenizer k = PreTokenizer::kGpt2;
  EXPECT_THAT(Split(k, "Привет мир γειά 你好世界 café"),
              ElementsAre("Привет", " мир", " γειά", " 你好世界", " café"));
  // A combining accent is \p{M}, not a letter, so a decomposed é splits.
  EXPECT_THAT(Split(k, "cafe\u0301 ok"), ElementsAre("cafe", "\u0301", " ok"));
  EXPECT_THAT(Split(k, "I ❤️ 🦙s"), ElementsAre("I", " ❤️", " 🦙", "s"));
  EXPECT_THAT(Split(k, "😶\u200d🌫️ x"), ElementsAre("😶\u200d🌫️", " x"));
}

TEST(PreTokenizerTest, Gpt2Whitespace) {
  const PreTokenizer k = PreTokenizer::kGpt2;
  // \s+(?!\S) leaves the last space of a run to the next word...
  EXPECT_THAT(Split(k, "a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Split(k, "    Hello\n    Hello"), ElementsAre("   ", " Hello", "\n   ", " Hello"));
  // ...but takes all of it at the end of the text.
  EXPECT_THAT(Split(k, "a   "), ElementsAre("a", "   "));
  EXPECT_THAT(Split(k, "hi \n "), ElementsAre("hi", " \n "));
  // A single whitespace character other than ' ' before a word matches nothing and
  // stays as its own gap piece.
  EXPECT_THAT(Split(k, "a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(Split(k, "\t\tx"), ElementsAre("\t", "\t", "x"));
  EXPECT_THAT(Split(k, "\n ="), ElementsAre("\n", " ="));
  // Non-ASCII whitespace is \s, but never the optional ' ' before a word.
  EXPECT_THAT(Split(k, "x \u3000y"), ElementsAre("x", " ", "\u3000", "y"));
  EXPECT_THAT(Split(k, "a\u00a0b"), ElementsAre("a", "\u00a0", "b"));
  EXPECT_THAT(Split(k, "a\u200bb"), ElementsAre("a", "\u200b", "b"));  // Cf, not \s
}

TEST(PreTokenizerTest, MptIsGpt2) {
  EXPECT_THAT(Split(PreTokenizer::kMpt, "It's 12345 ok!!  "),
              ElementsAre("It", "'s", " 12345", " ok", "!!", "  "));
}

// llama3: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|
//         [^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//         \s*[\r\n]+|\s+(?!\S)|\s+
TEST(PreTokenizerTest, Llama3Words) {
  const PreTokenizer k = PreTokenizer::kLlama3;
  EXPECT_THAT(Split(k, "Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split(k, "I'M HE'S we'Ll they'RE"),
              ElementsAre("I", "'M", " HE", "'S", " we", "'Ll", " they", "'RE"));
  // One non-letter, non-digit character may lead a word.
  EXPECT_THAT(Split(k, "(hello) 'quoted'"), ElementsAre("(hello", ")", " '", "quoted", "'"));
  EXPECT_THAT(Split(k, "\tfoo"), ElementsAre("\tfoo"));
  EXPECT_THAT(Split(k, "Привет мир 你好"), ElementsAre("Привет", " мир", " 你好"));
  EXPECT_THAT(Split(k, "🦙🦙 ok..."), ElementsAre("🦙🦙", " ok", "..."));
}

TEST(PreTokenizerTest, Llama3DigitsInThrees) {
  EXPECT_THAT(Split(PreTokenizer::kLlama3, "1 22 333 4444 55555 666666 7777777"),
              ElementsAre("1", " ", "22", " ", "333", " ", "444", "4", " ", "555", "55", " ", "666",
                          "666", " ", "777", "777", "7"));
  EXPECT_THAT(Split(PreTokenizer::kLlama3, "$1234.5"), ElementsAre("$", "123", "4", ".", "5"));
}

TEST(PreTokenizerTest, Llama3Whitespace) {
  const PreTokenizer k = PreTokenizer::kLlama3;
  EXPECT_THAT(Split(k, "a\n\nb"), ElementsAre("a", "\n\n", "b"));
  EXPECT_THAT(Split(k, "a \n  b"), ElementsAre("a", " \n", " ", " b"));
  EXPECT_THAT(Split(k, "x\r\n"), ElementsAre("x", "\r\n"));
  EXPECT_THAT(Split(k, "end.\n\nNext"), ElementsAre("end", ".\n\n", "Next"));
  EXPECT_THAT(Split(k, "hi  "), ElementsAre("hi", "  "));
  EXPECT_THAT(Split(k, "    Hello\n    Hello"),
              ElementsAre("   ", " Hello", "\n", "   ", " Hello"));
  // U+3000 is \s, and as the leading character of a word it is still matched by
  // [^\r\n\p{L}\p{N}].
  EXPECT_THAT(Split(k, "a\u3000b"), ElementsAre("a", "\u3000b"));
}

TEST(PreTokenizerTest, Qwen2DigitsOneByOne) {
  EXPECT_THAT(Split(PreTokenizer::kQwen2, "Qwen2.5 has 12345"),
              ElementsAre("Qwen", "2", ".", "5", " has", " ", "1", "2", "3", "4", "5"));
  EXPECT_THAT(Split(PreTokenizer::kQwen2, "I'VE \n\n x"), ElementsAre("I", "'VE", " \n\n", " x"));
}

// default: [\p{P}\$\+<=>\^~\|]+, then gpt-2, then \p{N}+, then [0-9][0-9][0-9]
TEST(PreTokenizerTest, DefaultExpressions) {
  const PreTokenizer k = PreTokenizer::kDefault;
  EXPECT_THAT(Split(k, "Hello, world!"), ElementsAre("Hello", ",", " world", "!"));
  EXPECT_THAT(Split(k, "a+b=c~d"), ElementsAre("a", "+", "b", "=", "c", "~", "d"));
  EXPECT_THAT(Split(k, "1234567"), ElementsAre("123", "456", "7"));
  // \p{N}+ cuts the space off " 12345" before the threes are taken.
  EXPECT_THAT(Split(k, " 12345"), ElementsAre(" ", "123", "45"));
  // ` is \p{Sk}, not in the first class.
  EXPECT_THAT(Split(k, "a `b`"), ElementsAre("a", " `", "b", "`"));
}

// falcon: [\p{P}\$\+<=>\^~\|`]+, then gpt-2, then [0-9][0-9][0-9]
TEST(PreTokenizerTest, FalconExpressions) {
  const PreTokenizer k = PreTokenizer::kFalcon;
  EXPECT_THAT(Split(k, "a `b`"), ElementsAre("a", " ", "`", "b", "`"));
  EXPECT_THAT(Split(k, "Hello, world!"), ElementsAre("Hello", ",", " world", "!"));
  EXPECT_THAT(Split(k, "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(Split(k, " 12345"), ElementsAre(" ", "123", "45"));
  EXPECT_THAT(Split(k, "x...y"), ElementsAre("x", "...", "y"));
}

// starcoder: \p{N}, then gpt-2
TEST(PreTokenizerTest, StarcoderSplitsEveryDigit) {
  EXPECT_THAT(Split(PreTokenizer::kStarcoder, "abc123 45"),
              ElementsAre("abc", "1", "2", "3", " ", "4", "5"));
  // The space cannot join the digit: they are in different fragments by then.
  EXPECT_THAT(Split(PreTokenizer::kStarcoder, "x 1"), ElementsAre("x", " ", "1"));
}

// deepseek-llm: [\r\n], \s?[cased letters]+, \s?[!-/:-~！-／：-～‘-‟　-。]+, \s+$,
// [一-龥ࠀ-一가-퟿]+, \p{N}+
TEST(PreTokenizerTest, DeepseekLlmExpressions) {
  const PreTokenizer k = PreTokenizer::kDeepseekLlm;
  EXPECT_THAT(Split(k, "Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split(k, "a\nb"), ElementsAre("a", "\n", "b"));
  EXPECT_THAT(Split(k, "Hi!! 你好"), ElementsAre("Hi", "!!", " ", "你好"));
  EXPECT_THAT(Split(k, "abc 12345"), ElementsAre("abc", " ", "12345"));
  EXPECT_THAT(Split(k, "ok   "), ElementsAre("ok", "   "));
  EXPECT_THAT(Split(k, "a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Split(k, "hi  \nthere"), ElementsAre("hi", "  ", "\n", "there"));
  EXPECT_THAT(Split(k, "Привет мир"), ElementsAre("Привет", " мир"));
  EXPECT_THAT(Split(k, "aم"), ElementsAre("a", "م"));
  EXPECT_THAT(Split(k, "🦙!"), ElementsAre("🦙", "!"));
  // ü is a letter to the second expression, but [:-~] of the third then cuts the
  // ASCII letters away from it.
  EXPECT_THAT(Split(k, "Führer"), ElementsAre("F", "ü", "hrer"));
}

// llama.cpp shows std::regex U+000B in place of U+3000, so the U+3000 in the class
// "　-。" of the third expression never matches (\s? takes it instead), nor does it in
// "ࠀ-一" of the fifth. Matched as the code point it is, the text would stay one piece.
TEST(PreTokenizerTest, DeepseekIdeographicSpaceMatchesOnlyAsWhitespace) {
  EXPECT_THAT(Split(PreTokenizer::kDeepseekLlm, "。\u3000。"), ElementsAre("。", "\u3000", "。"));
}

TEST(PreTokenizerTest, InvalidUtf8ReadsAsReplacementCharacter) {
  EXPECT_THAT(Split(PreTokenizer::kGpt2,
                    "a\xFF"
                    "b"),
              ElementsAre("a", "\xEF\xBF\xBD", "b"));
  EXPECT_THAT(Split(PreTokenizer::kLlama3, "\xC3(x"), ElementsAre("\xEF\xBF\xBD(", "x"));
  // What decodes past U+10FFFF comes back byte for byte.
  EXPECT_THAT(Split(PreTokenizer::kGpt2, "\xF4\x90\x80\x80x"),
              ElementsAre("\xF4\x90\x80\x80", "x"));
}

TEST(PreTokenizerTest, LongRunsOfEveryKind) {
  constexpr size_t kLength = 100000;
  const std::string inputs[] = {
      std::string(kLength, ' '),
      std::string(kLength, ' ') + "x",
      std::string(kLength, 'a'),
      std::string(kLength, '7'),
      std::string(kLength, '\n'),
      std::string(kLength, '!'),
      std::string(kLength / 2, ' ') + std::string(kLength / 2, '\n') + "y",
  };
  for (const PreTokenizer kind : kAllKinds) {
    for (const std::string& input : inputs) {
      const std::vector<std::string> pieces = Split(kind, input);
      ASSERT_FALSE(pieces.empty());
      EXPECT_EQ(Join(pieces), input);
    }
  }
  EXPECT_EQ(Split(PreTokenizer::kGpt2, inputs[1]).size(), 2u);
  EXPECT_EQ(Split(PreTokenizer::kLlama3, inputs[2]).size(), 1u);
  EXPECT_EQ(Split(PreTokenizer::kLlama3, inputs[3]).size(), (kLength + 2) / 3);
  EXPECT_EQ(Split(PreTokenizer::kQwen2, inputs[3]).size(), kLength);
}

// The strings of a llama.cpp tokenizer test input file.
std::vector<std::string> ReadVocabTestInput(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream contents;
  contents << file.rdbuf();
  const std::string data = contents.str();
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> strings;
  size_t begin = 0;
  for (size_t end = data.find(separator); end != std::string::npos;
       end = data.find(separator, begin)) {
    strings.push_back(data.substr(begin, end - begin));
    begin = end + separator.size();
  }
  return strings;
}

TEST(PreTokenizerTest, SharedVocabInputsSplitAndRejoin) {
  for (const char* name : {"gpt-2", "deepseek-llm", "falcon"}) {
    const std::string path =
        std::string(MOERT_SHARED_DIR) + "/vocab/ggml-vocab-" + name + ".gguf.inp";
    const std::vector<std::string> strings = ReadVocabTestInput(path);
    if (strings.empty()) GTEST_SKIP() << "missing " << path;
    EXPECT_GT(strings.size(), 40u) << path;
    for (const PreTokenizer kind : kAllKinds) {
      for (const std::string& text : strings) {
        const std::vector<std::string> pieces = Split(kind, text);
        EXPECT_EQ(Join(pieces), text);
        for (const std::string& piece : pieces) EXPECT_FALSE(piece.empty());
      }
    }
  }
}

// Pieces of some strings of those inputs, for the pre-tokenizer each file is made for.
TEST(PreTokenizerTest, SharedVocabSamples) {
  EXPECT_THAT(Split(PreTokenizer::kGpt2, "ied 4 ½ months"),
              ElementsAre("ied", " 4", " ½", " months"));
  EXPECT_THAT(Split(PreTokenizer::kGpt2, " this is 🦙.cpp"),
              ElementsAre(" this", " is", " 🦙.", "cpp"));
  EXPECT_THAT(Split(PreTokenizer::kGpt2, "' era"), ElementsAre("'", " era"));
  EXPECT_THAT(Split(PreTokenizer::kFalcon, " Hello, world!"),
              ElementsAre(" Hello", ",", " world", "!"));
  EXPECT_THAT(Split(PreTokenizer::kFalcon, "3333333"), ElementsAre("333", "333", "3"));
  EXPECT_THAT(
      Split(PreTokenizer::kDeepseekLlm, "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～"),
      ElementsAre("Hello", ",", " y", "'", "all", "!", " How", " are", " you", " 😁", " ?", "我想在",
                  "apple", "工作", "1314151", "天", "～"));
}

}  // namespace
}  // namespace moert::tokenizer
