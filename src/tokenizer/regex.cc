// The engine behind tokenizer/regex.h: a recursive-descent parser to a syntax tree, a
// compiler from the tree to small instruction programs (one for the expression, one per
// lookahead body), and a backtracking matcher with an explicit stack.
//
// Why matching stays linear: a program only branches at kSplit instructions, and what
// happens after reaching split s at text position p does not depend on how it was
// reached or where the search started (nothing here looks behind or captures, and
// optional repeats of something that can match empty, whose next iteration would
// depend on where the previous one began, are refused at compile time). So once
// (s, p) has been explored without a match it can be skipped on every later visit, in
// the same attempt, at later start positions and in later searches over the same text.
// Each (s, p) is then explored at most once, and a search costs O(splits * length).
#include "tokenizer/regex.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/status.h"
#include "core/strings.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_data.h"

namespace moert::tokenizer {
namespace regex_internal {

using CategoryMask = uint32_t;

constexpr CategoryMask Bit(GeneralCategory category) {
  return CategoryMask{1} << static_cast<unsigned>(category);
}

constexpr uint32_t kLastCodepoint = std::numeric_limits<uint32_t>::max();

struct CodepointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

// A set of code points: explicit ranges plus whole general categories, optionally
// negated as a whole.
struct CharClass {
  std::vector<CodepointRange> ranges;
  CategoryMask categories = 0;
  bool negated = false;
  // The answer for every ASCII code point, precomputed by Finish().
  uint64_t ascii[2] = {0, 0};

  void Add(uint32_t first, uint32_t last) { ranges.push_back({first, last}); }

  void AddAll(const CharClass& other) {
    ranges.insert(ranges.end(), other.ranges.begin(), other.ranges.end());
    categories |= other.categories;
  }

  // Sorts and merges the ranges so that lookups can binary-search them.
  void Finish() {
    std::sort(ranges.begin(), ranges.end(),
              [](const CodepointRange& a, const CodepointRange& b) { return a.first < b.first; });
    std::vector<CodepointRange> merged;
    for (const CodepointRange& range : ranges) {
      if (!merged.empty() &&
          (merged.back().last == kLastCodepoint || range.first <= merged.back().last + 1)) {
        merged.back().last = std::max(merged.back().last, range.last);
      } else {
        merged.push_back(range);
      }
    }
    ranges = std::move(merged);
    ascii[0] = ascii[1] = 0;
    for (uint32_t cp = 0; cp < 128; ++cp) {
      if (MatchesSlow(cp)) ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
  }

  bool MatchesSlow(uint32_t cp) const {
    bool in = categories != 0 && (categories & Bit(CategoryOf(cp))) != 0;
    if (!in) {
      const auto it =
          std::upper_bound(ranges.begin(), ranges.end(), cp,
                           [](uint32_t value, const CodepointRange& r) { return value < r.first; });
      in = it != ranges.begin() && cp <= std::prev(it)->last;
    }
    return in != negated;
  }

  bool Matches(uint32_t cp) const {
    if (cp < 128) return ((ascii[cp >> 6] >> (cp & 63)) & 1) != 0;
    return MatchesSlow(cp);
  }
};

// All code points not in `ranges` (sorted and disjoint).
std::vector<CodepointRange> Complement(const std::vector<CodepointRange>& ranges) {
  std::vector<CodepointRange> result;
  uint64_t next = 0;
  for (const CodepointRange& range : ranges) {
    if (range.first > next) result.push_back({static_cast<uint32_t>(next), range.first - 1});
    next = uint64_t{range.last} + 1;
  }
  if (next <= kLastCodepoint) result.push_back({static_cast<uint32_t>(next), kLastCodepoint});
  return result;
}

enum class Op : uint8_t {
  kChar,       // arg: the code point
  kClass,      // arg: index into Program::classes
  kSplit,      // try x, then y; arg: this split's memo slot
  kJump,       // continue at x
  kBeginText,  // ^
  kEndText,    // $
  kWordBoundary,
  kNotWordBoundary,
  kLookahead,  // arg: index of the body in Program::codes; negated for (?!...)
  kMatch,
};

struct Inst {
  Op op = Op::kMatch;
  bool negated = false;
  uint32_t arg = 0;
  uint32_t x = 0;
  uint32_t y = 0;
};

struct Code {
  std::vector<Inst> insts;
  uint32_t num_splits = 0;
};

struct Program {
  std::vector<Code> codes;  // [0] is the expression, the rest are lookahead bodies
  std::vector<CharClass> classes;
  bool nullable = false;  // the expression may match the empty string
};

namespace {

constexpr int kUnbounded = -1;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxNesting = 200;
constexpr size_t kMaxInstructions = 1 << 16;

struct Node {
  enum class Kind {
    kEmpty,
    kChar,
    kClass,
    kConcat,
    kAlternate,
    kRepeat,
    kBeginText,
    kEndText,
    kWordBoundary,
    kNotWordBoundary,
    kLookahead,
  };
  explicit Node(Kind k) : kind(k) {}

