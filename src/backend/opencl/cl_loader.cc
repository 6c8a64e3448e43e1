#include "backend/opencl/cl_loader.h"

#include <dlfcn.h>

#include <cstdlib>

#include "core/strings.h"

namespace moert::backend::opencl {
namespace {

// Opened once, on first use; never destroyed (the forwarders may run during exit).
const absl::StatusOr<ClApi>& Process() {
  static const auto* const api = new absl::StatusOr<ClApi>(OpenClLibrary(ClLibraryCandidates()));
  return *api;
}

}  // namespace

std::vector<std::string> ClLibraryCandidates() {
  std::vector<std::string> candidates;
  const char* chosen = std::getenv("MOERT_OPENCL_LIBRARY");
  if (chosen != nullptr && chosen[0] != '\0') return {chosen};  // the caller's choice only
#if defined(__ANDROID__)
#if defined(__LP64__)
#define MOERT_LIB "lib64"
#else
#define MOERT_LIB "lib"
#endif
  // The name first: an app that declares <uses-native-library android:name=
  // "libOpenCL.so"> (Android 12+) gets the vendor's through the linker namespace.
  for (const char* path : {
           "libOpenCL.so",
           "/vendor/" MOERT_LIB "/libOpenCL.so",         // Adreno, and most vendors
           "/system/vendor/" MOERT_LIB "/libOpenCL.so",
           "/system/" MOERT_LIB "/libOpenCL.so",
           "/vendor/" MOERT_LIB "/egl/libGLES_mali.so",  // Mali: OpenCL is in the GLES driver
           "/system/vendor/" MOERT_LIB "/egl/libGLES_mali.so",
           "/vendor/" MOERT_LIB "/libGLES_mali.so",
           "libGLES_mali.so",
           "/vendor/" MOERT_LIB "/libPVROCL.so",  // PowerVR
       }) {
    candidates.emplace_back(path);
  }
#undef MOERT_LIB
#else
  // The Khronos or ocl-icd ICD loader, which finds the drivers (PoCL, NVIDIA, ...).
  candidates.emplace_back("libOpenCL.so.1");
  candidates.emplace_back("libOpenCL.so");
#endif
  return candidates;
}

absl::StatusOr<ClApi> OpenClLibrary(const std::vector<std::string>& candidates) {
  std::string why;
  for (const std::string& candidate : candidates) {
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = ::dlerror();
      StrAppend(&why, "\n  ", candidate, ": ", error != nullptr ? error : "cannot be opened");
      continue;
    }
    ClApi api;
    std::string missing;
#define MOERT_CL_RESOLVE(name)                                                  \
  api.name = reinterpret_cast<decltype(api.name)>(::dlsym(handle, #name));       \
  if (api.name == nullptr && missing.empty()) missing = #name;
    MOERT_CL_FUNCTIONS(MOERT_CL_RESOLVE)
#undef MOERT_CL_RESOLVE
    if (!missing.empty()) {
      StrAppend(&why, "\n  ", candidate, ": has no ", missing);
      ::dlclose(handle);
      continue;
    }
    api.library = candidate;
    return api;  // the handle stays open: the functions are called until the process ends
  }
  return absl::NotFoundError(
      StrCat("no OpenCL library opens (set MOERT_OPENCL_LIBRARY to its path):", why));
}

const ClApi* ProcessClApi() {
  const absl::StatusOr<ClApi>& api = Process();
  return api.ok() ? &*api : nullptr;
}

std::string ClLoaderError() {
#if defined(MOERT_OPENCL_DLOPEN)
  const absl::StatusOr<ClApi>& api = Process();
  return api.ok() ? std::string() : std::string(api.status().message());
#else
  return std::string();
#endif
}

}  // namespace moert::backend::opencl

#if defined(MOERT_OPENCL_DLOPEN)
// The OpenCL entry points, each forwarding to the process's library. Hidden (the
// library's visibility preset), so they satisfy the backend's calls only.
namespace {

// What a call answers when no OpenCL library opened: the ICD loader's "no platform".
constexpr cl_int kNoLibrary = CL_PLATFORM_NOT_FOUND_KHR;

const moert::backend::opencl::ClApi* Api() { return moert::backend::opencl::ProcessClApi(); }

std::nullptr_t NoLibrary(cl_int* errcode_ret) {
  if (errcode_ret != nullptr) *errcode_ret = kNoLibrary;
  return nullptr;
}

}  // namespace

#define MOERT_CL_FORWARD(ret, name, failure, params, args)  \
  extern "C" ret CL_API_CALL name params {                  \
    const moert::backend::opencl::ClApi* api = Api();       \
    if (api == nullptr) return failure;                     \
    return api->name args;                                  \
  }

MOERT_CL_FORWARD(cl_int, clGetPlatformIDs, kNoLibrary,
                 (cl_uint num_entries, cl_platform_id* platforms, cl_uint* num_platforms),
                 (num_entries, platforms, num_platforms))
MOERT_CL_FORWARD(cl_int, clGetPlatformInfo, kNoLibrary,
                 (cl_platform_id platform, cl_platform_info param_name, size_t param_value_size,
                  void* param_value, size_t* param_value_size_ret),
                 (platform, param_name, param_value_size, param_value, param_value_size_ret))
MOERT_CL_FORWARD(cl_int, clGetDeviceIDs, kNoLibrary,
                 (cl_platform_id platform, cl_device_type device_type, cl_uint num_entries,
                  cl_device_id* devices, cl_uint* num_devices),
                 (platform, device_type, num_entries, devices, num_devices))
MOERT_CL_FORWARD(cl_int, clGetDeviceInfo, kNoLibrary,
                 (cl_device_id device, cl_device_info param_name, size_t param_value_size,
                  void* param_value, size_t* param_value_size_ret),
                 (device, param_name, param_value_size, param_value, param_value_size_ret))
MOERT_CL_FORWARD(cl_context, clCreateContext, NoLibrary(errcode_ret),
                 (const cl_context_properties* properties, cl_uint num_devices,
                  const cl_device_id* devices,
                  void(CL_CALLBACK* pfn_notify)(const char* errinfo, const void* private_info,
                                                size_t cb, void* user_data),
                  void* user_data, cl_int* errcode_ret),
                 (properties, num_devices, devices, pfn_notify, user_data, errcode_ret))
MOERT_CL_FORWARD(cl_int, clReleaseContext, kNoLibrary, (cl_context context), (context))
MOERT_CL_FORWARD(cl_command_queue, clCreateCommandQueue, NoLibrary(errcode_ret),
                 (cl_context context, cl_device_id device, cl_command_queue_properties properties,
                  cl_int* errcode_ret),
                 (context, device, properties, errcode_ret))
MOERT_CL_FORWARD(cl_int, clReleaseCommandQueue, kNoLibrary, (cl_command_queue command_queue),
                 (command_queue))
MOERT_CL_FORWARD(cl_mem, clCreateBuffer, NoLibrary(errcode_ret),
                 (cl_context context, cl_mem_flags flags, size_t size, void* host_ptr,
                  cl_int* errcode_ret),
                 (context, flags, size, host_ptr, errcode_ret))
MOERT_CL_FORWARD(cl_int, clReleaseMemObject, kNoLibrary, (cl_mem memobj), (memobj))
MOERT_CL_FORWARD(cl_int, clGetMemObjectInfo, kNoLibrary,
                 (cl_mem memobj, cl_mem_info param_name, size_t param_value_size, void* param_value,
                  size_t* param_value_size_ret),
                 (memobj, param_name, param_value_size, param_value, param_value_size_ret))
MOERT_CL_FORWARD(cl_program, clCreateProgramWithSource, NoLibrary(errcode_ret),
                 (cl_context context, cl_uint count, const char** strings, const size_t* lengths,
                  cl_int* errcode_ret),
                 (context, count, strings, lengths, errcode_ret))
MOERT_CL_FORWARD(cl_program, clCreateProgramWithBinary, NoLibrary(errcode_ret),
                 (cl_context context, cl_uint num_devices, const cl_device_id* device_list,
                  const size_t* lengths, const unsigned char** binaries, cl_int* binary_status,
                  cl_int* errcode_ret),
                 (context, num_devices, device_list, lengths, binaries, binary_status,
                  errcode_ret))
MOERT_CL_FORWARD(cl_int, clBuildProgram, kNoLibrary,
                 (cl_program program, cl_uint num_devices, const cl_device_id* device_list,
                  const char* options, void(CL_CALLBACK* pfn_notify)(cl_program, void*),
                  void* user_data),
                 (program, num_devices, device_list, options, pfn_notify, user_data))
MOERT_CL_FORWARD(cl_int, clGetProgramInfo, kNoLibrary,
                 (cl_program program, cl_program_info param_name, size_t param_value_size,
                  void* param_value, size_t* param_value_size_ret),
                 (program, param_name, param_value_size, param_value, param_value_size_ret))
MOERT_CL_FORWARD(cl_int, clGetProgramBuildInfo, kNoLibrary,
                 (cl_program program, cl_device_id device, cl_program_build_info param_name,
                  size_t param_value_size, void* param_value, size_t* param_value_size_ret),
                 (program, device, param_name, param_value_size, param_value,
                  param_value_size_ret))
MOERT_CL_FORWARD(cl_int, clReleaseProgram, kNoLibrary, (cl_program program), (program))
MOERT_CL_FORWARD(cl_kernel, clCreateKernel, NoLibrary(errcode_ret),
                 (cl_program program, const char* kernel_name, cl_int* errcode_ret),
                 (program, kernel_name, errcode_ret))
MOERT_CL_FORWARD(cl_int, clReleaseKernel, kNoLibrary, (cl_kernel kernel), (kernel))
MOERT_CL_FORWARD(cl_int, clSetKernelArg, kNoLibrary,
                 (cl_kernel kernel, cl_uint arg_index, size_t arg_size, const void* arg_value),
                 (kernel, arg_index, arg_size, arg_value))
MOERT_CL_FORWARD(cl_int, clEnqueueNDRangeKernel, kNoLibrary,
                 (cl_command_queue command_queue, cl_kernel kernel, cl_uint work_dim,
                  const size_t* global_work_offset, const size_t* global_work_size,
                  const size_t* local_work_size, cl_uint num_events_in_wait_list,
                  const cl_event* event_wait_list, cl_event* event),
                 (command_queue, kernel, work_dim, global_work_offset, global_work_size,
                  local_work_size, num_events_in_wait_list, event_wait_list, event))
MOERT_CL_FORWARD(cl_int, clEnqueueWriteBuffer, kNoLibrary,
                 (cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_write,
                  size_t offset, size_t size, const void* ptr, cl_uint num_events_in_wait_list,
                  const cl_event* event_wait_list, cl_event* event),
                 (command_queue, buffer, blocking_write, offset, size, ptr,
                  num_events_in_wait_list, event_wait_list, event))
MOERT_CL_FORWARD(cl_int, clEnqueueReadBuffer, kNoLibrary,
                 (cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_read,
                  size_t offset, size_t size, void* ptr, cl_uint num_events_in_wait_list,
                  const cl_event* event_wait_list, cl_event* event),
                 (command_queue, buffer, blocking_read, offset, size, ptr,
                  num_events_in_wait_list, event_wait_list, event))
MOERT_CL_FORWARD(void*, clEnqueueMapBuffer, NoLibrary(errcode_ret),
                 (cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_map,
                  cl_map_flags map_flags, size_t offset, size_t size,
                  cl_uint num_events_in_wait_list, const cl_event* event_wait_list,
                  cl_event* event, cl_int* errcode_ret),
                 (command_queue, buffer, blocking_map, map_flags, offset, size,
                  num_events_in_wait_list, event_wait_list, event, errcode_ret))
MOERT_CL_FORWARD(cl_int, clEnqueueUnmapMemObject, kNoLibrary,
                 (cl_command_queue command_queue, cl_mem memobj, void* mapped_ptr,
                  cl_uint num_events_in_wait_list, const cl_event* event_wait_list,
                  cl_event* event),
                 (command_queue, memobj, mapped_ptr, num_events_in_wait_list, event_wait_list,
                  event))
MOERT_CL_FORWARD(cl_int, clFlush, kNoLibrary, (cl_command_queue command_queue), (command_queue))
MOERT_CL_FORWARD(cl_int, clFinish, kNoLibrary, (cl_command_queue command_queue), (command_queue))

#undef MOERT_CL_FORWARD
#endif  // MOERT_OPENCL_DLOPEN
