// The backend registry (see registry.h): one entry per backend this build has.
#include "backend/registry.h"

#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/strings.h"
#ifdef MOERT_HAVE_OPENCL
#include "backend/opencl/opencl_backend.h"
#endif

namespace moert::backend {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpu(const BackendOptions& options) {
  return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(options.threads));
}

#ifdef MOERT_HAVE_OPENCL
absl::StatusOr<std::unique_ptr<Backend>> CreateOpenCl(const BackendOptions& options) {
  opencl::OpenClBackendOptions cl;
  cl.require_gpu = options.require_gpu;
  cl.allow_cpu_device = options.allow_cpu_device;
  if (!options.cache_dir.empty()) cl.device.cache_dir = options.cache_dir + "/opencl";
  return opencl::OpenOpenClBackend(cl);
}
#endif

constexpr BackendEntry kBackends[] = {
    {"cpu", &CreateCpu},
#ifdef MOERT_HAVE_OPENCL
    {"opencl", &CreateOpenCl},
#endif
};

}  // namespace

std::span<const BackendEntry> RegisteredBackends() { return kBackends; }

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options) {
  std::string names;
  for (const BackendEntry& entry : kBackends) {
    if (entry.name == name) return entry.create(options);
    StrAppend(&names, names.empty() ? "" : ", ", entry.name);
  }
  return absl::NotFoundError(StrCat("no backend '", name, "' in this build (", names, ")"));
}

}  // namespace moert::backend
