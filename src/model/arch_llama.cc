// llama: dense SwiGLU layers, or Mixtral-style routed experts (softmax router,
// top-k renormalised) in the same layout; RoPE on adjacent pairs; q/k/v biases when the
// file has them.
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewLlamaModel(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNormal, format::QkNorm::kNone,
                                        /*bias=*/false};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/false);
}

}  // namespace moert::model
