// Token sampling: the llama.cpp default chain (penalties, top-k, top-p, min-p,
// temperature, draw) over one logits vector, robust to NaN / inf logits.
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/strings.h"

namespace moert::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Candidate = std::pair<float, int32_t>;

// Higher logit first; the lower id first among equal logits, so every choice the
// sampler makes between tied tokens is deterministic.
bool Before(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

absl::Status OutOfRange(std::string_view field, float value, std::string_view range) {
  return absl::InvalidArgumentError(
      StrCat("SamplerOptions.", field, " = ", value, " is out of range: ", range));
}

// mt19937 takes a 32-bit seed; fold the high half in so that 64-bit seeds differ.
std::mt19937::result_type FoldSeed(uint64_t seed) {
  return static_cast<std::mt19937::result_type>((seed ^ (seed >> 32)) & 0xFFFFFFFFu);
}

}  // namespace

absl::Status ValidateSamplerOptions(const SamplerOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0.0f) {
    return OutOfRange("temperature", options.temperature, "must be finite and >= 0 (0: greedy)");
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return OutOfRange("top_p", options.top_p, "must be in (0, 1] (1: off)");
  }
  if (!(options.min_p >= 0.0f && options.min_p <= 1.0f)) {
    return OutOfRange("min_p", options.min_p, "must be in [0, 1] (0: off)");
  }
  if (!std::isfinite(options.repeat_penalty) || options.repeat_penalty <= 0.0f) {
    return OutOfRange("repeat_penalty", options.repeat_penalty, "must be finite and > 0 (1: off)");
  }
  if (options.repeat_last_n < -1) {
    return absl::InvalidArgumentError(
        StrCat("SamplerOptions.repeat_last_n = ", options.repeat_last_n,
               " is out of range: must be >= -1 (-1: the whole history)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Sampler> Sampler::Create(const SamplerOptions& options) {
  absl::Status status = ValidateSamplerOptions(options);
  if (!status.ok()) return status;
  return Sampler(options);
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(FoldSeed(options.seed)) {}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history) {
  absl::StatusOr<int32_t> token = TrySample(logits, history);
  return token.ok() ? *token : -1;
}

absl::StatusOr<int32_t> Sampler::TrySample(std::span<const float> logits,
                                           std::span<const int32_t> history) {
  absl::Status status = PrepareCandidates(logits, history);
  if (!status.ok()) return status;
  if (options_.temperature <= 0.0f) return candidates_[ArgmaxIndex()].second;

  Truncate();
  const double total = ComputeWeights();
  // The uniform draw is built from the raw 32-bit output, whose sequence the
  // standard fixes, rather than from std::uniform_real_distribution, whose output
  // differs between standard libraries: the same seed gives the same tokens
  // everywhere.
  const double u = static_cast<double>(rng_()) * 0x1p-32 * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cumulative += weights_[i];
    if (u < cumulative) return candidates_[i].second;
  }
  // Rounding left u at or past the last partial sum: the last token with weight.
  for (size_t i = candidates_.size(); i-- > 0;) {
    if (weights_[i] > 0.0) return candidates_[i].second;
  }
  return candidates_[ArgmaxIndex()].second;
}

absl::StatusOr<std::vector<TokenProbability>> Sampler::Distribution(
    std::span<const float> logits, std::span<const int32_t> history) {
  absl::Status status = PrepareCandidates(logits, history);
  if (!status.ok()) return status;
  if (options_.temperature <= 0.0f) {
    return std::vector<TokenProbability>{{candidates_[ArgmaxIndex()].second, 1.0f}};
  }
  Truncate();
  std::sort(candidates_.begin(), candidates_.end(), Before);
  const double total = ComputeWeights();
  std::vector<TokenProbability> out;
  out.reserve(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) {
    out.push_back({candidates_[i].second, static_cast<float>(weights_[i] / total)});
  }
  return out;
}

absl::Status Sampler::PrepareCandidates(std::span<const float> logits,
                                        std::span<const int32_t> history) {
  if (logits.empty()) {
    return absl::InvalidArgumentError("cannot sample from an empty logits vector");
  }
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        StrCat("logits vector of ", logits.size(), " entries exceeds the int32 id range"));
  }
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = std::isnan(logits[i]) ? kNegInf : logits[i];
    candidates_[i] = {logit, static_cast<int32_t>(i)};
  }
  // Indexed by id until here: the penalty looks tokens up directly.
  ApplyRepeatPenalty(history);

  // +inf would turn every softmax into NaN. A +inf token is certain, so the +inf
  // tokens alone stay, as equals. Otherwise -inf tokens (probability 0) go.
  const bool any_pos_inf =
      std::any_of(candidates_.begin(), candidates_.end(),
                  [](const Candidate& c) { return std::isinf(c.first) && c.first > 0; });
  if (any_pos_inf) {
    std::erase_if(candidates_, [](const Candidate& c) { return c.first != -kNegInf; });
    for (Candidate& c : candidates_) c.first = 0.0f;
  } else {
    std::erase_if(candidates_, [](const Candidate& c) { return c.first == kNegInf; });
  }
  if (candidates_.empty()) {
    return absl::InvalidArgumentError(
        StrCat("nothing to sample: all ", logits.size(), " logits are NaN or -inf"));
  }
  return absl::OkStatus();
}

