// The generated Unicode tables behind tokenizer/unicode.h (defined in unicode_data.cc,
// made by scripts/gen_unicode_data.py). Only unicode.cc reads these directly.
#ifndef MOERT_TOKENIZER_UNICODE_DATA_H_
#define MOERT_TOKENIZER_UNICODE_DATA_H_

#include <cstdint>
#include <span>

#include "tokenizer/unicode.h"

namespace moert::tokenizer::internal {

// One run of code points sharing a general category: from `first` up to the next
// entry's `first` (the last entry runs to U+10FFFF).
struct CategoryRange {
  uint32_t first;
  GeneralCategory category;
};

// Sorted by `first`, starting at U+0000; unassigned code points are kCn.
std::span<const CategoryRange> CategoryRanges();

// The White_Space code points, sorted.
std::span<const uint32_t> WhiteSpaceCodepoints();

// Version of the Unicode Character Database the tables come from, e.g. "15.1.0".
extern const char kUnicodeVersion[];

}  // namespace moert::tokenizer::internal

#endif  // MOERT_TOKENIZER_UNICODE_DATA_H_
