# Finds moert's dependencies from Debian's packages (scripts/setup-deps.sh installs
# them). Abseil, GoogleTest and Google Benchmark come with CMake configs; XNNPACK,
# pthreadpool and cpuinfo are imported by cmake/MoertImportedDeps.cmake (Debian 12's
# cpuinfo config names a static libclog it does not ship for every arch, and the
# other two have no config at all).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
include(MoertImportedDeps)
# MOERT_HAVE_IO_URING: the expert loader's io_uring engine is built (experts/read_engine.h).
if(TARGET moert::uring)
  set(MOERT_HAVE_IO_URING ON)
  set(MOERT_URING_PC_LIBS "-luring ")
  message(STATUS "moert: expert reads through io_uring (${moert_uring_LIBRARY})")
else()
  set(MOERT_HAVE_IO_URING OFF)
  set(MOERT_URING_PC_LIBS "")
  if(MOERT_IO_URING)
    message(STATUS "moert: liburing not found; expert reads through pread threads only")
  endif()
endif()

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

# stb_image (Debian's libstb-dev), used header-only by src/vision/image.cc and by the
# vision tests (stb_image_write). MOERT_STB_INCLUDE_DIR is the folder holding
# stb/stb_image.h, or empty where the compiler searches it anyway. The headers are
# architecture-independent, so a cross build whose sysroot lacks libstb-dev:arm64
# takes the host's; since the host's /usr/include must not reach the cross compiler (it would
# shadow the target's libc and Abseil headers), the two stb headers are copied into
# the build tree and that copy is the include folder.
find_path(MOERT_STB_HEADER_DIR stb/stb_image.h)
if(NOT MOERT_STB_HEADER_DIR AND CMAKE_CROSSCOMPILING)
  find_path(MOERT_STB_HOST_HEADER_DIR stb/stb_image.h NO_CMAKE_FIND_ROOT_PATH)
  if(MOERT_STB_HOST_HEADER_DIR)
    foreach(header stb_image.h stb_image_write.h)
      if(NOT EXISTS "${MOERT_STB_HOST_HEADER_DIR}/stb/${header}")
        message(FATAL_ERROR "moert: ${MOERT_STB_HOST_HEADER_DIR}/stb/${header} not found; "
                            "install Debian's libstb-dev (scripts/setup-deps.sh)")
      endif()
      configure_file("${MOERT_STB_HOST_HEADER_DIR}/stb/${header}"
                     "${PROJECT_BINARY_DIR}/third_party/stb/include/stb/${header}" COPYONLY)
    endforeach()
    set(MOERT_STB_HEADER_DIR "${PROJECT_BINARY_DIR}/third_party/stb/include")
  endif()
endif()
if(NOT MOERT_STB_HEADER_DIR)
  message(FATAL_ERROR "moert: stb/stb_image.h not found; install Debian's libstb-dev "
                      "(scripts/setup-deps.sh)")
endif()
# A compiler default folder (/usr/include) is left out: naming it again, even for
# one source, reorders the system folders and breaks libstdc++'s #include_next.
if("${MOERT_STB_HEADER_DIR}" IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
  set(MOERT_STB_INCLUDE_DIR "")
else()
  set(MOERT_STB_INCLUDE_DIR "${MOERT_STB_HEADER_DIR}")
endif()
