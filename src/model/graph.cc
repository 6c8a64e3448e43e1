// The layer graph over backend::Backend (see graph.h).
#include "model/graph.h"
#include "model/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "model/model.h"
#include "telemetry/trace.h"

namespace moert::model {

using backend::Op;
using backend::TensorRef;
using backend::Weight;

namespace {

// Scratch slots of the forward pass, each grown on demand.
enum Slot { kX, kCur, kOut, kQ, kNewK, kNewV, kAttn, kGate, kUp, kLogits, kSlotCount };

std::vector<const pipeline::MoeWeights*> MoeLayers(const ModelWeights& w) {
  std::vector<const pipeline::MoeWeights*> out(w.layers->size(), nullptr);
  if (!w.spec->is_moe()) return out;
  for (size_t il = 0; il < out.size(); ++il) out[il] = &(*w.layers)[il].moe;
  return out;
}

}  // namespace

struct LayerGraph::Layer {
  std::unique_ptr<backend::Buffer> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  std::unique_ptr<Weight> wq, wk, wv, wo;
  // The dense FFN; in a MoE layer, its dense fallback FFN (null when it has none).
  std::unique_ptr<Weight> gate, up, down;
};

LayerGraph::LayerGraph(backend::Backend& backend, ModelWeights weights,
                       const pipeline::MoeServices* services, LayerGraph* host,
                       GraphOptions options)
    : b_(backend),
      w_(weights),
      options_(options),
      moe_(backend, MoeLayers(weights), services, host != nullptr ? &host->moe_ : nullptr,
           options.placement),
      scratch_(backend, kSlotCount) {}

LayerGraph::~LayerGraph() = default;

absl::StatusOr<TensorRef> LayerGraph::Scratch(int slot, size_t bytes) {
  return scratch_.Get(slot, bytes);
}

absl::Status LayerGraph::Init() {
  const format::ModelSpec& spec = *w_.spec;
  weight_bytes_ = 0;
  const bool device = !b_.host_memory();
  const auto vec = [&](const std::vector<float>& v, std::unique_ptr<backend::Buffer>* out) -> absl::Status {
    if (v.empty()) return absl::OkStatus();
    if (device) {
      MOERT_ASSIGN_OR_RETURN(*out, b_.UploadFloats(v));
      weight_bytes_ += (*out)->size();
    } else {
      // The CPU reads the model's own copy.
      MOERT_ASSIGN_OR_RETURN(*out, b_.WrapHost(const_cast<float*>(v.data()), v.size() * 4));
    }
    return absl::OkStatus();
  };
  const auto mat = [&](const backend::Matrix& m, const std::string& name,
                       std::unique_ptr<Weight>* out) -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(*out, b_.UploadWeight(m, 1, name));
    weight_bytes_ += (*out)->device_bytes();
    return absl::OkStatus();
  };
  MOERT_RETURN_IF_ERROR(vec(*w_.output_norm, &output_norm_));
  MOERT_RETURN_IF_ERROR(vec(*w_.rope_freqs, &rope_freqs_));
  const bool tied = w_.output->empty();
  MOERT_RETURN_IF_ERROR(mat(tied ? w_.token_embd->dense() : *w_.output,
                            tied ? "token_embd.weight" : "output.weight", &lm_head_));
  layers_.clear();
  layers_.resize(w_.layers->size());
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerWeights& w = (*w_.layers)[il];
    Layer& l = layers_[il];
    const std::string blk = StrCat("blk.", il, ".");
    MOERT_RETURN_IF_ERROR(vec(w.attn_norm, &l.attn_norm));
    MOERT_RETURN_IF_ERROR(vec(w.ffn_norm, &l.ffn_norm));
    MOERT_RETURN_IF_ERROR(vec(w.attn.bq, &l.bq));
    MOERT_RETURN_IF_ERROR(vec(w.attn.bk, &l.bk));
    MOERT_RETURN_IF_ERROR(vec(w.attn.bv, &l.bv));
    MOERT_RETURN_IF_ERROR(vec(w.attn.q_norm, &l.q_norm));
    MOERT_RETURN_IF_ERROR(vec(w.attn.k_norm, &l.k_norm));
    MOERT_RETURN_IF_ERROR(mat(w.attn.wq, blk + "attn_q.weight", &l.wq));
    MOERT_RETURN_IF_ERROR(mat(w.attn.wk, blk + "attn_k.weight", &l.wk));
    MOERT_RETURN_IF_ERROR(mat(w.attn.wv, blk + "attn_v.weight", &l.wv));
    MOERT_RETURN_IF_ERROR(mat(w.attn.wo, blk + "attn_output.weight", &l.wo));
    const bool fallback = spec.is_moe() && !w.dense_fallback.gate.empty();
    if (!spec.is_moe() || fallback) {
      using format::TensorKind;
      const int layer = static_cast<int>(il);
      const backend::FfnWeights& ffn = fallback ? w.dense_fallback : w.ffn;
      const auto name = [&](TensorKind dense, TensorKind moe) {
        return format::TensorWeightName(fallback ? moe : dense, layer);
      };
      MOERT_RETURN_IF_ERROR(
          mat(ffn.gate, name(TensorKind::kFfnGate, TensorKind::kFfnGateDenseFallback), &l.gate));
      MOERT_RETURN_IF_ERROR(
          mat(ffn.up, name(TensorKind::kFfnUp, TensorKind::kFfnUpDenseFallback), &l.up));
      MOERT_RETURN_IF_ERROR(
          mat(ffn.down, name(TensorKind::kFfnDown, TensorKind::kFfnDownDenseFallback), &l.down));
    }
  }
  MOERT_RETURN_IF_ERROR(moe_.Init());
  if (device) {
    device_kv_ = std::make_unique<backend::DeviceKv>(b_, static_cast<int>(spec.n_layer),
                                                     KeyWidth(spec), ValueWidth(spec),
                                                     options_.kv_half);
  }
  return b_.Finish();
}

