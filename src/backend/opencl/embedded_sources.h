// The OpenCL C sources of kernels/opencl/, compiled into the library at build time
// (cmake/MoertOpenCL.cmake generates the definition).
#ifndef MOERT_BACKEND_OPENCL_EMBEDDED_SOURCES_H_
#define MOERT_BACKEND_OPENCL_EMBEDDED_SOURCES_H_

#include <optional>
#include <string_view>

namespace moert::backend::opencl {

// The text of kernels/opencl/<name>.cl ("q8_quant", "common", ...); nullopt when no
// such file was embedded.
std::optional<std::string_view> EmbeddedSource(std::string_view name);

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_EMBEDDED_SOURCES_H_
