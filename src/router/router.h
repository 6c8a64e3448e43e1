// The hardware-aware router: which experts a token runs in a MoE layer, from the gate
// logits the model computes, adjusted for what the device can afford right now.
//
// Per (layer, token):
//   p        = softmax(logits) over all experts (the architecture's routing weights)
//   score_i  = logit_i - alpha * pressure * (1 - resident_i) + lambda * bias_i
//   chosen   = the k highest scores (ties: the lower index), in descending order;
//              with no adjustment in force (alpha * pressure == 0 or every expert
//              resident, lambda == 0) the k highest p, exactly as model::RouteToken
//   weights  = p of the chosen experts (the unadjusted logits), divided by their sum
//              when the architecture renormalises
//   k        = the model's k less RouterOptions::k_reduction (the degrade policy's), or
//              less one above the thermal limit when that is more (never below 1); with
//              dynamic k, the smallest k in [k_min, that] whose chosen experts' summed
//              p reaches dynamic_k_p
// Slots past a token's k hold expert -1 and weight 0 (dynamic and thermal k).
//
// RoutingOverride::kUniform (moert-bench --routing uniform) replaces the choice: each
// (token, layer) takes k distinct experts drawn uniformly at random, in draw order,
// from a PRNG seeded with routing_seed when the router is made (one stream for the
// router's life: a run of the same calls draws the same experts). It is the worst case
// for an expert pool and the prefetcher: no locality from token to token. The weights
// are p of the drawn experts (renormalised as above); k is computed as above, dynamic k
// over the draw order; the residency penalty and the modality bias do not apply (and
// RouterStats::changed stays 0). The drawn experts are what WantedExperts counts.
//
// pressure = max(pool pressure, device memory pressure) (router/resource_monitor.h).
// With pressure 0, lambda 0, a normal temperature and dynamic k off, the experts and
// weights are bit for bit those of model::RouteToken (the reference path).
#ifndef MOERT_ROUTER_ROUTER_H_
#define MOERT_ROUTER_ROUTER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/config.h"
#include "router/resource_monitor.h"
#include "telemetry/runtime_metrics.h"

namespace moert::router {

// The model metadata key of the modality bias: n_layer * n_expert f32, layer-major
// (moert-pack --modality-bias writes it). Files written before it got this name hold
// it under kLegacyModalityBiasKey, which is still read.
inline constexpr char kModalityBiasKey[] = "moert.modality_bias";
inline constexpr char kLegacyModalityBiasKey[] = "moert.router.modality_bias";

// A modality bias side file: whitespace-separated numbers, layer-major (the count is
// checked against the model by Router::SetModalityBias). NotFound / InvalidArgument
// naming the file and the offending token.
absl::StatusOr<std::vector<float>> ReadModalityBias(const std::string& path);

// Who picks the experts: the model's gate (the default) or a uniform draw (benchmarks).
enum class RoutingOverride { kModel, kUniform };

// "model" / "uniform".
std::string_view RoutingName(RoutingOverride routing);
// The override a name gives; nullopt for any other name.
std::optional<RoutingOverride> ParseRouting(std::string_view name);

struct RouterOptions {
  // The residency penalty's scale in logits (score_i -= alpha * pressure for a
  // non-resident expert); 0: off at any pressure. docs/routing.md says why 1.
  float alpha = 1.0f;
  // Dynamic k: the routing probability the chosen experts must cover, in (0, 1];
  // 0: off (every token gets the model's k).
  float dynamic_k_p = 0;
  int k_min = 1;  // dynamic k's range; k_max 0: the model's k
  int k_max = 0;
  // The modality bias's scale at a request of only image tokens (lambda is this times
  // the request's share of image tokens).
  float modality_lambda = 0;
  // Experts fewer than the model's k (dynamic k's k_max) every token takes, never below
  // 1: the degrade policy's reduce_top_k. The thermal limit's drop of one does not come
  // on top of it (the larger of the two applies). 0: none.
  int k_reduction = 0;
  // kUniform: experts drawn uniformly at random instead of the model's (see the file
  // comment), from a PRNG seeded with routing_seed.
  RoutingOverride routing = RoutingOverride::kModel;
  uint64_t routing_seed = 1;
};

struct RouterStats {
  uint64_t token_layers = 0;  // (token, MoE layer) pairs routed
  uint64_t changed = 0;       // of those, where an adjustment changed the chosen set
  uint64_t experts = 0;       // experts chosen in all (average k = experts / token_layers)
  uint64_t thermal_drops = 0; // token-layers whose k the thermal limit lowered
  // What the last BeginStep read (gauges, not counts): the pressure it routed with, the
  // pool's share of it, and the device readings (ResourceMonitor::MemoryPressure).
  float pressure = 0;
  float pool_pressure = 0;
  DeviceMemoryStats device;

