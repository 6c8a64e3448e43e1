// An OpenCL device opened for moert: the platform/device choice (a GPU first; a CPU
// or accelerator device such as PoCL's only when allowed, which tests do), its
// context and in-order queue, what the device reports (DeviceInfo), the kernel
// variant and tile sizes chosen from that (KernelVariant), and the program cache.
//
// Single-threaded: one Device is driven by one thread (cl_kernel arguments are state).
#ifndef MOERT_BACKEND_OPENCL_DEVICE_H_
#define MOERT_BACKEND_OPENCL_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/opencl/cl_status.h"

namespace moert::backend::opencl {

class ProgramCache;

enum class Vendor { kAdreno, kMali, kOther };

// What the device says about itself (clGetDeviceInfo).
struct DeviceInfo {
  std::string platform_name;
  std::string name;
  std::string vendor;
  std::string driver_version;
  std::string device_version;    // "OpenCL 3.0 ..."
  std::string opencl_c_version;  // "OpenCL C 1.2 ..."
  std::string extensions;        // space-separated
  cl_device_type type = 0;
  uint64_t global_mem_bytes = 0;
  uint64_t local_mem_bytes = 0;
  uint64_t max_alloc_bytes = 0;
  bool unified_memory = false;  // CL_DEVICE_HOST_UNIFIED_MEMORY
  bool correctly_rounded_div_sqrt = false;
  size_t max_work_group_size = 0;
  uint32_t compute_units = 0;
  Vendor vendor_kind = Vendor::kOther;

  bool HasExtension(std::string_view extension) const;
  // "GPU", "CPU", "accelerator" or "other".
  std::string_view TypeName() const;
};

// Which kernel code paths and tile sizes a device gets. The baseline is OpenCL C 1.2
// without extensions; each `use_*` is on only when the device reports the extension.
struct KernelVariant {
  bool use_fp16 = false;                // cl_khr_fp16
  bool use_subgroups = false;           // cl_khr_subgroups or cl_intel_subgroups (reductions)
  bool use_qcom_subgroup_size = false;  // cl_qcom_reqd_sub_group_size (Adreno)
  bool use_int_dot = false;             // cl_khr_integer_dot_product (Mali, newer Adreno)
  // cl_arm_integer_dot_product_accumulate_int8 (Mali drivers without the khr
  // extension): the same integer path through arm_dot_acc. Only when !use_int_dot.
  bool use_arm_dot = false;
  // Tests only: the integer dot product path with software builtins, so that it runs
  // (and is compared with the CPU) on a device without the extension. Never default.
  bool int_dot_polyfill = false;
  // Tests only: the sub-group code with the work-group as one sub-group (local memory).
  bool subgroups_polyfill = false;
  // Tests only: the cl_arm integer dot path with a software arm_dot_acc.
  bool arm_dot_polyfill = false;
  // GEMV: work-items that split one output row's K blocks (1: one work-item per row,
  // the exact block order of kernels/ukernel.h; >1: a tree reduction, a few ulps off).
  int gemv_k_split = 1;
  // GEMV work-group size (rows per group when gemv_k_split == 1).
  size_t gemv_wg = 64;
  // GEMM: activation rows per work-item (weights read once for all of them).
  int gemm_mr = 4;
  size_t gemm_wg = 64;
  // Reductions over a row (RMSNorm, softmax, attention): work-group size.
  size_t row_wg = 64;

  // The -D options that select this variant in the .cl sources.
  std::string BuildOptions() const;
};

// The variant a device gets by default: extensions it reports, tiles per vendor.
KernelVariant DefaultVariant(const DeviceInfo& info);

struct DeviceOptions {
  // Accept a CPU or accelerator device when no GPU exists (PoCL in tests; slow).
  bool allow_cpu = false;
  // Substring that the device name must contain ("" = any).
  std::string name_filter;
  // Program binary cache: directory ("" = $XDG_CACHE_HOME/moert/opencl, else
  // ~/.cache/moert/opencl), or off.
  std::string cache_dir;
  bool disable_cache = false;
  // Overrides DefaultVariant (tests run every variant the device can).
  bool has_variant = false;
  KernelVariant variant;
};

class Device {
 public:
  // Opens the first GPU (then, when allowed, a CPU/accelerator) device of any
  // platform. NotFound "no OpenCL platform found (OCL_ICD_VENDORS=...)" when the ICD
  // loader finds no platform; NotFound when no usable device exists.
  static absl::StatusOr<std::unique_ptr<Device>> Open(const DeviceOptions& options = {});
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  const KernelVariant& variant() const { return variant_; }
  cl_device_id id() const { return device_; }
  cl_context context() const { return context_; }
  cl_command_queue queue() const { return queue_; }
  ProgramCache& programs() { return *programs_; }

  // Waits for every enqueued command; a device lost while they ran shows up here.
  absl::Status Finish();
  // Submits enqueued commands without waiting.
  absl::Status Flush();

 private:
  Device() = default;

  DeviceInfo info_;
  KernelVariant variant_;
  cl_platform_id platform_ = nullptr;
  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::unique_ptr<ProgramCache> programs_;
};

// Every platform and device, for moert-cl-info: one DeviceInfo per device. The same
// NotFound as Device::Open when there is no platform.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_DEVICE_H_
