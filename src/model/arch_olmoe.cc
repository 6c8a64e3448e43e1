// olmoe: RMSNorm over the whole query and key projections (before splitting into
// heads), NeoX RoPE, routed experts with the top-k weights not renormalised.
#include <memory>
#include <utility>

#include "model/decoder.h"

namespace moert::model {

std::unique_ptr<DecoderModel> NewOlmoeModel(format::ModelSpec spec, int threads) {
  constexpr AttentionOptions kAttention{format::RopeLayout::kNeox, format::QkNorm::kFullWidth,
                                        /*bias=*/false};
  return std::make_unique<PreNormDecoderModel>(std::move(spec), threads, kAttention,
                                               /*shared_expert=*/false);
}

}  // namespace moert::model
