// llama: dense SwiGLU layers, or Mixtral-style routed experts (softmax router,
// top-k renormalised) in the same layout; RoPE on adjacent pairs; q/k/v biases when the
// file has them.
#include <memory>
#include <utility>

#include "core/status.h"
#include "model/decoder.h"

namespace moert::model {
namespace {

constexpr AttentionOptions kAttention{format::RopeLayout::kNormal, format::QkNorm::kNone,
                                      /*bias=*/false};

class LlamaModel final : public DecoderModel {
 public:
  LlamaModel(format::ModelSpec spec, int threads) : DecoderModel(std::move(spec), threads) {}

 protected:
  absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) override {
    const int64_t n_embd = spec().n_embd;
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kAttnNorm, layer), n_embd, &w->attn_norm));
    MOERT_RETURN_IF_ERROR(LoadAttention(loader, spec(), layer, kAttention, &w->attn));
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kFfnNorm, layer), n_embd, &w->ffn_norm));
    if (spec().is_moe()) return LoadMoeFfn(loader, spec(), layer, /*shared_expert=*/false, &w->moe);
    return LoadDenseFfn(loader, spec(), layer, &w->ffn);
  }

  void RunLayer(LayerContext& ctx, const LayerWeights& w) override {
    NormInto(ctx, w.attn_norm, ctx.cur);
    RunAttention(ctx, w.attn, kAttention, ctx.cur->data(), ctx.out->data());
    AddResidual(ctx, *ctx.out);
    NormInto(ctx, w.ffn_norm, ctx.cur);
    if (spec().is_moe()) {
      MoeFfn(*ctx.pool, w.moe, ctx.cur->data(), ctx.n_tokens, ctx.out->data());
    } else {
      SwiGluFfn(*ctx.pool, w.ffn, ctx.cur->data(), ctx.n_tokens, ctx.out->data());
    }
    AddResidual(ctx, *ctx.out);
  }
};

}  // namespace

std::unique_ptr<DecoderModel> NewLlamaModel(format::ModelSpec spec, int threads) {
  return std::make_unique<LlamaModel>(std::move(spec), threads);
}

}  // namespace moert::model