  Kind kind;
  uint32_t value = 0;    // kChar: code point; kClass: class index
  int min = 0;           // kRepeat
  int max = 0;           // kRepeat; kUnbounded for no limit
  bool greedy = true;    // kRepeat
  bool negated = false;  // kLookahead
  std::vector<std::unique_ptr<Node>> children;
};

bool IsAssertion(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kBeginText:
    case Node::Kind::kEndText:
    case Node::Kind::kWordBoundary:
    case Node::Kind::kNotWordBoundary:
    case Node::Kind::kLookahead:
      return true;
    default:
      return false;
  }
}

bool IsNullable(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kChar:
    case Node::Kind::kClass:
      return false;
    case Node::Kind::kConcat:
      return std::all_of(node.children.begin(), node.children.end(),
                         [](const auto& child) { return IsNullable(*child); });
    case Node::Kind::kAlternate:
      return std::any_of(node.children.begin(), node.children.end(),
                         [](const auto& child) { return IsNullable(*child); });
    case Node::Kind::kRepeat:
      return node.min == 0 || IsNullable(*node.children[0]);
    default:
      return true;  // empty, assertions, lookahead
  }
}

// What an escape sequence stands for.
struct Escape {
  enum class Kind { kCodepoint, kSet, kWordBoundary, kNotWordBoundary };
  Kind kind = Kind::kCodepoint;
  uint32_t codepoint = 0;
  CharClass set;  // kSet: ranges and categories (never negated as a whole)
};

std::vector<CodepointRange> WhiteSpaceRanges() {
  std::vector<CodepointRange> result;
  for (const uint32_t cp : internal::WhiteSpaceCodepoints()) {
    if (!result.empty() && result.back().last + 1 == cp) {
      result.back().last = cp;
    } else {
      result.push_back({cp, cp});
    }
  }
  return result;
}

const std::vector<CodepointRange>& DigitRanges() {
  static const auto* const kRanges = new std::vector<CodepointRange>{{'0', '9'}};
  return *kRanges;
}

const std::vector<CodepointRange>& WordRanges() {
  static const auto* const kRanges =
      new std::vector<CodepointRange>{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return *kRanges;
}

const std::vector<CodepointRange>& SpaceRanges() {
  static const auto* const kRanges = new std::vector<CodepointRange>(WhiteSpaceRanges());
  return *kRanges;
}

std::optional<CategoryMask> PropertyMask(std::string_view name) {
  using GC = GeneralCategory;
  constexpr CategoryMask kLetterCased = Bit(GC::kLu) | Bit(GC::kLl) | Bit(GC::kLt);
  static constexpr struct {
    std::string_view name;
    CategoryMask mask;
  } kProperties[] = {
      {"L", kLetterCased | Bit(GC::kLm) | Bit(GC::kLo)},
      {"LC", kLetterCased},
      {"Lu", Bit(GC::kLu)},
      {"Ll", Bit(GC::kLl)},
      {"Lt", Bit(GC::kLt)},
      {"Lm", Bit(GC::kLm)},
      {"Lo", Bit(GC::kLo)},
      {"M", Bit(GC::kMn) | Bit(GC::kMc) | Bit(GC::kMe)},
      {"Mn", Bit(GC::kMn)},
      {"Mc", Bit(GC::kMc)},
      {"Me", Bit(GC::kMe)},
      {"N", Bit(GC::kNd) | Bit(GC::kNl) | Bit(GC::kNo)},
      {"Nd", Bit(GC::kNd)},
      {"Nl", Bit(GC::kNl)},
      {"No", Bit(GC::kNo)},
      {"P", Bit(GC::kPc) | Bit(GC::kPd) | Bit(GC::kPs) | Bit(GC::kPe) | Bit(GC::kPi) |
                Bit(GC::kPf) | Bit(GC::kPo)},
      {"Pc", Bit(GC::kPc)},
      {"Pd", Bit(GC::kPd)},
      {"Ps", Bit(GC::kPs)},
      {"Pe", Bit(GC::kPe)},
      {"Pi", Bit(GC::kPi)},
      {"Pf", Bit(GC::kPf)},
      {"Po", Bit(GC::kPo)},
      {"S", Bit(GC::kSm) | Bit(GC::kSc) | Bit(GC::kSk) | Bit(GC::kSo)},
      {"Sm", Bit(GC::kSm)},
      {"Sc", Bit(GC::kSc)},
      {"Sk", Bit(GC::kSk)},
      {"So", Bit(GC::kSo)},
      {"Z", Bit(GC::kZs) | Bit(GC::kZl) | Bit(GC::kZp)},
      {"Zs", Bit(GC::kZs)},
      {"Zl", Bit(GC::kZl)},
      {"Zp", Bit(GC::kZp)},
      // As in Unicode regular expressions (UTS #18), \p{C} includes unassigned code
      // points; FlagsOf()'s kControl follows llama.cpp and does not.
      {"C", Bit(GC::kCc) | Bit(GC::kCf) | Bit(GC::kCs) | Bit(GC::kCo) | Bit(GC::kCn)},
      {"Cc", Bit(GC::kCc)},
      {"Cf", Bit(GC::kCf)},
      {"Cs", Bit(GC::kCs)},
      {"Co", Bit(GC::kCo)},
      {"Cn", Bit(GC::kCn)},
  };
  for (const auto& property : kProperties) {
    if (property.name == name) return property.mask;
  }
  return std::nullopt;
}

constexpr CategoryMask kAllCategories = Bit(GeneralCategory::kCo) * 2 - 1;

bool IsAsciiDigit(uint32_t c) { return c >= '0' && c <= '9'; }

int HexValue(uint32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

class Parser {
 public:
  Parser(std::vector<uint32_t> pattern, std::vector<CharClass>* classes)
      : pattern_(std::move(pattern)), classes_(classes) {}

  absl::StatusOr<std::unique_ptr<Node>> Parse() {
    MOERT_ASSIGN_OR_RETURN(auto root, ParseAlternation(0));
    if (!AtEnd()) return Error("unmatched ')'");
    return root;
  }

 private:
  bool AtEnd() const { return pos_ >= pattern_.size(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < pattern_.size() ? pattern_[pos_ + ahead] : 0;
  }
  bool Has(size_t ahead) const { return pos_ + ahead < pattern_.size(); }

  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        StrCat("regex: ", what, " at code point ", pos_, " of the pattern"));
  }

  uint32_t AddClass(CharClass set) {
    set.Finish();
    classes_->push_back(std::move(set));
    return static_cast<uint32_t>(classes_->size() - 1);
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseAlternation(int depth) {
    if (depth > kMaxNesting) return Error("groups nested too deeply");
    MOERT_ASSIGN_OR_RETURN(auto first, ParseConcat(depth));
    if (AtEnd() || Peek() != '|') return first;
    auto alternate = std::make_unique<Node>(Node::Kind::kAlternate);
    alternate->children.push_back(std::move(first));
    while (!AtEnd() && Peek() == '|') {
      ++pos_;
      MOERT_ASSIGN_OR_RETURN(auto branch, ParseConcat(depth));
      alternate->children.push_back(std::move(branch));
    }
    return alternate;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseConcat(int depth) {
    auto concat = std::make_unique<Node>(Node::Kind::kConcat);
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      MOERT_ASSIGN_OR_RETURN(auto atom, ParseAtom(depth));
      MOERT_RETURN_IF_ERROR(ParseQuantifier(&atom));
      concat->children.push_back(std::move(atom));
    }
    if (concat->children.size() == 1) return std::move(concat->children[0]);
    if (concat->children.empty()) return std::make_unique<Node>(Node::Kind::kEmpty);
    return concat;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseAtom(int depth) {
    const uint32_t c = Peek();
    switch (c) {
      case '(':
        return ParseGroup(depth);
      case '[':
        return ParseClass();
      case '.': {
        ++pos_;
        CharClass dot;
        dot.negated = true;
        for (const uint32_t terminator : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) {
          dot.Add(terminator, terminator);
        }
        return ClassNode(std::move(dot));
      }
      case '^':
        ++pos_;
        return std::make_unique<Node>(Node::Kind::kBeginText);
      case '$':
        ++pos_;
        return std::make_unique<Node>(Node::Kind::kEndText);
      case '\\': {
        MOERT_ASSIGN_OR_RETURN(Escape escape, ParseEscape(/*in_class=*/false));
        switch (escape.kind) {
          case Escape::Kind::kCodepoint:
            return CharNode(escape.codepoint);
          case Escape::Kind::kSet:
            return ClassNode(std::move(escape.set));
          case Escape::Kind::kWordBoundary:
            return std::make_unique<Node>(Node::Kind::kWordBoundary);
          case Escape::Kind::kNotWordBoundary:
            return std::make_unique<Node>(Node::Kind::kNotWordBoundary);
        }
        return Error("bad escape");
      }
      case '*':
      case '+':
      case '?':
      case '{':
        return Error("nothing to repeat");
      default:
        ++pos_;
        return CharNode(c);
    }
  }

  std::unique_ptr<Node> CharNode(uint32_t cp) {
    auto node = std::make_unique<Node>(Node::Kind::kChar);
    node->value = cp;
    return node;
  }

  std::unique_ptr<Node> ClassNode(CharClass set) {
    auto node = std::make_unique<Node>(Node::Kind::kClass);
    node->value = AddClass(std::move(set));
    return node;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseGroup(int depth) {
    ++pos_;  // '('
    std::unique_ptr<Node> lookahead;
    if (Peek() == '?') {
      const uint32_t kind = Peek(1);
      if (kind == ':') {
        pos_ += 2;
      } else if (kind == '=' || kind == '!') {
        pos_ += 2;
        lookahead = std::make_unique<Node>(Node::Kind::kLookahead);
        lookahead->negated = kind == '!';
      } else if (kind == '<') {
        return Error("lookbehind and named groups are not supported");
      } else {
        return Error("unsupported group flag");
      }
    }
    MOERT_ASSIGN_OR_RETURN(auto body, ParseAlternation(depth + 1));
    if (AtEnd() || Peek() != ')') return Error("missing ')'");
    ++pos_;
    if (lookahead == nullptr) {
      if (!IsAssertion(*body)) return body;
      // A group around a lone assertion, "(?:\b)", may take a quantifier; the bare
      // assertion may not.
      auto group = std::make_unique<Node>(Node::Kind::kConcat);
      group->children.push_back(std::move(body));
      return group;
    }
    lookahead->children.push_back(std::move(body));
    return lookahead;
  }

  absl::Status ParseQuantifier(std::unique_ptr<Node>* atom) {
    if (AtEnd()) return absl::OkStatus();
    int min = 0;
    int max = 0;
    switch (Peek()) {
      case '?':
        max = 1;
        ++pos_;
        break;
      case '*':
        max = kUnbounded;
        ++pos_;
        break;
      case '+':
        min = 1;
        max = kUnbounded;
        ++pos_;
        break;
      case '{':
        MOERT_RETURN_IF_ERROR(ParseBraces(&min, &max));
        break;
      default:
        return absl::OkStatus();
    }
    if (IsAssertion(**atom)) return Error("nothing to repeat");
    // Engines disagree on optional iterations that match empty (ECMAScript fails them,
    // libstdc++ allows two in a row, Perl and RE2 stop the loop), and the memo's
    // guarantee needs every optional iteration to consume input. None of llama.cpp's
    // pre-tokenizer expressions repeats such a subexpression.
    if ((max == kUnbounded || max > min) && IsNullable(**atom)) {
      return Error("optional repeats of a subexpression that can match empty");
    }
    bool greedy = true;
    if (!AtEnd() && Peek() == '?') {
      greedy = false;
      ++pos_;
    }
    if (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{')) {
      return Error("possessive or doubled quantifiers are not supported");
    }
    auto repeat = std::make_unique<Node>(Node::Kind::kRepeat);
    repeat->min = min;
    repeat->max = max;
    repeat->greedy = greedy;
    repeat->children.push_back(std::move(*atom));
    *atom = std::move(repeat);
    return absl::OkStatus();
  }

  absl::StatusOr<int> ParseCount() {
    if (AtEnd() || !IsAsciiDigit(Peek())) return Error("malformed {n,m} quantifier");
    int value = 0;
    while (!AtEnd() && IsAsciiDigit(Peek())) {
      value = value * 10 + static_cast<int>(Peek() - '0');
      if (value > kMaxRepeat) return Error("repeat count above 1000");
      ++pos_;
    }
    return value;
  }

  absl::Status ParseBraces(int* min, int* max) {
    ++pos_;  // '{'
    MOERT_ASSIGN_OR_RETURN(*min, ParseCount());
    *max = *min;
    if (!AtEnd() && Peek() == ',') {
      ++pos_;
      if (!AtEnd() && Peek() == '}') {
        *max = kUnbounded;
      } else {
        MOERT_ASSIGN_OR_RETURN(*max, ParseCount());
        if (*max < *min) return Error("{n,m} with m < n");
      }
    }
    if (AtEnd() || Peek() != '}') return Error("malformed {n,m} quantifier");
    ++pos_;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseClass() {
    ++pos_;  // '['
    CharClass set;
    if (!AtEnd() && Peek() == '^') {
      set.negated = true;
      ++pos_;
    }
    // As in ECMAScript, "[]" is an empty class and "[^]" matches anything.
    while (true) {
      if (AtEnd()) return Error("missing ']'");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      MOERT_ASSIGN_OR_RETURN(Escape low, ParseClassAtom());
      if (!AtEnd() && Peek() == '-' && Has(1) && Peek(1) != ']') {
        ++pos_;  // '-'
        MOERT_ASSIGN_OR_RETURN(Escape high, ParseClassAtom());
        if (low.kind != Escape::Kind::kCodepoint || high.kind != Escape::Kind::kCodepoint) {
          return Error("class escape used as a range bound");
        }
        if (high.codepoint < low.codepoint) return Error("range out of order in class");
        set.Add(low.codepoint, high.codepoint);
      } else if (low.kind == Escape::Kind::kCodepoint) {
        set.Add(low.codepoint, low.codepoint);
      } else {
        set.AddAll(low.set);
      }
    }
    return ClassNode(std::move(set));
  }

  absl::StatusOr<Escape> ParseClassAtom() {
    if (Peek() == '\\') return ParseEscape(/*in_class=*/true);
    Escape literal;
    literal.codepoint = Peek();
    ++pos_;
    return literal;
  }

  // Parses the escape at pos_ (which is '\').
  absl::StatusOr<Escape> ParseEscape(bool in_class) {
    ++pos_;  // '\'
    if (AtEnd()) return Error("pattern ends with '\\'");
    const uint32_t c = Peek();
    ++pos_;
    Escape escape;
    escape.kind = Escape::Kind::kSet;
    switch (c) {
      case 'd':
        escape.set.ranges = DigitRanges();
        return escape;
      case 'D':
        escape.set.ranges = Complement(DigitRanges());
        return escape;
      case 's':
        escape.set.ranges = SpaceRanges();
        return escape;
      case 'S':
        escape.set.ranges = Complement(SpaceRanges());
        return escape;
      case 'w':
        escape.set.ranges = WordRanges();
        return escape;
      case 'W':
        escape.set.ranges = Complement(WordRanges());
        return escape;
      case 'p':
      case 'P': {
        if (AtEnd() || Peek() != '{') return Error("expected '{' after \\p");
        ++pos_;
        std::string name;
        while (!AtEnd() && Peek() != '}') {
          if (Peek() >= 128 || name.size() > 16) return Error("bad Unicode property name");
          name.push_back(static_cast<char>(Peek()));
          ++pos_;
        }
        if (AtEnd()) return Error("missing '}' after \\p{");
        ++pos_;
        const std::optional<CategoryMask> mask = PropertyMask(name);
        if (!mask.has_value()) {
          return Error(StrCat("unsupported Unicode property \\p{", name, "}"));
        }
        escape.set.categories = c == 'p' ? *mask : (kAllCategories & ~*mask);
        return escape;
      }
      case 'b':
        if (in_class) return CodepointEscape(0x08);
        escape.kind = Escape::Kind::kWordBoundary;
        return escape;
      case 'B':
        if (in_class) return Error("\\B inside a class");
        escape.kind = Escape::Kind::kNotWordBoundary;
        return escape;
      case 't':
        return CodepointEscape('\t');
      case 'n':
        return CodepointEscape('\n');
      case 'v':
        return CodepointEscape('\v');
      case 'f':
        return CodepointEscape('\f');
      case 'r':
        return CodepointEscape('\r');
      case '0':
        if (!AtEnd() && IsAsciiDigit(Peek())) return Error("octal escapes are not supported");
        return CodepointEscape(0);
      case 'x':
        return ParseHexEscape(2);
      case 'u':
        if (!AtEnd() && Peek() == '{') return ParseBracedHexEscape();
        return ParseHexEscape(4);
      default:
        break;
    }
    if (c >= '1' && c <= '9') return Error("backreferences are not supported");
    if (c < 128 && (IsAsciiDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))) {
      return Error("unknown escape");
    }
    return CodepointEscape(c);  // escaped punctuation or any non-ASCII code point
  }

  static Escape CodepointEscape(uint32_t cp) {
    Escape escape;
    escape.codepoint = cp;
    return escape;
  }

  absl::StatusOr<Escape> ParseHexEscape(int digits) {
    uint32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      const int digit = AtEnd() ? -1 : HexValue(Peek());
      if (digit < 0) return Error("malformed hex escape");
      value = value * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    return CodepointEscape(value);
  }

  absl::StatusOr<Escape> ParseBracedHexEscape() {
    ++pos_;  // '{'
    uint32_t value = 0;
    int digits = 0;
    while (!AtEnd() && Peek() != '}') {
      const int digit = HexValue(Peek());
      if (digit < 0 || ++digits > 6) return Error("malformed \\u{...} escape");
      value = value * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    if (AtEnd() || digits == 0 || value > 0x10FFFF) return Error("malformed \\u{...} escape");
    ++pos_;
    return CodepointEscape(value);
  }

  std::vector<uint32_t> pattern_;
  size_t pos_ = 0;
  std::vector<CharClass>* classes_;
};

class Compiler {
 public:
  explicit Compiler(Program* program) : program_(program) {}

  absl::Status CompileExpression(const Node& root) {
    program_->codes.emplace_back();  // index 0, filled in below
    Code main;
    MOERT_RETURN_IF_ERROR(Emit(root, &main));
    Add(&main, {.op = Op::kMatch});
    program_->codes[0] = std::move(main);
    program_->nullable = IsNullable(root);
    return absl::OkStatus();
  }

 private:
  uint32_t Add(Code* code, Inst inst) {
    if (inst.op == Op::kSplit) inst.arg = code->num_splits++;
    code->insts.push_back(inst);
    ++total_;
    return static_cast<uint32_t>(code->insts.size() - 1);
  }

  static uint32_t Here(const Code& code) { return static_cast<uint32_t>(code.insts.size()); }

  absl::Status Emit(const Node& node, Code* code) {
    if (total_ > kMaxInstructions) {
      return absl::InvalidArgumentError("regex: pattern too large once repeats are expanded");
    }
    switch (node.kind) {
      case Node::Kind::kEmpty:
        return absl::OkStatus();
      case Node::Kind::kChar:
        Add(code, {.op = Op::kChar, .arg = node.value});
        return absl::OkStatus();
      case Node::Kind::kClass:
        Add(code, {.op = Op::kClass, .arg = node.value});
        return absl::OkStatus();
      case Node::Kind::kBeginText:
        Add(code, {.op = Op::kBeginText});
        return absl::OkStatus();
      case Node::Kind::kEndText:
        Add(code, {.op = Op::kEndText});
        return absl::OkStatus();
      case Node::Kind::kWordBoundary:
        Add(code, {.op = Op::kWordBoundary});
        return absl::OkStatus();
      case Node::Kind::kNotWordBoundary:
        Add(code, {.op = Op::kNotWordBoundary});
        return absl::OkStatus();
      case Node::Kind::kConcat:
        for (const auto& child : node.children) MOERT_RETURN_IF_ERROR(Emit(*child, code));
        return absl::OkStatus();
      case Node::Kind::kAlternate:
        return EmitAlternate(node, code);
      case Node::Kind::kRepeat:
        return EmitRepeat(node, code);
      case Node::Kind::kLookahead: {
        Code body;
        MOERT_RETURN_IF_ERROR(Emit(*node.children[0], &body));
        Add(&body, {.op = Op::kMatch});
        program_->codes.push_back(std::move(body));
        Add(code, {.op = Op::kLookahead,
                   .negated = node.negated,
                   .arg = static_cast<uint32_t>(program_->codes.size() - 1)});
        return absl::OkStatus();
      }
    }
    return absl::InternalError("regex: unknown syntax node");
  }

  absl::Status EmitAlternate(const Node& node, Code* code) {
    std::vector<uint32_t> jumps_to_end;
    for (size_t k = 0; k < node.children.size(); ++k) {
      if (k + 1 == node.children.size()) {
        MOERT_RETURN_IF_ERROR(Emit(*node.children[k], code));
        break;
      }
      const uint32_t split = Add(code, {.op = Op::kSplit});
      code->insts[split].x = Here(*code);
      MOERT_RETURN_IF_ERROR(Emit(*node.children[k], code));
      jumps_to_end.push_back(Add(code, {.op = Op::kJump}));
      code->insts[split].y = Here(*code);
    }
    for (const uint32_t jump : jumps_to_end) code->insts[jump].x = Here(*code);
    return absl::OkStatus();
  }

  void SetSplit(Code* code, uint32_t split, uint32_t body, uint32_t exit, bool greedy) {
    code->insts[split].x = greedy ? body : exit;
    code->insts[split].y = greedy ? exit : body;
  }

  absl::Status EmitRepeat(const Node& node, Code* code) {
    const Node& child = *node.children[0];
    if (node.max == kUnbounded && node.min >= 1) {
      // x{n,}: n-1 copies, then a loop that runs the body at least once.
      for (int k = 0; k + 1 < node.min; ++k) MOERT_RETURN_IF_ERROR(Emit(child, code));
      const uint32_t body = Here(*code);
      MOERT_RETURN_IF_ERROR(Emit(child, code));
      const uint32_t split = Add(code, {.op = Op::kSplit});
      SetSplit(code, split, body, Here(*code), node.greedy);
      return absl::OkStatus();
    }
    for (int k = 0; k < node.min; ++k) MOERT_RETURN_IF_ERROR(Emit(child, code));
    if (node.max == kUnbounded) {
      const uint32_t split = Add(code, {.op = Op::kSplit});
      MOERT_RETURN_IF_ERROR(Emit(child, code));
      Add(code, {.op = Op::kJump, .x = split});
      SetSplit(code, split, split + 1, Here(*code), node.greedy);
      return absl::OkStatus();
    }
    // x{n,m}: the optional copies nest, x(?:x(?:x)?)?, so every skip leaves the repeat.
    std::vector<uint32_t> splits;
    for (int k = node.min; k < node.max; ++k) {
      splits.push_back(Add(code, {.op = Op::kSplit}));
      MOERT_RETURN_IF_ERROR(Emit(child, code));
    }
    for (const uint32_t split : splits) SetSplit(code, split, split + 1, Here(*code), node.greedy);
    return absl::OkStatus();
  }

  Program* program_;
  size_t total_ = 0;
};

// Runs a compiled program over one text. Its memos belong to that text, so one Matcher
// serves all searches of a FindAll.
class Matcher {
 public:
  Matcher(const Program& program, std::span<const uint32_t> text)
      : program_(program), text_(text), stride_(text.size() + 1) {
    const size_t main_bits = size_t{program.codes[0].num_splits} * stride_;
    visited_.assign((main_bits + 63) / 64, 0);
    lookaheads_.resize(program.codes.size());
    stacks_.resize(program.codes.size());
  }

  std::optional<Regex::Match> Search(size_t from) {
    for (size_t start = from; start <= text_.size(); ++start) {
      size_t end = 0;
      if (Run(0, start, /*not_null=*/false, &end)) {
        // A later search may begin where this match ended; for an expression that can
        // match empty, the states this match passed through there are not failures.
        if (program_.nullable) ClearMainMemo();
        return Regex::Match{start, end};
      }
    }
    return std::nullopt;
  }

  // A non-empty match starting exactly at `pos` (what std::regex_iterator tries after an
  // empty match). The memo must not carry the extra condition into other searches.
  // Like the iterator, which from its second search on tells the matcher that text
  // precedes the search start, ^ no longer matches at position 0 here.
  std::optional<Regex::Match> MatchNonEmptyAt(size_t pos) {
    begin_matches_ = false;
    ClearMainMemo();
    size_t end = 0;
    const bool found = Run(0, pos, /*not_null=*/true, &end);
    ClearMainMemo();
    if (!found) return std::nullopt;
    return Regex::Match{pos, end};
  }

 private:
  struct Thread {
    uint32_t pc;
    size_t pos;
  };

  // Per lookahead body: its verdict at each position (-1 unknown), and the memo of one
  // evaluation, made fresh each time by bumping the generation instead of clearing.
  struct LookaheadState {
    std::vector<int8_t> verdict;
    std::vector<uint32_t> stamps;
    uint32_t generation = 0;
  };

  void ClearMainMemo() { std::fill(visited_.begin(), visited_.end(), 0); }

  // Marks (split slot, pos) of `code_index` visited; true if it already was.
  bool Visit(size_t code_index, uint32_t slot, size_t pos) {
    const size_t index = slot * stride_ + pos;
    if (code_index == 0) {
      uint64_t& word = visited_[index / 64];
      const uint64_t bit = uint64_t{1} << (index % 64);
      const bool seen = (word & bit) != 0;
      word |= bit;
      return seen;
    }
    LookaheadState& state = lookaheads_[code_index];
    const bool seen = state.stamps[index] == state.generation;
    state.stamps[index] = state.generation;
    return seen;
  }

  bool Lookahead(uint32_t code_index, size_t pos) {
    LookaheadState& state = lookaheads_[code_index];
    if (state.verdict.empty()) {
      state.verdict.assign(stride_, -1);
      state.stamps.assign(size_t{program_.codes[code_index].num_splits} * stride_, 0);
    }
    if (state.verdict[pos] < 0) {
      ++state.generation;
      size_t end = 0;
      state.verdict[pos] = Run(code_index, pos, /*not_null=*/false, &end) ? 1 : 0;
    }
    return state.verdict[pos] == 1;
  }

  static bool IsWordChar(uint32_t cp) {
    return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') ||
           cp == '_';
  }

  bool AtWordBoundary(size_t pos) const {
    const bool before = pos > 0 && IsWordChar(text_[pos - 1]);
    const bool after = pos < text_.size() && IsWordChar(text_[pos]);
    return before != after;
  }

  // Leftmost-first depth-first run of code `code_index` anchored at `start`. Alternatives
  // wait on an explicit stack, so deep backtracking cannot overflow the call stack.
  bool Run(size_t code_index, size_t start, bool not_null, size_t* end) {
    const std::vector<Inst>& insts = program_.codes[code_index].insts;
    std::vector<Thread>& stack = stacks_[code_index];
    stack.clear();
    stack.push_back({0, start});
    const size_t size = text_.size();
    while (!stack.empty()) {
      uint32_t pc = stack.back().pc;
      size_t pos = stack.back().pos;
      stack.pop_back();
      bool alive = true;
      while (alive) {
        const Inst& inst = insts[pc];
        switch (inst.op) {
          case Op::kChar:
            alive = pos < size && text_[pos] == inst.arg;
            ++pc;
            ++pos;
            break;
          case Op::kClass:
            alive = pos < size && program_.classes[inst.arg].Matches(text_[pos]);
            ++pc;
            ++pos;
            break;
          case Op::kSplit:
            alive = !Visit(code_index, inst.arg, pos);
            if (alive) stack.push_back({inst.y, pos});
            pc = inst.x;
            break;
          case Op::kJump:
            pc = inst.x;
            break;
          case Op::kBeginText:
            alive = pos == 0 && begin_matches_;
            ++pc;
            break;
          case Op::kEndText:
            alive = pos == size;
            ++pc;
            break;
          case Op::kWordBoundary:
            alive = AtWordBoundary(pos);
            ++pc;
            break;
          case Op::kNotWordBoundary:
            alive = !AtWordBoundary(pos);
            ++pc;
            break;
          case Op::kLookahead:
            alive = Lookahead(inst.arg, pos) != inst.negated;
            ++pc;
            break;
          case Op::kMatch:
            if (not_null && pos == start) {
              alive = false;
              break;
            }
            *end = pos;
            return true;
        }
      }
    }
    return false;
  }

  const Program& program_;
  std::span<const uint32_t> text_;
  size_t stride_;                  // positions per split slot: text size + 1
  std::vector<uint64_t> visited_;  // main expression: one bit per (split, position)
  std::vector<LookaheadState> lookaheads_;
  std::vector<std::vector<Thread>> stacks_;
  bool begin_matches_ = true;  // whether ^ may match at position 0
};

}  // namespace
}  // namespace regex_internal

Regex::Regex(std::string pattern, std::shared_ptr<const regex_internal::Program> program)
    : pattern_(std::move(pattern)), program_(std::move(program)) {}

absl::StatusOr<Regex> Regex::Compile(std::string_view pattern) {
  auto program = std::make_shared<regex_internal::Program>();
  regex_internal::Parser parser(DecodeUtf8(pattern), &program->classes);
  MOERT_ASSIGN_OR_RETURN(auto root, parser.Parse());
  regex_internal::Compiler compiler(program.get());
  MOERT_RETURN_IF_ERROR(compiler.CompileExpression(*root));
  return Regex(std::string(pattern), std::move(program));
}

std::optional<Regex::Match> Regex::Search(std::span<const uint32_t> text, size_t from) const {
  if (from > text.size()) return std::nullopt;
  regex_internal::Matcher matcher(*program_, text);
  return matcher.Search(from);
}

std::vector<Regex::Match> Regex::FindAll(std::span<const uint32_t> text) const {
  regex_internal::Matcher matcher(*program_, text);
  std::vector<Match> matches;
  size_t pos = 0;
  while (pos <= text.size()) {
    std::optional<Match> found;
    if (!matches.empty() && matches.back().begin == matches.back().end) {
      found = matcher.MatchNonEmptyAt(pos);
      if (!found.has_value()) {
        if (pos == text.size()) break;
        found = matcher.Search(pos + 1);
      }
    } else {
      found = matcher.Search(pos);
    }
    if (!found.has_value()) break;
    matches.push_back(*found);
    pos = found->end;
  }
  return matches;
}

}  // namespace moert::tokenizer
