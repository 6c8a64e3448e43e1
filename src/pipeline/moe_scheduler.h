// The MoE scheduler: the one owner of a mixture-of-experts block on any backend. It
// routes (the router's gate logits; the hardware-aware router and its residency
// penalty on the host, or the backend's top-k), acquires the chosen experts from the
// expert pool (hits pinned first; with a prefetcher every miss starts loading at once
// and each expert computes as soon as its weights are in), splits a batch whose
// experts do not fit the pool together into subsets that do, runs the fused expert op
// (or, for fp32 experts, one matmul per expert over its tokens), merges the expert
// outputs in slot order, releases the pins and issues the next layer's prefetch. What
// it computes goes through backend::Backend; what runs where and when is decided here.
//
// Bit-identity: on the CPU backend a batch computes the same bits whether its experts
// are resident, pooled, streamed, split into subsets or prefetched (each pair's expert
// output is computed exactly as within the whole batch and the sum is in slot order).
//
// Not thread-safe: the model's forward pass drives it.
#ifndef MOERT_PIPELINE_MOE_SCHEDULER_H_
#define MOERT_PIPELINE_MOE_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "telemetry/metrics.h"
#include "backend/matrix.h"
#include "backend/scratch.h"
#include "experts/expert_cache.h"
#include "pipeline/op_observer.h"
#include "pipeline/prefetcher.h"
#include "router/router.h"

namespace moert::pipeline {

// A mixture-of-experts feed-forward network's weights: a softmax router over all
// experts, the top n_used, their weights renormalised to sum to 1 or not, and the
// weighted sum of the chosen experts' SwiGLU outputs; plus, for qwen2moe, a shared
// expert scaled by sigmoid(shared_gate . x). With an expert pool the routed experts'
// matrices stay empty (the pool holds them).
struct MoeWeights {
  int n_expert = 0;
  int n_used = 0;
  int n_ff = 0;  // each expert's width
  bool renormalize = false;
  backend::Matrix router;       // [n_expert][n_embd]
  backend::Matrix gate_exps;    // [n_expert * n_ff][n_embd], expert-major
  backend::Matrix up_exps;      // [n_expert * n_ff][n_embd]
  backend::Matrix down_exps;    // [n_expert * n_embd][n_ff]
  backend::FfnWeights shared;   // empty: no shared expert
  backend::Matrix shared_gate;  // [1][n_embd], with `shared`
};

// Where an expert pool's experts compute on a backend whose memory the host does not
// share (ModelLoadOptions::opencl_pooled_experts).
enum class PooledPlacement {
  // On the device, from the pool's memory: one device buffer over the pool's expert
  // region (zero-copy where the device shares host memory, else a device copy of each
  // block written as it is loaded or moved); on the CPU where the device cannot (a
  // weight format it has no fused op for, a region it cannot wrap, a batch whose
  // experts do not fit the pool together).
  kDevice,
  // kDevice with the device copy even where the device could read host memory.
  kDeviceCopy,
  // Always on the CPU: the FFN input is read back and the MoE output written.
  kHost,
};

// What the MoE blocks of a model share: borrowed, each may be null.
struct MoeServices {
  experts::ExpertCache* cache = nullptr;  // the expert pool (null: experts resident)
  router::Router* router = nullptr;       // null: the plain softmax top-k
  Prefetcher* prefetcher = nullptr;       // with `cache`
  int prefetch_depth = 0;                 // layers ahead, with `prefetcher`
  // Called with every batch's routing (tests); null or empty: none.
  const std::function<void(int layer, int64_t n, int slots, const int* experts,
                           const float* weights)>* route_observer = nullptr;
  // Per layer, where the time to route a batch is observed (null: not observed).
  std::vector<telemetry::Histogram*> router_latency;
  // Per layer, the gate logits of the last row of the last batch routed on the host (a
  // repro bundle's router logits); null: not kept.
  std::vector<std::vector<float>>* last_router_logits = nullptr;
  // Sees the router's logits and, with `experts`, each expert's projections (on a
  // backend sharing the host's memory; pipeline/op_observer.h); null or empty: none.
  const OpObserver* op_observer = nullptr;
};

// Where a pooled model's experts ran on a device backend.
struct PooledStats {
  // "device (zero-copy)", "device (copied per load)" or "host: <why>".
  std::string placement;
  uint64_t device_batches = 0;   // MoE blocks whose experts ran on the device
  uint64_t host_batches = 0;     // ... on the CPU
  uint64_t published_bytes = 0;  // expert bytes made visible to the device
};

class MoeScheduler {
 public:
  // The MoE blocks of `layers` (null for a dense layer), on `backend`. `services` is
  // read at every call (the model changes its prefetcher). `host`: the CPU backend's
  // scheduler, which runs what `backend` cannot (null when `backend` is the CPU or
  // shares the host's memory).
  MoeScheduler(backend::Backend& backend, std::vector<const MoeWeights*> layers,
               const MoeServices* services, MoeScheduler* host = nullptr,
               PooledPlacement placement = PooledPlacement::kDevice);
  ~MoeScheduler();
  MoeScheduler(const MoeScheduler&) = delete;
  MoeScheduler& operator=(const MoeScheduler&) = delete;

