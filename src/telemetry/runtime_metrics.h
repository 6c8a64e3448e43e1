// The runtime's metrics, one place for their names, help and buckets: each module builds
// the struct of the figures it publishes from the model's registry (at construction) and
// updates the cells where the event happens. docs/telemetry.md lists them.
#ifndef MOERT_TELEMETRY_RUNTIME_METRICS_H_
#define MOERT_TELEMETRY_RUNTIME_METRICS_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "telemetry/metrics.h"

namespace moert::telemetry {

// `registry`, or a registry of its own for a module made without one (tests, tools that
// scrape nothing): modules always have cells to update.
std::shared_ptr<Registry> RegistryOrOwn(std::shared_ptr<Registry> registry);

// Registers every family below, so the text lists each one from the start (labelled
// families with their known children at 0).
void RegisterRuntimeMetrics(Registry& registry);

// The expert cache: each expert a layer acquires counts once, by result.
struct ExpertCacheMetrics {
  explicit ExpertCacheMetrics(Registry& registry);
  Counter& hit;         // resident (not by a prefetch not yet used)
  Counter& prefetched;  // resident because a prefetch loaded it in time
  Counter& miss;        // loaded, or waited for, at the acquire
  Counter& stall_ns;    // time acquires waited for loads (exposed in seconds)
};

// The loader thread and reads made by a waiting thread.
struct LoaderMetrics {
  explicit LoaderMetrics(Registry& registry);
  Counter& read_bytes;  // bytes read from the model file (alignment padding included)
};

// The tiered pool's state, set after every change.
struct PoolMetrics {
  explicit PoolMetrics(Registry& registry);
  Gauge& persistent_used_bytes;
  Gauge& expert_used_bytes;
  Gauge& activation_used_bytes;
  Gauge& expert_fragmentation;  // 1 - largest free block / free bytes
};

// Routing one batch of a MoE layer, per layer.
Histogram& RouterLatency(Registry& registry, int layer);
// The bucket counts of every layer's router latency summed (per bucket, +Inf's last),
// and the buckets' bounds.
std::vector<uint64_t> RouterLatencyCounts(Registry& registry);
const std::vector<double>& RouterLatencyBounds();

// The hardware-aware router's choices (router/router.h: RouterStats).
struct RouterMetrics {
  explicit RouterMetrics(Registry& registry);
  Counter& token_layers;   // (token, MoE layer) pairs routed
  Counter& experts;        // experts chosen in all
  Counter& changed;        // token-layers where an adjustment changed the chosen set
  Counter& thermal_drops;  // token-layers whose k the thermal limit lowered
};

// Speculative routing's predictions, scored at the layer they were made for.
struct PrefetchMetrics {
  explicit PrefetchMetrics(Registry& registry);
  Counter& predicted;  // experts predicted
  Counter& correct;    // of those, chosen by the router
  Counter& chosen;     // experts the router chose at scored layers
};

// Backend::kAuto's device batches that failed and ran on the CPU, by backend name.
Counter& BackendFailures(Registry& registry, std::string_view backend);

// A degradation (smaller top-k, CPU fallback, smaller context ...), by reason: counted by
// the degrade policy where it decides.
void CountDegradeEvent(Registry& registry, std::string_view reason);
// A degrade the policy undid (a rule's recover), by the rule's reason.
void CountDegradeRecovery(Registry& registry, std::string_view reason);

// Sessions' requests: what was evaluated, how long it took, the time to first token.
struct GenerationMetrics {
  explicit GenerationMetrics(Registry& registry);
  Counter& prefill_tokens;
  Counter& prefill_ns;
  Counter& decode_tokens;
  Counter& decode_ns;
  Histogram& time_to_first_token;  // seconds
  Counter& requests;
};

// The registry's figures a generate call's stats are the difference of (read at its
// start and end; steps of other sessions running meanwhile included).
struct GenerationSnapshot {
  static GenerationSnapshot Read(const Registry& registry);
  double expert_hits = 0;  // hit + prefetched
  double expert_misses = 0;
  double read_bytes = 0;
  double stall_seconds = 0;
  double token_layers = 0;
  double experts_chosen = 0;
  double router_changed = 0;
  double thermal_drops = 0;
  double predicted = 0;
  double predicted_correct = 0;
  double predicted_chosen = 0;
};

}  // namespace moert::telemetry

#endif  // MOERT_TELEMETRY_RUNTIME_METRICS_H_
