// qwen2: dense SwiGLU layers, q/k/v biases, NeoX RoPE.
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewQwen2Model(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kNone,
                                        /*bias=*/true};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/false);
}

}  // namespace moert::model
