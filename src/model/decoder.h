// What every architecture shares: the decoder-only transformer around the layers
// (token embedding, KV cache, final norm, lm head, batching and argument checks) and
// the attention and feed-forward blocks the layers are built from. An architecture
// (model/arch_*.cc) says how to load one layer and how to run it.
#ifndef MOERT_MODEL_DECODER_H_
#define MOERT_MODEL_DECODER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "experts/expert_cache.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/weights.h"
#include "pipeline/prefetcher.h"

namespace moert::model {

struct AttentionWeights {
  Matrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;      // empty: no bias
  std::vector<float> q_norm, k_norm;  // empty: no q/k RMSNorm
};

// The weights of one layer; an architecture fills what it uses.
struct LayerWeights {
  std::vector<float> attn_norm;
  AttentionWeights attn;
  std::vector<float> ffn_norm;
  FfnWeights ffn;  // dense layers
  MoeWeights moe;  // mixture-of-experts layers
};

// How an architecture's attention differs from llama's.
struct AttentionOptions {
  format::RopeLayout rope = format::RopeLayout::kNormal;
  format::QkNorm qk_norm = format::QkNorm::kNone;
  bool bias = false;  // q/k/v biases: required when true, else loaded when present
};

// One batch passing through one layer.
struct LayerContext {
  ThreadPool* pool = nullptr;
  const format::ModelSpec* spec = nullptr;
  RopeParams rope;  // the model's; the layout comes from AttentionOptions
  int64_t n_tokens = 0;
  int64_t pos0 = 0;                   // position of the first token
  float* x = nullptr;                 // residual stream [n_tokens][n_embd], updated in place
  float* k_cache = nullptr;           // this layer's keys, [capacity][n_head_kv * head_dim_k]
  float* v_cache = nullptr;           // this layer's values, [capacity][n_head_kv * head_dim_v]
  std::vector<float>* cur = nullptr;  // scratch [n_tokens][n_embd]
  std::vector<float>* out = nullptr;  // scratch [n_tokens][n_embd]
  int layer = 0;                      // index of the layer being run
  // ModelLoadOptions::ffn_input_observer (null or empty: none).
  const std::function<void(int, int64_t, const float*)>* ffn_input_observer = nullptr;
};

// Blocks for the architecture files.
absl::Status LoadAttention(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                           const AttentionOptions& options, AttentionWeights* w);
absl::Status LoadDenseFfn(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                          FfnWeights* w);
// Routed experts, plus the shared expert and its gate when `shared_expert`.
absl::Status LoadMoeFfn(WeightLoader& loader, const format::ModelSpec& spec, int layer,
                        bool shared_expert, MoeWeights* w);

// out = attention(in): q/k/v projections (+ biases), q/k RMSNorm, RoPE, the new keys
// and values appended to the cache, causal attention, output projection.
void RunAttention(LayerContext& ctx, const AttentionWeights& w, const AttentionOptions& options,
                  const float* in, float* out);

// cur = RMSNorm(x) * weight.
void NormInto(LayerContext& ctx, const std::vector<float>& weight, std::vector<float>* cur);
// x += out.
void AddResidual(LayerContext& ctx, const std::vector<float>& out);

class DecoderKvCache;
class OpenClDecoder;

// A failure injected into the OpenCL forward (tests of the CPU fallback): after
// `after_calls` device batches that run normally, the next `times` batches (< 0: every
// batch from then on) fail in layer `layer` (clamped to the model's layers), once that
// layer's attention kernels are enqueued, with the Status a real enqueue returning the
// OpenCL error `cl_error` gives (backend/opencl/cl_status.h: CL_OUT_OF_RESOURCES -5,
// CL_DEVICE_NOT_AVAILABLE -2, CL_INVALID_COMMAND_QUEUE -36 ...). An int because this
// header includes no OpenCL header.
struct DeviceFailureForTesting {
  int after_calls = 0;
  int layer = 0;
  int cl_error = -5;  // CL_OUT_OF_RESOURCES
  int times = 1;
};

// The decoder-only transformer; an architecture implements LoadLayer and RunLayer.
class DecoderModel : public Model {
 public:
  ~DecoderModel() override;
  const format::ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int n_ctx) const override;
  absl::Status Forward(std::span<const int32_t> tokens, KvCache* cache, LogitsFor which,
                       std::vector<float>* logits) override;
  MemoryStats memory_stats() const override;
  BackendStats backend_stats() const override;
  absl::Status SaveHotSet() override;
  router::Router* router() override { return router_.get(); }
  absl::Status SetPrefetch(bool enabled, int depth) override;
  router::ResourceMonitor* resource_monitor() override { return monitor_.get(); }

  // Loads every tensor (called once by Model::Load); with a budget or an expert pool,
  // sizes them first and sets up the pool (ModelLoadOptions).
  absl::Status LoadWeights(const format::GgufFile& file, const ModelLoadOptions& options);

  // The expert pool's cache; null without one. For tests (fault injection) and stats.
  experts::ExpertCache* expert_cache() { return expert_cache_.get(); }

  // With Backend::kAuto, this many failed device batches in a row (a lost device fails
  // every one) move the model to the CPU for the rest of its life: the device is
  // released and backend_stats() says CPU, with the reason.
  static constexpr int kDeviceFailuresBeforeCpu = 3;

