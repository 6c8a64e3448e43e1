// Tests of tokenizer/regex.h: each supported construct, leftmost-first alternation,
// backtracking, lookahead, std::regex_iterator's walk over empty matches, compile
// errors, and inputs long enough that a naive backtracker would take quadratic time.
#include "tokenizer/regex.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Regex MustCompile(std::string_view pattern) {
  absl::StatusOr<Regex> regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << pattern << ": " << regex.status();
  return *std::move(regex);
}

// The substrings FindAll matches, as UTF-8.
std::vector<std::string> All(std::string_view pattern, std::string_view text) {
  const std::vector<uint32_t> cps = DecodeUtf8(text);
  std::vector<std::string> result;
  for (const Regex::Match& m : MustCompile(pattern).FindAll(cps)) {
    std::string piece;
    for (size_t i = m.begin; i < m.end; ++i) AppendUtf8(cps[i], &piece);
    result.push_back(piece);
  }
  return result;
}

std::vector<Regex::Match> Spans(std::string_view pattern, std::string_view text) {
  return MustCompile(pattern).FindAll(DecodeUtf8(text));
}

TEST(RegexTest, Literals) {
  EXPECT_THAT(All("abc", "xxabcabcab"), ElementsAre("abc", "abc"));
  EXPECT_THAT(All("中文", "a中文b中文"), ElementsAre("中文", "中文"));
  EXPECT_THAT(All("\\$\\+\\^\\|\\.\\*\\?\\(\\)\\[\\]\\{\\}\\\\\\/", "x$+^|.*?()[]{}\\/y"),
              ElementsAre("$+^|.*?()[]{}\\/"));
  EXPECT_THAT(All("\\r\\n\\t", "a\r\n\tb"), ElementsAre("\r\n\t"));
  EXPECT_THAT(All("\\x41\\u00e9\\u{1F999}", "A\xC3\xA9\xF0\x9F\xA6\x99"),
              ElementsAre("A\xC3\xA9\xF0\x9F\xA6\x99"));
  EXPECT_THAT(All("\r\n", "a\r\nb"), ElementsAre("\r\n"));  // raw control characters
  EXPECT_THAT(All("}]", "a}]"), ElementsAre("}]"));
}

TEST(RegexTest, Dot) { EXPECT_THAT(All("a.c", "abc a中c a\nc a\rc"), ElementsAre("abc", "a中c")); }

TEST(RegexTest, AlternationIsLeftmostFirstNotLongest) {
  EXPECT_THAT(All("a|ab", "ab"), ElementsAre("a"));
  EXPECT_THAT(All("ab|a", "ab"), ElementsAre("ab"));
  EXPECT_THAT(All("x|yy|z", "zyyx"), ElementsAre("z", "yy", "x"));
  // The leftmost position wins over an earlier alternative.
  EXPECT_THAT(Spans("b|a", "ab"), ElementsAre(Regex::Match{0, 1}, Regex::Match{1, 2}));
}

TEST(RegexTest, Groups) {
  EXPECT_THAT(All("(?:ab)+", "ababab x ab"), ElementsAre("ababab", "ab"));
  EXPECT_THAT(All("(ab)+c", "ababc"), ElementsAre("ababc"));  // captures nothing, groups
  EXPECT_THAT(All("a(?:b|c)d", "abd acd aed"), ElementsAre("abd", "acd"));
  EXPECT_THAT(All("(?:'[sS]|'[tT])", "it's IT'S don't"), ElementsAre("'s", "'S", "'t"));
}

