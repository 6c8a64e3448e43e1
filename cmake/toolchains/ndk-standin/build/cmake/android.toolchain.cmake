# Not the NDK: a stand-in for its build/cmake/android.toolchain.cmake, so that the
# android-arm64 preset (cmake/toolchains/android-arm64.cmake) can be configured and
# built on a machine without the NDK against a prefix from scripts/android-deps.sh
# --toolchain cmake/toolchains/aarch64-linux-gnu.cmake. Debian's aarch64 cross compiler
# with the NDK's find-root modes (only the sysroot and MOERT_ANDROID_PREFIX are
# searched); ANDROID stays unset and the result is an aarch64 Linux build:
#
#   ANDROID_NDK_HOME=$PWD/cmake/toolchains/ndk-standin \
#     cmake --preset android-arm64 -B build/android-standin -DMOERT_ANDROID_PREFIX=$PREFIX
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
