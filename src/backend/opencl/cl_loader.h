// The OpenCL library looked up at run time (MOERT_OPENCL_DLOPEN, the default): the
// backend calls the OpenCL C API as usual, and the library defines those entry points
// itself (hidden, so an app's own OpenCL is not shadowed), each forwarding to the
// function of the first OpenCL library that opens: MOERT_OPENCL_LIBRARY when set, else
// the ICD loader on Linux, or the vendors' libraries on Android (Adreno's libOpenCL.so,
// Mali's libGLES_mali.so, PowerVR's libPVROCL.so), where the NDK has no libOpenCL to link.
// Without any, clGetPlatformIDs answers CL_PLATFORM_NOT_FOUND_KHR and the model runs on
// the CPU, the reason (ClLoaderError) in the backend note.
#ifndef MOERT_BACKEND_OPENCL_CL_LOADER_H_
#define MOERT_BACKEND_OPENCL_CL_LOADER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/opencl/cl_status.h"

namespace moert::backend::opencl {

// The OpenCL 1.2 entry points the backend calls, X(name) each.
#define MOERT_CL_FUNCTIONS(X)                                                          \
  X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo)        \
  X(clCreateContext) X(clReleaseContext) X(clCreateCommandQueue)                       \
  X(clReleaseCommandQueue) X(clCreateBuffer) X(clReleaseMemObject)                     \
  X(clGetMemObjectInfo) X(clCreateProgramWithSource) X(clCreateProgramWithBinary)      \
  X(clBuildProgram) X(clGetProgramInfo) X(clGetProgramBuildInfo) X(clReleaseProgram)   \
  X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg) X(clEnqueueNDRangeKernel)     \
  X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer) X(clEnqueueMapBuffer)                 \
  X(clEnqueueUnmapMemObject) X(clFlush) X(clFinish)

// The functions of one opened OpenCL library.
struct ClApi {
#define MOERT_CL_MEMBER(name) decltype(&::name) name = nullptr;
  MOERT_CL_FUNCTIONS(MOERT_CL_MEMBER)
#undef MOERT_CL_MEMBER
  std::string library;  // the path or name it was opened by
};

// Where OpenCL is looked for: $MOERT_OPENCL_LIBRARY alone when set, else the platform's
// usual names and paths, in order.
std::vector<std::string> ClLibraryCandidates();

// Opens the first of `candidates` that dlopen()s and has every function of
// MOERT_CL_FUNCTIONS (the handle stays open for the process). NotFound naming every
// candidate and why it was passed over (dlopen's message, or the missing function).
absl::StatusOr<ClApi> OpenClLibrary(const std::vector<std::string>& candidates);

// The process's OpenCL, opened once from ClLibraryCandidates(); nullptr when none opens.
const ClApi* ProcessClApi();

// Why ProcessClApi() is nullptr ("" when it is not, or without MOERT_OPENCL_DLOPEN).
std::string ClLoaderError();

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_CL_LOADER_H_
