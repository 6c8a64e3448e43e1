// StrCat / StrAppend / StrJoin that accept std::string_view. Debian 12's Abseil is
// built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), so
// absl::StrCat rejects std::string_view arguments; these forward to Abseil after
// converting them.
#ifndef MOERT_CORE_STRINGS_H_
#define MOERT_CORE_STRINGS_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moert {
namespace strings_internal {

template <typename T>
decltype(auto) Piece(const T& value) {
  if constexpr (std::is_convertible_v<const T&, std::string_view> &&
                !std::is_convertible_v<const T&, absl::string_view>) {
    std::string_view s = value;
    return absl::string_view(s.data(), s.size());
  } else {
    return (value);
  }
}

}  // namespace strings_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(strings_internal::Piece(args)...);
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  absl::StrAppend(out, strings_internal::Piece(args)...);
}

// Joins the elements of `range` (anything StrCat takes) with `separator`.
template <typename Range>
std::string StrJoin(const Range& range, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& element : range) {
    if (!first) out.append(separator);
    first = false;
    StrAppend(&out, element);
  }
  return out;
}

}  // namespace moert

#endif  // MOERT_CORE_STRINGS_H_
