// The degrade policy: rules as data (a metric compared with a bound -> an action, with a
// cooldown), evaluated once per decode step over a MetricSource, each firing counted and
// logged; and the latch that keeps a session degraded once it has degraded too often.
// What an action does to a model is the DegradeActuator's (runtime/degrade_actions.h);
// this file only decides when. The rule file format and the defaults: docs/degrade.md.
#ifndef MOERT_PIPELINE_DEGRADE_POLICY_H_
#define MOERT_PIPELINE_DEGRADE_POLICY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::pipeline {

// The metric names the default rules read (Prometheus style; the metrics registry will
// publish them under these names).
inline constexpr char kPoolFragmentationMetric[] = "moert_pool_fragmentation_ratio";
inline constexpr char kCpuTemperatureMetric[] = "moert_cpu_temperature_celsius";
inline constexpr char kCpuTemperatureLimitMetric[] = "moert_cpu_temperature_limit_celsius";
inline constexpr char kRouterLatencyP99Metric[] = "moert_router_latency_seconds{quantile=\"0.99\"}";
inline constexpr char kStallPerTokenMetric[] = "moert_stall_seconds_per_token";

// Where a rule's figures come from. A metric that is not known now (no expert pool, no
// thermal zone, not measured) is nullopt, and a rule over it does not fire.
class MetricSource {
 public:
  virtual ~MetricSource() = default;
  virtual std::optional<double> Value(std::string_view name) const = 0;
};

// A MetricSource over a fixed set of values (the adapter's snapshot, tests).
class MetricSnapshot final : public MetricSource {
 public:
  void Set(std::string_view name, double value) { values_[std::string(name)] = value; }
  void Erase(std::string_view name) { values_.erase(std::string(name)); }
  std::optional<double> Value(std::string_view name) const override;

 private:
  std::map<std::string, double, std::less<>> values_;
};

// What a rule does; each takes effect without a reload (docs/degrade.md).
enum class DegradeAction {
  kDefragment,      // compact the expert pool
  kReduceTopK,      // one expert fewer per token (never below 1)
  kShrinkPool,      // halve the expert pool's limit (never below its floor)
  kShorterContext,  // halve the context the session keeps, sliding old turns out
  kCpuBackend,      // the CPU instead of the OpenCL device
  kDenseFallback,   // the dense fallback FFN instead of the routed experts
};

// "defragment", "reduce_top_k", "shrink_pool", "shorter_context", "cpu_backend",
// "dense_fallback".
const char* DegradeActionName(DegradeAction action);
// The inverse; InvalidArgument naming the choices otherwise.
absl::StatusOr<DegradeAction> ParseDegradeAction(std::string_view name);

enum class Comparison { kGreater, kGreaterEqual, kLess, kLessEqual };

struct DegradeRule {
  std::string metric;
  Comparison comparison = Comparison::kGreater;
  // The bound: a number, or with bound_metric set, that metric's value now (a rule whose
  // bound metric is unknown does not fire).
  double bound = 0;
  std::string bound_metric;
  DegradeAction action = DegradeAction::kDefragment;
  // After firing, the rule stays quiet for this many steps and this long (both when
  // both are set; 0: no cooldown of that kind).
  int64_t cooldown_steps = 0;
  uint64_t cooldown_ns = 0;
  // Undoing: once the condition has been known and false for this many steps and this
  // long (both when both are set), one of the rule's applied firings is undone, then
  // the next after as long again, until none is left. Both 0: never undone.
  int64_t recover_steps = 0;
  uint64_t recover_ns = 0;
  // The name its firings are counted and reported under; empty: the action's name.
  std::string reason;

  bool recovers() const { return recover_steps > 0 || recover_ns > 0; }
};

// Rules from text, one a line:
//   METRIC OP BOUND -> ACTION [cooldown N steps|s|ms] [recover N steps|s|ms] [reason NAME]
// OP is >, >=, < or <=; BOUND a number or a metric name; # starts a comment. Errors are
// InvalidArgument "<source>:<line>: <what is wrong>".
absl::StatusOr<std::vector<DegradeRule>> ParseDegradeRules(std::string_view text,
                                                           std::string_view source = "rules");
// The same from a file; NotFound naming it when it cannot be read.
absl::StatusOr<std::vector<DegradeRule>> ReadDegradeRulesFile(const std::string& path);
// The default rules (docs/degrade.md), as rule text and parsed.
std::string_view DefaultDegradeRulesText();
std::vector<DegradeRule> DefaultDegradeRules();

// Applies an action to whatever runs the model (runtime/degrade_actions.h). An error
// (nothing to do: no pool, already on the CPU, no dense fallback) is counted as a failed
// firing; the rule still cools down.
class DegradeActuator {
 public:
  virtual ~DegradeActuator() = default;
  virtual absl::Status Apply(DegradeAction action) = 0;
  // Undoes one earlier Apply of `action` (a rule's recover). FailedPrecondition naming
  // why when it cannot (defragment has nothing to undo; the OpenCL device, once given
  // up, stays given up); the rule then stops trying.
  virtual absl::Status Undo(DegradeAction action);
};

