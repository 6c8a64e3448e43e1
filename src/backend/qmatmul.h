// The CPU operators over the integer microkernels (kernels/): activations quantized
// to A8 once per input vector, GEMV/GEMM over packed weights split across the threads
// by weight tiles, and the fused MoE expert op (gate and up GEMV in one pass, SiLU*mul,
// quantize, down GEMV, weighted add into the output).
//
// Determinism: every output is computed by one kernel call with the fixed block order
// of kernels/ukernel.h, so results do not depend on the thread count, on the ISA
// variant (the kernels are bit-identical) or on whether tokens run one at a time
// (GEMV) or batched (GEMM).
#ifndef MOERT_BACKEND_QMATMUL_H_
#define MOERT_BACKEND_QMATMUL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "backend/packing.h"
#include "core/thread_pool.h"
#include "kernels/config.h"
#include "kernels/ukernel.h"

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

// n rows of K activations quantized to A8 (K a multiple of 32).
class A8Matrix {
 public:
  // Quantizes x ([n][k]) with `config`'s quantizer.
  void Quantize(const kernels::KernelConfig& config, core::ThreadPool& pool, const float* x,
                int64_t n, int64_t k);
  // Rows `rows` of `src`, in that order (gathering one expert's tokens).
  void Gather(const A8Matrix& src, std::span<const int64_t> rows);

  int64_t n() const { return n_; }
  int64_t k() const { return kb_ * MOERT_QK; }
  const moert_a8_block* row(int64_t i) const { return blocks_.data() + i * kb_; }
  size_t stride_bytes() const { return static_cast<size_t>(kb_) * sizeof(moert_a8_block); }

 private:
  std::vector<moert_a8_block> blocks_;
  int64_t n_ = 0;
  int64_t kb_ = 0;
};

// y[t][r] = w row r . a row t, for all of a's rows: y is [a.n()][w.rows].
struct QMatMulJob {
  PackedView w;
  const A8Matrix* a = nullptr;
  float* y = nullptr;
};
// All jobs in one dispatch to the threads.
void QMatMuls(core::ThreadPool& pool, const kernels::KernelConfig& config,
              std::span<const QMatMulJob> jobs);

// One expert's (or a dense FFN's) SwiGLU weights: down(silu(gate x) * up x).
struct FfnView {
  PackedView gate;  // [n_ff][n_embd]
  PackedView up;    // [n_ff][n_embd]
  PackedView down;  // [n_embd][n_ff]
};

// Whether FusedFfn can run these weights: packed, n_embd and n_ff multiples of 32.
bool CanFuse(const FfnView& w);

// The MoE experts of n tokens: out[t] = sum over slots s < k, in slot order, of
// weights[t*k+s] * ffn(experts[t*k+s], x[t]) (written, not added). A slot whose
// expert is -1 is empty (a token the router gave fewer experts); slot 0 of every
// token must hold one. `weights` null:
// k must be 1 and out[t] = ffn(x[t]) (a dense FFN or a shared expert). One token runs
// every chosen expert's GEMVs with the threads splitting rows; a batch groups its
// tokens by expert and runs one GEMM per expert over its group.
void FusedFfn(core::ThreadPool& pool, const kernels::KernelConfig& config, const A8Matrix& x,
              int k, const int* experts, const float* weights,
              absl::FunctionRef<FfnView(int)> expert, int64_t n_embd, float* out);

}  // namespace moert::backend

#endif  // MOERT_BACKEND_QMATMUL_H_
