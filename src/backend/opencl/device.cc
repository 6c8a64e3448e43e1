// Opening an OpenCL device: platform/device choice, DeviceInfo, the default kernel
// variant per vendor, context and queue (see device.h).
#include "backend/opencl/device.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include "backend/opencl/cl_loader.h"
#include "backend/opencl/program_cache.h"
#include "core/status.h"
#include "core/strings.h"

namespace moert::backend::opencl {
namespace {

absl::StatusOr<std::string> DeviceString(cl_device_id device, cl_device_info param,
                                         std::string_view what) {
  size_t size = 0;
  MOERT_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, 0, nullptr, &size),
                           StrCat("clGetDeviceInfo(", what, ")"));
  std::string s(size, '\0');
  MOERT_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, size, s.data(), nullptr),
                           StrCat("clGetDeviceInfo(", what, ")"));
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

template <typename T>
absl::StatusOr<T> DeviceValue(cl_device_id device, cl_device_info param, std::string_view what) {
  T value{};
  MOERT_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, sizeof(T), &value, nullptr),
                           StrCat("clGetDeviceInfo(", what, ")"));
  return value;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

absl::StatusOr<DeviceInfo> QueryDevice(cl_platform_id platform, cl_device_id device) {
  DeviceInfo info;
  size_t size = 0;
  MOERT_CL_RETURN_IF_ERROR(clGetPlatformInfo(platform, CL_PLATFORM_NAME, 0, nullptr, &size),
                           "clGetPlatformInfo(CL_PLATFORM_NAME)");
  info.platform_name.resize(size);
  MOERT_CL_RETURN_IF_ERROR(
      clGetPlatformInfo(platform, CL_PLATFORM_NAME, size, info.platform_name.data(), nullptr),
      "clGetPlatformInfo(CL_PLATFORM_NAME)");
  while (!info.platform_name.empty() && info.platform_name.back() == '\0') {
    info.platform_name.pop_back();
  }
  MOERT_ASSIGN_OR_RETURN(info.name, DeviceString(device, CL_DEVICE_NAME, "CL_DEVICE_NAME"));
  MOERT_ASSIGN_OR_RETURN(info.vendor, DeviceString(device, CL_DEVICE_VENDOR, "CL_DEVICE_VENDOR"));
  MOERT_ASSIGN_OR_RETURN(info.driver_version,
                         DeviceString(device, CL_DRIVER_VERSION, "CL_DRIVER_VERSION"));
  MOERT_ASSIGN_OR_RETURN(info.device_version,
                         DeviceString(device, CL_DEVICE_VERSION, "CL_DEVICE_VERSION"));
  MOERT_ASSIGN_OR_RETURN(info.opencl_c_version, DeviceString(device, CL_DEVICE_OPENCL_C_VERSION,
                                                             "CL_DEVICE_OPENCL_C_VERSION"));
  MOERT_ASSIGN_OR_RETURN(info.extensions,
                         DeviceString(device, CL_DEVICE_EXTENSIONS, "CL_DEVICE_EXTENSIONS"));
  MOERT_ASSIGN_OR_RETURN(info.type,
                         DeviceValue<cl_device_type>(device, CL_DEVICE_TYPE, "CL_DEVICE_TYPE"));
  MOERT_ASSIGN_OR_RETURN(
      info.global_mem_bytes,
      DeviceValue<cl_ulong>(device, CL_DEVICE_GLOBAL_MEM_SIZE, "CL_DEVICE_GLOBAL_MEM_SIZE"));
  MOERT_ASSIGN_OR_RETURN(
      info.local_mem_bytes,
      DeviceValue<cl_ulong>(device, CL_DEVICE_LOCAL_MEM_SIZE, "CL_DEVICE_LOCAL_MEM_SIZE"));
  MOERT_ASSIGN_OR_RETURN(
      info.max_alloc_bytes,
      DeviceValue<cl_ulong>(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, "CL_DEVICE_MAX_MEM_ALLOC_SIZE"));
  MOERT_ASSIGN_OR_RETURN(
      const cl_bool unified,
      DeviceValue<cl_bool>(device, CL_DEVICE_HOST_UNIFIED_MEMORY, "CL_DEVICE_HOST_UNIFIED_MEMORY"));
  info.unified_memory = unified != CL_FALSE;
  MOERT_ASSIGN_OR_RETURN(const cl_device_fp_config fp,
                         DeviceValue<cl_device_fp_config>(device, CL_DEVICE_SINGLE_FP_CONFIG,
                                                          "CL_DEVICE_SINGLE_FP_CONFIG"));
  info.correctly_rounded_div_sqrt = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  MOERT_ASSIGN_OR_RETURN(
      info.max_work_group_size,
      DeviceValue<size_t>(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, "CL_DEVICE_MAX_WORK_GROUP_SIZE"));
  MOERT_ASSIGN_OR_RETURN(
      info.compute_units,
      DeviceValue<cl_uint>(device, CL_DEVICE_MAX_COMPUTE_UNITS, "CL_DEVICE_MAX_COMPUTE_UNITS"));
  const std::string id = Lower(info.vendor + " " + info.name);
  if (id.find("qualcomm") != std::string::npos || id.find("adreno") != std::string::npos) {
    info.vendor_kind = Vendor::kAdreno;
  } else if (id.find("arm") != std::string::npos || id.find("mali") != std::string::npos) {
    info.vendor_kind = Vendor::kMali;
  }
  return info;
}

