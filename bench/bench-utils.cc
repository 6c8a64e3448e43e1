// The shared half of the kernel benchmarks (see bench-utils.h): cache and working-set
// sizing, thread pools, random data, the read-bandwidth measurement, the counters, the
// common main, and the quantized GEMV/GEMM benchmark body every weight family uses.
#include "bench/bench-utils.h"

#include <cpuinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "core/fp16.h"
#include "core/strings.h"

namespace moert::bench {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMinWorkingSet = 256 * kMiB;
constexpr size_t kMaxWorkingSet = 1024 * kMiB;

size_t DivUp(size_t a, size_t b) { return (a + b - 1) / b; }
size_t RoundUp(size_t a, size_t b) { return DivUp(a, b) * b; }

size_t EnvBytes(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "moert-bench: ignoring %s=%s (expected a byte count)\n", name, v);
    return 0;
  }
  return static_cast<size_t>(n);
}

// "32768K" / "8M" / "1048576" as sysfs writes cache sizes.
size_t ParseCacheSize(const std::string& s) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  size_t bytes = static_cast<size_t>(n);
  if (*end == 'K') bytes <<= 10;
  if (*end == 'M') bytes <<= 20;
  return bytes;
}

// The largest data or unified cache of CPU 0 in sysfs (its highest level).
size_t SysfsLlcBytes() {
  int best_level = 0;
  size_t best_bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = StrCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/");
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (type == "Instruction") continue;
    const size_t bytes = ParseCacheSize(size);
    if (bytes != 0 && level >= best_level) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

size_t CpuinfoLlcBytes() {
  if (!cpuinfo_initialize()) return 0;
  if (cpuinfo_get_l4_caches_count() != 0) return cpuinfo_get_l4_cache(0)->size;
  if (cpuinfo_get_l3_caches_count() != 0) return cpuinfo_get_l3_cache(0)->size;
  if (cpuinfo_get_l2_caches_count() != 0) return cpuinfo_get_l2_cache(0)->size;
  return 0;
}

CacheInfo DetectLastLevelCache() {
  if (const size_t b = EnvBytes("MOERT_BENCH_LLC_BYTES"); b != 0) return {b, "env"};
  if (const size_t b = SysfsLlcBytes(); b != 0) return {b, "sysfs"};
  if (const size_t b = CpuinfoLlcBytes(); b != 0) return {b, "cpuinfo"};
#if defined(_SC_LEVEL3_CACHE_SIZE)
  // glibc reads CPUID here; in a VM that can be the whole socket's L3 rather than the
  // slice one core's CCX can use, so this is an upper bound (the 1 GiB cap applies).
  if (const long b = sysconf(_SC_LEVEL3_CACHE_SIZE); b > 0)
    return {static_cast<size_t>(b), "sysconf"};
#endif
  return {32 * kMiB, "default"};
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15u);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return z ^ (z >> 31);
}

// --- Streaming reads: several independent accumulators so loads are never waiting on
// an add chain; the sum keeps the compiler from dropping the loads.

uint64_t SumU64(const uint8_t* p, size_t bytes) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i < bytes; i += 64) {
    uint64_t v[8];
    std::memcpy(v, p + i, sizeof(v));
    s0 += v[0] + v[4];
    s1 += v[1] + v[5];
    s2 += v[2] + v[6];
    s3 += v[3] + v[7];
  }
  return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__) || defined(__i386__)
// Compiled for AVX2 by attribute (only this function; it runs only where
// __builtin_cpu_supports says so), so the benchmark sources need no ISA flags.
__attribute__((target("avx2"))) uint64_t SumAvx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 256) {
    const auto* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(v + 0));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(v + 1));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(v + 2));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(v + 3));
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(v + 4));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(v + 5));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(v + 6));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(v + 7));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
bool HaveAvx2() { return __builtin_cpu_supports("avx2"); }
#endif

