// InferenceGuard's retry loop.
#include "runtime/inference_guard.h"

#include <optional>

#include "core/strings.h"
#include "telemetry/platform.h"
#include "telemetry/runtime_metrics.h"

namespace moert::runtime {

absl::Status InferenceGuard::Run(int64_t step, const std::function<absl::Status()>& attempt,
                                 std::vector<std::string>* degrades) {
  absl::Status status = attempt();
  if (status.ok()) return status;
  bool on_device = false;
  {
    std::lock_guard<std::mutex> lock(*model_mutex_);
    on_device = actuator_->on_device();
  }
  const std::optional<pipeline::FailureKind> kind = pipeline::ClassifyFailure(status, on_device);
  if (!kind) return status;
  const char* kind_name = pipeline::FailureKindName(*kind);
  std::string tried;
  for (pipeline::DegradeAction action : policy_->options().RetryOrder(*kind)) {
    const char* action_name = pipeline::DegradeActionName(action);
    absl::Status applied;
    {
      std::lock_guard<std::mutex> lock(*model_mutex_);
      applied = actuator_->Apply(action);
    }
    StrAppend(&tried, tried.empty() ? "" : ", ", action_name,
              applied.ok() ? "" : StrCat(" (not applied: ", applied.message(), ")"));
    if (!applied.ok()) continue;
    const std::string degrade = StrCat(kind_name, ": ", action_name, " (", status.ToString(), ")");
    telemetry::Log(telemetry::LogLevel::kWarning,
                   StrCat("InferenceGuard: step ", step, " failed, retrying degraded: ", degrade));
    policy_->NoteDegrade(step, kind_name);
    if (metrics_ != nullptr) telemetry::CountDegradeEvent(*metrics_, kind_name);
    degrades->push_back(degrade);
    status = attempt();
    if (status.ok()) return status;
    const std::optional<pipeline::FailureKind> again = pipeline::ClassifyFailure(status, on_device);
    if (!again) return status;
  }
  if (tried.empty()) return status;
  return absl::Status(status.code(),
                      StrCat(status.message(), " (InferenceGuard retried after: ", tried, ")"));
}

}  // namespace moert::runtime