  double average_k() const {
    return token_layers == 0 ? 0.0 : static_cast<double>(experts) / static_cast<double>(token_layers);
  }
  double changed_fraction() const {
    return token_layers == 0 ? 0.0 : static_cast<double>(changed) / static_cast<double>(token_layers);
  }
};

class Router {
 public:
  // `monitor` (may be null: no pressure, no thermal state) must outlive the router.
  // `metrics` (may be null: none published) must outlive the router.
  Router(const kernels::KernelConfig& kernels, const RouterOptions& options, int n_layer,
         int n_expert, ResourceMonitor* monitor, telemetry::Registry* metrics = nullptr);

  // InvalidArgument naming the field for options out of range (alpha < 0 or not
  // finite, dynamic_k_p outside [0, 1], k_min < 1, k_max < k_min when set, a routing
  // that is no RoutingOverride, ...).
  static absl::Status Validate(const RouterOptions& options);

  const RouterOptions& options() const { return options_; }
  // The uniform draw's stream goes on where it was (routing_seed seeds it only when
  // the router is made).
  void set_options(const RouterOptions& options) { options_ = options; }

  // Per-layer modality bias (n_expert values each); empty: none.
  // InvalidArgument when the size is not n_layer * n_expert.
  absl::Status SetModalityBias(std::vector<float> bias);
  bool has_modality_bias() const { return !bias_.empty(); }
  // The share of image tokens in the current request, in [0, 1] (lambda follows it).
  void SetImageShare(float share) { image_share_ = share; }

  // Slots per token Route writes: the model's k, or dynamic k's k_max when larger.
  int slots(int n_used) const;

  // Starts a forward pass (one decode step or prefill micro-batch): the monitor's
  // pressure (pool and device) and temperature are read once here and hold for the
  // whole pass.
  void BeginStep();

  // Routes `n` tokens of `layer`: logits [n][n_expert] in, experts and weights
  // [n][slots(n_used)] out (see the file comment). `resident` (bit e of word e / 64 set:
  // expert e is resident; empty: all resident) feeds the residency penalty.
  void Route(int layer, const float* logits, int64_t n, int n_used, bool renormalize,
             std::span<const uint64_t> resident, int* experts, float* weights);

  // Experts the model would have chosen without adjustments in the last steps, over
  // all layers (the working set the pressure compares with the pool).
  uint64_t WantedExperts(int window_steps) const;

  const RouterStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }
  // What BeginStep read (for stats and tests).
  float pressure() const { return pressure_; }
  bool thermal_throttled() const { return throttled_; }

 private:
  kernels::KernelConfig kernels_;
  RouterOptions options_;
  int n_layer_;
  int n_expert_;
  ResourceMonitor* monitor_;
  std::vector<float> bias_;  // [n_layer][n_expert] or empty
  float image_share_ = 0;
  float pressure_ = 0;
  bool throttled_ = false;
  uint64_t step_ = 0;
  // Last step each (layer, expert) was in an unadjusted choice; 0: never.
  std::vector<uint64_t> wanted_step_;
  RouterStats stats_;
  std::optional<telemetry::RouterMetrics> metrics_;
  // Scratch, n_expert each.
  std::vector<float> p_, score_;
  std::vector<uint32_t> plain_, adjusted_;
  std::vector<bool> in_plain_;
  uint64_t draw_state_;  // the uniform draw's PRNG (splitmix64)
};

}  // namespace moert::router

#endif  // MOERT_ROUTER_ROUTER_H_