#if defined(__aarch64__)
uint64_t SumNeon(const uint8_t* p, size_t bytes) {
  uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 128) {
    const auto* v = reinterpret_cast<const uint64_t*>(p + i);
    a0 = vaddq_u64(a0, vld1q_u64(v + 0));
    a1 = vaddq_u64(a1, vld1q_u64(v + 2));
    a2 = vaddq_u64(a2, vld1q_u64(v + 4));
    a3 = vaddq_u64(a3, vld1q_u64(v + 6));
    a0 = vaddq_u64(a0, vld1q_u64(v + 8));
    a1 = vaddq_u64(a1, vld1q_u64(v + 10));
    a2 = vaddq_u64(a2, vld1q_u64(v + 12));
    a3 = vaddq_u64(a3, vld1q_u64(v + 14));
  }
  return vaddvq_u64(vaddq_u64(vaddq_u64(a0, a1), vaddq_u64(a2, a3)));
}
#endif

using SumFn = uint64_t (*)(const uint8_t*, size_t);

SumFn BestSum() {
#if defined(__x86_64__) || defined(__i386__)
  if (HaveAvx2()) return SumAvx2;
#endif
#if defined(__aarch64__)
  return SumNeon;
#else
  return SumU64;
#endif
}

std::atomic<bool> g_failed{false};

std::mutex g_bandwidth_mutex;
std::map<int, ReadBandwidthFigure>& BandwidthTable() {
  static std::map<int, ReadBandwidthFigure> table;
  return table;
}

// `passes` passes of segment reads over `buffer` with `threads` threads.
ReadBandwidthFigure MeasureBandwidth(const uint8_t* buffer, size_t bytes, int threads, int passes) {
  pthreadpool_t pool = ThreadPool(threads);
  ReadBandwidthFigure figure;
  for (int pass = 0; pass < passes; ++pass) {
    LoopTimer timer;
    size_t read = 0;
    for (; read + kBandwidthSegment <= bytes; read += kBandwidthSegment) {
      benchmark::DoNotOptimize(StreamRead(buffer + read, kBandwidthSegment, pool, false));
      timer.Lap();
    }
    figure.sustained = std::max(figure.sustained, static_cast<double>(read) / timer.WallSeconds());
    figure.best =
        std::max(figure.best, static_cast<double>(kBandwidthSegment) / timer.BestLapSeconds());
  }
  return figure;
}

void MeasureBandwidths(std::span<const int> thread_counts) {
  const size_t bytes = std::max(WorkingSetBytes(), 2 * kBandwidthSegment);
  AlignedBytes buffer = AllocateAligned(bytes);
  FillRandom(buffer.get(), bytes, 42);  // also faults every page in
  std::lock_guard<std::mutex> lock(g_bandwidth_mutex);
  for (int threads : thread_counts) {
    BandwidthTable()[threads] = MeasureBandwidth(buffer.get(), bytes, threads, 3);
  }
}

std::string FormatGbps(double bytes_per_second) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes_per_second * 1e-9);
  return text;
}

// --- Quantized GEMV / GEMM drivers: the output tiles split over the pool.

// Rows (a multiple of MOERT_NR) of one GEMV task: the whole matrix on one thread, else
// four tasks per thread so a thread that gets preempted can be helped by the others.
size_t GemvTaskRows(size_t n, int threads) {
  if (threads <= 1) return n;
  return RoundUp(DivUp(n, static_cast<size_t>(threads) * 4), MOERT_NR);
}

void Gemv(pthreadpool_t pool, int threads, moert_qgemm_ukernel_fn fn, size_t n, size_t kb,
          size_t tile_bytes, const moert_a8_block* a, const uint8_t* w, float* c) {
  const size_t a_stride = kb * sizeof(moert_a8_block);
  const size_t task_rows = GemvTaskRows(n, threads);
  pthreadpool_parallelize_1d_tile_1d(
      pool,
      [&](size_t n0, size_t rows) {
        fn(1, rows, kb, a, a_stride, w + n0 / MOERT_NR * tile_bytes, c + n0, n);
      },
      n, task_rows);
}

