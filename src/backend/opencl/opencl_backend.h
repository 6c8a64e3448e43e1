// The OpenCL backend: Backend over one OpenCL device (backend/opencl/device.h) and the
// operators of backend/opencl/ops.h. Weights are uploaded once (packed W4/W8 tiles as
// they are; float weights as halves when every value is one, else fp32); every op only
// enqueues, on the device's in-order queue.
//
// Single-threaded, like the Device it drives.
#ifndef MOERT_BACKEND_OPENCL_OPENCL_BACKEND_H_
#define MOERT_BACKEND_OPENCL_OPENCL_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/opencl/device.h"

namespace moert::backend::opencl {

struct OpenClBackendOptions {
  bool require_gpu = false;  // only a GPU device (Backend::kAuto)
  bool allow_cpu_device = false;  // a CPU/accelerator device when there is no GPU (PoCL)
  DeviceOptions device;           // the rest of the device choice (tests: variants)
};

// Opens the device and runs the self-test (an fp32 GEMV against the CPU's dot
// product). FailedPrecondition naming why when there is no usable device, it is not a
// GPU where one is required, or the self-test fails.
absl::StatusOr<std::unique_ptr<Backend>> OpenOpenClBackend(const OpenClBackendOptions& options);

// The device behind an OpenCL backend (null for another backend): tests and the
// device's own reporting.
Device* DeviceOf(Backend& backend);

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_OPENCL_BACKEND_H_
