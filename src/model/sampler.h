// Token sampling over a logits vector: repetition penalty, top-k, top-p, min-p,
// temperature, seeded RNG; temperature 0 is greedy (argmax), as in llama.cpp.
#ifndef MOERT_MODEL_SAMPLER_H_
#define MOERT_MODEL_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::model {

struct SamplerOptions {
  float temperature = 0.8f;     // <= 0: greedy
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // 1: off
  float min_p = 0.05f;          // 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;       // how many recent tokens the penalty looks at
                                // (0: none, -1: the whole history)
  uint64_t seed = 0xFFFFFFFF;   // the RNG seed (same seed, same tokens); unlike
                                // llama.cpp, no value means "random"
};

// InvalidArgument naming the field for out-of-range values (negative temperature,
// top_p outside (0, 1], min_p outside [0, 1], repeat_penalty <= 0, ...).
absl::Status ValidateSamplerOptions(const SamplerOptions& options);

// One token of the distribution a Sampler draws from.
struct TokenProbability {
  int32_t id;
  float probability;
};

// Applies, in llama.cpp's default chain order: repetition penalty over the last
// repeat_last_n tokens of the history, top-k, top-p, min-p (top-p and min-p see the
// probabilities at temperature 1), temperature, then one draw from std::mt19937.
// NaN logits count as -inf. A +inf logit is certain: only the +inf tokens stay
// candidates, equally likely. With no logit above -inf there is nothing to sample.
class Sampler {
 public:
  static absl::StatusOr<Sampler> Create(const SamplerOptions& options);

  // Picks the next token from `logits` given the tokens so far (for the penalty).
  // -1 where TrySample gives an error (empty logits, or every logit NaN or -inf).
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history);

  // Sample with the reason for a failure: InvalidArgument for empty logits or when
  // every logit is NaN or -inf.
  absl::StatusOr<int32_t> TrySample(std::span<const float> logits,
                                    std::span<const int32_t> history);

  // The distribution Sample would draw from, without drawing (the RNG is untouched):
  // the surviving candidates and their probabilities, most likely first (ties: lower
  // id first). Greedy gives the argmax alone with probability 1. For tests and
  // diagnostics (log-probabilities, "why this token").
  absl::StatusOr<std::vector<TokenProbability>> Distribution(std::span<const float> logits,
                                                             std::span<const int32_t> history);

  const SamplerOptions& options() const { return options_; }

 private:
  explicit Sampler(const SamplerOptions& options);

  // Fills candidates_ with the finite (or +inf, see above) penalised logits.
  absl::Status PrepareCandidates(std::span<const float> logits, std::span<const int32_t> history);
  void ApplyRepeatPenalty(std::span<const int32_t> history);
  // Top-k, top-p and min-p on candidates_ (never leaves it empty).
  void Truncate();
  // Index in candidates_ of the highest logit, lowest id among ties.
  size_t ArgmaxIndex() const;
  // exp((logit - max) / temperature) for every candidate, into weights_.
  double ComputeWeights();

  SamplerOptions options_;
  std::mt19937 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (logit, id)
  std::vector<int32_t> penalty_ids_;                   // scratch: distinct recent ids
  std::vector<double> weights_;                        // scratch
};

}  // namespace moert::model

#endif  // MOERT_MODEL_SAMPLER_H_