// GEMM tasks of kGemmTaskRows activation rows by kGemmTaskCols weight rows: inside a
// task the kernel is called for MR activation rows at a time over all the task's
// weight tiles (as XNNPACK drives its GEMM kernels), so the task's activations stay in
// L1/L2 and its weight tiles in L2.
constexpr size_t kGemmTaskRows = 64;
constexpr size_t kGemmTaskCols = 64;

void Gemm(pthreadpool_t pool, moert_qgemm_ukernel_fn fn, size_t mr, size_t m, size_t n, size_t kb,
          size_t tile_bytes, const moert_a8_block* a, const uint8_t* w, float* c) {
  const size_t a_stride = kb * sizeof(moert_a8_block);
  const size_t task_rows = std::max(mr, kGemmTaskRows / mr * mr);
  pthreadpool_parallelize_2d_tile_2d(
      pool,
      [&](size_t m0, size_t n0, size_t rows, size_t cols) {
        const uint8_t* w_task = w + n0 / MOERT_NR * tile_bytes;
        for (size_t i = m0; i < m0 + rows; i += mr) {
          const size_t mb = std::min(mr, m0 + rows - i);
          fn(mb, cols, kb, a + i * kb, a_stride, w_task, c + i * n + n0, n);
        }
      },
      m, n, task_rows, kGemmTaskCols);
}

struct QGemmCase {
  moert_qgemm_ukernel_fn fn = nullptr;
  moert_qgemm_ukernel_fn reference = nullptr;  // the family's scalar kernel
  size_t mr = 1;
  Op op = Op::kGemv;
  Shape shape{};
  size_t m = 1;
  int threads = 1;
  size_t block_bytes = 0;
  std::span<const uint8_t> (*make_arena)() = nullptr;
  std::string label;
};

// Whether a few outputs of one run of the driver (c, from weights w) have the bits the
// scalar kernel gives them: catches a driver that computes the wrong tiles, and a kernel
// that breaks the bit-exact contract (tests/kernels is the real check).
bool OutputsMatchReference(const QGemmCase& bc, const uint8_t* w, const moert_a8_block* a,
                           const float* c) {
  const size_t n = bc.shape.n;
  const size_t kb = bc.shape.k / MOERT_QK;
  const size_t tile_bytes = kb * bc.block_bytes;
  for (size_t sample = 0; sample < 16; ++sample) {
    const size_t i = sample * 7919 % bc.m;
    const size_t j = (sample * 104729 + n - 1) % n;
    const size_t n0 = j / MOERT_NR * MOERT_NR;
    float expected[MOERT_NR];
    bc.reference(1, std::min<size_t>(MOERT_NR, n - n0), kb, a + i * kb, kb * sizeof(moert_a8_block),
                 w + n0 / MOERT_NR * tile_bytes, expected, 0);
    if (std::memcmp(&expected[j - n0], &c[i * n + j], sizeof(float)) != 0) return false;
  }
  return true;
}

