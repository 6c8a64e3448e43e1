// Tests of the status macros in core/status.h.
#include "core/status.h"

#include <gtest/gtest.h>

namespace moert::core {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  MOERT_ASSIGN_OR_RETURN(int h, Half(x));
  MOERT_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status CheckEven(int x) {
  MOERT_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPassesValuesThrough) {
  absl::StatusOr<int> q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
}

TEST(StatusMacros, AssignOrReturnPropagatesTheFirstError) {
  absl::StatusOr<int> q = Quarter(6);  // 6 -> 3 -> odd
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(), "odd");
}

TEST(StatusMacros, ReturnIfError) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moert::core
