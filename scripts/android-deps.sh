#!/usr/bin/env bash
# Builds moert's dependencies for Android arm64-v8a (API 26, c++_shared, 16 KiB pages)
# from unpacked sources into one prefix, for `cmake --preset android-arm64
# -DMOERT_ANDROID_PREFIX=PREFIX` and the Gradle module (moertAndroidPrefix).
#
#   export ANDROID_NDK_HOME=/path/to/ndk          # r26 or newer
#   scripts/android-deps.sh --src ~/moert-src --prefix ~/moert-android-arm64
#
# Options:
#   --src DIR        the sources, one unpacked folder each (names below); required
#   --prefix DIR     where they are installed; required
#   --toolchain FILE a CMake toolchain file in place of cmake/toolchains/android-arm64.cmake
#                    (which wraps the NDK's): cmake/toolchains/aarch64-linux-gnu.cmake
#                    exercises the recipes with Debian's cross compiler, without the NDK
#   --build DIR      build folders (default PREFIX/.build)
#   --only LIST      comma-separated subset, in this order: abseil cpuinfo fp16 fxdiv
#                    pthreadpool xnnpack zstd libsodium stb opencl (default: all whose
#                    sources are there; opencl only when its headers are)
#   --jobs N         parallel build jobs (default: nproc)
#
# The sources, at the versions moert is built and tested with (Debian 12's; folder names
# as the upstream tarballs, a `git archive --prefix=NAME-COMMIT/`, or `apt-get source`
# unpack them: the first matching folder under --src is used):
#   abseil       abseil-cpp-20220623.1 / abseil-20220623.1: github.com/abseil/abseil-cpp,
#                tag 20220623.1 (Debian: abseil)
#   cpuinfo      cpuinfo-*: github.com/pytorch/cpuinfo, commit
#                082deffc80ce517f81dc2f3aebe6ba671fcd09c9 (Debian: cpuinfo)
#   fp16         FP16-* / fp16-*: github.com/Maratyszcza/FP16, commit 4dfe081 (Debian: fp16)
#   fxdiv        FXdiv-* / fxdiv-*: github.com/Maratyszcza/FXdiv, commit b408327
#                (Debian: fxdiv)
#   pthreadpool  pthreadpool-*: github.com/google/pthreadpool (was Maratyszcza/pthreadpool),
#                commit 1787867f6183f056420e532eec640cba25efafea (Debian: pthreadpool)
#   xnnpack      XNNPACK-* / xnnpack-*: github.com/google/XNNPACK, commit
#                ae108ef49aa5623b896fc93d4298c49d1750d9ba (Debian: xnnpack); moert calls
#                its f32 fully-connected operator, whose API later commits changed
#   zstd         zstd-1.5.4 / libzstd-1.5.4*: github.com/facebook/zstd, release 1.5.4
#                (Debian: libzstd)
#   libsodium    libsodium-1.0.18: the release tarball libsodium-1.0.18.tar.gz (has
#                ./configure), or a checkout / Debian's libsodium source, which need
#                autoconf, automake and libtool for ./autogen.sh
#   stb          stb-* / libstb-*: github.com/nothings/stb, commit 8b5f1f3 (Debian: libstb);
#                stb_image.h and stb_image_write.h are copied to PREFIX/include/stb/
#   opencl       optional, OpenCL-Headers-* / khronos-opencl-headers-*: the Khronos
#                headers (v2023.02.06), for the OpenCL backend (CL/ is copied)
#
# What lands in PREFIX: Abseil, zstd and libsodium as static, position-independent
# archives (linked into libmoert.so; Abseil with its CMake config under lib/cmake/absl),
# cpuinfo (with its static clog), pthreadpool and XNNPACK as shared libraries with
# unversioned SONAMEs (an APK carries only lib*.so files, so a libfoo.so.1 would not be
# found on the device: CMake's Android platform never versions them, and this script
# checks the result of whatever toolchain it was given), and the header-only FP16, FXdiv
# and stb.
# moert finds them as cmake/MoertDependencies.cmake and MoertImportedDeps.cmake look:
# find_package(absl CONFIG), then cpuinfo.h/libcpuinfo, pthreadpool.h/libpthreadpool,
# xnnpack.h/libXNNPACK, zstd.h/libzstd, sodium.h/libsodium and stb/stb_image.h.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
all=(abseil cpuinfo fp16 fxdiv pthreadpool xnnpack zstd libsodium stb opencl)
src="" prefix="" toolchain="" build="" only="" jobs=$(nproc)
while (($#)); do
  case "$1" in
    --src) src=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --toolchain) toolchain=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "android-deps.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "android-deps.sh: $*" >&2; exit 1; }