void RunQGemm(benchmark::State& state, const QGemmCase& bc) {
  const std::span<const uint8_t> arena = bc.make_arena();
  const size_t n = bc.shape.n;
  const size_t kb = bc.shape.k / MOERT_QK;
  const size_t tile_bytes = kb * bc.block_bytes;
  const size_t matrix_bytes = DivUp(n, MOERT_NR) * tile_bytes;
  const size_t count = arena.size() / matrix_bytes;
  if (count < 2) {
    Fail(state,
         "the working set holds fewer than two matrices of this shape; "
         "raise MOERT_BENCH_WORKING_SET_BYTES");
    return;
  }
  const std::vector<moert_a8_block> a = RandomActivations(bc.m, bc.shape.k, 7);
  std::vector<float> c(bc.m * n);
  pthreadpool_t pool = ThreadPool(bc.threads);
  if (bc.op == Op::kGemv) {
    Gemv(pool, bc.threads, bc.fn, n, kb, tile_bytes, a.data(), arena.data(), c.data());
  } else {
    Gemm(pool, bc.fn, bc.mr, bc.m, n, kb, tile_bytes, a.data(), arena.data(), c.data());
  }
  if (!OutputsMatchReference(bc, arena.data(), a.data(), c.data())) {
    Fail(state, "outputs differ from the scalar kernel's");
    return;
  }
  size_t next = 0;
  LoopTimer timer;
  for (auto _ : state) {
    // A different matrix every iteration, cycling through more bytes than the LLC.
    const uint8_t* w = arena.data() + next * matrix_bytes;
    if (++next == count) next = 0;
    if (bc.op == Op::kGemv) {
      Gemv(pool, bc.threads, bc.fn, n, kb, tile_bytes, a.data(), w, c.data());
    } else {
      Gemm(pool, bc.fn, bc.mr, bc.m, n, kb, tile_bytes, a.data(), w, c.data());
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
    timer.Lap();
  }
  state.SetLabel(bc.label);
  SetWeightCounters(state, matrix_bytes, bc.threads, timer);
  if (bc.op == Op::kGemm) {
    SetOpsCounter(
        state,
        2.0 * static_cast<double>(bc.m) * static_cast<double>(n) * static_cast<double>(bc.shape.k),
        timer);
  }
}

}  // namespace

const CacheInfo& LastLevelCache() {
  static const CacheInfo info = DetectLastLevelCache();
  return info;
}

size_t WorkingSetBytes() {
  static const size_t bytes = [] {
    if (const size_t b = EnvBytes("MOERT_BENCH_WORKING_SET_BYTES"); b != 0) return b;
    return std::clamp(4 * LastLevelCache().llc_bytes, kMinWorkingSet, kMaxWorkingSet);
  }();
  return bytes;
}

pthreadpool_t ThreadPool(int threads) {
  struct Pools {
    std::mutex mutex;
    std::map<int, pthreadpool_t> pools;
    ~Pools() {
      for (auto& [count, pool] : pools) pthreadpool_destroy(pool);
    }
  };
  static Pools pools;
  std::lock_guard<std::mutex> lock(pools.mutex);
  pthreadpool_t& pool = pools.pools[threads];
  if (pool == nullptr) pool = pthreadpool_create(static_cast<size_t>(threads));
  return pool;
}

void FreeDeleter::operator()(void* p) const { std::free(p); }

AlignedBytes AllocateAligned(size_t bytes) {
  void* p = std::aligned_alloc(64, RoundUp(std::max<size_t>(bytes, 1), 64));
  if (p == nullptr) {
    std::fprintf(stderr, "moert-bench: out of memory allocating %zu bytes\n", bytes);
    std::abort();
  }
  return AlignedBytes(static_cast<uint8_t*>(p));
}

void FillRandom(void* p, size_t bytes, uint64_t seed) {
  auto* out = static_cast<uint8_t*>(p);
  uint64_t state = seed;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t r = SplitMix64(state);
    std::memcpy(out + i, &r, 8);
  }
  const uint64_t r = SplitMix64(state);
  std::memcpy(out + i, &r, bytes - i);
}

uint64_t StreamRead(const uint8_t* data, size_t bytes, pthreadpool_t pool, bool force_u64) {
  const SumFn sum = force_u64 ? SumU64 : BestSum();
  const size_t threads = pthreadpool_get_threads_count(pool);
  const size_t task_bytes = threads <= 1 ? bytes : RoundUp(DivUp(bytes, threads * 4), 4096);
  std::atomic<uint64_t> total{0};
  pthreadpool_parallelize_1d_tile_1d(
      pool,
      [&](size_t start, size_t length) {
        total.fetch_add(sum(data + start, length), std::memory_order_relaxed);
      },
      bytes, task_bytes);
  return total.load();
}

const char* StreamReadIsa() {
#if defined(__x86_64__) || defined(__i386__)
  if (HaveAvx2()) return "avx2";
#endif
#if defined(__aarch64__)
  return "neon";
#else
  return "u64";
#endif
}

