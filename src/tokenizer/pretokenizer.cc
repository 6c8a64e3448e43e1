// The pre-tokenizers of byte-level BPE vocabularies: llama.cpp's regex lists (from
// llm_tokenizer_bpe's constructor in src/llama-vocab.cpp, Feb 2025) run the way its
// unicode_regex_split runs them.
//
// How llama.cpp splits, and what this file reproduces:
//  * The expressions apply in order. Each one splits every current fragment into its
//    matches and the unmatched gaps between them, and keeps both. A match never
//    crosses a fragment boundary, and ^, $ and lookaheads see only their fragment.
//  * llama.cpp matches std::regex on a copy of the text where every non-ASCII
//    whitespace code point is replaced by U+000B (std::regex's \s knows only ASCII);
//    \p{L}, \p{N}, \p{P}, \p{S} and \p{M} are matched through category placeholders
//    that give the same answers as true category tests. So \s does match non-ASCII
//    whitespace, but a literal such as U+3000 in a class never matches, because the
//    text shows U+000B there. We match on the same substituted copy.
//  * The gpt-2 and llama3 expressions run through hand-written splitters in
//    llama.cpp (unicode_regex_split_custom_gpt2/_llama3); those are meant to, and as
//    far as we can tell do, give exactly the regex's splits, so we run the regex.
//  * Pieces are rebuilt from the decoded code points, so an invalid byte comes back as
//    U+FFFD, as in llama.cpp.
#include "tokenizer/pretokenizer.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/strings.h"
#include "telemetry/platform.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

// The expressions below are copied byte for byte from llama.cpp so that a difference
// is easy to spot; do not reformat them.
// clang-format off

constexpr std::string_view kGpt2Expression =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

// llama.cpp's adaptation of tokenizer.json's (?i:'s|'t|...) for std::regex.
constexpr std::string_view kLlama3Expression =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr std::string_view kQwen2Expression =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr std::string_view kDefaultExpressions[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    kGpt2Expression,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

constexpr std::string_view kGpt2Expressions[] = {kGpt2Expression};

constexpr std::string_view kLlama3Expressions[] = {kLlama3Expression};

constexpr std::string_view kQwen2Expressions[] = {kQwen2Expression};

// The letter class is the cased letters (Lu, Ll, Lt) of an older Unicode version. Six
// of its code points are spelled as escapes: they have singleton canonical
// decompositions, so any tool that NFC-normalizes text would silently turn them into
// other letters (U+212A KELVIN SIGN into 'K', making "K-ℭ" a range over most of the BMP).
constexpr std::string_view kDeepseekLlmExpressions[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆ"
    "Έ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷ"
    "ᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1F7Dᾀ-ᾴᾶ-ᾼ\u1FBE"
    "ῂ-ῄῆ-ῌῐ-\u1FD3ῖ-\u1FDBῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝ"
    "ℤ\u2126ℨ\u212A-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳ"
    "Ꙁ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀"
    "-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
};

constexpr std::string_view kFalconExpressions[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    kGpt2Expression,
    "[0-9][0-9][0-9]",
};

constexpr std::string_view kMptExpressions[] = {kGpt2Expression};

constexpr std::string_view kStarcoderExpressions[] = {
    "\\p{N}",
    kGpt2Expression,
};

// clang-format on

constexpr size_t kNumPreTokenizers = 8;

std::span<const std::string_view> ExpressionsOf(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::kDefault:
      return kDefaultExpressions;
    case PreTokenizer::kGpt2:
      return kGpt2Expressions;
    case PreTokenizer::kLlama3:
      return kLlama3Expressions;
    case PreTokenizer::kQwen2:
      return kQwen2Expressions;
    case PreTokenizer::kDeepseekLlm:
      return kDeepseekLlmExpressions;
    case PreTokenizer::kFalcon:
      return kFalconExpressions;
    case PreTokenizer::kMpt:
      return kMptExpressions;
    case PreTokenizer::kStarcoder:
      return kStarcoderExpressions;
  }
  return kDefaultExpressions;
}

// Compiled once, on first use. The expressions are constants covered by the tests, so
// failing to compile one is a bug in this file, not bad input.
const std::vector<Regex>& CompiledExpressionsOf(PreTokenizer kind) {
  static const auto* const kCompiled = [] {
    auto* compiled = new std::array<std::vector<Regex>, kNumPreTokenizers>();
    for (size_t k = 0; k < kNumPreTokenizers; ++k) {
      for (const std::string_view expression : ExpressionsOf(static_cast<PreTokenizer>(k))) {
        absl::StatusOr<Regex> regex = Regex::Compile(expression);
        if (!regex.ok()) {
          telemetry::Log(telemetry::LogLevel::kError,
                         StrCat("pre-tokenizer expression does not compile: ",
                                regex.status().ToString()));
          std::abort();
        }
        (*compiled)[k].push_back(*std::move(regex));
      }
    }
    return compiled;
  }();
  return (*kCompiled)[static_cast<size_t>(kind)];
}

