# Finds moert's dependencies from Debian's packages (scripts/setup-deps.sh installs
# them). Abseil, GoogleTest and Google Benchmark come with CMake configs; XNNPACK,
# pthreadpool and cpuinfo are imported by cmake/MoertImportedDeps.cmake (Debian 12's
# cpuinfo config names a static libclog it does not ship for every arch, and the
# other two have no config at all).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
include(MoertImportedDeps)

# OpenCL: headers through their CMake config where the package has one, otherwise
# CMake's FindOpenCL (headers + ICD loader). Optional: without it the OpenCL backend
# is left out of the build.
find_package(OpenCLHeaders CONFIG QUIET)
find_package(OpenCL QUIET)
set(MOERT_HAVE_OPENCL ${OpenCL_FOUND})

if(MOERT_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  include(GoogleTest)
endif()
if(MOERT_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()
