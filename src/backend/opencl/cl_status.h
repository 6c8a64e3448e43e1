// The OpenCL C API as the backend includes it (OpenCL 1.2 entry points only, so the
// same code runs on Adreno and Mali drivers that stop at 1.2 or 2.0), and the mapping
// of every cl_int error code to an absl::Status that names the call and the error.
#ifndef MOERT_BACKEND_OPENCL_CL_STATUS_H_
#define MOERT_BACKEND_OPENCL_CL_STATUS_H_

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <string_view>

#include "absl/status/status.h"

namespace moert::backend::opencl {

// "CL_OUT_OF_RESOURCES" etc.; "CL_UNKNOWN_ERROR(<code>)" style text for unknown codes
// is produced by ClStatus, this returns nullptr for them.
const char* ClErrorName(cl_int err);

// OK for CL_SUCCESS; otherwise a Status naming `call` and the error. The code says
// what a caller can do about it: out of resources / memory -> kResourceExhausted,
// a lost device (CL_DEVICE_NOT_AVAILABLE, an error in an earlier command) ->
// kUnavailable, a failed program build -> kInternal, bad arguments -> kInvalidArgument,
// no platform -> kNotFound.
absl::Status ClStatus(cl_int err, std::string_view call);

}  // namespace moert::backend::opencl

// Returns the Status of a cl call's error code from the enclosing function.
#define MOERT_CL_RETURN_IF_ERROR(expr, call_name) \
  MOERT_RETURN_IF_ERROR(::moert::backend::opencl::ClStatus((expr), (call_name)))

#endif  // MOERT_BACKEND_OPENCL_CL_STATUS_H_
