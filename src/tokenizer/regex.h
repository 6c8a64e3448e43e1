// A small backtracking regular-expression engine over Unicode code points, made for the
// pre-tokenizer expressions of llama.cpp's BPE vocabularies. It takes the ECMAScript
// syntax llama.cpp hands to std::regex, plus \p{...} classes matched against the real
// general-category tables (tokenizer/unicode.h), and gives leftmost-first
// (Perl/ECMAScript) matches. A failure memo over (branch point, position) keeps
// matching linear in the text length, where a plain backtracker such as std::regex
// takes quadratic time on some of these expressions (\s+$ over a long run of spaces).
//
// Supported: literals (any code point, escapes \t \n \v \f \r \0 \xHH \uHHHH \u{H...}
// and escaped punctuation), '.', classes [...] and [^...] with ranges, \d \D \s \S \w
// \W, \p{X} \P{X} for the general categories (L, Lu, Ll, Lt, Lm, Lo, LC, M, Mn, Mc, Me,
// N, Nd, Nl, No, P, Pc, Pd, Ps, Pe, Pi, Pf, Po, S, Sm, Sc, Sk, So, Z, Zs, Zl, Zp, C, Cc,
// Cf, Cs, Co, Cn) inside and outside classes, groups (...) and (?:...) (neither
// captures), alternation, greedy and lazy ? * + {n} {n,} {n,m}, lookahead (?=...) and
// (?!...), and the assertions ^ $ \b \B. \d and \w are ASCII-only as in ECMAScript;
// \s is the Unicode White_Space property (llama.cpp's whitespace set); ^ and $ match
// only at the ends of the searched text (no multiline mode). Not supported, and
// rejected at compile time: backreferences, lookbehind, named groups, inline flags
// such as (?i), possessive or atomic forms, and optional repeats of a subexpression
// that can match empty, such as (?:a*)* or (?:a?){1,2} (engines disagree on those,
// and none of llama.cpp's pre-tokenizer expressions has one).
//
// Memory while searching: one bit per (branch point, position) of the text, e.g.
// about 300 KB for the llama3 expression over 100k code points.
#ifndef MOERT_TOKENIZER_REGEX_H_
#define MOERT_TOKENIZER_REGEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::tokenizer {

namespace regex_internal {
struct Program;
}  // namespace regex_internal

class Regex {
 public:
  // A match as code point offsets [begin, end) into the searched text.
  struct Match {
    size_t begin = 0;
    size_t end = 0;
    bool operator==(const Match&) const = default;
  };

  // Compiles the UTF-8 `pattern`. Malformed or unsupported syntax is InvalidArgument
  // naming the code point offset where it was found.
  static absl::StatusOr<Regex> Compile(std::string_view pattern);

  // The leftmost-first match starting at or after `from`, or nullopt. Anchors and
  // lookaheads see only `text`: what lies outside it does not exist for them.
  std::optional<Match> Search(std::span<const uint32_t> text, size_t from = 0) const;

  // Every successive match, as std::regex_iterator walks them: each search starts
  // where the previous match ended; after an empty match the next one must either be
  // non-empty at the same position or start at least one code point later.
  std::vector<Match> FindAll(std::span<const uint32_t> text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, std::shared_ptr<const regex_internal::Program> program);

  std::string pattern_;
  // Immutable once compiled, so copies share it and may search from several threads.
  std::shared_ptr<const regex_internal::Program> program_;
};

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_REGEX_H_
