// The decoder-only transformer: loading its weights (the expert pool, the router, the
// prefetcher), its KV cache, batching and argument checks, and which backend's layer
// graph (model/graph.h) runs a batch.
#ifndef MOERT_MODEL_DECODER_H_
#define MOERT_MODEL_DECODER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "experts/expert_cache.h"
#include "memory/budget.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu_fallback.h"
#include "backend/failure_policy.h"
#include "model/graph.h"
#include "model/kv_cache.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/weight_lock.h"
#include "model/weights.h"
#include "pipeline/moe_scheduler.h"
#include "pipeline/prefetcher.h"

namespace moert::model {

// Blocks for loading a layer.
absl::Status LoadAttention(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                           const AttentionOptions& options, AttentionWeights* w);
absl::Status LoadDenseFfn(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                          FfnWeights* w);
// Routed experts, plus the shared expert and its gate when `shared_expert`.
absl::Status LoadMoeFfn(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                        bool shared_expert, pipeline::MoeWeights* w);
// A MoE layer's dense fallback FFN (blk.N.ffn_{gate,up,down}_dense_fallback, moert-pack
// --dense-fallback) when the file has one, `w` left empty when it has none; one of the
// three alone, or a shape other than the experts' ([n_embd, n_ff_expert] gate and up,
// [n_ff_expert, n_embd] down), is InvalidArgument naming the tensor.
absl::Status LoadDenseFallbackFfn(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                                  FfnWeights* w);

class DecoderKvCache;

// The decoder-only transformer every supported architecture is: x += Attention(Norm(x));
// x += Ffn(Norm(x)), the FFN dense SwiGLU or mixture-of-experts; what differs between
// architectures (RoPE layout, q/k norm, biases, the shared expert) is their row of the
// architecture table. The layer graph (model/graph.h) computes it on the CPU backend and,
// with ModelLoadOptions::backend, on a device (backend selection and its failure policy:
// backend/).
class DecoderModel final : public Model {
 public:
  DecoderModel(format::ModelSpec spec, int threads);
  ~DecoderModel() override;
  const format::ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int n_ctx) const override;
  using Model::Forward;
  absl::Status Forward(const ForwardInput& input, KvCache* cache, LogitsFor which,
                       std::vector<float>* logits) override;
  MemoryStats memory_stats() const override;
  BackendStats backend_stats() const override;
  absl::Status SaveHotSet() override;
  std::vector<std::vector<float>> last_router_logits() const override {
    return last_router_logits_;
  }
  std::string pool_state() const override;
  router::Router* router() override { return router_.get(); }
  absl::Status SetPrefetch(bool enabled, int depth) override;
  void CancelPendingLoads() override;
  // Thread safety: meant for between Forward calls; a call from another thread during
  // one is safe too and applies from the next Forward, which runs one mode throughout.
  // That Forward, the first with it on, drops the expert loads still queued.
  absl::Status SetDenseFallback(bool on) override;
  bool has_dense_fallback() const override { return has_dense_fallback_; }
  router::ResourceMonitor* resource_monitor() override { return monitor_.get(); }
  memory::MemoryBudget* budget() override { return budget_.get(); }
  void ApplyMemoryLimits(bool drop_unused) override;
  absl::Status Defragment() override;
  absl::Status UseCpuBackend(std::string_view why) override;
  // model/expert_update.cc.
  absl::StatusOr<std::unique_ptr<ExpertUpdate>> PrepareExpertUpdate(
      const format::GgufFile& file, std::span<const std::pair<int, int>> experts) override;
  absl::Status CommitExpertUpdate(ExpertUpdate& update) override;

  // Loads every tensor (called once by Model::Load); with a budget or an expert pool,
  // sizes them first and sets up the pool (ModelLoadOptions).
  absl::Status LoadWeights(const format::GgufFile& file, const ModelLoadOptions& options);

  // The expert pool's cache; null without one. For tests (fault injection) and stats.
  experts::ExpertCache* expert_cache() { return expert_cache_.get(); }

