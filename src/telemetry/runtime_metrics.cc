// The runtime's metric families: names, help, label names and buckets.
#include "telemetry/runtime_metrics.h"

#include <string>
#include <utility>
#include <vector>

namespace moert::telemetry {
namespace {

constexpr double kNanosecondsPerSecond = 1e9;

CounterFamily& ExpertLoads(Registry& r) {
  return r.AddCounter("moert_expert_loads_total",
                      "Experts acquired by MoE layers, by result: hit (resident), prefetched "
                      "(resident thanks to a prefetch in time), miss (loaded or waited for).",
                      {"result"});
}
Counter& StallNs(Registry& r) {
  return r
      .AddCounter("moert_expert_stall_seconds_total",
                  "Time the decode thread waited for expert loads.", {}, kNanosecondsPerSecond)
      .Get();
}
Counter& ReadBytes(Registry& r) {
  return r
      .AddCounter("moert_expert_read_bytes_total",
                  "Bytes of expert weights read from the model file.")
      .Get();
}
GaugeFamily& PoolUsed(Registry& r) {
  return r.AddGauge("moert_pool_used_bytes", "Bytes handed out by each tier of the memory pool.",
                    {"tier"});
}
GaugeFamily& PoolFragmentation(Registry& r) {
  return r.AddGauge("moert_pool_fragmentation_ratio",
                    "1 - largest free block / free bytes, of the expert tier.", {"tier"});
}
HistogramFamily& RouterLatencyFamily(Registry& r) {
  return r.AddHistogram("moert_router_latency_seconds",
                        "Time to route one batch of tokens of a MoE layer.", {"layer"},
                        RouterLatencyBounds());
}
// A counter without labels, by name and help.
struct CounterSpec {
  std::string_view name;
  std::string_view help;
};
constexpr CounterSpec kRouterTokenLayers = {
    "moert_router_token_layers_total",
    "(token, MoE layer) pairs the hardware-aware router routed."};
constexpr CounterSpec kRouterExperts = {
    "moert_router_experts_chosen_total",
    "Experts the hardware-aware router chose, over all token-layers."};
constexpr CounterSpec kRouterChanged = {
    "moert_router_changed_total",
    "Token-layers where residency or the modality bias changed the chosen experts."};
constexpr CounterSpec kRouterThermalDrops = {"moert_router_thermal_drops_total",
                                             "Token-layers whose k the thermal limit lowered."};
constexpr CounterSpec kPrefetchPredicted = {
    "moert_prefetch_predicted_experts_total",
    "Experts speculative routing predicted, at scored layers."};
constexpr CounterSpec kPrefetchCorrect = {"moert_prefetch_correct_experts_total",
                                          "Predicted experts the router then chose."};
constexpr CounterSpec kPrefetchChosen = {"moert_prefetch_chosen_experts_total",
                                         "Experts the router chose at layers with a prediction."};

Counter& PlainCounter(Registry& r, const CounterSpec& spec) {
  return r.AddCounter(spec.name, spec.help).Get();
}
CounterFamily& BackendFailureFamily(Registry& r) {
  return r.AddCounter("moert_backend_failures_total",
                      "Batches a device backend failed (run on the CPU instead).", {"backend"});
}
CounterFamily& DegradeEvents(Registry& r) {
  return r.AddCounter("moert_degrade_events_total",
                      "Degradations made under resource exhaustion, by reason.", {"reason"});
}
CounterFamily& DegradeRecoveries(Registry& r) {
  return r.AddCounter("moert_degrade_recoveries_total",
                      "Degradations undone once their condition cleared, by reason.", {"reason"});
}
Counter& PrefillTokens(Registry& r) {
  return r.AddCounter("moert_prefill_tokens_total", "Tokens evaluated as prompt batches.").Get();
}
Counter& PrefillNs(Registry& r) {
  return r
      .AddCounter("moert_prefill_seconds_total", "Time spent evaluating prompt batches.", {},
                  kNanosecondsPerSecond)
      .Get();
}
Counter& DecodeTokens(Registry& r) {
  return r
      .AddCounter("moert_decode_tokens_total",
                  "Tokens evaluated one at a time while "
                  "generating.")
      .Get();
}
Counter& DecodeNs(Registry& r) {
  return r
      .AddCounter("moert_decode_seconds_total", "Time spent in one-token decode steps.", {},
                  kNanosecondsPerSecond)
      .Get();
}
Histogram& TimeToFirstToken(Registry& r) {
  // 10 ms .. ~82 s.
  return r
      .AddHistogram("moert_time_to_first_token_seconds",
                    "From a generate call to its first sampled token.", {},
                    ExponentialBuckets(0.01, 2, 14))
      .Get();
}
Counter& Requests(Registry& r) {
  return r.AddCounter("moert_requests_total", "Generate calls of sessions.").Get();
}

}  // namespace

std::shared_ptr<Registry> RegistryOrOwn(std::shared_ptr<Registry> registry) {
  return registry != nullptr ? std::move(registry) : std::make_shared<Registry>();
}

void RegisterRuntimeMetrics(Registry& registry) {
  (void)ExpertCacheMetrics(registry);
  (void)LoaderMetrics(registry);
  (void)PoolMetrics(registry);
  (void)RouterLatencyFamily(registry);
  (void)RouterMetrics(registry);
  (void)PrefetchMetrics(registry);
  (void)BackendFailureFamily(registry);
  (void)DegradeEvents(registry);
  (void)DegradeRecoveries(registry);
  (void)GenerationMetrics(registry);
}

ExpertCacheMetrics::ExpertCacheMetrics(Registry& registry)
    : hit(ExpertLoads(registry).WithLabels({"hit"})),
      prefetched(ExpertLoads(registry).WithLabels({"prefetched"})),
      miss(ExpertLoads(registry).WithLabels({"miss"})),
      stall_ns(StallNs(registry)) {}

LoaderMetrics::LoaderMetrics(Registry& registry) : read_bytes(ReadBytes(registry)) {}

PoolMetrics::PoolMetrics(Registry& registry)
    : persistent_used_bytes(PoolUsed(registry).WithLabels({"persistent"})),
      expert_used_bytes(PoolUsed(registry).WithLabels({"expert"})),
      activation_used_bytes(PoolUsed(registry).WithLabels({"activation"})),
      expert_fragmentation(PoolFragmentation(registry).WithLabels({"expert"})) {}

Histogram& RouterLatency(Registry& registry, int layer) {
  return RouterLatencyFamily(registry).WithLabels({std::to_string(layer)});
}

const std::vector<double>& RouterLatencyBounds() {
  // 1 us .. 16 ms: a decode step's routing takes microseconds, a prefill batch's more.
  static const std::vector<double> bounds = ExponentialBuckets(1e-6, 4, 8);
  return bounds;
}

std::vector<uint64_t> RouterLatencyCounts(Registry& registry) {
  std::vector<uint64_t> counts(RouterLatencyBounds().size() + 1, 0);
  for (const Histogram* layer : RouterLatencyFamily(registry).children()) {
    const Histogram::Snapshot s = layer->snapshot();
    for (size_t i = 0; i < counts.size() && i < s.counts.size(); ++i) counts[i] += s.counts[i];
  }
  return counts;
}

RouterMetrics::RouterMetrics(Registry& registry)
    : token_layers(PlainCounter(registry, kRouterTokenLayers)),
      experts(PlainCounter(registry, kRouterExperts)),
      changed(PlainCounter(registry, kRouterChanged)),
      thermal_drops(PlainCounter(registry, kRouterThermalDrops)) {}

PrefetchMetrics::PrefetchMetrics(Registry& registry)
    : predicted(PlainCounter(registry, kPrefetchPredicted)),
      correct(PlainCounter(registry, kPrefetchCorrect)),
      chosen(PlainCounter(registry, kPrefetchChosen)) {}

GenerationSnapshot GenerationSnapshot::Read(const Registry& registry) {
  const auto value = [&](std::string_view name, std::vector<std::string> labels = {}) {
    return registry.Read(name, labels).value_or(0);
  };
  GenerationSnapshot s;
  s.expert_hits = value("moert_expert_loads_total", {"hit"}) +
                  value("moert_expert_loads_total", {"prefetched"});
  s.expert_misses = value("moert_expert_loads_total", {"miss"});
  s.read_bytes = value("moert_expert_read_bytes_total");
  s.stall_seconds = value("moert_expert_stall_seconds_total");
  s.token_layers = value("moert_router_token_layers_total");
  s.experts_chosen = value("moert_router_experts_chosen_total");
  s.router_changed = value("moert_router_changed_total");
  s.thermal_drops = value("moert_router_thermal_drops_total");
  s.predicted = value("moert_prefetch_predicted_experts_total");
  s.predicted_correct = value("moert_prefetch_correct_experts_total");
  s.predicted_chosen = value("moert_prefetch_chosen_experts_total");
  return s;
}

Counter& BackendFailures(Registry& registry, std::string_view backend) {
  return BackendFailureFamily(registry).WithLabels({backend});
}

void CountDegradeEvent(Registry& registry, std::string_view reason) {
  DegradeEvents(registry).WithLabels({reason}).Increment();
}

void CountDegradeRecovery(Registry& registry, std::string_view reason) {
  DegradeRecoveries(registry).WithLabels({reason}).Increment();
}

GenerationMetrics::GenerationMetrics(Registry& registry)
    : prefill_tokens(PrefillTokens(registry)),
      prefill_ns(PrefillNs(registry)),
      decode_tokens(DecodeTokens(registry)),
      decode_ns(DecodeNs(registry)),
      time_to_first_token(TimeToFirstToken(registry)),
      requests(Requests(registry)) {}

}  // namespace moert::telemetry
