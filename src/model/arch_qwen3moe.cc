// qwen3moe: per-head q/k RMSNorm, NeoX RoPE, routed experts with the top-k weights
// renormalised.
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewQwen3MoeModel(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kPerHead,
                                        /*bias=*/false};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/false);
}

}  // namespace moert::model
