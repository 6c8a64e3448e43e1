#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, libFuzzer + ASan + UBSan; the whole library
# instrumented, asserts on) in $MOERT_FUZZ_BUILD (default build-fuzz) and runs them for
# SECONDS in all (default 60, shared equally, at least 1 s each) on a copy of each
# one's seed corpus:
#   gguf   gguf_fuzzer on tests/fuzz/corpus: the GGUF reader on arbitrary bytes
#   model  model_fuzzer on tests/fuzz/model_corpus: valid small models with mutated
#          metadata and tensors through Model::Load and a forward pass
#   repro  repro_fuzzer on tests/fuzz/repro_corpus: the repro bundle reader
# Exits non-zero when a fuzzer finds a crash; the crashing input is left in
# <build>/fuzz-run/<fuzzer>/artifacts/.
#   usage: scripts/run-fuzz.sh [SECONDS [FUZZER...]]   (FUZZER: gguf, model, repro; default all)
set -euo pipefail

seconds="${1:-60}"
if ! [[ "${seconds}" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [SECONDS [gguf|model|repro ...]]" >&2
  exit 2
fi
shift || true
fuzzers=("$@")
[[ ${#fuzzers[@]} -gt 0 ]] || fuzzers=(gguf model repro)
for f in "${fuzzers[@]}"; do
  if [[ "${f}" != gguf && "${f}" != model && "${f}" != repro ]]; then
    echo "unknown fuzzer '${f}' (gguf, model, repro)" >&2
    exit 2
  fi
done
each=$(( seconds / ${#fuzzers[@]} ))
(( each > 0 )) || each=1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOERT_FUZZ_BUILD:-${root}/build-fuzz}"
mkdir -p "${build}" && build="$(cd "${build}" && pwd)"

# -O1 with line tables and asserts on, as fuzzing builds usually are: quicker to build
# than -O2 -g, and an assert that fires is a finding. No OpenCL: the fuzzers run the CPU.
CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DMOERT_BUILD_FUZZERS=ON -DMOERT_BUILD_TESTS=ON -DMOERT_BUILD_BENCH=OFF \
  -DMOERT_BUILD_TOOLS=OFF -DMOERT_OPENCL=OFF >/dev/null
targets=()
for f in "${fuzzers[@]}"; do targets+=("${f}_fuzzer"); done
ninja -C "${build}" -j "${MOERT_FUZZ_BUILD_JOBS:-2}" "${targets[@]}"

# Each run works on a copy, so that what it adds never lands in the source tree.
run_fuzzer() {
  local name="$1" corpus="$2"
  shift 2
  local run="${build}/fuzz-run/${name}"
  rm -rf "${run}"
  mkdir -p "${run}/corpus" "${run}/artifacts"
  cp "${corpus}"/* "${run}/corpus/"
  echo "=== ${name}_fuzzer: ${each} s"
  "${build}/bin/${name}_fuzzer" "${run}/corpus" -max_total_time="${each}" \
    -artifact_prefix="${run}/artifacts/" -print_final_stats=1 "$@"
}

for f in "${fuzzers[@]}"; do
  case "${f}" in
    gguf)
      run_fuzzer gguf "${root}/tests/fuzz/corpus" -max_len=8192 -timeout=10 \
        -dict="${root}/tests/fuzz/gguf.dict"
      ;;
    model)
      # Its inputs are a 27-byte header and a few bytes per mutation; the files it
      # writes are capped at a few MiB, so an allocation above 512 MiB is a finding
      # (a shape the library should have refused).
      run_fuzzer model "${root}/tests/fuzz/model_corpus" -max_len=1024 -timeout=20 \
        -malloc_limit_mb=512 -rss_limit_mb=2048
      ;;
    repro)
      run_fuzzer repro "${root}/tests/fuzz/repro_corpus" -max_len=4096 -timeout=10 \
        -malloc_limit_mb=512
      ;;
  esac
done
