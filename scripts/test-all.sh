#!/usr/bin/env bash
# Sets up and runs every test of moert (this is what CI runs, through .ci/run):
#   1. x86_64 build, warnings as errors, unit + tool + install tests
#   2. the same unit tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   2b. the runtime, experts, pipeline, memory and telemetry tests under ThreadSanitizer
#   3. aarch64 cross build (no benchmarks: their kernels' bits are the unit tests'),
#      its tests under qemu-aarch64 -cpu max
#   (tests labelled `slow`, the full perplexity runs, only run in step 1)
#   4. the fuzzers (libFuzzer): the GGUF reader's and the model's (Model::Load and a
#      forward pass on mutated valid models), for a bounded time
# Build trees go under build/ (or $MOERT_BUILD_ROOT). Set MOERT_FUZZ_SECONDS to
# change the fuzzing time (default 60, shared by the two fuzzers), MOERT_SKIP="aarch64
# asan tsan fuzz" to skip steps.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${MOERT_BUILD_ROOT:-build}
jobs=${MOERT_JOBS:-$(nproc)}
skip=" ${MOERT_SKIP:-} "
started=$(date +%s)

step() { echo; echo "=== [$(( $(date +%s) - started ))s] $*"; }

step "dependencies"
scripts/setup-deps.sh --aarch64

step "x86_64: build (warnings are errors) and test"
cmake -S . -B "$root/x86" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOERT_WERROR=ON
cmake --build "$root/x86" -j "$jobs"
ctest --test-dir "$root/x86" --output-on-failure -j "$jobs"

if [[ $skip != *" asan "* ]]; then
  step "x86_64: unit tests under ASan + UBSan"
  cmake -S . -B "$root/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOERT_WERROR=ON \
    -DMOERT_SANITIZE=ON -DMOERT_BUILD_BENCH=OFF -DMOERT_BUILD_TOOLS=OFF
  cmake --build "$root/asan" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/asan" --output-on-failure -j "$jobs" -E '^install\.' -LE slow
fi

if [[ $skip != *" tsan "* ]]; then
  # The calls documented for any thread, the loader's and prefetcher's threads, the
  # budget's ledger, the read engines' pread workers, hot updates racing steps: the
  # modules with threads of their own. No OpenCL (PoCL's threads are not instrumented);
  # the compute pool's hand-offs are annotated (core/thread_pool).
  step "x86_64: runtime, experts, pipeline, memory and telemetry tests under ThreadSanitizer"
  cmake -S . -B "$root/tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOERT_WERROR=ON \
    -DMOERT_TSAN=ON -DMOERT_OPENCL=OFF -DMOERT_BUILD_BENCH=OFF -DMOERT_BUILD_TOOLS=OFF
  cmake --build "$root/tsan" -j "$jobs" --target runtime_test experts_test pipeline_test memory_test \
    telemetry_test
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir "$root/tsan" --output-on-failure -j "$jobs" -LE slow \
    -R '^(Runtime|Session|ThreadSafety|MemoryBudget|ExpertCache|Loader|ExpertDirectory|Checksum|HotSet|IoMode|Prefetch|Oracle/Prefetch|MoeScheduler|Buddy|Budget|Tiered|CoPlacement|Defrag|Degrade|InferenceGuard|GuardInjection|Metrics|Trace|ModelTrace|Platform|Engines/|IoMode|Delta|HotUpdate|ResidentAndPooled/HotUpdate)'
fi

if [[ $skip != *" aarch64 "* ]]; then
  step "aarch64: cross build and tests under qemu-aarch64 -cpu max"
  scripts/arm64-sysroot.sh "$root/aarch64/sysroot"
  cmake -S . -B "$root/aarch64" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOERT_WERROR=ON \
    -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
    -DMOERT_ARM64_SYSROOT="$PWD/$root/aarch64/sysroot" -DMOERT_BUILD_BENCH=OFF
  cmake --build "$root/aarch64" -j "$jobs"
  ctest --test-dir "$root/aarch64" --output-on-failure -j "$jobs" -LE slow
fi

if [[ $skip != *" fuzz "* ]]; then
  step "fuzzers"
  MOERT_FUZZ_BUILD="$root/fuzz" scripts/run-fuzz.sh "${MOERT_FUZZ_SECONDS:-60}"
fi

step "all tests passed"
