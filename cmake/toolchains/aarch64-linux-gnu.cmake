# Cross build for aarch64 Linux with Debian's g++-aarch64-linux-gnu; tests run under
# qemu-aarch64-static -cpu max. Dependencies come from MOERT_ARM64_SYSROOT, a folder of
# unpacked arm64 Debian packages (scripts/arm64-sysroot.sh). qemu gets exactly one C
# library, the cross toolchain's (-L /usr/aarch64-linux-gnu): mixing it with a
# multiarch libc6:arm64 hangs pthread_create. The sysroot's shared libraries reach
# the emulated program through LD_LIBRARY_PATH (qemu -E); MOERT_TEST_EMULATED tells
# tests that need to exec a binary again (threadsafe death tests) that they cannot.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(NOT MOERT_ARM64_SYSROOT)
  set(MOERT_ARM64_SYSROOT "${CMAKE_BINARY_DIR}/sysroot")
endif()
set(MOERT_ARM64_SYSROOT "${MOERT_ARM64_SYSROOT}" CACHE PATH
    "Unpacked arm64 Debian packages (scripts/arm64-sysroot.sh)")
# Try-compile projects need the variable too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MOERT_ARM64_SYSROOT)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu "${MOERT_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(_moert_arm64_libs "${MOERT_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu")
# The linker resolves the sysroot libraries' own dependencies from here.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-rpath-link,${_moert_arm64_libs}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-Wl,-rpath-link,${_moert_arm64_libs}")

find_program(MOERT_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR
    "${MOERT_QEMU_AARCH64};-cpu;max;-L;/usr/aarch64-linux-gnu;-E;LD_LIBRARY_PATH=${_moert_arm64_libs};-E;MOERT_TEST_EMULATED=qemu-aarch64")
