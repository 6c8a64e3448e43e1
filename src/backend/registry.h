// The backends this build has, by name: the conformance suite runs every op of each
// against the CPU, and backend selection opens them. Adding a backend is one folder
// under src/backend/ and one line in registry.cc (docs/backends.md).
#ifndef MOERT_BACKEND_REGISTRY_H_
#define MOERT_BACKEND_REGISTRY_H_

#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "backend/backend.h"

namespace moert::backend {

struct BackendOptions {
  int threads = 1;                // the CPU backend's threads (0: one per core)
  bool require_gpu = false;       // a device backend: only a GPU
  bool allow_cpu_device = false;  // a device backend: a CPU device will do (PoCL in tests)
  // Where a device backend keeps files between runs (OpenCL program binaries under
  // CACHE_DIR/opencl); empty: core::DefaultCacheDir().
  std::string cache_dir;
};

struct BackendEntry {
  std::string_view name;  // "cpu", "opencl"
  absl::StatusOr<std::unique_ptr<Backend>> (*create)(const BackendOptions& options);
};

// The CPU first.
std::span<const BackendEntry> RegisteredBackends();

// The backend registered as `name`; NotFound naming the ones there are.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options);

}  // namespace moert::backend

#endif  // MOERT_BACKEND_REGISTRY_H_