// The failures InferenceGuard retries degraded (runtime/inference_guard.h).
enum class FailureKind {
  kExhausted,   // ResourceExhausted: the pool (or memory) cannot hold what a step needs
  kIoError,     // DataLoss, or Unavailable on the CPU: an expert read failed
  kTimeout,     // DeadlineExceeded
  kDeviceLost,  // Unavailable from the OpenCL device
};
// "exhausted", "io_error", "timeout", "device_lost".
const char* FailureKindName(FailureKind kind);
// The kind of `status`; nullopt for one the guard does not retry (OK, a bad request,
// cancellation, ...). `on_device`: the model runs on a device now.
std::optional<FailureKind> ClassifyFailure(const absl::Status& status, bool on_device);

struct DegradePolicyOptions {
  std::vector<DegradeRule> rules = DefaultDegradeRules();
  // InferenceGuard's retries: per kind of failure, the degrades tried in this order, one
  // more per retry (an action that cannot apply is skipped).
  std::vector<DegradeAction> retry_exhausted = {
      DegradeAction::kDefragment, DegradeAction::kReduceTopK, DegradeAction::kDenseFallback};
  std::vector<DegradeAction> retry_io_error = {DegradeAction::kReduceTopK,
                                               DegradeAction::kDenseFallback};
  std::vector<DegradeAction> retry_timeout = {
      DegradeAction::kReduceTopK, DegradeAction::kDenseFallback, DegradeAction::kCpuBackend};
  std::vector<DegradeAction> retry_device_lost = {DegradeAction::kCpuBackend};
  const std::vector<DegradeAction>& RetryOrder(FailureKind kind) const;
  // More than latch_degrades applied firings (and InferenceGuard retries) within latch_window_steps
  // steps: the policy stops (nothing more is applied or undone) and says the session stays
  // degraded. 0: never.
  int latch_degrades = 5;
  int64_t latch_window_steps = 64;
};

// InvalidArgument naming the field (or the rule) at fault.
absl::Status ValidateDegradePolicyOptions(const DegradePolicyOptions& options);

// One firing, or one undo.
struct DegradeEvent {
  int64_t step = 0;
  std::string reason;
  DegradeAction action = DegradeAction::kDefragment;
  bool undo = false;    // a recover undid one earlier firing of the rule
  double value = 0;     // the metric's value
  double bound = 0;     // what it was compared with
  absl::Status status;  // the action's outcome
};

struct DegradeCounters {
  uint64_t steps = 0;   // evaluations
  uint64_t fired = 0;   // firings, failed ones included
  uint64_t failed = 0;  // firings whose action returned an error
  uint64_t undone = 0;  // firings a recover undid
  std::map<std::string, uint64_t> fired_by_reason;
};

// Not thread-safe: one per session, used from the thread that runs its steps.
class DegradePolicy {
 public:
  explicit DegradePolicy(DegradePolicyOptions options);

  // Evaluates every rule once against `metrics` at `step` (increasing; a decode step's
  // index), applying each firing rule's action through `actuator` in rule order, and
  // undoing one firing of each recovering rule whose condition has stayed clear long
  // enough. Returns this step's firings and undos. Once latched, does nothing.
  std::vector<DegradeEvent> Step(int64_t step, const MetricSource& metrics,
                                 DegradeActuator& actuator);
  // Counts a degrade made outside the rules (InferenceGuard's retries) toward the latch.
  void NoteDegrade(int64_t step, std::string_view reason);

  bool latched() const { return latched_; }
  // Why the policy latched ("stays degraded for the session: ..."); empty until then.
  const std::string& latch_reason() const { return latch_reason_; }
  const DegradeCounters& counters() const { return counters_; }
  // Every firing so far (the session's).
  const std::vector<DegradeEvent>& events() const { return events_; }
  const DegradePolicyOptions& options() const { return options_; }

 private:
  bool CoolingDown(size_t rule, int64_t step, uint64_t now_ns) const;
  void CountTowardLatch(int64_t step);
  // Adds an event to events(), dropping the oldest beyond the kept number.
  void Keep(const DegradeEvent& event);
  // The rule's condition is known and false at (step, now): undoes one of its applied
  // firings when it has been so for its recover time; the undo's event, if one.
  std::optional<DegradeEvent> Recover(size_t rule, int64_t step, uint64_t now_ns,
                                      DegradeActuator& actuator);

  DegradePolicyOptions options_;
  struct LastFiring {
    bool fired = false;
    int64_t step = 0;
    uint64_t ns = 0;
  };
  std::vector<LastFiring> last_;  // per rule
  struct RuleRecovery {
    int applied = 0;  // firings whose action applied and no undo has taken back yet
    bool clear = false;  // the condition is known and false since (step, ns)
    int64_t step = 0;
    uint64_t ns = 0;
    bool gave_up = false;  // an undo failed: the rule's firings stay
  };
  std::vector<RuleRecovery> recovery_;  // per rule
  std::vector<int64_t> recent_;   // steps of the firings inside the latch window
  bool latched_ = false;
  std::string latch_reason_;
  DegradeCounters counters_;
  std::vector<DegradeEvent> events_;
};

// The reason a rule's firings go by (its own, else its action's name).
std::string RuleReason(const DegradeRule& rule);

}  // namespace moert::pipeline

#endif  // MOERT_PIPELINE_DEGRADE_POLICY_H_
