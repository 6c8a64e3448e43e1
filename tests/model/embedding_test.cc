// The token embedding table kept in its file's blocks (model/embedding.h): every row
// it dequantizes is bit for bit that row of the whole table dequantized, for each type
// the quantizer writes and for the oracle models' own tables; a table of the wrong
// size is refused and leaves the table as it was; the loader counts a kept table at its
// file bytes for the memory budget.
#include "model/embedding.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/oracle_file.h"
#include "format/dequant.h"
#include "format/quantize.h"
#include "model/weights.h"

namespace moert::model {
namespace {

using format::GgmlType;

void ExpectRowsMatch(const EmbeddingTable& table, const std::vector<float>& whole) {
  std::vector<float> row(static_cast<size_t>(table.cols()));
  for (int64_t r = 0; r < table.rows(); ++r) {
    table.Row(r, row.data());
    ASSERT_EQ(std::memcmp(row.data(), whole.data() + r * table.cols(), row.size() * 4), 0)
        << "row " << r;
  }
}

TEST(EmbeddingTableTest, QuantizedRowsAreTheWholeTableDequantized) {
  const int64_t rows = 37, cols = 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> value(0.0f, 1.5f);
  std::vector<float> source(static_cast<size_t>(rows * cols));
  for (float& v : source) v = value(rng);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                        GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(std::string(format::GgmlTypeName(type)));
    std::vector<uint8_t> bytes(*format::GgmlRowBytes(type, rows * cols));
    ASSERT_TRUE(format::Quantize(type, source, bytes).ok());
    std::vector<float> whole(source.size());
    ASSERT_TRUE(format::Dequantize(type, bytes, whole).ok());
    EmbeddingTable table;
    ASSERT_TRUE(table.SetQuantized(type, rows, cols, bytes).ok());
    EXPECT_TRUE(table.quantized());
    EXPECT_EQ(table.quantized_bytes().size(), bytes.size());
    EXPECT_TRUE(table.dense().empty());
    ExpectRowsMatch(table, whole);
  }
}

TEST(EmbeddingTableTest, RefusesATableOfTheWrongSizeAndKeepsTheOldOne) {
  const int64_t rows = 4, cols = 64;
  std::vector<uint8_t> bytes(*format::GgmlRowBytes(GgmlType::kQ8_0, rows * cols));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13);
  // Q8_0 scales are halves: keep them finite.
  for (size_t b = 0; b < bytes.size(); b += 34) bytes[b + 1] = 0x3c;
  EmbeddingTable table;
  ASSERT_TRUE(table.SetQuantized(GgmlType::kQ8_0, rows, cols, bytes).ok());

  const std::vector<uint8_t> short_bytes(bytes.begin(), bytes.end() - 1);
  const absl::Status size = table.SetQuantized(GgmlType::kQ8_0, rows, cols, short_bytes);
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(size.message()).find(std::to_string(short_bytes.size())), std::string::npos)
      << size;
  // 48 values are not a whole number of Q8_0 blocks.
  EXPECT_EQ(table.SetQuantized(GgmlType::kQ8_0, rows, 48, bytes).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.SetQuantized(GgmlType::kQ8_0, 0, cols, {}).code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(table.rows(), rows);
  std::vector<float> whole(static_cast<size_t>(rows * cols));
  ASSERT_TRUE(format::Dequantize(GgmlType::kQ8_0, bytes, whole).ok());
  ExpectRowsMatch(table, whole);
}

TEST(EmbeddingTableTest, DenseRowsAreTheMatrixRows) {
  backend::Matrix m;
  m.rows = 3;
  m.cols = 5;
  for (int i = 0; i < 15; ++i) m.data.push_back(static_cast<float>(i) * 0.25f - 1.0f);
  const std::vector<float> whole = m.data;
  EmbeddingTable table;
  table.SetDense(std::move(m));
  EXPECT_FALSE(table.quantized());
  EXPECT_TRUE(table.quantized_bytes().empty());
  EXPECT_EQ(table.rows(), 3);
  ExpectRowsMatch(table, whole);
}

// The oracle models' tables (Q4_0, Q8_0, F16): kept in their blocks, each row is the
// row the fp32 load gives, and the budget's dry run counts the file's bytes.
TEST(EmbeddingTableTest, OracleTablesKeptInTheirBlocks) {
  for (const std::string name : {"tiny-moe-shakespeare-q4_0.gguf", "tiny-moe-shakespeare-q8_0.gguf",
                                 "tiny-moe-shakespeare-f16.gguf"}) {
    SCOPED_TRACE(name);
    const format::GgufFile& file = test_util::OracleFile(name);
    const format::GgufTensorInfo* info = file.FindTensor("token_embd.weight");
    ASSERT_NE(info, nullptr);
    const int64_t cols = static_cast<int64_t>(info->dims[0]);
    const int64_t rows = static_cast<int64_t>(info->dims[1]);

    WeightLoader loader(file, {});
    EmbeddingTable kept, dense;
    ASSERT_TRUE(loader.LoadEmbedding("token_embd.weight", rows, cols, true, &kept).ok());
    ASSERT_TRUE(loader.LoadEmbedding("token_embd.weight", rows, cols, false, &dense).ok());
    EXPECT_TRUE(kept.quantized());
    EXPECT_EQ(kept.quantized_bytes().size(), info->n_bytes);
    ASSERT_FALSE(dense.quantized());
    ExpectRowsMatch(kept, dense.dense().data);

    WeightLoader measure(file, {});
    measure.set_measure_only(true);
    EmbeddingTable none;
    ASSERT_TRUE(measure.LoadEmbedding("token_embd.weight", rows, cols, true, &none).ok());
    EXPECT_EQ(measure.measured_bytes(), info->n_bytes);
    ASSERT_TRUE(measure.LoadEmbedding("token_embd.weight", rows, cols, false, &none).ok());
    EXPECT_EQ(measure.measured_bytes(), info->n_bytes + uint64_t(rows * cols) * 4);
    EXPECT_TRUE(none.empty());
  }
}

TEST(EmbeddingTableTest, LoaderNamesATableOfTheWrongShape) {
  const format::GgufFile& file = test_util::OracleFile("tiny-moe-shakespeare-q4_0.gguf");
  WeightLoader loader(file, {});
  EmbeddingTable table;
  const absl::Status status = loader.LoadEmbedding("token_embd.weight", 255, 2048, true, &table);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("token_embd.weight"), std::string::npos) << status;
  EXPECT_TRUE(table.empty());
}

}  // namespace
}  // namespace moert::model
