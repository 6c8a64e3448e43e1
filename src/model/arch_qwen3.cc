// qwen3: dense SwiGLU layers, RMSNorm of each query and key head before NeoX RoPE.
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewQwen3Model(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kPerHead,
                                        /*bias=*/false};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/false);
}

}  // namespace moert::model
