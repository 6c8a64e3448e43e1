// moert-cl-info: the OpenCL platforms and devices moert can see (name, driver, OpenCL
// C version, memory, extensions) and the kernel variant each would get. Exits 1 with
// the reason (e.g. "no OpenCL platform found (OCL_ICD_VENDORS=...)") when there is
// none, so scripts and ctest can check for a usable device.
#include <cstdio>
#include <cstring>
#include <string>

#ifdef MOERT_HAVE_OPENCL
#include "backend/opencl/device.h"
#endif

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: moert-cl-info\n  Lists the OpenCL devices moert can use.\n");
      return 0;
    }
    std::fprintf(stderr, "moert-cl-info: unknown argument '%s'\n", argv[i]);
    return 2;
  }
#ifndef MOERT_HAVE_OPENCL
  std::fprintf(stderr, "moert-cl-info: this build of moert has no OpenCL backend\n");
  return 1;
#else
  using moert::backend::opencl::DefaultVariant;
  using moert::backend::opencl::DeviceInfo;
  auto devices = moert::backend::opencl::ListDevices();
  if (!devices.ok()) {
    std::fprintf(stderr, "moert-cl-info: %s\n", std::string(devices.status().message()).c_str());
    return 1;
  }
  if (devices->empty()) {
    std::fprintf(stderr, "moert-cl-info: no OpenCL device found\n");
    return 1;
  }
  for (size_t i = 0; i < devices->size(); ++i) {
    const DeviceInfo& d = (*devices)[i];
    std::printf("device %zu: %s\n", i, d.name.c_str());
    std::printf("  platform:        %s\n", d.platform_name.c_str());
    std::printf("  type:            %s\n", std::string(d.TypeName()).c_str());
    std::printf("  vendor:          %s\n", d.vendor.c_str());
    std::printf("  driver:          %s\n", d.driver_version.c_str());
    std::printf("  version:         %s\n", d.device_version.c_str());
    std::printf("  OpenCL C:        %s\n", d.opencl_c_version.c_str());
    std::printf("  global memory:   %llu MiB\n",
                static_cast<unsigned long long>(d.global_mem_bytes >> 20));
    std::printf("  local memory:    %llu KiB\n",
                static_cast<unsigned long long>(d.local_mem_bytes >> 10));
    std::printf("  unified memory:  %s\n", d.unified_memory ? "yes" : "no");
    std::printf("  max work-group:  %zu\n", d.max_work_group_size);
    std::printf("  compute units:   %u\n", d.compute_units);
    std::printf("  extensions:      %s\n", d.extensions.c_str());
    std::printf("  moert variant:   %s\n", DefaultVariant(d).BuildOptions().c_str());
  }
  return 0;
#endif
}