// The ICD loader's answer when it finds no vendor file is CL_PLATFORM_NOT_FOUND_KHR
// (or success with zero platforms); both become the same clear message.
absl::Status NoPlatform() {
  const std::string no_library = ClLoaderError();
  if (!no_library.empty()) return absl::NotFoundError(no_library);
  const char* vendors = std::getenv("OCL_ICD_VENDORS");
  return absl::NotFoundError(
      StrCat("no OpenCL platform found (OCL_ICD_VENDORS=",
             vendors != nullptr ? vendors : "<unset: /etc/OpenCL/vendors>",
             "); install an OpenCL driver (an ICD) for the GPU, or pocl-opencl-icd"));
}

absl::StatusOr<std::vector<cl_platform_id>> Platforms() {
  cl_uint n = 0;
  const cl_int err = clGetPlatformIDs(0, nullptr, &n);
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n == 0)) return NoPlatform();
  MOERT_CL_RETURN_IF_ERROR(err, "clGetPlatformIDs");
  std::vector<cl_platform_id> platforms(n);
  MOERT_CL_RETURN_IF_ERROR(clGetPlatformIDs(n, platforms.data(), nullptr), "clGetPlatformIDs");
  return platforms;
}

std::vector<cl_device_id> Devices(cl_platform_id platform, cl_device_type type) {
  cl_uint n = 0;
  if (clGetDeviceIDs(platform, type, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::vector<cl_device_id> devices(n);
  if (clGetDeviceIDs(platform, type, n, devices.data(), nullptr) != CL_SUCCESS) return {};
  return devices;
}

}  // namespace

bool DeviceInfo::HasExtension(std::string_view extension) const {
  size_t pos = 0;
  const std::string_view all = extensions;
  while (pos < all.size()) {
    size_t end = all.find(' ', pos);
    if (end == std::string_view::npos) end = all.size();
    if (all.substr(pos, end - pos) == extension) return true;
    pos = end + 1;
  }
  return false;
}

std::string_view DeviceInfo::TypeName() const {
  if ((type & CL_DEVICE_TYPE_GPU) != 0) return "GPU";
  if ((type & CL_DEVICE_TYPE_CPU) != 0) return "CPU";
  if ((type & CL_DEVICE_TYPE_ACCELERATOR) != 0) return "accelerator";
  return "other";
}

std::string KernelVariant::BuildOptions() const {
  std::string s = StrCat("-DMOERT_GEMV_KSPLIT=", gemv_k_split, " -DMOERT_GEMM_MR=", gemm_mr);
  if (use_fp16) s += " -DMOERT_CL_FP16=1";
  if (use_subgroups) s += " -DMOERT_CL_SUBGROUPS=1";
  if (use_qcom_subgroup_size) s += " -DMOERT_CL_QCOM_SUBGROUP_SIZE=1";
  if (use_int_dot) s += " -DMOERT_CL_INT_DOT=1";
  if (use_arm_dot) s += " -DMOERT_CL_ARM_DOT=1";
  if (int_dot_polyfill) s += " -DMOERT_CL_INT_DOT_POLYFILL=1";
  if (subgroups_polyfill) s += " -DMOERT_CL_SUBGROUPS_POLYFILL=1";
  if (arm_dot_polyfill) s += " -DMOERT_CL_ARM_DOT_POLYFILL=1";
  return s;
}

KernelVariant DefaultVariant(const DeviceInfo& info) {
  KernelVariant v;
  v.use_fp16 = info.HasExtension("cl_khr_fp16");
  // The sub-group split-K reduction is compiled by clang and tested through its
  // polyfill, but has never run on a device with real sub-groups (it assumes row-major
  // sub-group numbering) nor been timed: off until it has (the local-memory tree runs).
  v.use_subgroups = false;
  v.use_qcom_subgroup_size = info.HasExtension("cl_qcom_reqd_sub_group_size");
  v.use_int_dot = info.HasExtension("cl_khr_integer_dot_product");
  v.use_arm_dot =
      !v.use_int_dot && info.HasExtension("cl_arm_integer_dot_product_accumulate_int8");
  const bool gpu = (info.type & CL_DEVICE_TYPE_GPU) != 0;
  switch (info.vendor_kind) {
    case Vendor::kAdreno:
      // Adreno waves are 64 (half) or 128 (full) wide; 8 work-items per row spread a
      // row's blocks so that neighbouring items read neighbouring bytes.
      v.gemv_k_split = 8;
      v.gemv_wg = 128;
      v.gemm_mr = 4;
      v.gemm_wg = 128;
      v.row_wg = 128;
      break;
    case Vendor::kMali:
      // Valhall warps are 16 wide; smaller groups keep more of them resident.
      v.gemv_k_split = 4;
      v.gemv_wg = 64;
      v.gemm_mr = 4;
      v.gemm_wg = 64;
      v.row_wg = 64;
      break;
    case Vendor::kOther:
      // Desktop GPUs: split K across 8 items; CPU devices (PoCL): one item per row,
      // which is also the exact block order of the CPU kernels.
      v.gemv_k_split = gpu ? 8 : 1;
      v.gemv_wg = gpu ? 128 : 64;
      v.gemm_mr = 4;
      v.gemm_wg = 64;
      v.row_wg = 64;
      break;
  }
  const size_t max_wg = std::max<size_t>(info.max_work_group_size, 1);
  v.gemv_wg = std::min(v.gemv_wg, max_wg);
  v.gemm_wg = std::min(v.gemm_wg, max_wg);
  v.row_wg = std::min(v.row_wg, max_wg);
  while (v.gemv_k_split > 1 && static_cast<size_t>(v.gemv_k_split) > v.gemv_wg) v.gemv_k_split /= 2;
  return v;
}

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  MOERT_ASSIGN_OR_RETURN(const std::vector<cl_platform_id> platforms, Platforms());
  std::vector<DeviceInfo> out;
  for (cl_platform_id p : platforms) {
    for (cl_device_id d : Devices(p, CL_DEVICE_TYPE_ALL)) {
      MOERT_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(p, d));
      out.push_back(std::move(info));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Device>> Device::Open(const DeviceOptions& options) {
  MOERT_ASSIGN_OR_RETURN(const std::vector<cl_platform_id> platforms, Platforms());
  // GPUs of every platform first, then (when allowed) the rest.
  std::vector<cl_device_type> types = {CL_DEVICE_TYPE_GPU};
  if (options.allow_cpu) {
    types.push_back(CL_DEVICE_TYPE_ACCELERATOR);
    types.push_back(CL_DEVICE_TYPE_CPU);
  }
  std::string seen;
  for (cl_device_type type : types) {
    for (cl_platform_id p : platforms) {
      for (cl_device_id d : Devices(p, type)) {
        MOERT_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(p, d));
        if (!options.name_filter.empty() &&
            info.name.find(options.name_filter) == std::string::npos) {
          StrAppend(&seen, seen.empty() ? "" : ", ", info.name);
          continue;
        }
        auto device = std::unique_ptr<Device>(new Device());
        device->info_ = std::move(info);
        device->platform_ = p;
        device->device_ = d;
        device->variant_ = options.has_variant ? options.variant : DefaultVariant(device->info_);
        cl_int err = CL_SUCCESS;
        const cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                               reinterpret_cast<cl_context_properties>(p), 0};
        device->context_ = clCreateContext(props, 1, &d, nullptr, nullptr, &err);
        MOERT_CL_RETURN_IF_ERROR(err, "clCreateContext");
        device->queue_ = clCreateCommandQueue(device->context_, d, 0, &err);
        MOERT_CL_RETURN_IF_ERROR(err, "clCreateCommandQueue");
        std::string cache_dir;
        if (!options.disable_cache) {
          cache_dir = options.cache_dir.empty() ? DefaultCacheDir() : options.cache_dir;
        }
        std::string base = device->variant_.BuildOptions();
        // The CPU quantizer divides correctly rounded; match it where the device can.
        if (device->info_.correctly_rounded_div_sqrt) {
          base += " -cl-fp32-correctly-rounded-divide-sqrt";
        }
        device->programs_ = std::make_unique<ProgramCache>(device->context_, d, device->info_,
                                                           std::move(base), std::move(cache_dir));
        return device;
      }
    }
  }
  if (!seen.empty()) {
    return absl::NotFoundError(
        StrCat("no OpenCL device named like '", options.name_filter, "' (found: ", seen, ")"));
  }
  return absl::NotFoundError(options.allow_cpu
                                 ? "no OpenCL device found"
                                 : "no OpenCL GPU found (CPU devices such as PoCL's are not used "
                                   "unless allowed)");
}

Device::~Device() {
  programs_.reset();
  if (queue_ != nullptr) {
    clFinish(queue_);
    clReleaseCommandQueue(queue_);
  }
  if (context_ != nullptr) clReleaseContext(context_);
}

absl::Status Device::Finish() { return ClStatus(clFinish(queue_), "clFinish"); }

absl::Status Device::Flush() { return ClStatus(clFlush(queue_), "clFlush"); }

}  // namespace moert::backend::opencl