uint64_t LayerGraph::weight_bytes() const { return weight_bytes_ + moe_.weight_bytes(); }

uint64_t LayerGraph::kv_bytes() const { return device_kv_ != nullptr ? device_kv_->bytes() : 0; }

void LayerGraph::Invalidate(uint64_t kv_id, int64_t from) {
  if (device_kv_ != nullptr) device_kv_->Invalidate(kv_id, from);
}

TensorRef LayerGraph::Keys(int il, int64_t pos) const {
  if (device_kv_ != nullptr) return device_kv_->keys(il, pos);
  const size_t row = KvRowSize(options_.k_type, KeyWidth(*w_.spec));
  return TensorRef(kv_->keys, static_cast<size_t>(int64_t{il} * kv_->host.capacity + pos) * row);
}

TensorRef LayerGraph::Values(int il, int64_t pos) const {
  if (device_kv_ != nullptr) return device_kv_->values(il, pos);
  const size_t row = KvRowSize(options_.v_type, ValueWidth(*w_.spec));
  return TensorRef(kv_->values, static_cast<size_t>(int64_t{il} * kv_->host.capacity + pos) * row);
}

absl::Status LayerGraph::Forward(const BatchInput& input, int64_t pos0, const SequenceKv& kv,
                                 int64_t first_logit_row, float* logits) {
  const format::ModelSpec& spec = *w_.spec;
  const std::span<const int32_t> tokens = input.tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t e = spec.n_embd;
  MOERT_TRACE_SCOPE_ARG("forward", "tokens", n);
  kv_ = &kv;
  if (device_kv_ != nullptr) MOERT_RETURN_IF_ERROR(device_kv_->Bind(kv.host, pos0));
  // The token embeddings, looked up on the host, and the caller's rows.
  MOERT_ASSIGN_OR_RETURN(TensorRef x, Scratch(kX, static_cast<size_t>(n * e) * 4));
  staging_.resize(static_cast<size_t>(n * e));
  const float* given = input.embeddings.data();
  for (int64_t t = 0; t < n; ++t) {
    const int32_t token = tokens[static_cast<size_t>(t)];
    float* row = staging_.data() + t * e;
    if (token == kEmbeddingToken) {
      std::copy(given, given + e, row);
      given += e;
    } else {
      w_.token_embd->Row(token, row);
    }
  }
  MOERT_RETURN_IF_ERROR(b_.Write(x, staging_.data(), staging_.size() * 4));
  for (int il = 0; il < static_cast<int>(spec.n_layer); ++il) {
    MOERT_RETURN_IF_ERROR(RunLayer(il, n, pos0, x));
  }
  if (first_logit_row < n) {
    MOERT_TRACE_SCOPE("lm head");
    const int64_t rows = n - first_logit_row;
    const size_t bytes = static_cast<size_t>(rows * spec.n_vocab) * 4;
    MOERT_ASSIGN_OR_RETURN(TensorRef cur, Scratch(kCur, static_cast<size_t>(n * e) * 4));
    MOERT_RETURN_IF_ERROR(b_.RmsNorm(x.At(static_cast<size_t>(first_logit_row * e) * 4), rows, e,
                                     TensorRef(output_norm_), spec.rms_eps, cur));
    if (b_.host_memory()) {
      // Straight into the caller's logits.
      MOERT_ASSIGN_OR_RETURN(std::unique_ptr<backend::Buffer> out, b_.WrapHost(logits, bytes));
      MOERT_RETURN_IF_ERROR(b_.MatMul(*lm_head_, 0, cur, rows, TensorRef(out)));
    } else {
      MOERT_ASSIGN_OR_RETURN(TensorRef out, Scratch(kLogits, bytes));
      MOERT_RETURN_IF_ERROR(b_.MatMul(*lm_head_, 0, cur, rows, out));
      MOERT_RETURN_IF_ERROR(b_.Read(out, logits, bytes));
    }
  }
  if (device_kv_ != nullptr) {
    // The new keys and values back to the host cache.
    MOERT_RETURN_IF_ERROR(device_kv_->Commit(kv.host, pos0, n));
  }
  return b_.Finish();
}