ReadBandwidthFigure ReadBandwidth(int threads) {
  {
    std::lock_guard<std::mutex> lock(g_bandwidth_mutex);
    const auto it = BandwidthTable().find(threads);
    if (it != BandwidthTable().end()) return it->second;
  }
  const int counts[] = {threads};
  MeasureBandwidths(counts);
  std::lock_guard<std::mutex> lock(g_bandwidth_mutex);
  return BandwidthTable()[threads];
}

ReadBandwidthFigure ReadBandwidthUpTo(int threads) {
  ReadBandwidthFigure up_to;
  for (int t = 1; t <= threads; ++t) {
    const ReadBandwidthFigure f = ReadBandwidth(t);
    up_to.sustained = std::max(up_to.sustained, f.sustained);
    up_to.best = std::max(up_to.best, f.best);
  }
  return up_to;
}

LoopTimer::LoopTimer() : start_(std::chrono::steady_clock::now()), last_(start_) {}

void LoopTimer::Lap() {
  const auto now = std::chrono::steady_clock::now();
  const double lap = std::chrono::duration<double>(now - last_).count();
  if (best_lap_ == 0.0 || lap < best_lap_) best_lap_ = lap;
  last_ = now;
}

double LoopTimer::WallSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void SetWeightCounters(benchmark::State& state, size_t bytes_per_iteration, int threads,
                       const LoopTimer& timer) {
  const double per_iteration = static_cast<double>(bytes_per_iteration);
  const double bytes = static_cast<double>(state.iterations()) * per_iteration;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  const double wall = timer.WallSeconds();
  const double best = timer.BestLapSeconds();
  if (wall <= 0.0 || best <= 0.0) return;
  const ReadBandwidthFigure bandwidth = ReadBandwidthUpTo(threads);
  state.counters["GB/s"] = bytes / wall * 1e-9;
  state.counters["bw_fraction"] = bytes / wall / bandwidth.sustained;
  state.counters["GB/s_best"] = per_iteration / best * 1e-9;
  state.counters["bw_fraction_best"] = per_iteration / best / bandwidth.best;
}

void SetOpsCounter(benchmark::State& state, double ops_per_iteration, const LoopTimer& timer) {
  const double wall = timer.WallSeconds();
  const double best = timer.BestLapSeconds();
  if (wall <= 0.0 || best <= 0.0) return;
  state.counters["GOPS"] =
      static_cast<double>(state.iterations()) * ops_per_iteration / wall * 1e-9;
  state.counters["GOPS_best"] = ops_per_iteration / best * 1e-9;
}

