// The CPU backend's fp32 ops (the reference numerics every other path is compared
// with): matmul over fp32 weights or, for packed weights, the integer kernels
// (backend/cpu/qmatmul.h), RMSNorm, LayerNorm, RoPE, causal grouped-query attention
// over a KV cache, SiLU, GELU, and the SwiGLU FFN; and the compute context (threads and
// microkernels) they run on.
//
// Determinism: every output value is computed by one thread, with one fixed order of
// additions that does not depend on the thread count, on how many tokens are batched
// together or on which tokens share an expert. Prefill and token-by-token decode
// therefore give bit-identical results, and so do 1 and N threads.
#ifndef MOERT_BACKEND_CPU_F32_OPS_H_
#define MOERT_BACKEND_CPU_F32_OPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_type.h"
#include "backend/matrix.h"
#include "core/thread_pool.h"
#include "format/arch.h"
#include "kernels/config.h"

namespace moert::backend::cpu {

// The compute context of one model: its threads and the microkernels its quantized
// matmuls use (kernels::GetKernelConfig() unless the model was loaded with another).
class ThreadPool : public core::ThreadPool {
 public:
  explicit ThreadPool(int threads)
      : core::ThreadPool(threads), kernels_(kernels::GetKernelConfig()) {}
  const kernels::KernelConfig& kernels() const { return kernels_; }
  void set_kernels(const kernels::KernelConfig& config) { kernels_ = config; }

 private:
  kernels::KernelConfig kernels_;
};


// The dot product every matmul and attention score uses: two 4-lane partial sums
// over blocks of 8, reduced in a fixed order, then the tail.
float Dot(const float* a, const float* b, int64_t n);

// y[t][r] = dot(w row r, x[t]) for n tokens: x is [n][w.cols], y is [n][w.rows].
void MatMul(ThreadPool& pool, MatrixView w, const float* x, int64_t n, float* y);

// Several independent matmuls in one dispatch to the threads (q/k/v, all experts):
// fewer hand-offs, which matters most when the cores are shared. Packed weights run on
// the integer kernels, each distinct input quantized to A8 once for all the jobs that
// read it; fp32 weights on the reference dot product.
struct MatMulJob {
  MatrixView w;
  const float* x = nullptr;
  int64_t n = 0;
  float* y = nullptr;
};
void MatMuls(ThreadPool& pool, std::span<const MatMulJob> jobs);

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i] over each of `n_rows` rows of
// `width` values (weight has `width` values). y may be x.
void RmsNorm(const float* x, int64_t n_rows, int64_t width, const float* weight, float eps,
             float* y);

// y[t][i] += b[i] over n rows of b.size() values.
void AddBias(const std::vector<float>& b, int64_t n, float* y);
void AddBias(const float* b, int64_t width, int64_t n, float* y);

// ggml's norm: y = (x - mean) / sqrt(var + eps) over each of n_rows rows of width
// (mean and variance summed in double, as ggml does), then * weight and, when bias is
// not null, + bias. y may be x.
void LayerNorm(const float* x, int64_t n_rows, int64_t width, const float* weight,
               const float* bias, float eps, float* y);

// Softmax of each of n_rows rows of width: exp(x - max) / sum, the sum in double (as
// the router and attention sum theirs). y may be x.
void Softmax(const float* x, int64_t n_rows, int64_t width, float* y);

// ggml's CPU GELU: the tanh approximation read from an fp16 table (the input rounded
// to half, the output stored as half) for -10 < x < 10; 0 at or below -10, x at or
// above 10.
float Gelu(float x);

struct RopeParams {
  format::RopeLayout layout = format::RopeLayout::kNormal;
  int n_rot = 0;                        // leading dimensions of each head that rotate
  float theta_base = 10000;             // rope.freq_base
  float freq_scale = 1;                 // 1 / linear scaling factor
  const float* freq_factors = nullptr;  // n_rot / 2 divisors of the frequencies, or null
};

// Rotates the heads of x ([n][n_heads * head_dim]) for positions pos0 .. pos0 + n - 1.
// kNormal rotates adjacent pairs (x[2i], x[2i+1]); kNeox rotates (x[i], x[i + n_rot/2]).
// Pair i turns by pos * freq_scale * theta_base^(-2i/n_rot) / freq_factors[i].
void ApplyRope(const RopeParams& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
               float* x);

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;
  int head_dim_v = 0;
  float scale = 1;  // applied to q.k before the softmax
  // > 0: no mask, every query attends to keys 0 .. n_kv - 1 (a vision tower, a
  // cross-attention); 0: causal.
  int64_t n_kv = 0;
};

// A KV cache as the attention kernels read it: rows of `type` (backend/kv_type.h),
// row_bytes apart (KvRowBytes of the row's width). fp32 rows are read in place; the
// others' values are widened to floats (backend/cpu/kv_rows.h) into a task's own
// buffer as it reads them, and the float arithmetic after that is the fp32 path's, so
// attention over a typed cache is attention over its widened fp32 copy, bit for bit.
struct KvRows {
  const uint8_t* data = nullptr;
  KvType type = KvType::kF32;
  size_t row_bytes = 0;
};
// fp32 rows of `width` floats.
KvRows F32Rows(const float* rows, int64_t width);

// Causal grouped-query attention for the n queries at positions pos0 .. pos0 + n - 1
// (q: [n][n_head * head_dim_k]) over cached keys/values at positions 0 .. pos0 + n - 1
// (k: rows of n_head_kv * head_dim_k, v: rows of n_head_kv * head_dim_v). Query head h
// reads KV head h / (n_head / n_head_kv). out: [n][n_head * head_dim_v].
void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const float* k_cache, const float* v_cache, float* out);
void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const KvRows& k_cache, const KvRows& v_cache, float* out);

// The entropy in nats of each query's unmasked attention over shape.n_kv keys, per
// head: entropy[t * n_head + h] = -sum_j p_j ln p_j with p = softmax_j(scale q_th . k_j)
// (the distribution Attention weighs the values with). Visual-token pruning reads it.
void AttentionEntropy(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
                      const float* k, float* entropy);
void AttentionEntropy(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
                      const KvRows& k, float* entropy);

// silu(x) = x / (1 + exp(-x)); sigmoid(x) = 1 / (1 + exp(-x)).
float Silu(float x);
float Sigmoid(float x);

// Routing of one token: softmax over `router_logits`, the n_used most probable
// experts (ties: the lower index first) in descending order of probability, and
// their weights (the probabilities, divided by their sum when `renormalize`).
void RouteToken(const float* router_logits, int n_expert, int n_used, bool renormalize,
                int* experts, float* weights);

// out: [n][n_embd] for x: [n][n_embd].
void SwiGluFfn(ThreadPool& pool, const FfnWeights& w, const float* x, int64_t n, float* out);

}  // namespace moert::backend::cpu

#endif  // MOERT_BACKEND_CPU_F32_OPS_H_