[[ -n "$src" && -n "$prefix" ]] || die "--src DIR and --prefix DIR are required (--help)"
[[ -d "$src" ]] || die "--src $src is not a folder"
src=$(cd "$src" && pwd)
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
build=${build:-$prefix/.build}
mkdir -p "$build"
build=$(cd "$build" && pwd)

android=0
if [[ -z "$toolchain" ]]; then
  [[ -n "${ANDROID_NDK_HOME:-${ANDROID_NDK_ROOT:-}}" ]] ||
    die "set ANDROID_NDK_HOME to the NDK, or pass --toolchain FILE"
  toolchain=$repo/cmake/toolchains/android-arm64.cmake
fi
[[ -f "$toolchain" ]] || die "--toolchain $toolchain: no such file"
toolchain=$(cd "$(dirname "$toolchain")" && pwd)/$(basename "$toolchain")
[[ "$toolchain" == */android-arm64.cmake || "$toolchain" == */android.toolchain.cmake ]] &&
  android=1

# The source folder of a dependency: the first folder under --src matching a pattern.
source_of() {
  local pattern dir
  for pattern in "$@"; do
    for dir in "$src"/$pattern; do
      [[ -d "$dir" ]] && { echo "$dir"; return 0; }
    done
  done
  return 1
}
declare -A patterns=(
  [abseil]="abseil-cpp* abseil-*"
  [cpuinfo]="cpuinfo*"
  [fp16]="FP16* fp16*"
  [fxdiv]="FXdiv* fxdiv*"
  [pthreadpool]="pthreadpool*"
  [xnnpack]="XNNPACK* xnnpack*"
  [zstd]="zstd* libzstd*"
  [libsodium]="libsodium*"
  [stb]="stb stb-* libstb*"
  [opencl]="OpenCL-Headers* khronos-opencl-headers* opencl-headers*"
)
declare -A dir
wanted=()
if [[ -n "$only" ]]; then
  IFS=, read -r -a picked <<< "$only"
  for name in "${all[@]}"; do
    for p in "${picked[@]}"; do [[ "$p" == "$name" ]] && wanted+=("$name"); done
  done
  for p in "${picked[@]}"; do
    [[ -v "patterns[$p]" ]] || die "--only: no dependency '$p' (${all[*]})"
  done
else
  wanted=("${all[@]}")
fi
missing=()
for name in "${wanted[@]}"; do
  # shellcheck disable=SC2086  # the patterns are globs
  if found=$(source_of ${patterns[$name]}); then
    dir[$name]=$found
  elif [[ "$name" != opencl || -n "$only" ]]; then
    missing+=("$name (${patterns[$name]})")
  fi
