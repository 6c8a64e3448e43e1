// Token embedding rows from a table kept in its file's blocks.
#include "model/embedding.h"

#include <algorithm>
#include <cassert>
#include <optional>

#include "core/strings.h"
#include "format/dequant.h"

namespace moert::model {

absl::Status EmbeddingTable::SetQuantized(format::GgmlType type, int64_t rows, int64_t cols,
                                          std::span<const uint8_t> bytes) {
  if (!format::CanDequantize(type) || rows <= 0 || cols <= 0) {
    return absl::InvalidArgumentError(StrCat("an embedding table of type ",
                                             format::GgmlTypeName(type), " and ", rows, " x ", cols,
                                             " values cannot be read a row at a time"));
  }
  const std::optional<uint64_t> row_bytes = format::GgmlRowBytes(type, static_cast<uint64_t>(cols));
  if (!row_bytes || *row_bytes * static_cast<uint64_t>(rows) != bytes.size()) {
    return absl::InvalidArgumentError(StrCat("an embedding table of type ",
                                             format::GgmlTypeName(type), ", ", rows, " rows of ",
                                             cols, " values, cannot be ", bytes.size(), " bytes"));
  }
  dense_ = backend::Matrix();
  blocks_.assign(bytes.begin(), bytes.end());
  type_ = type;
  rows_ = rows;
  cols_ = cols;
  row_bytes_ = static_cast<size_t>(*row_bytes);
  return absl::OkStatus();
}

void EmbeddingTable::Row(int64_t r, float* out) const {
  assert(r >= 0 && r < rows_);
  if (blocks_.empty()) {
    const float* row = dense_.row(r);
    std::copy(row, row + cols_, out);
    return;
  }
  // SetQuantized checked the sizes, which are all Dequantize can reject.
  const absl::Status status = format::Dequantize(
      type_,
      std::span<const uint8_t>(blocks_).subspan(static_cast<size_t>(r) * row_bytes_, row_bytes_),
      std::span<float>(out, static_cast<size_t>(cols_)));
  assert(status.ok());
  (void)status;
}

}  // namespace moert::model
