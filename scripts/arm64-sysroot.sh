#!/usr/bin/env bash
# Fetches Debian's arm64 builds of moert's dependencies with `apt-get download` and
# unpacks them (dpkg-deb -x) into a sysroot folder for the aarch64 cross build.
# Never `apt-get install`s them: the arm64 XNNPACK/pthreadpool/cpuinfo packages
# conflict with the amd64 ones. Needs `scripts/setup-deps.sh --aarch64` first.
#
#   scripts/arm64-sysroot.sh DEST     (e.g. build-aarch64/sysroot)
set -euo pipefail
dest=${1:?usage: arm64-sysroot.sh DEST}
packages=(
  libabsl-dev:arm64 libabsl20220623:arm64
  libgtest-dev:arm64 libgmock-dev:arm64
  libbenchmark-dev:arm64 libbenchmark1debian:arm64
  libxnnpack-dev:arm64 libxnnpack0:arm64
  libpthreadpool-dev:arm64 libpthreadpool0:arm64
  libcpuinfo-dev:arm64 libcpuinfo0:arm64
  ocl-icd-opencl-dev:arm64 ocl-icd-libopencl1:arm64 opencl-c-headers
  libzstd-dev:arm64 libzstd1:arm64 libsodium-dev:arm64 libsodium23:arm64
)
stamp="$dest/.packages"
if [[ -f "$stamp" && "$(cat "$stamp")" == "${packages[*]}" ]]; then
  echo "arm64-sysroot.sh: $dest is up to date"
  exit 0
fi
mkdir -p "$dest/debs"
dest=$(cd "$dest" && pwd)
(cd "$dest/debs" && apt-get download "${packages[@]}")
for deb in "$dest"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dest"
done
# Debian's absolute symlinks (lib*.so -> /usr/lib/...) must point inside the sysroot.
find "$dest/usr/lib" -type l | while read -r link; do
  target=$(readlink "$link")
  if [[ "$target" == /* ]]; then ln -sfn "$dest$target" "$link"; fi
done
echo "${packages[*]}" > "$stamp"
echo "arm64-sysroot.sh: unpacked ${#packages[@]} packages into $dest"
