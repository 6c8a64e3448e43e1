# Cross build for Android arm64-v8a with the NDK (r26 or newer): API 26+, libc++ as a
# shared library (c++_shared, which an app with several native libraries must use),
# ELF segments aligned for 16 KiB pages (Android 15 devices may run with them).
#
#   cmake -S . -B build/android --preset android-arm64   # ANDROID_NDK_HOME set
#
# Wraps the NDK's own toolchain file. moert's dependencies (Abseil, XNNPACK,
# pthreadpool, cpuinfo, stb, zstd, libsodium) are not in the NDK: scripts/android-deps.sh
# builds them for arm64-v8a into one prefix; pass it as MOERT_ANDROID_PREFIX
# (docs/android.md). Without the NDK, ANDROID_NDK_HOME=cmake/toolchains/ndk-standin
# configures the same against Debian's aarch64 cross compiler.
if(NOT ANDROID_NDK)
  if(DEFINED ENV{ANDROID_NDK_HOME})
    set(ANDROID_NDK "$ENV{ANDROID_NDK_HOME}")
  elseif(DEFINED ENV{ANDROID_NDK_ROOT})
    set(ANDROID_NDK "$ENV{ANDROID_NDK_ROOT}")
  else()
    message(FATAL_ERROR "android-arm64.cmake: set ANDROID_NDK_HOME (or -DANDROID_NDK=) to the NDK")
  endif()
endif()
if(NOT ANDROID_ABI)
  set(ANDROID_ABI arm64-v8a)
endif()
if(NOT ANDROID_PLATFORM)
  set(ANDROID_PLATFORM android-26)
endif()
if(NOT ANDROID_STL)
  set(ANDROID_STL c++_shared)
endif()
# NDK r27+: link with 16 KiB-aligned segments (older NDKs ignore the variable; the
# linker flag below covers them).
set(ANDROID_SUPPORT_FLEXIBLE_PAGE_SIZES ON)
include("${ANDROID_NDK}/build/cmake/android.toolchain.cmake")

set(CMAKE_SHARED_LINKER_FLAGS_INIT "${CMAKE_SHARED_LINKER_FLAGS_INIT} -Wl,-z,max-page-size=16384")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${CMAKE_EXE_LINKER_FLAGS_INIT} -Wl,-z,max-page-size=16384")

if(MOERT_ANDROID_PREFIX)
  list(APPEND CMAKE_FIND_ROOT_PATH "${MOERT_ANDROID_PREFIX}")
  list(APPEND CMAKE_PREFIX_PATH "${MOERT_ANDROID_PREFIX}")
endif()
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MOERT_ANDROID_PREFIX)