TEST(RegexTest, Classes) {
  EXPECT_THAT(All("[a-c]+", "abcdcba"), ElementsAre("abc", "cba"));
  EXPECT_THAT(All("[^a-c]+", "abxyzc"), ElementsAre("xyz"));
  EXPECT_THAT(All("[-a]+", "a-b"), ElementsAre("a-"));
  EXPECT_THAT(All("[a-]+", "-ab"), ElementsAre("-a"));
  EXPECT_THAT(All("[\\]\\-]+", "a]-b"), ElementsAre("]-"));
  EXPECT_THAT(All("[\\r\\n]", "a\r\nb"), ElementsAre("\r", "\n"));
  EXPECT_THAT(All("[一-龥]+", "ab中文cd"), ElementsAre("中文"));
  EXPECT_THAT(All("[Ａ-Ｚ𐐀-𐑏]+", "xＡＢ𐐀y"), ElementsAre("ＡＢ𐐀"));
  EXPECT_THAT(All("[\\d\\s]+", "ab1 2cd"), ElementsAre("1 2"));
  EXPECT_THAT(All("[^\\s\\p{L}\\p{N}]+", "ab, 12!?é…"), ElementsAre(",", "!?", "…"));
  EXPECT_THAT(All("[\\p{L}\\p{N}]+", "ab1-é2"), ElementsAre("ab1", "é2"));
  EXPECT_THAT(All("[\\S]+", "a b"), ElementsAre("a", "b"));
  EXPECT_THAT(All("[]", "abc"), IsEmpty());                // ECMAScript: empty class
  EXPECT_THAT(All("[^]", "a\n"), ElementsAre("a", "\n"));  // and the full one
}

TEST(RegexTest, ShorthandClasses) {
  // \s is Unicode White_Space, as llama.cpp's whitespace set.
  EXPECT_THAT(All("\\s+", "a \t\u3000\u00a0\u0085\u2028b\u200bc"),
              ElementsAre(" \t\u3000\u00a0\u0085\u2028"));
  EXPECT_THAT(All("\\S+", "a\u200bb c"), ElementsAre("a\u200bb", "c"));
  // \d and \w are ASCII, as in ECMAScript; \p{N} is not.
  EXPECT_THAT(All("\\d+", "12٣4"), ElementsAre("12", "4"));
  EXPECT_THAT(All("\\p{N}+", "12٣4 Ⅻ½"), ElementsAre("12٣4", "Ⅻ½"));
  EXPECT_THAT(All("\\w+", "ab_9 é"), ElementsAre("ab_9"));
  EXPECT_THAT(All("\\D+", "1ab2"), ElementsAre("ab"));
  EXPECT_THAT(All("\\W+", "ab é!c"), ElementsAre(" é!"));
}

TEST(RegexTest, UnicodeProperties) {
  EXPECT_THAT(All("\\p{L}+", "héllo, wörld! 你好 Привет"),
              ElementsAre("héllo", "wörld", "你好", "Привет"));
  EXPECT_THAT(All("\\p{Lu}+", "ABcDΩж"), ElementsAre("AB", "DΩ"));
  EXPECT_THAT(All("\\p{Ll}+", "ABcDΩж"), ElementsAre("c", "ж"));
  EXPECT_THAT(All("\\p{Lt}", "ǅa"), ElementsAre("ǅ"));
  EXPECT_THAT(All("\\p{Lm}", "aʰb"), ElementsAre("ʰ"));
  EXPECT_THAT(All("\\p{Lo}+", "中文abc"), ElementsAre("中文"));
  EXPECT_THAT(All("\\p{M}+", "e\u0301\u0302x"), ElementsAre("\u0301\u0302"));
  EXPECT_THAT(All("\\p{P}+", "a,.!?-b$"), ElementsAre(",.!?-"));
  EXPECT_THAT(All("\\p{S}+", "a$+<=>^`|~€🦙b"), ElementsAre("$+<=>^`|~€🦙"));
  EXPECT_THAT(All("\\p{Z}+", "a \u3000\u2028b\tc"), ElementsAre(" \u3000\u2028"));
  EXPECT_THAT(All("\\p{C}+", "a\n\u200d\u0378b"), ElementsAre("\n\u200d\u0378"));
  EXPECT_THAT(All("\\p{Nd}+", "1٣Ⅻ"), ElementsAre("1٣"));
  EXPECT_THAT(All("\\P{L}+", "ab12cd"), ElementsAre("12"));
  EXPECT_THAT(All("[\\P{L}]+", "ab12cd"), ElementsAre("12"));
}