 private:
  absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w);
  // Loads (or, in measure mode, sizes) every tensor through `loader`.
  absl::Status LoadTensors(WeightLoader& loader);
  // Sizes the budget and creates the expert pool (LoadWeights with a pool).
  absl::Status SetUpExpertPool(const format::GgufFile& file, const ModelLoadOptions& options);
  // Sets up router_ (LoadWeights, after the layers and the pool).
  absl::Status SetUpRouter(const format::GgufFile& file, const ModelLoadOptions& options);
  // The CPU's graph, and the device's for ModelLoadOptions::backend (LoadWeights, last).
  absl::Status SetUpBackend(const ModelLoadOptions& options);
  // Runs one micro-batch; logits for its rows [first_logit_row, n) go to `logits`.
  absl::Status ForwardBatch(const BatchInput& input, int64_t pos0, DecoderKvCache* cache,
                            int64_t first_logit_row, float* logits);
  ModelWeights Weights() const;
  // From now on the CPU runs every batch; BackendStats::cpu_reason says `reason`.
  void GiveUpDevice(std::string reason);

  format::ModelSpec spec_;
  AttentionOptions attention_;  // from the architecture table
  ThreadPool pool_;
  EmbeddingTable token_embd_;  // quantized unless the lm head shares it
  std::vector<float> output_norm_;
  Matrix output_;                  // empty when tied to token_embd_
  std::vector<float> rope_freqs_;  // empty when absent
  std::vector<LayerWeights> layers_;
  WeightLock weight_lock_;  // after the weights: unlocked before they are freed
  std::function<void(int, int64_t, const float*)> ffn_input_observer_;
  // Every MoE layer has a dense fallback FFN (LayerWeights::dense_fallback). It runs
  // instead of the experts while dense_fallback_, which Forward sets from what
  // SetDenseFallback asked last (the graphs' GraphOptions::dense_fallback).
  bool has_dense_fallback_ = false;
  std::atomic<bool> dense_fallback_requested_{false};
  bool dense_fallback_ = false;
  // With a budget or a pool: its sizing (the pool's live figures come from the cache).
  MemoryStats memory_;
  // What the model publishes to (LoadWeights sets it); before what refers to it.
  std::shared_ptr<telemetry::Registry> registry_;
  std::unique_ptr<experts::ExpertCache> expert_cache_;
  // The ledger every KV cache reserves in (shared: a cache may outlive the model).
  std::shared_ptr<memory::MemoryBudget> budget_;
  KvTypes kv_types_;  // ModelLoadOptions::kv_type_k / kv_type_v
  std::string hot_set_path_;  // empty: no hot set
  mutable std::mutex hot_set_mutex_;
  std::string hot_set_error_;  // the last SaveHotSet's failure (hot_set_mutex_)
  // MoE models: the router and what it knows of the device (null: reference routing).
  std::unique_ptr<router::ResourceMonitor> monitor_;
  std::unique_ptr<router::Router> router_;
  std::function<void(int, int64_t, int, const int*, const float*)> route_observer_;
  pipeline::OpObserver op_observer_;  // ModelLoadOptions::op_observer
  // Per layer, the router logits of the last routed row (MoeServices::last_router_logits).
  std::vector<std::vector<float>> last_router_logits_;
  // With an expert pool and ModelLoadOptions::prefetch (null otherwise).
  std::unique_ptr<pipeline::Prefetcher> prefetcher_;
  // What the MoE blocks share (the graphs' schedulers read it at every call).
  pipeline::MoeServices moe_services_;

  // The CPU backend and its graph (always: the reference, and where a device's failed
  // batches run); the device's, null on the CPU or once Backend::kAuto gave it up.
  std::unique_ptr<backend::cpu::CpuBackend> cpu_;
  std::unique_ptr<LayerGraph> cpu_graph_;
  std::unique_ptr<backend::CpuFallbackBackend> device_;  // what it lacks runs on the CPU
  std::unique_ptr<LayerGraph> device_graph_;
  bool fallback_to_cpu_ = false;  // Backend::kAuto
  backend::DeviceFailurePolicy failures_;
  BackendStats backend_;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_DECODER_H_
