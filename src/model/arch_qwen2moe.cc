// qwen2moe: q/k/v biases, NeoX RoPE, routed experts (top-k not renormalised unless
// the file says so) plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewQwen2MoeModel(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kNone,
                                        /*bias=*/true};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/true);
}

}  // namespace moert::model
