// What the kernel benchmarks (bench/*.cc, one binary per kernel family) share: the
// expert shapes of the real models, a working set larger than the last-level cache so
// that every weight byte comes from DRAM, the machine's read bandwidth (measured once
// when a benchmark binary starts), 1- and 2-thread pools, random packed weights, and
// the counters every weight-streaming benchmark reports:
//   bytes_per_second  weight bytes per second (SetBytesProcessed; the console prints
//                     it in binary units, e.g. "18.6G/s" = 18.6 GiB/s);
//   GB/s              the same in decimal GB/s, the unit of the bandwidth figure;
//   bw_fraction       GB/s divided by the sustained read bandwidth measured with up
//                     to the same number of threads (ReadBandwidthUpTo; 1.0 =
//                     streaming at memory speed);
//   GOPS              (GEMM only) 2*M*N*K / time, in 10^9 operations per second;
//   GB/s_best, bw_fraction_best, GOPS_best
//                     the same for the fastest single iteration instead of the mean,
//                     divided by the fastest segment of the bandwidth measurement: on a
//                     machine shared with other work (where a pool thread can wait
//                     milliseconds for a core) these are the figures to compare.
//
// Environment overrides (bytes): MOERT_BENCH_LLC_BYTES (the last-level cache size when
// detection is wrong), MOERT_BENCH_WORKING_SET_BYTES (the bytes cycled through per
// benchmark; default 4x LLC, at least 256 MiB, at most 1 GiB).
#ifndef MOERT_BENCH_BENCH_UTILS_H_
#define MOERT_BENCH_BENCH_UTILS_H_

#include <benchmark/benchmark.h>
#include <pthreadpool.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::bench {

// One weight matrix: n output rows by k input columns (the packed layout's N x K).
struct Shape {
  const char* name;
  size_t n;
  size_t k;
};

// The expert matrices of the three reference models: gate/up project the hidden size
// (K) to the expert width (N); down projects back.
inline constexpr Shape kExpertShapes[] = {
    {"olmoe_gate", 1024, 2048},    {"olmoe_down", 2048, 1024},    // OLMoE-1B-7B
    {"qwen_gate", 1408, 2048},     {"qwen_down", 2048, 1408},     // Qwen1.5-MoE-A2.7B
    {"mixtral_gate", 14336, 4096}, {"mixtral_down", 4096, 14336}  // Mixtral-8x7B
};
// The GEMM (prefill) benchmarks run on OLMoE's two shapes, M in kGemmRows.
inline constexpr Shape kOlmoeShapes[] = {{"olmoe_gate", 1024, 2048}, {"olmoe_down", 2048, 1024}};
inline constexpr size_t kGemmRows[] = {16, 128, 512};
inline constexpr int kThreadCounts[] = {1, 2};

// Last-level cache size in bytes and where the figure came from ("sysfs", "cpuinfo",
// "sysconf", "env", "default").
struct CacheInfo {
  size_t llc_bytes = 0;
  const char* source = "";
};
const CacheInfo& LastLevelCache();
// Bytes each benchmark cycles through (see the file comment).
size_t WorkingSetBytes();

// A pthreadpool of `threads` threads, the caller's thread being one of them; created
// on first use and kept for the life of the process.
pthreadpool_t ThreadPool(int threads);

// Memory allocated 64-byte aligned, freed with free().
struct FreeDeleter {
  void operator()(void* p) const;
};
using AlignedBytes = std::unique_ptr<uint8_t, FreeDeleter>;
AlignedBytes AllocateAligned(size_t bytes);

// Fills `bytes` bytes with pseudo-random bytes (splitmix64; fast enough for GiBs).
void FillRandom(void* p, size_t bytes, uint64_t seed);

// Reads `bytes` bytes (a multiple of 4096) once, split over `pool`'s threads as the
// GEMV splits its rows (one task on one thread, else four per thread), with AVX2 loads
// on x86 CPUs that have them, NEON on aarch64, 64-bit integer sums otherwise
// (`force_u64` picks those). Returns the sum, so nothing is optimized out.
uint64_t StreamRead(const uint8_t* data, size_t bytes, pthreadpool_t pool, bool force_u64);
// The name of the load StreamRead uses: "avx2", "neon" or "u64".
const char* StreamReadIsa();

// The read bandwidth is measured the way the kernels read weights: StreamRead of one
// kBandwidthSegment after the other (about one expert matrix each), cycling through a
// WorkingSetBytes() buffer. Main() measures it before any benchmark runs.
inline constexpr size_t kBandwidthSegment = size_t{2} << 20;
struct ReadBandwidthFigure {
  double sustained = 0.0;  // bytes/s over a whole pass, best of 3 passes (bw_fraction)
  double best = 0.0;       // bytes/s of the fastest segment (bw_fraction_best)
};
// With `threads` threads.
ReadBandwidthFigure ReadBandwidth(int threads);
// The best of ReadBandwidth(t) for t = 1..threads, each field: what the fractions divide
// by (more threads can always read at least as fast as fewer; on a busy machine the
// 2-thread measurement alone can come out lower).
ReadBandwidthFigure ReadBandwidthUpTo(int threads);

