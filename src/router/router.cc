// The hardware-aware router (see router.h).
#include "router/router.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <utility>

#include "core/strings.h"

namespace moert::router {
namespace {

// The k largest of x[0, n) in descending order, ties to the lower index: the top-k
// microkernel, or a partial sort past its largest n.
void TopK(const kernels::KernelConfig& config, int n, const float* x, int k, uint32_t* out) {
  if (n <= MOERT_TOPK_MAX_N && config.topk.topk != nullptr) {
    config.topk.topk(static_cast<size_t>(n), x, static_cast<size_t>(k), out);
    return;
  }
  std::vector<uint32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0u);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](uint32_t a, uint32_t b) {
    return x[a] > x[b] || (x[a] == x[b] && a < b);
  });
  std::copy(order.begin(), order.begin() + k, out);
}

bool IsResident(std::span<const uint64_t> resident, uint32_t e) {
  return resident.empty() || ((resident[e / 64] >> (e % 64)) & 1u) != 0;
}

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit counter through a mixing function;
// every seed, 0 included, starts a full-period stream.
uint64_t NextRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

// Uniform in [0, n): draws at or past the largest multiple of n are drawn again, so
// no value is likelier than another.
uint32_t RandomBelow(uint64_t* state, uint32_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x = NextRandom(state);
  while (x >= limit) x = NextRandom(state);
  return static_cast<uint32_t>(x % n);
}

// k distinct experts of n, uniformly, into out[0, k) (out holds n): the first k steps
// of a Fisher-Yates shuffle.
void DrawUniform(uint64_t* state, uint32_t n, int k, uint32_t* out) {
  std::iota(out, out + n, 0u);
  for (uint32_t i = 0; i < static_cast<uint32_t>(k); ++i) {
    std::swap(out[i], out[i + RandomBelow(state, n - i)]);
  }
}

}  // namespace

std::string_view RoutingName(RoutingOverride routing) {
  switch (routing) {
    case RoutingOverride::kModel:
      return "model";
    case RoutingOverride::kUniform:
      return "uniform";
  }
  return "unknown";
}

std::optional<RoutingOverride> ParseRouting(std::string_view name) {
  for (RoutingOverride r : {RoutingOverride::kModel, RoutingOverride::kUniform}) {
    if (name == RoutingName(r)) return r;
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<float>> ReadModalityBias(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("cannot open modality bias file ", path));
  std::vector<float> bias;
  std::string token;
  while (in >> token) {
    char* end = nullptr;
    const float v = std::strtof(token.c_str(), &end);
    if (end == token.c_str() || *end != '\0' || !std::isfinite(v)) {
      return absl::InvalidArgumentError(StrCat(path, ": value ", bias.size() + 1, " ('", token,
                                               "') is not a finite number"));
    }
    bias.push_back(v);
  }
  if (bias.empty()) return absl::InvalidArgumentError(StrCat(path, ": no values"));
  return bias;
}

Router::Router(const kernels::KernelConfig& kernels, const RouterOptions& options, int n_layer,
               int n_expert, ResourceMonitor* monitor, telemetry::Registry* metrics)
    : kernels_(kernels),
      options_(options),
      n_layer_(n_layer),
      n_expert_(n_expert),
      monitor_(monitor),
      wanted_step_(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert), 0),
      p_(static_cast<size_t>(n_expert)),
      score_(static_cast<size_t>(n_expert)),
      plain_(static_cast<size_t>(n_expert)),
      adjusted_(static_cast<size_t>(n_expert)),
      in_plain_(static_cast<size_t>(n_expert)),
      draw_state_(options.routing_seed) {
  if (metrics != nullptr) metrics_.emplace(*metrics);
}

absl::Status Router::Validate(const RouterOptions& options) {
  if (!(options.alpha >= 0) || !std::isfinite(options.alpha)) {
    return absl::InvalidArgumentError(
        StrCat("router alpha must be a finite number >= 0, got ", options.alpha));
  }
  if (!(options.dynamic_k_p >= 0 && options.dynamic_k_p <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("dynamic k probability must be in [0, 1] (0: off), got ", options.dynamic_k_p));
  }
  if (options.k_min < 1) {
    return absl::InvalidArgumentError(StrCat("dynamic k_min must be >= 1, got ", options.k_min));
  }
  if (options.k_max != 0 && options.k_max < options.k_min) {
    return absl::InvalidArgumentError(StrCat("dynamic k_max (", options.k_max,
                                             ") must be 0 (the model's k) or >= k_min (",
                                             options.k_min, ")"));
  }
  if (options.k_reduction < 0) {
    return absl::InvalidArgumentError(
        StrCat("router k_reduction must be >= 0, got ", options.k_reduction));
  }
  if (!std::isfinite(options.modality_lambda)) {
    return absl::InvalidArgumentError("modality lambda must be finite");
  }
  if (options.routing != RoutingOverride::kModel && options.routing != RoutingOverride::kUniform) {
    return absl::InvalidArgumentError(StrCat("routing must be model or uniform, got value ",
                                             static_cast<int>(options.routing)));
  }
  return absl::OkStatus();
}

absl::Status Router::SetModalityBias(std::vector<float> bias) {
  const size_t want = static_cast<size_t>(n_layer_) * static_cast<size_t>(n_expert_);
  if (!bias.empty() && bias.size() != want) {
    return absl::InvalidArgumentError(StrCat("modality bias has ", bias.size(),
                                             " values; the model needs n_layer * n_expert = ",
                                             want));
  }
  for (float b : bias) {
    if (!std::isfinite(b)) return absl::InvalidArgumentError("modality bias holds a non-finite value");
  }
  bias_ = std::move(bias);
  return absl::OkStatus();
}

