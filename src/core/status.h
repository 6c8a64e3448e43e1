// Status helpers shared by every module: the return-if-error and assign-or-return
// macros that Debian 12's Abseil (20220623) does not have yet.
#ifndef MOERT_CORE_STATUS_H_
#define MOERT_CORE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MOERT_STATUS_CONCAT_INNER_(a, b) a##b
#define MOERT_STATUS_CONCAT_(a, b) MOERT_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define MOERT_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status moert_status_ = (expr);           \
    if (!moert_status_.ok()) return moert_status_;   \
  } while (0)

// `lhs` = value of the StatusOr `expr`, or returns its status from the enclosing
// function. `lhs` may be a declaration: MOERT_ASSIGN_OR_RETURN(auto x, F());
#define MOERT_ASSIGN_OR_RETURN(lhs, expr) \
  MOERT_ASSIGN_OR_RETURN_IMPL_(MOERT_STATUS_CONCAT_(moert_statusor_, __LINE__), lhs, expr)

#define MOERT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#endif  // MOERT_CORE_STATUS_H_