benchmark::internal::Benchmark* Configure(benchmark::internal::Benchmark* b) {
  return b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

std::vector<moert_a8_block> RandomActivations(size_t m, size_t k, uint64_t seed) {
  std::vector<float> x(m * k);
  uint64_t state = seed;
  for (float& v : x) {
    v = static_cast<float>(SplitMix64(state) >> 40) * 0x1p-23f - 1.0f;  // [-1, 1)
  }
  std::vector<moert_a8_block> a(m * (k / MOERT_QK));
  for (size_t i = 0; i < m; ++i) {
    moert_q8_quant_ukernel__scalar(k, x.data() + i * k, a.data() + i * (k / MOERT_QK));
  }
  return a;
}

void Fail(benchmark::State& state, const std::string& message) {
  g_failed = true;
  state.SkipWithError(message.c_str());
}

int Main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--benchmark_list_tests" || arg == "--benchmark_list_tests=true") listing = true;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const CacheInfo& llc = LastLevelCache();
  benchmark::AddCustomContext("moert_llc_bytes", StrCat(llc.llc_bytes, " (", llc.source, ")"));
  benchmark::AddCustomContext("moert_working_set_bytes", StrCat(WorkingSetBytes()));
  const kernels::KernelConfig& config = kernels::GetKernelConfig();
  benchmark::AddCustomContext("moert_dispatched_isa", kernels::IsaName(config.isa));
  std::vector<std::string> isas;
  for (kernels::Isa isa : kernels::AvailableIsas()) isas.emplace_back(kernels::IsaName(isa));
  benchmark::AddCustomContext("moert_available_isas", StrJoin(isas, ","));
  if (!listing) {
    MeasureBandwidths(kThreadCounts);
    for (int threads : kThreadCounts) {
      const ReadBandwidthFigure bw = ReadBandwidth(threads);
      benchmark::AddCustomContext(
          StrCat("moert_read_bw_threads:", threads),
          StrCat(FormatGbps(bw.sustained), " GB/s sustained, ", FormatGbps(bw.best),
                 " GB/s best segment (", StreamReadIsa(), " loads, ", kBandwidthSegment >> 20,
                 " MiB segments)"));
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_failed ? 1 : 0;
}

void RegisterQGemmBenchmarks(const char* family, kernels::GemmConfig kernels::KernelConfig::*format,
                             Op op, size_t block_bytes, std::span<const uint8_t> (*make_arena)()) {
  struct Variant {
    std::string name;
    kernels::GemmConfig config;
  };
  auto isa_of = [op](const kernels::GemmConfig& g) {
    return op == Op::kGemv ? g.gemv_isa : g.gemm_isa;
  };
  std::vector<Variant> variants = {{"dispatched", kernels::GetKernelConfig().*format}};
  const kernels::GemmConfig scalar = (*kernels::KernelConfigFor(kernels::Isa::kScalar)).*format;
  for (kernels::Isa isa : kernels::AvailableIsas()) {
    absl::StatusOr<kernels::KernelConfig> config = kernels::KernelConfigFor(isa);
    if (!config.ok()) continue;
    const kernels::GemmConfig& g = (*config).*format;
    if (isa_of(g) != isa) continue;  // no kernel of this family for `isa`
    variants.push_back({kernels::IsaName(isa), g});
  }
  const std::span<const Shape> shapes = op == Op::kGemv ? std::span<const Shape>(kExpertShapes)
                                                        : std::span<const Shape>(kOlmoeShapes);
  static constexpr size_t kOneRow[] = {1};
  const std::span<const size_t> rows =
      op == Op::kGemv ? std::span<const size_t>(kOneRow) : std::span<const size_t>(kGemmRows);
  for (const Variant& v : variants) {
    for (const Shape& shape : shapes) {
      for (size_t m : rows) {
        for (int threads : kThreadCounts) {
          QGemmCase bc;
          bc.fn = op == Op::kGemv ? v.config.gemv : v.config.gemm;
          bc.reference = op == Op::kGemv ? scalar.gemv : scalar.gemm;
          bc.mr = op == Op::kGemv ? 1 : v.config.mr;
          bc.op = op;
          bc.shape = shape;
          bc.m = m;
          bc.threads = threads;
          bc.block_bytes = block_bytes;
          bc.make_arena = make_arena;
          bc.label = kernels::IsaName(isa_of(v.config));
          std::string name = StrCat(family, "/", v.name, "/", shape.name);
          if (op == Op::kGemm) StrAppend(&name, "/m:", m);
          StrAppend(&name, "/threads:", threads);
          Configure(benchmark::RegisterBenchmark(
              name.c_str(), [bc](benchmark::State& state) { RunQGemm(state, bc); }));
        }
      }
    }
  }
}

namespace internal {

// Scales in [2^-10, 2^-5), either sign: Q4_0-like magnitudes, never subnormal (a
// subnormal float could take a slow path and measure the wrong thing), inf or NaN.
uint16_t RandomScale(uint64_t random) {
  const float magnitude =
      0x1p-10f * (1.0f + static_cast<float>((random >> 40) & 0xFFFF) * 0x1p-11f);
  const float v = (random >> 63) != 0 ? -magnitude : magnitude;
  return core::FloatToFp16(v);
}

}  // namespace internal

}  // namespace moert::bench
