// The degrade policy's view of a loaded model: today's figures as the policy's metrics
// (the pool's fragmentation, the CPU temperature and its limit, the expert stall per
// token), read from the model's stats until the metrics registry publishes them, and
// the policy's actions applied to the model without a reload.
#ifndef MOERT_RUNTIME_DEGRADE_ACTIONS_H_
#define MOERT_RUNTIME_DEGRADE_ACTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/model.h"
#include "pipeline/degrade_policy.h"

namespace moert::runtime {

// Not thread-safe: use under the model's forward_mutex, between Forward calls.
class ModelMetrics {
 public:
  explicit ModelMetrics(model::Model* model) : model_(model) {}

  // The figures after a step that evaluated `tokens` tokens: the stall per token is the
  // pool's stall since the previous Read over `tokens` (unknown at the first Read).
  const pipeline::MetricSource& Read(int64_t tokens);
  // An expert hot update swapped the model (MoERuntime::ApplyUpdate): read that one from
  // now on, starting the stall count again.
  void Rebind(model::Model* model) {
    model_ = model;
    have_stall_ = false;
  }

 private:
  model::Model* model_;
  bool have_stall_ = false;
  uint64_t stall_ns_ = 0;
  pipeline::MetricSnapshot snapshot_;
};

// The actions on a model: they apply to every session of the model (its pool, router
// and backend are shared), except shorter_context, which is the session's own. Use under
// the model's forward_mutex, between Forward calls. FailedPrecondition naming why when
// an action has nothing to act on.
class ModelActuator final : public pipeline::DegradeActuator {
 public:
  // `shorten_context`: the session's shorter_context (empty: FailedPrecondition).
  // `in_force` (may be null; the model's, shared by its sessions' actuators): the
  // lasting degrades applied, by name, once each (defragment and shorter_context are not
  // the model's to keep).
  ModelActuator(model::Model* model, std::function<absl::Status()> shorten_context,
                std::vector<std::string>* in_force = nullptr)
      : model_(model), shorten_context_(std::move(shorten_context)), in_force_(in_force) {}

  absl::Status Apply(pipeline::DegradeAction action) override;
  // The model runs on a device now (an Unavailable is then a lost device).
  bool on_device() const;
  // An expert hot update swapped the model: act on that one from now on.
  void Rebind(model::Model* model) { model_ = model; }

 private:
  absl::Status ApplyOnce(pipeline::DegradeAction action);
  absl::Status ReduceTopK();
  absl::Status ShrinkPool();

  model::Model* model_;
  std::function<absl::Status()> shorten_context_;
  std::vector<std::string>* in_force_;
};

}  // namespace moert::runtime

#endif  // MOERT_RUNTIME_DEGRADE_ACTIONS_H_
