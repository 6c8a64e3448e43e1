// qwen3moe: per-head q/k RMSNorm, NeoX RoPE, routed experts with the top-k weights
// renormalised.
#include <memory>
#include <utility>

#include "core/status.h"
#include "model/decoder.h"

namespace moert::model {
namespace {

constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kPerHead,
                                      /*bias=*/false};

class Qwen3MoeModel final : public DecoderModel {
 public:
  Qwen3MoeModel(format::ModelSpec spec, int threads) : DecoderModel(std::move(spec), threads) {}

 protected:
  absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) override {
    const int64_t n_embd = spec().n_embd;
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kAttnNorm, layer), n_embd, &w->attn_norm));
    MOERT_RETURN_IF_ERROR(LoadAttention(loader, spec(), layer, kAttention, &w->attn));
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kFfnNorm, layer), n_embd, &w->ffn_norm));
    return LoadMoeFfn(loader, spec(), layer, /*shared_expert=*/false, &w->moe);
  }

  void RunLayer(LayerContext& ctx, const LayerWeights& w) override {
    NormInto(ctx, w.attn_norm, ctx.cur);
    RunAttention(ctx, w.attn, kAttention, ctx.cur->data(), ctx.out->data());
    AddResidual(ctx, *ctx.out);
    NormInto(ctx, w.ffn_norm, ctx.cur);
    MoeFfn(*ctx.pool, w.moe, ctx.cur->data(), ctx.n_tokens, ctx.out->data());
    AddResidual(ctx, *ctx.out);
  }
};

}  // namespace

std::unique_ptr<DecoderModel> NewQwen3MoeModel(format::ModelSpec spec, int threads) {
  return std::make_unique<Qwen3MoeModel>(std::move(spec), threads);
}

}  // namespace moert::model
