#!/usr/bin/env bash
# Installs moert's build and test dependencies from Debian 12's packages when they
# are missing, and nothing else. Safe to run again: it does nothing when all are there.
#
#   scripts/setup-deps.sh            host (x86_64) build, tests, OpenCL on PoCL
#   scripts/setup-deps.sh --aarch64  also the aarch64 cross toolchain and qemu, clang 19
#                                    (it builds the SME2 kernels, which GCC 12 cannot),
#                                    and registers arm64 so `apt-get download` can fetch
#                                    the arm64 sysroot (scripts/arm64-sysroot.sh)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  clang lld libclang-rt-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxnnpack-dev libpthreadpool-dev libcpuinfo-dev libstb-dev
  opencl-headers ocl-icd-opencl-dev pocl-opencl-icd clinfo
  prometheus  # promtool: tests/tools checks the --metrics text
  libzstd-dev libsodium-dev  # repro bundles and delta packages (zstd), their signatures
  liburing-dev  # the expert loader's io_uring reads (optional: MOERT_IO_URING)
  openjdk-17-jdk-headless  # the Java API over JNI (examples/android), its ctest tests (host only)
)
want_arm64=0
for arg in "$@"; do
  case "$arg" in
    --aarch64) want_arm64=1 ;;
    *) echo "setup-deps.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
if [[ $want_arm64 == 1 ]]; then
  packages+=(g++-aarch64-linux-gnu qemu-user-static dpkg-dev clang-19)
fi

sudo_cmd=()
if [[ $(id -u) != 0 ]]; then sudo_cmd=(sudo); fi

need_update=0
if [[ $want_arm64 == 1 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
  need_update=1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -gt 0 || $need_update == 1 ]]; then
  # Third-party lists on some machines are unreachable; Debian's own must work.
  "${sudo_cmd[@]}" apt-get update -q || echo "setup-deps.sh: apt-get update reported errors; continuing" >&2
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup-deps.sh: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "setup-deps.sh: dependencies present"