TEST(RegexTest, GreedyQuantifiers) {
  EXPECT_THAT(All("ab?", "a ab abb"), ElementsAre("a", "ab", "ab"));
  EXPECT_THAT(All("ab*", "a ab abb"), ElementsAre("a", "ab", "abb"));
  EXPECT_THAT(All("ab+", "a ab abb"), ElementsAre("ab", "abb"));
  EXPECT_THAT(All("a{2}", "aaaaa"), ElementsAre("aa", "aa"));
  EXPECT_THAT(All("a{2,}", "a aa aaaaa"), ElementsAre("aa", "aaaaa"));
  EXPECT_THAT(All("a{1,3}", "aaaaaaa"), ElementsAre("aaa", "aaa", "a"));
  EXPECT_THAT(All("\\p{N}{1,3}", "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(All("(?:ab){2}", "abababab"), ElementsAre("abab", "abab"));
}

TEST(RegexTest, LazyQuantifiers) {
  EXPECT_THAT(All("a+?", "aaa"), ElementsAre("a", "a", "a"));
  EXPECT_THAT(All("<.+?>", "<a><bc>"), ElementsAre("<a>", "<bc>"));
  EXPECT_THAT(All("a{2,3}?", "aaaaa"), ElementsAre("aa", "aa"));
  EXPECT_THAT(All("x??y", "xy y"), ElementsAre("xy", "y"));
}

TEST(RegexTest, Backtracking) {
  EXPECT_THAT(All("a*ab", "aaaab"), ElementsAre("aaaab"));
  EXPECT_THAT(All("(?:a|ab)c", "abc"), ElementsAre("abc"));
  EXPECT_THAT(All("\\s*[\\r\\n]+", "  \n \n  x"), ElementsAre("  \n \n"));
  EXPECT_THAT(All("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", "(ab 12 \ncd"), ElementsAre("(ab", "cd"));
  EXPECT_THAT(All("(?:a{1,3})b", "aaaab"), ElementsAre("aaab"));
}

TEST(RegexTest, Lookahead) {
  EXPECT_THAT(Spans("a(?=b)", "ab ac"), ElementsAre(Regex::Match{0, 1}));
  EXPECT_THAT(Spans("a(?!b)", "ab ac"), ElementsAre(Regex::Match{3, 4}));
  // The idiom of the GPT-2 family: trailing whitespace keeps its last character for
  // the next word unless nothing but whitespace follows.
  EXPECT_THAT(All("\\s+(?!\\S)", "a   b"), ElementsAre("  "));
  EXPECT_THAT(All("\\s+(?!\\S)", "a   "), ElementsAre("   "));
  EXPECT_THAT(All("\\s+(?!\\S)", "a b"), IsEmpty());
  EXPECT_THAT(All("\\s+(?!\\S)", "a\t\t\tb  \n"), ElementsAre("\t\t", "  \n"));
  // A lookahead sees nothing past the searched text.
  const std::vector<uint32_t> text = DecodeUtf8("a  b");
  EXPECT_THAT(MustCompile("\\s+(?!\\S)").FindAll(std::span(text).first(3)),
              ElementsAre(Regex::Match{1, 3}));
  EXPECT_THAT(All("x(?=(?:ab)+c)", "xababc xabd"), ElementsAre("x"));
  EXPECT_THAT(All("(?!ab)\\w\\w", "abcab"), ElementsAre("bc"));
}

TEST(RegexTest, Anchors) {
  EXPECT_THAT(Spans("^a", "aaa"), ElementsAre(Regex::Match{0, 1}));
  EXPECT_THAT(Spans("a$", "aaa"), ElementsAre(Regex::Match{2, 3}));
  EXPECT_THAT(All("\\s+$", "a  \n b  "), ElementsAre("  "));
  EXPECT_THAT(All("\\s+$", "a  \n"), ElementsAre("  \n"));  // no multiline mode
  EXPECT_THAT(All("^$", ""), ElementsAre(""));
  EXPECT_THAT(All("\\bab", "ab cab ab_ab"), ElementsAre("ab", "ab"));
  EXPECT_THAT(Spans("\\Bb", "ab b"), ElementsAre(Regex::Match{1, 2}));
}

TEST(RegexTest, SearchFrom) {
  const Regex regex = MustCompile("b+");
  const std::vector<uint32_t> text = DecodeUtf8("abbab");
  EXPECT_EQ(regex.Search(text), (Regex::Match{1, 3}));
  EXPECT_EQ(regex.Search(text, 2), (Regex::Match{2, 3}));
  EXPECT_EQ(regex.Search(text, 3), (Regex::Match{4, 5}));
  EXPECT_EQ(regex.Search(text, 5), std::nullopt);
  EXPECT_EQ(regex.Search(text, 6), std::nullopt);
  EXPECT_EQ(MustCompile("x*").Search(text, 5), (Regex::Match{5, 5}));
}

TEST(RegexTest, FindAllWalksEmptyMatchesLikeStdRegexIterator) {
  // After an empty match the iterator first tries a non-empty match at the same place.
  EXPECT_THAT(Spans("a*", "baa"),
              ElementsAre(Regex::Match{0, 0}, Regex::Match{1, 3}, Regex::Match{3, 3}));
  EXPECT_THAT(Spans("b?|ba", "ba"),
              ElementsAre(Regex::Match{0, 1}, Regex::Match{1, 1}, Regex::Match{2, 2}));
  EXPECT_THAT(Spans("x*|ab", "ab"),
              ElementsAre(Regex::Match{0, 0}, Regex::Match{0, 2}, Regex::Match{2, 2}));
  // ^ holds only for the first search, as with std::regex_iterator's match_prev_avail.
  EXPECT_THAT(Spans("^|^a", "a"), ElementsAre(Regex::Match{0, 0}));
  EXPECT_THAT(Spans("a*", ""), ElementsAre(Regex::Match{0, 0}));
}

TEST(RegexTest, CompileErrors) {
  for (const std::string_view pattern : {
           "(",      ")",        "a)",      "(?:a",        "[a",      "[z-a]",       "[\\d-z]",
           "a{2,1}", "a{",       "a{x}",    "a{1001}",     "*a",      "+",           "?",
           "a**",    "a*+",      "a++",     "\\1",         "(?<=a)b", "(?<n>a)",     "(?i)a",
           "(?i:a)", "\\p{Foo}", "\\p{L",   "\\pL",        "\\q",     "\\",          "^*",
           "(?=a)*", "(?:a*)*",  "(?:a|)+", "(?:a?){2,3}", "\\u12",   "\\u{110000}", "\\01",
       }) {
    const absl::StatusOr<Regex> regex = Regex::Compile(pattern);
    EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
  }
  EXPECT_THAT(std::string(Regex::Compile("ab(").status().message()),
              ::testing::HasSubstr("code point 3"));
}

TEST(RegexTest, AcceptsWhatTheLlamaCppExpressionsUse) {
  for (const std::string_view pattern : {
           "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
           "(?:\\b){2}",
           "(?:a?){3}",
           "\\s{512}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
           "((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+",
           "\\d{1,3}(?=(?:\\d{3})*\\b)",
       }) {
    EXPECT_TRUE(Regex::Compile(pattern).ok()) << pattern;
  }
}

// Each of these is quadratic or worse for a backtracker without the failure memo; they
// finish in milliseconds here. No timing is asserted (timings belong in bench/).
TEST(RegexTest, LongInputs) {
  constexpr size_t kLength = 100000;
  const std::vector<uint32_t> spaces(kLength, ' ');
  std::vector<uint32_t> spaces_then_x = spaces;
  spaces_then_x.push_back('x');
  const std::vector<uint32_t> letters(kLength, 'a');

  EXPECT_THAT(MustCompile("\\s+(?!\\S)").FindAll(spaces), ElementsAre(Regex::Match{0, kLength}));
  EXPECT_THAT(MustCompile("\\s+(?!\\S)").FindAll(spaces_then_x),
              ElementsAre(Regex::Match{0, kLength - 1}));
  EXPECT_THAT(MustCompile("\\s+$").FindAll(spaces_then_x), IsEmpty());
  EXPECT_THAT(MustCompile("\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+").FindAll(spaces_then_x),
              ElementsAre(Regex::Match{0, kLength - 1}, Regex::Match{kLength - 1, kLength}));
  EXPECT_THAT(MustCompile("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+").FindAll(letters),
              ElementsAre(Regex::Match{0, kLength}));
  EXPECT_THAT(MustCompile("(?:a|b)*c").FindAll(letters), IsEmpty());
  EXPECT_THAT(MustCompile("a*a*a*b").FindAll(letters), IsEmpty());
  EXPECT_EQ(MustCompile("\\p{L}{1,3}").FindAll(letters).size(), (kLength + 2) / 3);
}

}  // namespace
}  // namespace moert::tokenizer