struct NamedPreTokenizer {
  std::string_view name;
  PreTokenizer kind;
};

// llama.cpp's `tokenizer.ggml.pre` names (llama_vocab::impl::load), each mapped to the
// kind whose expression list its pre-tokenizer type uses. Types that llama.cpp keeps
// apart only for other settings (dbrx, olmo, command-r, ...) share a kind here; the
// vocabulary reads those settings from the name itself.
constexpr NamedPreTokenizer kNames[] = {
    {"default", PreTokenizer::kDefault},
    {"llama3", PreTokenizer::kLlama3},
    {"llama-v3", PreTokenizer::kLlama3},
    {"llama-bpe", PreTokenizer::kLlama3},
    {"falcon3", PreTokenizer::kLlama3},
    {"dbrx", PreTokenizer::kLlama3},
    {"smaug-bpe", PreTokenizer::kLlama3},
    {"deepseek-llm", PreTokenizer::kDeepseekLlm},
    {"falcon", PreTokenizer::kFalcon},
    {"mpt", PreTokenizer::kMpt},
    {"starcoder", PreTokenizer::kStarcoder},
    {"refact", PreTokenizer::kStarcoder},
    {"command-r", PreTokenizer::kStarcoder},
    {"smollm", PreTokenizer::kStarcoder},
    {"codeshell", PreTokenizer::kStarcoder},
    {"exaone", PreTokenizer::kStarcoder},
    {"minerva-7b", PreTokenizer::kStarcoder},
    {"gpt-2", PreTokenizer::kGpt2},
    {"phi-2", PreTokenizer::kGpt2},
    {"jina-es", PreTokenizer::kGpt2},
    {"jina-de", PreTokenizer::kGpt2},
    {"gigachat", PreTokenizer::kGpt2},
    {"jina-v1-en", PreTokenizer::kGpt2},
    {"jina-v2-es", PreTokenizer::kGpt2},
    {"jina-v2-de", PreTokenizer::kGpt2},
    {"jina-v2-code", PreTokenizer::kGpt2},
    {"roberta-bpe", PreTokenizer::kGpt2},
    {"olmo", PreTokenizer::kGpt2},
    {"jais", PreTokenizer::kGpt2},
    {"qwen2", PreTokenizer::kQwen2},
    {"deepseek-r1-qwen", PreTokenizer::kQwen2},
    {"stablelm2", PreTokenizer::kQwen2},
};

// std::regex's \s knows only ASCII whitespace, so llama.cpp shows it U+000B in place of
// any other whitespace code point (see the top of this file).
constexpr uint32_t kWhitespaceStandIn = 0x0B;

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name) {
  if (name.empty()) return PreTokenizer::kDefault;
  for (const NamedPreTokenizer& entry : kNames) {
    if (entry.name == name) return entry.kind;
  }
  return absl::InvalidArgumentError(
      StrCat("unsupported pre-tokenizer '", name, "' (tokenizer.ggml.pre)"));
}

std::span<const std::string_view> PreTokenizerExpressions(PreTokenizer kind) {
  return ExpressionsOf(kind);
}

std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text) {
  const std::vector<uint32_t> codepoints = DecodeUtf8(text);
  std::vector<uint32_t> subject = codepoints;
  for (uint32_t& cp : subject) {
    if (cp > 0x7F && FlagsOf(cp).is(CodepointFlags::kWhitespace)) cp = kWhitespaceStandIn;
  }

  // Fragments as lengths in code points, in order; they always tile the whole text.
  std::vector<size_t> fragments = {subject.size()};
  for (const Regex& regex : CompiledExpressionsOf(kind)) {
    std::vector<size_t> split;
    split.reserve(fragments.size());
    size_t fragment_begin = 0;
    for (const size_t length : fragments) {
      const std::span<const uint32_t> fragment(subject.data() + fragment_begin, length);
      size_t done = 0;
      for (const Regex::Match& match : regex.FindAll(fragment)) {
        if (match.begin > done) split.push_back(match.begin - done);
        // llama.cpp would also keep an empty match as an empty piece, which its BPE
        // turns into no tokens; none of the expressions here can match empty anyway.
        if (match.end > match.begin) split.push_back(match.end - match.begin);
        done = match.end;
      }
      if (done < length) split.push_back(length - done);
      fragment_begin += length;
    }
    fragments = std::move(split);
  }

  std::vector<std::string> pieces;
  pieces.reserve(fragments.size());
  size_t begin = 0;
  for (const size_t length : fragments) {
    std::string piece;
    for (size_t i = begin; i < begin + length; ++i) AppendUtf8(codepoints[i], &piece);
    pieces.push_back(std::move(piece));
    begin += length;
  }
  return pieces;
}

}  // namespace moert::tokenizer
