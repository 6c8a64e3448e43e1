// Weights as the loader makes them and every backend uploads them: row-major fp32,
// or a packed runtime layout (backend/packing.h) that the CPU kernels read in place
// and a device copies as it is; views of one expert of a stacked expert tensor.
#ifndef MOERT_BACKEND_MATRIX_H_
#define MOERT_BACKEND_MATRIX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/packing.h"

namespace moert::backend {

// A borrowed matrix in a runtime layout (PackedBytes(format, rows, cols) bytes).
struct PackedView {
  WeightFormat format = WeightFormat::kW8;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;

  bool empty() const { return data == nullptr; }
};

// An owned packed matrix, or `groups` matrices of `rows` x `cols` back to back (a
// stacked expert tensor: each expert packed on its own, so each is one extent).
class PackedMatrix {
 public:
  PackedMatrix() = default;
  PackedMatrix(WeightFormat format, int64_t groups, int64_t rows, int64_t cols);

  bool empty() const { return bytes_ == nullptr; }
  WeightFormat format() const { return format_; }
  int64_t groups() const { return groups_; }
  int64_t rows() const { return rows_; }  // per group
  int64_t cols() const { return cols_; }
  size_t group_bytes() const { return group_bytes_; }
  size_t size_bytes() const { return group_bytes_ * static_cast<size_t>(groups_); }

  uint8_t* mutable_group(int64_t g) { return bytes_.get() + static_cast<size_t>(g) * group_bytes_; }
  PackedView group(int64_t g) const {
    return {format_, rows_, cols_, bytes_.get() + static_cast<size_t>(g) * group_bytes_};
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  WeightFormat format_ = WeightFormat::kW8;
  int64_t groups_ = 0, rows_ = 0, cols_ = 0;
  size_t group_bytes_ = 0;
  std::unique_ptr<uint8_t, Free> bytes_;  // 64-byte aligned
};

// A weight of `rows` outputs by `cols` inputs that owns its values: row-major fp32,
// or (`packed` not empty, `data` empty) in a runtime layout for the integer kernels,
// where a stacked expert tensor is one packed group per expert. A 1-D weight (a norm,
// a bias) is one row.
struct Matrix {
  std::vector<float> data;
  PackedMatrix packed;
  int64_t rows = 0;
  int64_t cols = 0;

  bool empty() const { return data.empty() && packed.empty(); }
  const float* row(int64_t r) const { return data.data() + r * cols; }
};

// A borrowed matrix (one expert's slice of a stacked expert tensor): fp32 `data`, or
// `packed` when `data` is null.
struct MatrixView {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  PackedView packed;

  MatrixView() = default;
  MatrixView(const float* d, int64_t r, int64_t c) : data(d), rows(r), cols(c) {}
  MatrixView(const PackedView& p) : rows(p.rows), cols(p.cols), packed(p) {}  // NOLINT
  MatrixView(const Matrix& m)  // NOLINT
      : data(m.packed.empty() ? m.data.data() : nullptr), rows(m.rows), cols(m.cols),
        packed(m.packed.empty() ? PackedView{} : m.packed.group(0)) {}
};

// One expert's (or a dense FFN's) SwiGLU weights: down(silu(gate x) * up x).
struct FfnView {
  PackedView gate;  // [n_ff][n_embd]
  PackedView up;    // [n_ff][n_embd]
  PackedView down;  // [n_embd][n_ff]
};

// A SwiGLU feed-forward network: down(silu(gate(x)) * up(x)).
struct FfnWeights {
  Matrix gate;  // [n_ff][n_embd]
  Matrix up;    // [n_ff][n_embd]
  Matrix down;  // [n_embd][n_ff]

  bool empty() const { return gate.empty(); }
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_MATRIX_H_
