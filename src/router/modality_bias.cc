// The modality bias from routing statistics (see modality_bias.h).
#include "router/modality_bias.h"

#include <algorithm>
#include <cmath>

#include "core/strings.h"

namespace moert::router {

ModalityBiasEstimator::ModalityBiasEstimator(int n_layer, int n_expert)
    : n_layer_(std::max(0, n_layer)), n_expert_(std::max(0, n_expert)) {
  for (int m = 0; m < 2; ++m) {
    chosen_[m].assign(static_cast<size_t>(n_layer_) * static_cast<size_t>(n_expert_), 0);
    slots_[m].assign(static_cast<size_t>(n_layer_), 0);
  }
}

void ModalityBiasEstimator::Observe(int layer, int64_t n, int slots, const int* experts,
                                    std::span<const uint8_t> image) {
  if (layer < 0 || layer >= n_layer_ || experts == nullptr || slots < 1) return;
  const int64_t count = std::min<int64_t>(n, static_cast<int64_t>(image.size()));
  for (int64_t t = 0; t < count; ++t) {
    const int m = image[static_cast<size_t>(t)] != 0 ? 1 : 0;
    (m == 1 ? image_tokens_ : text_tokens_) += 1;
    for (int s = 0; s < slots; ++s) {
      const int e = experts[t * slots + s];
      if (e < 0 || e >= n_expert_) continue;
      ++chosen_[m][static_cast<size_t>(layer) * static_cast<size_t>(n_expert_) +
                   static_cast<size_t>(e)];
      ++slots_[m][static_cast<size_t>(layer)];
    }
  }
}

absl::StatusOr<std::vector<float>> ModalityBiasEstimator::Bias(float clip) const {
  if (!(clip > 0)) return absl::InvalidArgumentError(StrCat("clip must be > 0, got ", clip));
  if (image_tokens_ == 0 || text_tokens_ == 0) {
    return absl::FailedPreconditionError(StrCat(
        "the modality bias needs routing statistics of both modalities; no ",
        image_tokens_ == 0 ? "image" : "text", " token was routed (give ",
        image_tokens_ == 0 ? "calibration images" : "a calibration text", ")"));
  }
  std::vector<float> bias(chosen_[0].size());
  for (int l = 0; l < n_layer_; ++l) {
    for (int e = 0; e < n_expert_; ++e) {
      const size_t i = static_cast<size_t>(l) * static_cast<size_t>(n_expert_) +
                       static_cast<size_t>(e);
      const auto freq = [&](int m) {
        return (static_cast<double>(chosen_[m][i]) + 1.0) /
               (static_cast<double>(slots_[m][static_cast<size_t>(l)]) + n_expert_);
      };
      const double b = std::log(freq(1) / freq(0));
      bias[i] = static_cast<float>(std::clamp(b, -static_cast<double>(clip),
                                              static_cast<double>(clip)));
    }
  }
  return bias;
}

std::vector<std::vector<float>> BiasRows(const std::vector<float>& bias, int n_expert) {
  std::vector<std::vector<float>> rows;
  if (n_expert < 1) return rows;
  for (size_t i = 0; i + static_cast<size_t>(n_expert) <= bias.size();
       i += static_cast<size_t>(n_expert)) {
    rows.emplace_back(bias.begin() + static_cast<std::ptrdiff_t>(i),
                      bias.begin() + static_cast<std::ptrdiff_t>(i + static_cast<size_t>(n_expert)));
  }
  return rows;
}

}  // namespace moert::router
