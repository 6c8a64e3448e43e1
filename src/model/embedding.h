// The token embedding table: one row per vocabulary entry, looked up a row per token.
// A quantized file keeps the table in its own blocks and dequantizes only the rows a
// batch looks up, so the table costs its file bytes (OLMoE's Q4_0 table: 55 MiB, not
// the 393 MiB of fp32) and a memory budget gives the rest to the expert pool.
// Dequantization is per block, so a row is bit for bit the row of the whole table
// dequantized.
#ifndef MOERT_MODEL_EMBEDDING_H_
#define MOERT_MODEL_EMBEDDING_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "backend/matrix.h"
#include "format/ggml_types.h"

namespace moert::model {

class EmbeddingTable {
 public:
  EmbeddingTable() = default;

  // The table as fp32 (the reference path, an F32 file, or a table the lm head shares).
  void SetDense(backend::Matrix m) {
    dense_ = std::move(m);
    blocks_.clear();
    rows_ = dense_.rows;
    cols_ = dense_.cols;
  }
  // The table in `type`'s blocks: `rows` rows of GgmlRowBytes(type, cols) bytes each,
  // copied from `bytes` (which must hold exactly that many; InvalidArgument otherwise).
  absl::Status SetQuantized(format::GgmlType type, int64_t rows, int64_t cols,
                            std::span<const uint8_t> bytes);

  bool empty() const { return dense_.empty() && blocks_.empty(); }
  bool quantized() const { return !blocks_.empty(); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // The fp32 table; empty when the table is quantized.
  const backend::Matrix& dense() const { return dense_; }
  // The bytes the table holds (for the memory budget and weight locking).
  std::span<const uint8_t> quantized_bytes() const { return blocks_; }

  // Row `r` (0 <= r < rows(), which the caller has checked) as cols() floats in `out`.
  void Row(int64_t r, float* out) const;

 private:
  backend::Matrix dense_;
  std::vector<uint8_t> blocks_;
  format::GgmlType type_ = format::GgmlType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  size_t row_bytes_ = 0;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_EMBEDDING_H_
