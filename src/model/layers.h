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
#include "backend/cpu/f32_ops.h"
#include "backend/cpu/qmatmul.h"
#include "backend/matrix.h"
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

// The weights and the CPU ops the layers are built from (backend/matrix.h,
// backend/cpu/f32_ops.h), under the names the model has always used.
using backend::FfnWeights;
using backend::Matrix;
using backend::MatrixView;
using backend::cpu::AddBias;
using backend::cpu::ApplyRope;
using backend::cpu::Attention;
using backend::cpu::AttentionShape;
using backend::cpu::Dot;
using backend::cpu::MatMul;
using backend::cpu::MatMulJob;
using backend::cpu::MatMuls;
using backend::cpu::RmsNorm;
using backend::cpu::RopeParams;
using backend::cpu::Sigmoid;
using backend::cpu::Silu;
using backend::cpu::SwiGluFfn;
using backend::cpu::ThreadPool;

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