int Router::slots(int n_used) const {
  if (options_.dynamic_k_p > 0 && options_.k_max > 0) {
    return std::min(n_expert_, std::max(n_used, options_.k_max));
  }
  return n_used;
}

void Router::BeginStep() {
  ++step_;
  pressure_ = 0;
  throttled_ = false;
  if (monitor_ == nullptr) return;
  const uint64_t wanted = WantedExperts(monitor_->options().pressure_window_steps);
  pressure_ = monitor_->MemoryPressure(wanted);
  stats_.pressure = pressure_;
  stats_.pool_pressure = monitor_->PoolPressure(wanted);
  stats_.device = monitor_->device_stats();
  throttled_ = monitor_->ThermalThrottled();
}

uint64_t Router::WantedExperts(int window_steps) const {
  uint64_t count = 0;
  for (uint64_t s : wanted_step_) {
    if (s != 0 && step_ - s < static_cast<uint64_t>(window_steps)) ++count;
  }
  return count;
}

void Router::Route(int layer, const float* logits, int64_t n, int n_used, bool renormalize,
                   std::span<const uint64_t> resident, int* experts, float* weights) {
  const int ne = n_expert_;
  const int n_slots = slots(n_used);
  const bool dynamic = options_.dynamic_k_p > 0;
  const int k_max = dynamic && options_.k_max > 0 ? std::min(options_.k_max, ne) : n_used;
  // The degrade policy's reduction; the thermal drop is one unless that is already more.
  const int k_reduced = std::max(1, k_max - options_.k_reduction);
  const int k_limit =
      throttled_ ? std::max(1, k_max - std::max(1, options_.k_reduction)) : k_reduced;
  const int k_low = dynamic ? std::min(options_.k_min, k_limit) : k_limit;

  const float penalty = options_.alpha * pressure_;
  bool any_missing = false;
  if (penalty > 0 && !resident.empty()) {
    for (uint32_t e = 0; e < static_cast<uint32_t>(ne) && !any_missing; ++e) {
      any_missing = !IsResident(resident, e);
    }
  }
  const float lambda = options_.modality_lambda * image_share_;
  const bool biased = lambda != 0 && !bias_.empty();
  const float* bias = biased ? bias_.data() + static_cast<size_t>(layer) * static_cast<size_t>(ne)
                             : nullptr;
  const bool uniform = options_.routing == RoutingOverride::kUniform;
  // A uniform draw has no preference for an adjustment to move.
  const bool adjust = !uniform && (any_missing || biased);
  // The batch's counts, published once after the loop.
  const RouterStats before = stats_;

  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * ne;
    int* chosen = experts + t * n_slots;
    float* w = weights + t * n_slots;

    // The routing probabilities: model::RouteToken's arithmetic, step for step.
    float max = l[0];
    for (int e = 1; e < ne; ++e) max = std::max(max, l[e]);
    double sum = 0;
    for (int e = 0; e < ne; ++e) {
      p_[static_cast<size_t>(e)] = std::exp(l[e] - max);
      sum += p_[static_cast<size_t>(e)];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (float& v : p_) v *= inv;

    // The unadjusted choice: the model's top k, or the uniform draw standing in for it.
    if (uniform) {
      DrawUniform(&draw_state_, static_cast<uint32_t>(ne), k_max, plain_.data());
    } else {
      TopK(kernels_, ne, p_.data(), k_max, plain_.data());
    }
    const uint32_t* order = plain_.data();
    if (adjust) {
      for (int e = 0; e < ne; ++e) {
        float s = l[e];
        if (any_missing && !IsResident(resident, static_cast<uint32_t>(e))) s -= penalty;
        if (biased) s += lambda * bias[e];
        score_[static_cast<size_t>(e)] = s;
      }
      TopK(kernels_, ne, score_.data(), k_max, adjusted_.data());
      order = adjusted_.data();
    }

    int k = k_limit;
    if (dynamic) {
      k = k_low;
      float covered = 0;
      for (int i = 0; i < k; ++i) covered += p_[order[i]];
      while (k < k_limit && covered < options_.dynamic_k_p) covered += p_[order[k++]];
    }

    float total = 0;
    for (int i = 0; i < k; ++i) {
      chosen[i] = static_cast<int>(order[i]);
      w[i] = p_[order[i]];
      total += w[i];
    }
    if (renormalize) {
      for (int i = 0; i < k; ++i) w[i] /= total;
    }
    for (int i = k; i < n_slots; ++i) {
      chosen[i] = -1;
      w[i] = 0;
    }

    for (int i = 0; i < k; ++i) {
      wanted_step_[static_cast<size_t>(layer) * static_cast<size_t>(ne) + plain_[static_cast<size_t>(i)]] = step_;
    }
    if (adjust) {
      // Changed: some adjusted choice is not among the plain top k.
      std::fill(in_plain_.begin(), in_plain_.end(), false);
      for (int i = 0; i < k; ++i) in_plain_[plain_[static_cast<size_t>(i)]] = true;
      for (int i = 0; i < k; ++i) {
        if (!in_plain_[adjusted_[static_cast<size_t>(i)]]) {
          ++stats_.changed;
          break;
        }
      }
    }
    ++stats_.token_layers;
    stats_.experts += static_cast<uint64_t>(k);
    if (k_limit < k_reduced) ++stats_.thermal_drops;
  }
  if (metrics_) {
    metrics_->token_layers.Increment(stats_.token_layers - before.token_layers);
    metrics_->experts.Increment(stats_.experts - before.experts);
    metrics_->changed.Increment(stats_.changed - before.changed);
    metrics_->thermal_drops.Increment(stats_.thermal_drops - before.thermal_drops);
  }
}

}  // namespace moert::router
