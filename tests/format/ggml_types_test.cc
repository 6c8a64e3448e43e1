// Tests of the ggml type table: ids, block shapes, row sizes.
#include "format/ggml_types.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace moert::format {
namespace {

TEST(GgmlTypes, KnownIdsHaveLlamaCppBlockShapes) {
  struct Case { uint32_t id; uint32_t elements; uint32_t bytes; const char* name; };
  const Case cases[] = {
      {0, 1, 4, "f32"},      {1, 1, 2, "f16"},       {2, 32, 18, "q4_0"},
      {3, 32, 20, "q4_1"},   {6, 32, 22, "q5_0"},    {8, 32, 34, "q8_0"},
      {12, 256, 144, "q4_K"}, {13, 256, 176, "q5_K"}, {14, 256, 210, "q6_K"},
      {15, 256, 292, "q8_K"}, {30, 1, 2, "bf16"},
  };
  for (const Case& c : cases) {
    auto t = LookupGgmlType(c.id);
    ASSERT_TRUE(t.has_value()) << c.id;
    EXPECT_EQ(t->block_elements, c.elements) << c.name;
    EXPECT_EQ(t->block_bytes, c.bytes) << c.name;
    EXPECT_EQ(t->name, c.name);
  }
}

TEST(GgmlTypes, RemovedAndUnknownIdsAreRejected) {
  EXPECT_FALSE(LookupGgmlType(4).has_value());
  EXPECT_FALSE(LookupGgmlType(5).has_value());
  EXPECT_FALSE(LookupGgmlType(31).has_value());
  EXPECT_FALSE(LookupGgmlType(1000).has_value());
}

TEST(GgmlTypes, RowBytesNeedWholeBlocksAndDoNotOverflow) {
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_0, 64), 36u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kF32, 3), 12u);
  EXPECT_FALSE(GgmlRowBytes(GgmlType::kQ4_0, 33).has_value());
  EXPECT_FALSE(GgmlRowBytes(GgmlType::kF32, UINT64_MAX / 2).has_value());
}

}  // namespace
}  // namespace moert::format
