// The layer graph of the decoder-only transformer, written once over backend::Backend:
// token embedding, for each layer the pre-norm attention block (q/k/v projections and
// biases, q/k RMSNorm, RoPE, causal attention over the KV cache, output projection)
// and the FFN block (the dense SwiGLU FFN, or the MoE block, which the MoE scheduler
// owns), then the final norm and the lm head. Architecture differences (RoPE layout,
// q/k norm, biases, the shared expert) come from the architecture table
// (format/arch.cc). The same graph runs on the CPU backend (the reference, bit for bit
// the model's numerics) and on a device.
#ifndef MOERT_MODEL_GRAPH_H_
#define MOERT_MODEL_GRAPH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "backend/backend.h"
#include "backend/device_kv.h"
#include "backend/matrix.h"
#include "backend/scratch.h"
#include "format/arch.h"
#include "format/model_spec.h"
#include "model/embedding.h"
#include "pipeline/moe_scheduler.h"

namespace moert::model {

struct AttentionWeights {
  backend::Matrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;      // empty: no bias
  std::vector<float> q_norm, k_norm;  // empty: no q/k RMSNorm
};

// The weights of one layer; a dense model fills `ffn`, a MoE one `moe`.
struct LayerWeights {
  std::vector<float> attn_norm;
  AttentionWeights attn;
  std::vector<float> ffn_norm;
  backend::FfnWeights ffn;
  pipeline::MoeWeights moe;
  // A MoE layer's dense fallback FFN (moert-pack --dense-fallback), run instead of the
  // routed experts while the model's dense fallback is on; empty when the file has none.
  backend::FfnWeights dense_fallback;
};

// How an architecture's attention differs from llama's (its row of the table).
struct AttentionOptions {
  format::RopeLayout rope = format::RopeLayout::kNormal;
  format::QkNorm qk_norm = format::QkNorm::kNone;
  bool bias = false;  // q/k/v biases: required when true, else loaded when present
};

// What the graph reads of a model (borrowed; the model outlives its graphs).
struct ModelWeights {
  const format::ModelSpec* spec = nullptr;
  const EmbeddingTable* token_embd = nullptr;
  const std::vector<float>* output_norm = nullptr;
  const backend::Matrix* output = nullptr;  // empty: tied to token_embd
  const std::vector<float>* rope_freqs = nullptr;
  const std::vector<LayerWeights>* layers = nullptr;
  AttentionOptions attention;
};

// The KV cache of the sequence a batch extends: the host cache (the whole truth), as
// pointers per layer, and as the CPU buffers that hold it ([layer][capacity][width]).
struct SequenceKv {
  backend::HostKv host;
  backend::Buffer* keys = nullptr;
  backend::Buffer* values = nullptr;
};

// One micro-batch's input: token ids, kEmbeddingToken (model.h: -1) where the next
// row of `embeddings` (n_embd floats) is the position's input.
struct BatchInput {
  std::span<const int32_t> tokens;
  std::span<const float> embeddings;
};

struct GraphOptions {
  pipeline::PooledPlacement placement = pipeline::PooledPlacement::kDevice;
  bool kv_half = false;  // a device backend's KV cache in IEEE half
  // The host cache's element types (model/kv_cache.h); not f32: the CPU only.
  backend::KvType k_type = backend::KvType::kF32;
  backend::KvType v_type = backend::KvType::kF32;
  // Called with each layer's FFN input on a backend that shares the host's memory
  // (ModelLoadOptions::ffn_input_observer); null or empty: none.
  const std::function<void(int layer, int64_t n_tokens, const float* x)>* ffn_input_observer =
      nullptr;
  // True: each MoE layer runs its dense fallback FFN (LayerWeights::dense_fallback)
  // instead of the router and the routed experts (a shared expert still adds); the
  // model sets it between batches. Null: never.
  const bool* dense_fallback = nullptr;
  // Sees each layer's attention and FFN outputs (pipeline/op_observer.h; the MoE
  // scheduler shows the router's and the experts' through MoeServices). Null or empty:
  // none.
  const pipeline::OpObserver* op_observer = nullptr;
};

class LayerGraph {
 public:
  // The model's graph on `backend`. `host`: the CPU backend's graph, which runs what
  // `backend` cannot (null when `backend` is the CPU).
  LayerGraph(backend::Backend& backend, ModelWeights weights, const pipeline::MoeServices* services,
             LayerGraph* host, GraphOptions options);
  ~LayerGraph();
  LayerGraph(const LayerGraph&) = delete;
  LayerGraph& operator=(const LayerGraph&) = delete;

  // Uploads the weights (the CPU borrows the model's). Unimplemented naming the tensor
  // when the backend has no kernels for one; ResourceExhausted when they do not fit.
  absl::Status Init();

  // One micro-batch (checked by the model): its positions pos0 .., their keys and
  // values appended to `kv` (positions below pos0 read from it), logits of rows
  // [first_logit_row, n) to `logits`. Fails only on a device error or a failed expert
  // load.
  absl::Status Forward(const BatchInput& input, int64_t pos0, const SequenceKv& kv,
                       int64_t first_logit_row, float* logits);
  // The host cache `kv_id` changed (another backend wrote it) at positions >= from.
  void Invalidate(uint64_t kv_id, int64_t from);

  backend::Backend& backend() { return b_; }
  pipeline::PooledStats pooled_stats() const { return moe_.pooled_stats(); }
  // Device memory of the uploaded weights (the pool's region not counted) and the KV
  // cache's copy; 0 on the CPU.
  uint64_t weight_bytes() const;
  uint64_t kv_bytes() const;

 private:
  struct Layer;

  absl::Status RunLayer(int il, int64_t n, int64_t pos0, backend::TensorRef x);
  absl::Status RunAttention(int il, int64_t n, int64_t pos0, backend::TensorRef cur,
                            backend::TensorRef out);
  absl::Status RunDenseFfn(int il, int64_t n, backend::TensorRef cur, backend::TensorRef out);
  backend::TensorRef Keys(int il, int64_t pos) const;
  backend::TensorRef Values(int il, int64_t pos) const;
  absl::StatusOr<backend::TensorRef> Scratch(int slot, size_t bytes);
  // Shows `t` (n rows of `width`) to the op observer, when there is one and it can.
  void Observe(int il, pipeline::ObservedOp op, backend::TensorRef t, int64_t n, int64_t width);

  backend::Backend& b_;
  ModelWeights w_;
  GraphOptions options_;
  pipeline::MoeScheduler moe_;
  std::vector<Layer> layers_;
  std::unique_ptr<backend::Buffer> output_norm_, rope_freqs_;
  std::unique_ptr<backend::Weight> lm_head_;
  std::unique_ptr<backend::DeviceKv> device_kv_;  // a device backend's copy of the cache
  const SequenceKv* kv_ = nullptr;                // during Forward
  backend::ScratchBuffers scratch_;
  std::vector<float> staging_;  // embeddings on their way to a device
  uint64_t weight_bytes_ = 0;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_GRAPH_H_