  // Uploads the routers, the resident experts and the shared experts to the backend
  // and, with an expert pool, sets up the backend's view of the pool's memory.
  // Unimplemented naming the tensor when the backend has no kernels for a weight.
  absl::Status Init();

  // out = the MoE FFN of layer `layer` for the n rows of x ([n][n_embd] floats in the
  // backend's memory; out too). A failed expert load returns its Status with nothing
  // left pinned.
  absl::Status Run(int layer, backend::TensorRef x, int64_t n, backend::TensorRef out);
  // out += the shared expert of layer `layer` for the n rows of x; nothing when the
  // layer has none. For the model's dense fallback, which replaces only the routed
  // experts.
  absl::Status AddSharedExpert(int layer, backend::TensorRef x, int64_t n,
                               backend::TensorRef out);

  // With an expert pool on a device backend; empty placement otherwise.
  PooledStats pooled_stats() const { return pooled_; }
  // Device memory the uploaded MoE weights take (the pool's region not counted).
  uint64_t weight_bytes() const { return weight_bytes_; }

  // The (token, slot) routing of a batch: k slots per token (-1: an empty slot).
  struct Route {
    int k = 0;
    std::vector<int> chosen;
    std::vector<float> weights;
  };

 private:
  struct Layer;
  struct Region;

  // Routes on the host (the router, the observer, the prefetcher's scoring and its
  // prediction for a later layer) or on the backend (its top-k); the experts and
  // weights land in the backend's buffers, and in `route` when routed on the host.
  absl::Status RouteBatch(int layer, backend::TensorRef x, int64_t n, bool on_host, Route* route,
                          backend::TensorRef* experts, backend::TensorRef* weights);
  // The routed experts of a batch, resident or pooled.
  absl::Status RunRouted(int layer, backend::TensorRef x, int64_t n, const Route& route,
                         backend::TensorRef experts, backend::TensorRef weights,
                         backend::TensorRef out);
  absl::Status RunResident(int layer, backend::TensorRef x, int64_t n, const Route& route,
                           bool routed_on_host, backend::TensorRef experts,
                           backend::TensorRef weights, backend::TensorRef out);
  // One matmul per expert over its tokens (fp32 experts), the outputs merged in slot order.
  absl::Status RunGrouped(int layer, backend::TensorRef x, int64_t n, std::span<const int> chosen,
                          int k, backend::TensorRef experts, backend::TensorRef weights,
                          backend::TensorRef out);
  // The pooled experts on a backend that shares the host's memory (the pipeline:
  // streaming, split batches).
  absl::Status RunPooledHost(int layer, backend::TensorRef x, int64_t n, const Route& route,
                             backend::TensorRef experts, backend::TensorRef weights,
                             backend::TensorRef out);
  // The pooled experts on a device from its view of the pool (false in *ran: it cannot,
  // or the batch's experts do not fit the pool together: the CPU runs them).
  absl::Status RunPooledDevice(int layer, backend::TensorRef x, int64_t n, const Route& route,
                               backend::TensorRef experts, backend::TensorRef weights,
                               backend::TensorRef out, bool* ran);
  // This batch's routed experts on the host scheduler: x read back, out written.
  absl::Status RunOnHost(int layer, backend::TensorRef x, int64_t n, const Route& route,
                         backend::TensorRef out);
  // The routed experts pair by pair, each projection shown to the op observer (its
  // `experts` mode; resident experts on a host-memory backend).
  absl::Status RunObserved(int layer, backend::TensorRef x, int64_t n, const Route& route,
                           backend::TensorRef out);
  absl::Status RunShared(int layer, backend::TensorRef x, int64_t n, backend::TensorRef out);
  // The pooled experts [first, last) of `distinct` as one subset: their pairs' outputs
  // into `pair_rows` (rows after *rows_used), `row_of_pair` set for those pairs.
  absl::Status RunSubset(int layer, backend::TensorRef x, std::span<const int> subset,
                         const Route& route, backend::TensorRef pair_rows, int64_t* rows_used,
                         std::vector<int>* row_of_pair);
  // The Experts argument for layer `layer`'s pooled experts in this backend's region.
  backend::Experts PlacedExperts(int layer, std::span<const uint64_t> offsets) const;
  // Makes the pinned expert's bytes visible to the device; its block offset.
  absl::StatusOr<uint64_t> PublishExpert(int layer, int expert);
  absl::Status CheckZeroCopy(uint64_t offset, uint64_t bytes);
  void SetUpRegion();
  absl::StatusOr<backend::TensorRef> Scratch(int slot, size_t bytes);

  backend::Backend& b_;
  std::vector<const MoeWeights*> host_layers_;
  const MoeServices* services_;
  MoeScheduler* host_;
  PooledPlacement placement_;
  std::vector<Layer> layers_;
  std::unique_ptr<Region> region_;
  backend::ScratchBuffers scratch_;
  PooledStats pooled_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace moert::pipeline

#endif  // MOERT_PIPELINE_MOE_SCHEDULER_H_
