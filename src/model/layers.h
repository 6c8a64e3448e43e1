// Building blocks of the reference forward pass: fp32 matmul over dequantized weights
// (threaded over output rows), RMSNorm, RoPE, causal grouped-query attention over the
// KV cache, and the SwiGLU and mixture-of-experts feed-forward networks.
//
// Determinism: every output value is computed by one thread, with one fixed order of
// additions that does not depend on the thread count, on how many tokens are batched
// together or on which tokens share an expert. Prefill and token-by-token decode
// therefore give bit-identical results, and so do 1 and N threads.
#ifndef MOERT_MODEL_LAYERS_H_
#define MOERT_MODEL_LAYERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/qmatmul.h"
#include "core/thread_pool.h"
#include "format/arch.h"
#include "kernels/config.h"

namespace moert::experts {
class ExpertCache;
}  // namespace moert::experts
namespace moert::router {
class Router;
}  // namespace moert::router
namespace moert::pipeline {
class Prefetcher;
}  // namespace moert::pipeline

namespace moert::model {

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

// A weight of `rows` outputs by `cols` inputs that owns its values: row-major fp32,
// or (`packed` not empty, `data` empty) in a runtime layout for the integer kernels,
// where a stacked expert tensor is one packed group per expert. A 1-D weight (a norm,
// a bias) is one row.
struct Matrix {
  std::vector<float> data;
  backend::PackedMatrix packed;
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
  backend::PackedView packed;

  MatrixView() = default;
  MatrixView(const float* d, int64_t r, int64_t c) : data(d), rows(r), cols(c) {}
  MatrixView(const backend::PackedView& p) : rows(p.rows), cols(p.cols), packed(p) {}  // NOLINT
  MatrixView(const Matrix& m)  // NOLINT
      : data(m.packed.empty() ? m.data.data() : nullptr), rows(m.rows), cols(m.cols),
        packed(m.packed.empty() ? backend::PackedView{} : m.packed.group(0)) {}
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
};

// Causal grouped-query attention for the n queries at positions pos0 .. pos0 + n - 1
// (q: [n][n_head * head_dim_k]) over cached keys/values at positions 0 .. pos0 + n - 1
// (k: rows of n_head_kv * head_dim_k, v: rows of n_head_kv * head_dim_v). Query head h
// reads KV head h / (n_head / n_head_kv). out: [n][n_head * head_dim_v].
void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const float* k_cache, const float* v_cache, float* out);

// silu(x) = x / (1 + exp(-x)); sigmoid(x) = 1 / (1 + exp(-x)).
float Silu(float x);
float Sigmoid(float x);

// A SwiGLU feed-forward network: down(silu(gate(x)) * up(x)).
struct FfnWeights {
  Matrix gate;  // [n_ff][n_embd]
  Matrix up;    // [n_ff][n_embd]
  Matrix down;  // [n_embd][n_ff]

  bool empty() const { return gate.empty(); }
};

// out: [n][n_embd] for x: [n][n_embd].
void SwiGluFfn(ThreadPool& pool, const FfnWeights& w, const float* x, int64_t n, float* out);

// A mixture-of-experts feed-forward network: a softmax router over all experts, the
// top n_used, their weights renormalised to sum to 1 or not, and the weighted sum of
// the chosen experts' SwiGLU outputs; plus, for qwen2moe, a shared expert scaled by
// sigmoid(shared_gate . x).
struct MoeWeights {
  int n_expert = 0;
  int n_used = 0;
  int n_ff = 0;  // each expert's width
  bool renormalize = false;
  Matrix router;       // [n_expert][n_embd]
  Matrix gate_exps;    // [n_expert * n_ff][n_embd], expert-major
  Matrix up_exps;      // [n_expert * n_ff][n_embd]
  Matrix down_exps;    // [n_expert * n_embd][n_ff]
  FfnWeights shared;   // empty: no shared expert
  Matrix shared_gate;  // [1][n_embd], with `shared`
  // Routed experts in an expert pool (model loaded with a memory budget): layer
  // `layer` of `cache` holds them, and gate_exps/up_exps/down_exps stay empty.
  experts::ExpertCache* cache = nullptr;
  int layer = 0;
  // The hardware-aware router (router/router.h); null: RouteToken, the reference.
  router::Router* adaptive_router = nullptr;
  // Prefetch of predicted experts (pipeline/prefetcher.h; with `cache`): this layer's
  // routing is scored against the prediction made for it, and layer `prefetch_layer`'s
  // experts are predicted from this layer's input with `prefetch_router` (that layer's
  // router) and their loads started once this layer's experts are pinned. Null: none.
  pipeline::Prefetcher* prefetcher = nullptr;
  const Matrix* prefetch_router = nullptr;
  int prefetch_layer = -1;
  // Called with every batch's routing: n tokens of `slots` experts and weights each
  // (expert -1: an empty slot). Tests; null or empty: none.
  const std::function<void(int layer, int64_t n, int slots, const int* experts,
                           const float* weights)>* route_observer = nullptr;

  MatrixView Gate(int e) const;
  MatrixView Up(int e) const;
  MatrixView Down(int e) const;
};

// Routing of one token: softmax over `router_logits`, the n_used most probable
// experts (ties: the lower index first) in descending order of probability, and
// their weights (the probabilities, divided by their sum when `renormalize`).
void RouteToken(const float* router_logits, int n_expert, int n_used, bool renormalize,
                int* experts, float* weights);

// out: [n][n_embd] for x: [n][n_embd]. Tokens are grouped by expert, one matmul per
// expert over its group; each token's expert outputs are summed in routing order.
//
// With an expert pool (w.cache), each chosen expert is acquired from the cache (loaded
// on a miss) and pinned while it computes. When the batch's distinct experts do not
// all fit in the pool at once, they run in subsets that do, each (token, slot) pair's
// expert output is kept, and the per-token sums are then made in slot order: the same
// arithmetic as backend::FusedFfn, so the output is bit-identical to fully resident
// experts. A failed load returns its Status (nothing stays pinned). With a prefetcher,
// the loads of the predicted experts of a later layer start after this layer's experts
// are acquired and before they compute (the output does not depend on it).
absl::Status MoeFfn(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n,
                    float* out);

// MoeFfn in two halves, for a backend that runs the experts itself (the OpenCL device
// with an expert pool). The routing of n tokens: k slots each (the adaptive router may
// leave some empty: expert -1), chosen and weights [n][k].
struct MoeRoute {
  int k = 0;
  std::vector<int> chosen;
  std::vector<float> weights;
};
// The first half: the router's logits, the routing (the adaptive router with the
// pool's residency, or RouteToken), the route observer and, with a prefetcher, the
// scoring of this layer's prediction and the prediction of the next layer's experts.
MoeRoute RouteMoe(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n);
// The second half on the host: the routed experts (and the shared one) for `route`.
absl::Status RunMoeExperts(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n,
                           const MoeRoute& route, float* out);
// With an expert pool (w.cache), for a device that computes the routed experts: pins
// every distinct expert `route` chose (loading the misses; with a prefetcher they
// start loading together, as in MoeFfn's pipeline), then starts the next layer's
// prefetch so that it overlaps the device's compute. Returns the pinned experts, to be
// released once the device is done with them. A failure (ResourceExhausted when the
// batch's experts do not fit in the pool together, a load error) leaves nothing pinned
// by this call; RunMoeExperts then serves the batch (it splits it to fit the pool).
absl::StatusOr<std::vector<int>> AcquireRouted(const MoeWeights& w, const MoeRoute& route);

}  // namespace moert::model

#endif  // MOERT_MODEL_LAYERS_H_
