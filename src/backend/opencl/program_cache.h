// OpenCL programs built from the embedded kernel sources, once per (source, options)
// in memory, and cached as device binaries on disk so that the next start skips the
// compiler: a binary is keyed by a hash of the device name, driver version, device
// version, build options and source text, loaded with clCreateProgramWithBinary, and
// dropped (rebuilt from source) when the driver rejects it.
#ifndef MOERT_BACKEND_OPENCL_PROGRAM_CACHE_H_
#define MOERT_BACKEND_OPENCL_PROGRAM_CACHE_H_

#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "backend/opencl/cl_status.h"

namespace moert::backend::opencl {

struct DeviceInfo;

class ProgramCache {
 public:
  struct Stats {
    int source_builds = 0;      // programs compiled from source
    int disk_hits = 0;          // programs loaded from a cached binary
    int binaries_rejected = 0;  // cached binaries the driver refused (then rebuilt)
    int disk_writes = 0;        // binaries written to the cache
  };

  // `cache_dir` empty: no disk cache. `base_options`: the device's variant options.
  ProgramCache(cl_context context, cl_device_id device, const DeviceInfo& info,
               std::string base_options, std::string cache_dir);
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // Kernel `kernel` of kernels/opencl/<source>.cl (with common.cl in front), built
  // with the base options plus `options`. The kernel object stays owned by the cache.
  // A build failure is kInternal with the build log in the message.
  absl::StatusOr<cl_kernel> Kernel(std::string_view source, std::string_view kernel,
                                   std::string_view options = "");

  // Builds `text` (a whole program) with the base options plus `options`, through
  // the disk cache. The program stays owned by the cache.
  absl::StatusOr<cl_program> Build(std::string_view text, std::string_view options);

  const Stats& stats() const { return stats_; }
  const std::string& cache_dir() const { return cache_dir_; }

 private:
  cl_context context_;
  cl_device_id device_;
  std::string device_key_;  // name, driver and device version
  std::string base_options_;
  std::string cache_dir_;
  Stats stats_;
  std::map<std::pair<std::string, std::string>, cl_program> programs_;  // (text, options)
  std::map<std::pair<cl_program, std::string>, cl_kernel> kernels_;
};

// The default cache directory: core::DefaultCacheDir()/opencl ($XDG_CACHE_HOME/moert/
// opencl, else $HOME/.cache/moert/opencl); empty when neither variable is set.
std::string DefaultCacheDir();

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_PROGRAM_CACHE_H_