// Times a benchmark's loop for the counters below (Google Benchmark's own rate counters
// would print as "GB/s=12/s" and "bw_fraction=0.8/s"): the whole loop, and the fastest
// iteration.
//   LoopTimer timer;
//   for (auto _ : state) { ...; timer.Lap(); }
//   SetWeightCounters(state, bytes, threads, timer);
class LoopTimer {
 public:
  LoopTimer();
  // Ends one iteration.
  void Lap();
  // Since construction.
  double WallSeconds() const;
  // The shortest iteration; 0 before the first Lap().
  double BestLapSeconds() const { return best_lap_; }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
  double best_lap_ = 0.0;
};

// Sets bytes_per_second, GB/s and bw_fraction (over the whole loop) and GB/s_best and
// bw_fraction_best (the fastest iteration) for `bytes_per_iteration` bytes read per
// iteration by a benchmark running `threads` threads.
void SetWeightCounters(benchmark::State& state, size_t bytes_per_iteration, int threads,
                       const LoopTimer& timer);
// Sets GOPS and GOPS_best for `ops_per_iteration` operations per iteration.
void SetOpsCounter(benchmark::State& state, double ops_per_iteration, const LoopTimer& timer);

// Registers every benchmark as wall-clock timed (the pool's other threads don't show in
// the caller's CPU time) in milliseconds.
benchmark::internal::Benchmark* Configure(benchmark::internal::Benchmark* b);

// `m` rows of `k` random floats in [-1, 1), quantized by the scalar reference.
std::vector<moert_a8_block> RandomActivations(size_t m, size_t k, uint64_t seed);

// Ends a benchmark with an error (SkipWithError) and makes Main() return 1, so that a
// wrong result or a setup failure fails a scripted run instead of printing a line.
void Fail(benchmark::State& state, const std::string& message);

// A benchmark binary's main after its benchmarks are registered: parses the flags,
// measures the read bandwidth (skipped for --benchmark_list_tests), records the cache,
// working set, bandwidth and dispatched ISA in the report's context, and runs; 1 if a
// benchmark called Fail().
int Main(int argc, char** argv);

// The variants a family with one kernel (q8-quant, f32-topk, f32-gemm) is benchmarked
// in: "dispatched" (GetKernelConfig()'s) and every AvailableIsas() whose config has its
// own kernel for the family (an ISA without one would only rerun a lower ISA's).
// `family` is the family's config in KernelConfig, a struct with an `isa` member.
template <typename Config>
struct FamilyVariant {
  std::string name;
  Config config;
};
template <typename Config>
std::vector<FamilyVariant<Config>> FamilyVariants(Config kernels::KernelConfig::*family) {
  std::vector<FamilyVariant<Config>> variants = {
      {"dispatched", kernels::GetKernelConfig().*family}};
  for (kernels::Isa isa : kernels::AvailableIsas()) {
    absl::StatusOr<kernels::KernelConfig> config = kernels::KernelConfigFor(isa);
    if (!config.ok() || ((*config).*family).isa != isa) continue;
    variants.push_back({kernels::IsaName(isa), (*config).*family});
  }
  return variants;
}

// --- Quantized GEMV/GEMM over packed weights (the q4/q4m/q8/q4s24 families) ---

enum class Op { kGemv, kGemm };

// Benchmarks of one weight format's family: "q4_gemv/<variant>/<shape>/threads:T" for
// GEMV over kExpertShapes, "q4_gemm/<variant>/<shape>/m:M/threads:T" for GEMM over
// kOlmoeShapes x kGemmRows. Variants: "dispatched" (GetKernelConfig(); the label says
// which ISA's kernel that is) and every AvailableIsas() whose config has its own
// kernel for this family (an ISA without one would only rerun a lower ISA's kernel).
// `block_bytes` is sizeof the format's block; `make_arena` returns the process-wide
// random weights of the format (WeightArena<Block>).
void RegisterQGemmBenchmarks(const char* family, kernels::GemmConfig kernels::KernelConfig::*format,
                             Op op, size_t block_bytes, std::span<const uint8_t> (*make_arena)());

// Random packed weights of one format, WorkingSetBytes() of them: random values, and
// finite fp16 scales (and W4M offsets) of a realistic magnitude. Every matrix of the
// format is a run of whole blocks (no shape here has padding rows), so any run of
// them is a valid matrix; allocated on first use, kept for the process.
template <typename Block>
std::span<const uint8_t> WeightArena();

namespace internal {
uint16_t RandomScale(uint64_t random);
template <typename Block>
concept HasOffset = requires(Block b) {
  b.m;
};  // W4M's per-row fp16 offset
}  // namespace internal

template <typename Block>
std::span<const uint8_t> WeightArena() {
  static const std::span<const uint8_t> arena = [] {
    const size_t blocks = WorkingSetBytes() / sizeof(Block);
    const size_t bytes = blocks * sizeof(Block);
    uint8_t* data = AllocateAligned(bytes).release();  // kept for the process
    FillRandom(data, bytes, 0x5eed0000u + sizeof(Block));
    auto* b = reinterpret_cast<Block*>(data);
    uint64_t r = 1;
    for (size_t i = 0; i < blocks; ++i) {
      for (int row = 0; row < MOERT_NR; ++row) {
        r = r * 6364136223846793005u + 1442695040888963407u;
        b[i].d[row] = internal::RandomScale(r);
        if constexpr (internal::HasOffset<Block>) b[i].m[row] = internal::RandomScale(r >> 32);
      }
    }
    return std::span<const uint8_t>(data, bytes);
  }();
  return arena;
}

}  // namespace moert::bench

#endif  // MOERT_BENCH_BENCH_UTILS_H_
