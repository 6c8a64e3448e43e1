// The modality bias from routing statistics: how often each layer's router chose each
// expert for image tokens and for text tokens over calibration inputs, turned into the
// per-expert logit offset the router adds at lambda * bias (router/router.h). moert-pack
// --modality-bias computes it and stores it in the model as `moert.modality_bias`.
//
//   f_m[l][e] = (chosen_m[l][e] + 1) / (slots_m[l] + n_expert)    (Laplace-smoothed)
//   bias[l][e] = clamp(ln(f_image[l][e] / f_text[l][e]), -clip, clip)
//
// ln of the frequency ratio: added to the gate logits at lambda 1, it moves the
// softmax's preference from the experts text tokens use toward those image tokens use
// (for a logit-linear router, by the log-ratio of their shares), and it is 0 for an
// expert both modalities use alike.
#ifndef MOERT_ROUTER_MODALITY_BIAS_H_
#define MOERT_ROUTER_MODALITY_BIAS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::router {

class ModalityBiasEstimator {
 public:
  ModalityBiasEstimator(int n_layer, int n_expert);

  // One layer's routing of n tokens: experts [n][slots] (-1: an unused slot), image[t]
  // non-zero where token t is an image position. Out-of-range layers and experts are
  // ignored.
  void Observe(int layer, int64_t n, int slots, const int* experts,
               std::span<const uint8_t> image);

  // n_layer * n_expert values, layer-major. FailedPrecondition naming the modality
  // when no token of it was observed; InvalidArgument for clip <= 0.
  absl::StatusOr<std::vector<float>> Bias(float clip = 4.0f) const;

  // Token-layers observed per modality.
  uint64_t image_token_layers() const { return image_tokens_; }
  uint64_t text_token_layers() const { return text_tokens_; }

 private:
  int n_layer_;
  int n_expert_;
  // [modality][layer][expert] choices and [modality][layer] slots used.
  std::vector<uint64_t> chosen_[2];
  std::vector<uint64_t> slots_[2];
  uint64_t image_tokens_ = 0;
  uint64_t text_tokens_ = 0;
};

// The bias as moert-pack prints it: one line per layer, the experts' values.
std::vector<std::vector<float>> BiasRows(const std::vector<float>& bias, int n_expert);

}  // namespace moert::router

#endif  // MOERT_ROUTER_MODALITY_BIAS_H_
