// The degrade policy's view of a loaded model: today's figures as the policy's metrics
// (the pool's fragmentation, the CPU temperature and its limit, the expert stall per
// token from the model's stats; the router's p99 latency from the metrics registry),
// and the policy's actions applied to the model without a reload.
#ifndef MOERT_RUNTIME_DEGRADE_ACTIONS_H_
#define MOERT_RUNTIME_DEGRADE_ACTIONS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/model.h"
#include "pipeline/degrade_policy.h"
#include "telemetry/metrics.h"

namespace moert::runtime {

// Not thread-safe: use under the model's forward_mutex, between Forward calls.
class ModelMetrics {
 public:
  // The decode steps the router's p99 latency is taken over.
  static constexpr size_t kLatencyWindowSteps = 64;

  // `registry` (may be null: no router latency): the one the model publishes to.
  explicit ModelMetrics(model::Model* model, telemetry::Registry* registry = nullptr)
      : model_(model), registry_(registry) {}

  // The figures after a step that evaluated `tokens` tokens: the stall per token is the
  // pool's stall since the previous Read over `tokens` (unknown at the first Read); the
  // router's p99 latency is over the routings of the last kLatencyWindowSteps decode
  // steps (steps of one token; a prefill's batches are left out), unknown until one.
  const pipeline::MetricSource& Read(int64_t tokens);
  // An expert hot update swapped the model (MoERuntime::ApplyUpdate): read that one from
  // now on, starting the stall count again.
  void Rebind(model::Model* model) {
    model_ = model;
    have_stall_ = false;
  }

 private:
  void ReadRouterLatency(int64_t tokens);

  model::Model* model_;
  telemetry::Registry* registry_;
  bool have_stall_ = false;
  uint64_t stall_ns_ = 0;
  std::vector<uint64_t> latency_counts_;             // the registry's at the last Read
  std::deque<std::vector<uint64_t>> latency_steps_;  // per decode step in the window
  pipeline::MetricSnapshot snapshot_;
};

// The actions on a model: they apply to every session of the model (its pool, router
// and backend are shared), except shorter_context, which is the session's own. Use under
// the model's forward_mutex, between Forward calls. FailedPrecondition naming why when
// an action has nothing to act on.
class ModelActuator final : public pipeline::DegradeActuator {
 public:
  // `shorten_context(longer)`: the session's shorter_context, and with longer its undo
  // (empty: FailedPrecondition). `in_force` (may be null; the model's, shared by its
  // sessions' actuators): the lasting degrades applied and not undone, by name, once per
  // application (defragment and shorter_context are not the model's to keep).
  ModelActuator(model::Model* model, std::function<absl::Status(bool longer)> shorten_context,
                std::vector<std::string>* in_force = nullptr)
      : model_(model), shorten_context_(std::move(shorten_context)), in_force_(in_force) {}

  absl::Status Apply(pipeline::DegradeAction action) override;
  // reduce_top_k: one expert more again; shrink_pool: the pool's limit doubled again;
  // dense_fallback: the experts again once no other application holds it;
  // shorter_context: the session's context doubled again. defragment and cpu_backend
  // cannot be undone.
  absl::Status Undo(pipeline::DegradeAction action) override;
  // The model runs on a device now (an Unavailable is then a lost device).
  bool on_device() const;
  // An expert hot update swapped the model: act on that one from now on.
  void Rebind(model::Model* model) { model_ = model; }

 private:
  absl::Status ApplyOnce(pipeline::DegradeAction action);
  // Removes one application of `action` from in_force; how many remain.
  size_t Release(pipeline::DegradeAction action);
  absl::Status ReduceTopK();
  absl::Status ShrinkPool();

  model::Model* model_;
  std::function<absl::Status(bool longer)> shorten_context_;
  std::vector<std::string>* in_force_;
};

}  // namespace moert::runtime

#endif  // MOERT_RUNTIME_DEGRADE_ACTIONS_H_