done
((${#missing[@]} == 0)) || die "no sources under $src for: ${missing[*]}"

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake_common=("${generator[@]}" -DCMAKE_TOOLCHAIN_FILE="$toolchain"
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DMOERT_ANDROID_PREFIX="$prefix")
if ((android)); then
  cmake_common+=(-DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-26
    -DANDROID_STL=c++_shared)
fi

# cmake_build NAME SOURCE_DIR [CMAKE ARGS...]: configure, build, install; a log per step.
cmake_build() {
  local name=$1 source=$2
  shift 2
  echo "android-deps.sh: $name from $source"
  local log=$build/$name.log
  if ! { cmake -S "$source" -B "$build/$name" "${cmake_common[@]}" "$@" &&
         cmake --build "$build/$name" -j "$jobs" &&
         cmake --install "$build/$name"; } > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "$name failed (the whole log: $log)"
  fi
}

# The C compiler and flags the toolchain file sets up, for libsodium's ./configure.
probe_toolchain() {
  local probe=$build/probe
  mkdir -p "$probe/src"
  cat > "$probe/src/CMakeLists.txt" << 'EOF'
cmake_minimum_required(VERSION 3.16)
project(probe C)
set(cc "${CMAKE_C_COMPILER}")
if(CMAKE_C_COMPILER_TARGET)
  string(APPEND cc " --target=${CMAKE_C_COMPILER_TARGET}")
endif()
if(CMAKE_SYSROOT)
  string(APPEND cc " --sysroot=${CMAKE_SYSROOT}")
endif()
file(WRITE "${CMAKE_BINARY_DIR}/toolchain.env"
     "cc='${cc}'\ncflags='${CMAKE_C_FLAGS} ${CMAKE_C_FLAGS_RELEASE}'\n"
     "ldflags='${CMAKE_SHARED_LINKER_FLAGS}'\nar='${CMAKE_AR}'\nranlib='${CMAKE_RANLIB}'\n"
     "target='${CMAKE_C_COMPILER_TARGET}'\n")
EOF
  cmake -S "$probe/src" -B "$probe" "${cmake_common[@]}" > "$build/probe.log" 2>&1 ||
    { tail -n 30 "$build/probe.log" >&2; die "the toolchain $toolchain does not configure"; }
  cc="" cflags="" ldflags="" ar="" ranlib="" target=""
  # shellcheck disable=SC1091
  source "$probe/toolchain.env"
}

copy_headers() {  # copy_headers NAME FROM... : into PREFIX/include
  local name=$1
  shift
  echo "android-deps.sh: $name headers"
  cp -R "$@" "$prefix/include/"
}

mkdir -p "$prefix/include" "$prefix/lib"
built=()
for name in "${wanted[@]}"; do
  [[ -v "dir[$name]" ]] || continue
  s=${dir[$name]}
  case "$name" in
    abseil)
      cmake_build abseil "$s" -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON \
        -DBUILD_SHARED_LIBS=OFF -DBUILD_TESTING=OFF -DABSL_ENABLE_INSTALL=ON ;;
    cpuinfo)
      cmake_build cpuinfo "$s" -DCPUINFO_LIBRARY_TYPE=shared -DCPUINFO_BUILD_TOOLS=OFF \
        -DCPUINFO_BUILD_UNIT_TESTS=OFF -DCPUINFO_BUILD_MOCK_TESTS=OFF \
        -DCPUINFO_BUILD_BENCHMARKS=OFF ;;
    fp16) copy_headers fp16 "$s/include/fp16.h" "$s/include/fp16" ;;
    fxdiv) copy_headers fxdiv "$s/include/fxdiv.h" ;;
    pthreadpool)
      # It builds FXdiv's (header-only) CMake project as part of its own.
      # shellcheck disable=SC2086
      fxdiv=$(source_of ${patterns[fxdiv]}) || die "pthreadpool needs the fxdiv sources"
      cmake_build pthreadpool "$s" -DPTHREADPOOL_LIBRARY_TYPE=shared \
        -DPTHREADPOOL_BUILD_TESTS=OFF -DPTHREADPOOL_BUILD_BENCHMARKS=OFF \
        -DFXDIV_SOURCE_DIR="$fxdiv" ;;
    xnnpack)
      for f in lib/libcpuinfo.so lib/libclog.a lib/libpthreadpool.so include/fp16.h \
               include/fxdiv.h; do
        [[ -f "$prefix/$f" ]] || die "xnnpack needs $prefix/$f (cpuinfo, pthreadpool, fp16, fxdiv first)"
      done
      # Against the libraries installed above, not copies of its own (moert hands it
      # the pthreadpool it created).
      cmake_build xnnpack "$s" -DXNNPACK_LIBRARY_TYPE=shared -DXNNPACK_BUILD_TESTS=OFF \
        -DXNNPACK_BUILD_BENCHMARKS=OFF -DXNNPACK_USE_SYSTEM_LIBS=ON \
        -DCPUINFO_LIBRARY="$prefix/lib/libcpuinfo.so" -DCLOG_LIBRARY="$prefix/lib/libclog.a" \
        -DPTHREADPOOL_LIBRARY="$prefix/lib/libpthreadpool.so" \
        -DFP16_HDR="$prefix/include/fp16.h" -DFXDIV_HDR="$prefix/include/fxdiv.h" \
        -DCMAKE_C_FLAGS="-I$prefix/include" -DCMAKE_CXX_FLAGS="-I$prefix/include" ;;
    zstd)
      cmake_build zstd "$s/build/cmake" -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_TESTS=OFF \
        -DZSTD_BUILD_SHARED=OFF -DZSTD_BUILD_STATIC=ON ;;
    libsodium)
      echo "android-deps.sh: libsodium from $s"
      probe_toolchain
      host=$("${cc%% *}" -dumpmachine)
      [[ "$target" == *android* ]] && host=aarch64-linux-android
      log=$build/libsodium.log
      if ! {
        if [[ ! -x "$s/configure" ]]; then (cd "$s" && ./autogen.sh -s); fi &&
        mkdir -p "$build/libsodium" &&
        (cd "$build/libsodium" &&
         "$s/configure" --host="$host" --prefix="$prefix" --libdir="$prefix/lib" \
           --disable-shared --enable-static --with-pic CC="$cc" CFLAGS="$cflags" \
           LDFLAGS="$ldflags" AR="$ar" RANLIB="$ranlib" &&
         make -j "$jobs" && make install)
      } > "$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "libsodium failed (the whole log: $log)"
      fi ;;
    stb)
      echo "android-deps.sh: stb headers"
      mkdir -p "$prefix/include/stb"
      cp "$s/stb_image.h" "$s/stb_image_write.h" "$prefix/include/stb/" ;;
    opencl) copy_headers opencl "$s/CL" ;;
  esac
  built+=("$name")
