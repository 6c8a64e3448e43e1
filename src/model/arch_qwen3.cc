// qwen3: dense SwiGLU layers, RMSNorm of each query and key head before NeoX RoPE.
#include <memory>
#include <utility>

#include "core/status.h"
#include "model/decoder.h"

namespace moert::model {
namespace {

constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kPerHead,
                                      /*bias=*/false};

class Qwen3Model final : public DecoderModel {
 public:
  Qwen3Model(format::ModelSpec spec, int threads) : DecoderModel(std::move(spec), threads) {}

 protected:
  absl::Status LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) override {
    const int64_t n_embd = spec().n_embd;
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kAttnNorm, layer), n_embd, &w->attn_norm));
    MOERT_RETURN_IF_ERROR(LoadAttention(loader, spec(), layer, kAttention, &w->attn));
    MOERT_RETURN_IF_ERROR(loader.LoadVector(
        format::TensorWeightName(format::TensorKind::kFfnNorm, layer), n_embd, &w->ffn_norm));
    return LoadDenseFfn(loader, spec(), layer, &w->ffn);
  }

  void RunLayer(LayerContext& ctx, const LayerWeights& w) override {
    NormInto(ctx, w.attn_norm, ctx.cur);
    RunAttention(ctx, w.attn, kAttention, ctx.cur->data(), ctx.out->data());
    AddResidual(ctx, *ctx.out);
    NormInto(ctx, w.ffn_norm, ctx.cur);
    SwiGluFfn(*ctx.pool, w.ffn, ctx.cur->data(), ctx.n_tokens, ctx.out->data());
    AddResidual(ctx, *ctx.out);
  }
};

}  // namespace

std::unique_ptr<DecoderModel> NewQwen3Model(format::ModelSpec spec, int threads) {
  return std::make_unique<Qwen3Model>(std::move(spec), threads);
}

}  // namespace moert::model
