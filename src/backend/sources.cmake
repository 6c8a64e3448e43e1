# Sources of src/backend (paths relative to src/).
list(APPEND MOERT_SOURCES
  backend/packing.cc
  backend/cpu/qmatmul.cc
  backend/cpu/kv_rows.cc
  backend/cpu/f32_ops.cc
  backend/matrix.cc
  backend/expert_groups.cc
  backend/kv_type.cc
  backend/backend.cc
  backend/cpu/cpu_backend.cc
  backend/cpu/xnnpack_f32.cc
  backend/registry.cc
  backend/device_kv.cc
  backend/cpu_fallback.cc
)
# The OpenCL backend (MOERT_HAVE_OPENCL, cmake/MoertOpenCL.cmake).
if(MOERT_HAVE_OPENCL)
  list(APPEND MOERT_SOURCES
    backend/opencl/cl_loader.cc
    backend/opencl/cl_status.cc
    backend/opencl/device.cc
    backend/opencl/program_cache.cc
    backend/opencl/buffer.cc
    backend/opencl/ops.cc
    backend/opencl/opencl_backend.cc
  )
endif()
