// The CPU operators over the integer microkernels (kernels/): activations quantized
// to A8 once per input vector, GEMV/GEMM over packed weights split across the threads
// by weight tiles, and the fused MoE expert op (gate and up GEMV in one pass, SiLU*mul,
// quantize, down GEMV, weighted add into the output).
//
// Determinism: every output is computed by one kernel call with the fixed block order
// of kernels/ukernel.h, so results do not depend on the thread count, on the ISA
// variant (the kernels are bit-identical) or on whether tokens run one at a time
// (GEMV) or batched (GEMM).
#ifndef MOERT_BACKEND_CPU_QMATMUL_H_
#define MOERT_BACKEND_CPU_QMATMUL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "backend/matrix.h"
#include "backend/packing.h"
#include "core/thread_pool.h"
#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::backend::cpu {

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

// The weighted merge of expert outputs in slot order: out[t] = sum over slots s < k
// with experts[t*k+s] >= 0, in order, of weights[t*k+s] * y[t*k+s] (the first term
// written, the rest added); y is [n*k][width]. weights null: out[t] = y[t*k+s] for its
// one expert (k = 1: a dense FFN).
void CombineSlots(core::ThreadPool& pool, const float* y, const int* experts,
                  const float* weights, int64_t n, int k, int64_t width, float* out);

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

}  // namespace moert::backend::cpu

#endif  // MOERT_BACKEND_CPU_QMATMUL_H_