void Sampler::ApplyRepeatPenalty(std::span<const int32_t> history) {
  if (options_.repeat_penalty == 1.0f || options_.repeat_last_n == 0) return;
  size_t window = history.size();
  if (options_.repeat_last_n > 0) {
    window = std::min(window, static_cast<size_t>(options_.repeat_last_n));
  }
  std::span<const int32_t> recent = history.last(window);
  // Each distinct token is penalised once, however often it occurs (llama.cpp).
  penalty_ids_.assign(recent.begin(), recent.end());
  std::sort(penalty_ids_.begin(), penalty_ids_.end());
  penalty_ids_.erase(std::unique(penalty_ids_.begin(), penalty_ids_.end()), penalty_ids_.end());
  for (int32_t id : penalty_ids_) {
    if (id < 0 || static_cast<size_t>(id) >= candidates_.size()) continue;
    float& logit = candidates_[static_cast<size_t>(id)].first;
    // Dividing a negative logit would make the token more likely.
    logit = logit > 0.0f ? logit / options_.repeat_penalty : logit * options_.repeat_penalty;
  }
}

void Sampler::Truncate() {
  const int top_k = options_.top_k;
  if (top_k > 0 && static_cast<size_t>(top_k) < candidates_.size()) {
    std::nth_element(candidates_.begin(), candidates_.begin() + top_k, candidates_.end(), Before);
    candidates_.resize(static_cast<size_t>(top_k));
    // nth_element leaves an order of its own choosing, which differs between
    // standard libraries; sorted, the draw below is the same everywhere.
    std::sort(candidates_.begin(), candidates_.end(), Before);
  }

  // Top-p and min-p each keep a prefix of the candidates sorted by Before (min-p:
  // all tokens with logit >= max + log(min_p); top-p: the shortest prefix whose
  // probability reaches top_p), so applying them in llama.cpp's order keeps the
  // shorter of the two prefixes, whatever the order. Filtering by min-p first
  // means only its survivors need sorting, while top-p's probabilities are still
  // normalised over every candidate top-k left, as in llama.cpp.
  const bool use_top_p = options_.top_p < 1.0f;
  const bool use_min_p = options_.min_p > 0.0f;
  if (!use_top_p && !use_min_p) return;
  const float max_logit = candidates_[ArgmaxIndex()].first;
  double top_p_norm = 0.0;
  if (use_top_p) {
    for (const Candidate& c : candidates_) {
      top_p_norm += std::exp(static_cast<double>(c.first) - max_logit);
    }
  }
  if (use_min_p) {
    const float min_logit = max_logit + std::log(options_.min_p);
    std::erase_if(candidates_, [&](const Candidate& c) { return c.first < min_logit; });
  }
  if (use_top_p) {
    std::sort(candidates_.begin(), candidates_.end(), Before);
    double cumulative = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += std::exp(static_cast<double>(candidates_[i].first) - max_logit) / top_p_norm;
      if (cumulative >= options_.top_p) {
        candidates_.resize(i + 1);
        break;
      }
    }
  }
}

size_t Sampler::ArgmaxIndex() const {
  size_t best = 0;
  for (size_t i = 1; i < candidates_.size(); ++i) {
    if (Before(candidates_[i], candidates_[best])) best = i;
  }
  return best;
}

double Sampler::ComputeWeights() {
  const float max_logit = candidates_[ArgmaxIndex()].first;
  const double temperature = options_.temperature;
  weights_.resize(candidates_.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    // (logit - max) <= 0, so a tiny temperature underflows to 0, never to inf.
    weights_[i] = std::exp((static_cast<double>(candidates_[i].first) - max_logit) / temperature);
    total += weights_[i];
  }
  return total;  // >= 1: the max contributes exp(0)
}

}  // namespace moert::model
