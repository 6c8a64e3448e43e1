// InferenceGuard, at the API boundary: a step of a request (one Forward: a prefill chunk
// or a decode token) that fails with exhaustion, an I/O error, a timeout or a lost device
// (pipeline::ClassifyFailure) is run again after the next degrade of the policy's order
// for that kind of failure (DegradePolicyOptions::RetryOrder), until it succeeds or the
// order is spent; then the request fails with the last error, naming what was tried. A
// failed Forward leaves the KV cache as it was, so the retry continues the same request
// and what was streamed stays valid. A step that succeeds first time is not touched.
#ifndef MOERT_RUNTIME_INFERENCE_GUARD_H_
#define MOERT_RUNTIME_INFERENCE_GUARD_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipeline/degrade_policy.h"
#include "runtime/degrade_actions.h"
#include "telemetry/metrics.h"

namespace moert::runtime {

class InferenceGuard {
 public:
  // All must outlive the guard. `model_mutex` is taken around each action (the attempt
  // takes it itself). Each retry is counted in `metrics` (may be null) as a degrade
  // event of its failure kind.
  InferenceGuard(pipeline::DegradePolicy* policy, ModelActuator* actuator, std::mutex* model_mutex,
                 telemetry::Registry* metrics = nullptr)
      : policy_(policy), actuator_(actuator), model_mutex_(model_mutex), metrics_(metrics) {}

  // Runs `attempt` at `step`, retrying degraded as the file comment says. Each degrade
  // applied counts toward the policy's latch and is appended to *degrades as
  // "<failure>: <action> (<the error>)".
  absl::Status Run(int64_t step, const std::function<absl::Status()>& attempt,
                   std::vector<std::string>* degrades);

 private:
  pipeline::DegradePolicy* policy_;
  ModelActuator* actuator_;
  std::mutex* model_mutex_;
  telemetry::Registry* metrics_;
};

}  // namespace moert::runtime

#endif  // MOERT_RUNTIME_INFERENCE_GUARD_H_
