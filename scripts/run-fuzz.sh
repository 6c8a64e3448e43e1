#!/usr/bin/env bash
# Builds gguf_fuzzer (clang, libFuzzer + ASan + UBSan) in $MOERT_FUZZ_BUILD (default
# build-fuzz) and runs it for SECONDS (default 60) on a copy of the seed corpus in
# tests/fuzz/corpus. Exits non-zero when the fuzzer finds a crash; the crashing input
# is left in <build>/fuzz-run/artifacts/.
#   usage: scripts/run-fuzz.sh [SECONDS]
set -euo pipefail

seconds="${1:-60}"
if ! [[ "${seconds}" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [SECONDS]" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOERT_FUZZ_BUILD:-${root}/build-fuzz}"
mkdir -p "${build}" && build="$(cd "${build}" && pwd)"

CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" -G Ninja \
  -DMOERT_BUILD_FUZZERS=ON -DMOERT_BUILD_TESTS=ON -DMOERT_BUILD_BENCH=OFF \
  -DMOERT_BUILD_TOOLS=OFF >/dev/null
ninja -C "${build}" -j "${MOERT_FUZZ_BUILD_JOBS:-2}" gguf_fuzzer

# The run works on a copy, so that what it adds never lands in the source tree.
run="${build}/fuzz-run"
rm -rf "${run}"
mkdir -p "${run}/corpus" "${run}/artifacts"
cp "${root}"/tests/fuzz/corpus/* "${run}/corpus/"

"${build}/bin/gguf_fuzzer" "${run}/corpus" \
  -max_total_time="${seconds}" -max_len=8192 -timeout=10 \
  -dict="${root}/tests/fuzz/gguf.dict" \
  -artifact_prefix="${run}/artifacts/" -print_final_stats=1
