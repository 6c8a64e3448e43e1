// Backend::kAuto's policy for a device's failures: a batch the device fails runs on
// the CPU instead (counted, its Status kept), and a device that fails this many
// batches in a row (a lost device fails every one) is given up for good: the CPU runs
// the rest, and the device's memory is freed.
#ifndef MOERT_BACKEND_FAILURE_POLICY_H_
#define MOERT_BACKEND_FAILURE_POLICY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace moert::backend {

class DeviceFailurePolicy {
 public:
  static constexpr int kFailuresBeforeCpu = 3;

  void OnSuccess() {
    ++device_batches_;
    in_a_row_ = 0;
  }
  // A failed device batch (which the CPU then runs): true when the device is to be given
  // up now.
  bool OnFailure(const absl::Status& status) {
    ++fallbacks_;
    last_failure_ = status.ToString();
    return ++in_a_row_ >= kFailuresBeforeCpu;
  }

  int failures_in_a_row() const { return in_a_row_; }
  uint64_t fallbacks() const { return fallbacks_; }
  uint64_t device_batches() const { return device_batches_; }  // run to the end
  const std::string& last_failure() const { return last_failure_; }

 private:
  int in_a_row_ = 0;
  uint64_t fallbacks_ = 0;
  uint64_t device_batches_ = 0;
  std::string last_failure_;
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_FAILURE_POLICY_H_