done

# What moert looks for, present; libraries for AArch64 (every object of an archive), and
# shared ones with unversioned SONAMEs.
declare -A expect=(
  [abseil]="lib/cmake/absl/abslConfig.cmake lib/libabsl_base.a"
  [cpuinfo]="include/cpuinfo.h lib/libcpuinfo.so"
  [fp16]=include/fp16.h
  [fxdiv]=include/fxdiv.h
  [pthreadpool]="include/pthreadpool.h lib/libpthreadpool.so"
  [xnnpack]="include/xnnpack.h lib/libXNNPACK.so"
  [zstd]="include/zstd.h lib/libzstd.a"
  [libsodium]="include/sodium.h lib/libsodium.a"
  [stb]="include/stb/stb_image.h include/stb/stb_image_write.h"
  [opencl]=include/CL/cl.h
)
for name in "${built[@]}"; do
  for f in ${expect[$name]}; do
    [[ -f "$prefix/$f" ]] || die "$name: $prefix/$f was not installed"
    if [[ "$f" == *.so || "$f" == *.a ]]; then
      machine=$(readelf -h "$prefix/$f" | sed -n 's/^ *Machine: *//p' | sort -u | xargs)
      [[ "$machine" == AArch64 ]] || die "$prefix/$f is for '$machine', not AArch64"
    fi
    if [[ "$f" == *.so ]]; then
      soname=$(readelf -d "$prefix/$f" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
      [[ "$soname" == "$(basename "$f")" ]] ||
        die "$prefix/$f has SONAME '$soname': an APK can only carry lib*.so names"
    fi
  done
done
echo "android-deps.sh: built ${built[*]} into $prefix"
echo "  then: cmake --preset android-arm64 -DMOERT_ANDROID_PREFIX=$prefix"