  // Tests of the device failure path. FailedPrecondition when the model has no OpenCL
  // forward (the CPU backend, or kAuto after it gave the device up).
  absl::Status InjectDeviceFailureForTesting(const DeviceFailureForTesting& failure);
  // Backend::kAuto's failure policy (fall back to the CPU, count it, give the device up
  // after kDeviceFailuresBeforeCpu in a row) on a model loaded with Backend::kOpenCl:
  // kAuto takes only a GPU, so tests on PoCL's CPU device reach the fallback this way.
  absl::Status FallBackToCpuForTesting();
  // Tests: the OpenCL forward's zero-copy check of the expert pool sees stale bytes
  // (OpenClDecoder::SpoilZeroCopyCheckForTesting). FailedPrecondition without one.
  absl::Status SpoilZeroCopyCheckForTesting();
  // Batches the device ran to the end (tests: the device is used again after a fallback).
  uint64_t DeviceBatchesForTesting() const { return device_batches_; }

 protected:
  DecoderModel(format::ModelSpec spec, int threads);

  virtual absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) = 0;
  // Runs ctx.n_tokens tokens through one layer, updating ctx.x. Fails only when an
  // expert cannot be loaded from the pool.
  virtual absl::Status RunLayer(LayerContext& ctx, const LayerWeights& w) = 0;
  // What the OpenCL forward (model/opencl_decoder.h) needs to know of RunLayer: the
  // layer is PreNormDecoderModel's with these options (false: CPU only).
  virtual bool PreNormLayout(AttentionOptions* attention, bool* shared_expert) const {
    (void)attention;
    (void)shared_expert;
    return false;
  }

 private:
  // Loads (or, in measure mode, sizes) every tensor through `loader`.
  absl::Status LoadTensors(WeightLoader& loader);
  // Sizes the budget and creates the expert pool (LoadWeights with a pool).
  absl::Status SetUpExpertPool(const format::GgufFile& file, const ModelLoadOptions& options);
  // Runs one micro-batch; logits for its rows [first_logit_row, n) go to `logits`.
  absl::Status ForwardBatch(std::span<const int32_t> tokens, int64_t pos0, DecoderKvCache* cache,
                            int64_t first_logit_row, float* logits);

  format::ModelSpec spec_;
  ThreadPool pool_;
  Matrix token_embd_;
  std::vector<float> output_norm_;
  Matrix output_;                  // empty when tied to token_embd_
  std::vector<float> rope_freqs_;  // empty when absent
  std::vector<LayerWeights> layers_;
  std::function<void(int, int64_t, const float*)> ffn_input_observer_;
  // With a budget or a pool: its sizing (the pool's live figures come from the cache).
  MemoryStats memory_;
  std::unique_ptr<experts::ExpertCache> expert_cache_;
  std::string hot_set_path_;  // empty: no hot set
  // MoE models: the router and what it knows of the device (null: reference routing).
  std::unique_ptr<router::ResourceMonitor> monitor_;
  std::unique_ptr<router::Router> router_;
  std::function<void(int, int64_t, int, const int*, const float*)> route_observer_;
  // With an expert pool and ModelLoadOptions::prefetch (null otherwise).
  std::unique_ptr<pipeline::Prefetcher> prefetcher_;

  // Sets up router_ (LoadWeights, after the layers and the pool).
  absl::Status SetUpRouter(const format::GgufFile& file, const ModelLoadOptions& options);
  // Sets up opencl_ for ModelLoadOptions::backend (LoadWeights, last).
  absl::Status SetUpBackend(const ModelLoadOptions& options);

  // The OpenCL forward (null: the CPU); with Backend::kAuto a failed device run falls
  // back to the CPU (counted in backend_).
  std::unique_ptr<OpenClDecoder> opencl_;
  bool fallback_to_cpu_ = false;
  BackendStats backend_;
  uint64_t device_batches_ = 0;       // batches the device ran to the end
  int device_failures_in_a_row_ = 0;  // kAuto: reset by a device batch that succeeds
};

// The pre-norm block every supported architecture uses: x += Attention(Norm(x));
// x += Ffn(Norm(x)), where Ffn is the dense SwiGLU FFN for a dense model and the MoE
// FFN (with the shared expert when `shared_expert`) for a MoE one. What differs
// between architectures is `attention` and `shared_expert`, set by each
// architecture's file.
class PreNormDecoderModel final : public DecoderModel {
 public:
  PreNormDecoderModel(format::ModelSpec spec, int threads, AttentionOptions attention,
                      bool shared_expert)
      : DecoderModel(std::move(spec), threads),
        attention_(attention),
        shared_expert_(shared_expert) {}

 protected:
  absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) override;
  absl::Status RunLayer(LayerContext& ctx, const LayerWeights& w) override;
  bool PreNormLayout(AttentionOptions* attention, bool* shared_expert) const override {
    *attention = attention_;
    *shared_expert = shared_expert_;
    return true;
  }

 private:
  const AttentionOptions attention_;
  const bool shared_expert_;
};

// One factory per architecture (model/arch_*.cc).
std::unique_ptr<DecoderModel> NewLlamaModel(format::ModelSpec spec, int threads);
std::unique_ptr<DecoderModel> NewQwen2Model(format::ModelSpec spec, int threads);
std::unique_ptr<DecoderModel> NewQwen2MoeModel(format::ModelSpec spec, int threads);
std::unique_ptr<DecoderModel> NewQwen3Model(format::ModelSpec spec, int threads);
std::unique_ptr<DecoderModel> NewQwen3MoeModel(format::ModelSpec spec, int threads);
std::unique_ptr<DecoderModel> NewOlmoeModel(format::ModelSpec spec, int threads);

}  // namespace moert::model

#endif  // MOERT_MODEL_DECODER_H_