absl::Status LayerGraph::RunLayer(int il, int64_t n, int64_t pos0, TensorRef x) {
  MOERT_TRACE_SCOPE_ARG("layer", "layer", il);
  const format::ModelSpec& spec = *w_.spec;
  const Layer& l = layers_[static_cast<size_t>(il)];
  const int64_t e = spec.n_embd;
  MOERT_ASSIGN_OR_RETURN(TensorRef cur, Scratch(kCur, static_cast<size_t>(n * e) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef out, Scratch(kOut, static_cast<size_t>(n * e) * 4));
  MOERT_RETURN_IF_ERROR(b_.RmsNorm(x, n, e, TensorRef(l.attn_norm), spec.rms_eps, cur));
  MOERT_RETURN_IF_ERROR(RunAttention(il, n, pos0, cur, out));
  Observe(il, pipeline::ObservedOp::kAttention, out, n, e);
  MOERT_RETURN_IF_ERROR(b_.Add(x, out, n * e));
  MOERT_RETURN_IF_ERROR(b_.RmsNorm(x, n, e, TensorRef(l.ffn_norm), spec.rms_eps, cur));
  if (options_.ffn_input_observer != nullptr && *options_.ffn_input_observer &&
      b_.host_memory()) {
    (*options_.ffn_input_observer)(il, n,
                                   reinterpret_cast<const float*>(cur.buffer->host() + cur.offset));
  }
  if (!spec.is_moe()) {
    MOERT_RETURN_IF_ERROR(RunDenseFfn(il, n, cur, out));
  } else if (options_.dense_fallback != nullptr && *options_.dense_fallback && l.gate != nullptr) {
    // The degraded mode: no router, no expert loads.
    MOERT_RETURN_IF_ERROR(RunDenseFfn(il, n, cur, out));
    MOERT_RETURN_IF_ERROR(moe_.AddSharedExpert(il, cur, n, out));
  } else {
    MOERT_RETURN_IF_ERROR(moe_.Run(il, cur, n, out));
  }
  Observe(il, pipeline::ObservedOp::kFfn, out, n, e);
  return b_.Add(x, out, n * e);
}

void LayerGraph::Observe(int il, pipeline::ObservedOp op, TensorRef t, int64_t n, int64_t width) {
  const pipeline::OpObserver* observer = options_.op_observer;
  if (observer == nullptr || !*observer || !b_.host_memory()) return;
  // The CPU backend's ops are done when they return; Finish is a no-op there.
  (void)b_.Finish();
  observer->fn({il, op, -1, -1, n, width, reinterpret_cast<float*>(t.buffer->host() + t.offset)});
}

absl::Status LayerGraph::RunAttention(int il, int64_t n, int64_t pos0, TensorRef cur,
                                      TensorRef out) {
  MOERT_TRACE_SCOPE("attention");
  const format::ModelSpec& spec = *w_.spec;
  const Layer& l = layers_[static_cast<size_t>(il)];
  const int n_head = static_cast<int>(spec.n_head);
  const int n_head_kv = static_cast<int>(spec.n_head_kv);
  const int dk = static_cast<int>(spec.head_dim_k);
  const int64_t q_width = int64_t{n_head} * dk;
  const int64_t kw = KeyWidth(spec), vw = ValueWidth(spec);
  const bool half = device_kv_ != nullptr && device_kv_->half();
  const bool typed = device_kv_ == nullptr && (options_.k_type != backend::KvType::kF32 ||
                                               options_.v_type != backend::KvType::kF32);
  MOERT_ASSIGN_OR_RETURN(TensorRef q, Scratch(kQ, static_cast<size_t>(n * q_width) * 4));
  // The new rows' place in the cache: k and v are projected there (a half or typed
  // cache: into scratch, then converted into it once RoPE'd).
  const TensorRef k_rows = Keys(il, pos0), v_rows = Values(il, pos0);
  TensorRef k = k_rows, v = v_rows;
  if (half || typed) {
    MOERT_ASSIGN_OR_RETURN(k, Scratch(kNewK, static_cast<size_t>(n * kw) * 4));
    MOERT_ASSIGN_OR_RETURN(v, Scratch(kNewV, static_cast<size_t>(n * vw) * 4));
  }
  const backend::MatMulArgs qkv[3] = {
      {l.wq.get(), 0, cur, n, q}, {l.wk.get(), 0, cur, n, k}, {l.wv.get(), 0, cur, n, v}};
  MOERT_RETURN_IF_ERROR(b_.MatMuls(qkv));
  if (l.bq != nullptr) MOERT_RETURN_IF_ERROR(b_.AddBias(q, TensorRef(l.bq), n, q_width));
  if (l.bk != nullptr) MOERT_RETURN_IF_ERROR(b_.AddBias(k, TensorRef(l.bk), n, kw));
  if (l.bv != nullptr) MOERT_RETURN_IF_ERROR(b_.AddBias(v, TensorRef(l.bv), n, vw));
  const float eps = spec.rms_eps;
  if (w_.attention.qk_norm == format::QkNorm::kPerHead) {
    MOERT_RETURN_IF_ERROR(b_.RmsNorm(q, n * n_head, dk, TensorRef(l.q_norm), eps, q));
    MOERT_RETURN_IF_ERROR(b_.RmsNorm(k, n * n_head_kv, dk, TensorRef(l.k_norm), eps, k));
  } else if (w_.attention.qk_norm == format::QkNorm::kFullWidth) {
    MOERT_RETURN_IF_ERROR(b_.RmsNorm(q, n, q_width, TensorRef(l.q_norm), eps, q));
    MOERT_RETURN_IF_ERROR(b_.RmsNorm(k, n, kw, TensorRef(l.k_norm), eps, k));
  }
  backend::RopeArgs rope;
  rope.neox = w_.attention.rope == format::RopeLayout::kNeox;
  rope.n_rot = static_cast<int>(spec.n_rot);
  rope.theta_base = spec.rope_theta;
  rope.freq_scale =
      spec.rope_scaling == format::RopeScaling::kLinear ? 1.0f / spec.rope_scaling_factor : 1.0f;
  rope.freq_factors = TensorRef(rope_freqs_);
  MOERT_RETURN_IF_ERROR(b_.Rope(rope, pos0, n, n_head, dk, q));
  MOERT_RETURN_IF_ERROR(b_.Rope(rope, pos0, n, n_head_kv, dk, k));
  if (half) {
    MOERT_RETURN_IF_ERROR(b_.StoreHalf(k, n * kw, k_rows));
    MOERT_RETURN_IF_ERROR(b_.StoreHalf(v, n * vw, v_rows));
  } else if (typed) {
    MOERT_RETURN_IF_ERROR(b_.StoreKv(options_.k_type, k, n, kw, k_rows));
    MOERT_RETURN_IF_ERROR(b_.StoreKv(options_.v_type, v, n, vw, v_rows));
  }
  backend::AttentionArgs shape;
  shape.n_head = n_head;
  shape.n_head_kv = n_head_kv;
  shape.head_dim_k = dk;
  shape.head_dim_v = static_cast<int>(spec.head_dim_v);
  shape.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  shape.kv_half = half;
  if (typed) {
    shape.k_type = options_.k_type;
    shape.v_type = options_.v_type;
  }
  MOERT_ASSIGN_OR_RETURN(TensorRef attn,
                         Scratch(kAttn, static_cast<size_t>(n * n_head * shape.head_dim_v) * 4));
  MOERT_RETURN_IF_ERROR(
      b_.Attention(shape, q, n, pos0, Keys(il, 0), Values(il, 0), attn));
  return b_.MatMul(*l.wo, 0, attn, n, out);
}

absl::Status LayerGraph::RunDenseFfn(int il, int64_t n, TensorRef cur, TensorRef out) {
  MOERT_TRACE_SCOPE("ffn");
  const Layer& l = layers_[static_cast<size_t>(il)];
  if (l.gate->type() == l.up->type() && l.gate->type() == l.down->type() &&
      b_.Supports(Op::kFusedMoe, l.gate->type())) {
    backend::Experts ffn;
    ffn.gate = l.gate.get();
    ffn.up = l.up.get();
    ffn.down = l.down.get();
    ffn.n_expert = 1;
    return b_.FusedMoe(ffn, cur, n, 1, TensorRef(), TensorRef(), out);
  }
  const int64_t ff = l.gate->rows();
  MOERT_ASSIGN_OR_RETURN(TensorRef g, Scratch(kGate, static_cast<size_t>(n * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef u, Scratch(kUp, static_cast<size_t>(n * ff) * 4));
  const backend::MatMulArgs jobs[2] = {{l.gate.get(), 0, cur, n, g}, {l.up.get(), 0, cur, n, u}};
  MOERT_RETURN_IF_ERROR(b_.MatMuls(jobs));
  MOERT_RETURN_IF_ERROR(b_.SiluMul(g, u, n * ff));
  return b_.MatMul(*l.down, 0, g, n, out);
}

}  // namespace moert::model
