// The expert pool (BuddyAllocator + Defragmenter in a TieredPool) against malloc/free on
// the churn of a 64-expert model behind an LRU cache with the same byte budget: allocation
// latency, fragmentation and resident memory, as Google Benchmark counters.
// BM_ChurnBuddyDefrag/paired:P/co:C compares co-placement (memory/co_placement.h) off and
// on, over the independent trace (P = 0) and one where experts come in pairs that are
// mostly routed together (P = 1): mean fragmentation, defragmentation bytes moved and
// allocations that failed (each cost an eviction).
// Run: <build>/bin/moert-bench-memory [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <optional>
#include <random>
#include <vector>

#include "memory/co_placement.h"
#include "memory/defragmenter.h"
#include "memory/tiered_pool.h"

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kBudget = 80 * kMiB;
constexpr int kSteps = 10000;

// The same trace as tests/memory/defragmenter_test.cc (ChurnOfA64ExpertModel): 64 experts
// of 0.75/1.5/3/6 MiB, top-4 routing over a Zipf-like popularity that drifts every 100 steps.
// Paired: experts 2i and 2i+1 have the same size (as the experts of one layer do) and a
// routed expert brings its pair along with probability kPairProbability (when the step has
// room); the unpaired trace is unchanged.
constexpr double kPairProbability = 0.9;

struct ChurnTrace {
  std::vector<uint64_t> expert_bytes;
  std::vector<std::vector<int>> steps;
};

ChurnTrace MakeChurnTrace(uint64_t seed, int steps, bool paired) {
  ChurnTrace trace;
  std::mt19937_64 rng(seed);
  const uint64_t sizes[] = {768 * kKiB, 1536 * kKiB, 3 * kMiB, 6 * kMiB};
  for (int e = 0; e < 64; ++e) trace.expert_bytes.push_back(sizes[rng() % 4]);
  if (paired) {
    for (size_t e = 1; e < 64; e += 2) trace.expert_bytes[e] = trace.expert_bytes[e - 1];
  }
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<int> rank(64);
  for (int e = 0; e < 64; ++e) rank[static_cast<size_t>(e)] = e;
  std::shuffle(rank.begin(), rank.end(), rng);
  std::vector<double> weight(64);
  for (int r = 0; r < 64; ++r) weight[static_cast<size_t>(r)] = 1.0 / std::pow(r + 1.0, 0.9);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  for (int s = 0; s < steps; ++s) {
    if (s % 100 == 99) {
      for (int i = 0; i < 6; ++i) std::swap(rank[rng() % 64], rank[rng() % 64]);
    }
    std::vector<int> chosen;
    while (chosen.size() < 4) {
      const int e = rank[static_cast<size_t>(pick(rng))];
      if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
      chosen.push_back(e);
      const int pair = e ^ 1;
      if (paired && chosen.size() < 4 && coin(rng) < kPairProbability &&
          std::find(chosen.begin(), chosen.end(), pair) == chosen.end()) {
        chosen.push_back(pair);
      }
    }
    trace.steps.push_back(chosen);
  }
  return trace;
}

const ChurnTrace& Trace(bool paired = false) {
  static const ChurnTrace independent = MakeChurnTrace(42, kSteps, /*paired=*/false);
  static const ChurnTrace pairs = MakeChurnTrace(42, kSteps, /*paired=*/true);
  return paired ? pairs : independent;
}

uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

struct Latencies {
  std::vector<double> ns;
  void Add(std::chrono::steady_clock::time_point start) {
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() -
                                                          start)
                     .count());
  }
  void Report(benchmark::State& state) {
    std::sort(ns.begin(), ns.end());
    double sum = 0;
    for (double v : ns) sum += v;
    state.counters["allocs"] = static_cast<double>(ns.size());
    state.counters["alloc_ns_mean"] = ns.empty() ? 0 : sum / static_cast<double>(ns.size());
    state.counters["alloc_ns_p50"] = ns.empty() ? 0 : ns[ns.size() / 2];
    state.counters["alloc_ns_p99"] = ns.empty() ? 0 : ns[ns.size() * 99 / 100];
    state.counters["alloc_ns_max"] = ns.empty() ? 0 : ns.back();
  }
};

// LRU cache driver shared by both allocators. `Policy` has: bool Allocate(int expert,
// uint64_t bytes) (false: the cache must evict), void Free(int expert), uint8_t* Data(int),
// void Pin(int) / Unpin(int), and a step hook that sees the step's experts.
template <typename Policy>
void RunChurn(const ChurnTrace& trace, Policy& policy, Latencies& latencies, uint64_t& peak_rss,
              uint64_t& evictions) {
  std::vector<bool> resident(64, false);
  std::list<int> lru;
  const uint64_t rss_before = ResidentBytes();
  for (const std::vector<int>& step : trace.steps) {
    for (int e : step) {
      const auto ue = static_cast<size_t>(e);
      if (resident[ue]) {
        lru.remove(e);
      } else {
        while (true) {
          const auto start = std::chrono::steady_clock::now();
          const bool ok = policy.Allocate(e, trace.expert_bytes[ue]);
          latencies.Add(start);
          if (ok) break;
          auto victim = std::find_if(lru.rbegin(), lru.rend(),
                                     [&](int v) { return !policy.Pinned(v); });
          if (victim == lru.rend()) std::abort();  // 4 pinned experts always fit the budget
          const int v = *victim;
          lru.erase(std::next(victim).base());
          policy.Free(v);
          resident[static_cast<size_t>(v)] = false;
          ++evictions;
        }
        // Loading the expert writes its bytes, which makes its pages resident. One byte per
        // page has the same effect on RSS at a fraction of the memset time.
        uint8_t* data = policy.Data(e);
        for (uint64_t i = 0; i < trace.expert_bytes[ue]; i += 4096) data[i] = static_cast<uint8_t>(e);
        resident[ue] = true;
      }
      lru.push_front(e);
      policy.Pin(e);
    }
    for (int e : step) policy.Unpin(e);
    policy.AfterStep(step);
    const uint64_t rss = ResidentBytes();
    peak_rss = std::max(peak_rss, rss - std::min(rss, rss_before));
  }
}

// The pool as the expert cache drives it, co-placement included: the step's experts are one
// co-use group, and a new block goes to the free buddy of a resident partner when there is
// one (ExpertCache::AllocateNextToPartner).
struct BuddyPolicy {
  BuddyPolicy(moert::memory::TieredPool* p, bool co)
      : pool(p), owner(p->expert_allocator().pool_bytes() / min_block(), -1), co_placement(co) {}

  moert::memory::TieredPool* pool;
  moert::memory::Defragmenter defrag;
  std::vector<int> owner;  // expert by offset / min block
  bool co_placement;
  moert::memory::CoUseCounts co_use{64};
  std::vector<bool> live = std::vector<bool>(64, false);
  uint64_t co_placed = 0;
  uint64_t failed_allocations = 0;  // Allocate calls that returned false (the cache evicts)
  std::vector<uint64_t> offset = std::vector<uint64_t>(64, 0);
  std::vector<int> pins = std::vector<int>(64, 0);
  double fragmentation_sum = 0;
  double fragmentation_max = 0;
  double after_defrag_max = 0;
  uint64_t steps = 0;

  bool Allocate(int e, uint64_t bytes) {
    if (co_placement) {
      std::vector<uint64_t> partners;
      for (int p : co_use.Partners(e)) {
        if (live[static_cast<size_t>(p)]) partners.push_back(offset[static_cast<size_t>(p)]);
      }
      if (std::optional<uint64_t> at =
              moert::memory::BuddyOfPartner(pool->expert_allocator(), bytes, partners)) {
        if (pool->AllocateExpertAt(*at, bytes).ok()) {
          ++co_placed;
          Placed(e, *at);
          return true;
        }
      }
    }
    const uint64_t runs = defrag.stats().runs;
    auto block = defrag.AllocateExpert(*pool, bytes, [&](uint64_t from, uint64_t to, uint64_t) {
      const int moved = owner[from / min_block()];
      owner[to / min_block()] = moved;
      offset[static_cast<size_t>(moved)] = to;
    });
    if (defrag.stats().runs != runs) {
      after_defrag_max = std::max(after_defrag_max, pool->expert_allocator().fragmentation());
    }
    if (!block.ok()) {
      ++failed_allocations;
      return false;
    }
    Placed(e, block->offset);
    return true;
  }
  void Placed(int e, uint64_t at) {
    offset[static_cast<size_t>(e)] = at;
    owner[at / min_block()] = e;
    live[static_cast<size_t>(e)] = true;
  }
  uint64_t min_block() const { return pool->expert_allocator().min_block_bytes(); }
  void Free(int e) {
    pool->FreeExpert(offset[static_cast<size_t>(e)]);
    live[static_cast<size_t>(e)] = false;
  }
  uint8_t* Data(int e) { return pool->ExpertData(offset[static_cast<size_t>(e)]); }
  bool Pinned(int e) const { return pins[static_cast<size_t>(e)] != 0; }
  void Pin(int e) {
    ++pins[static_cast<size_t>(e)];
    pool->PinExpert(offset[static_cast<size_t>(e)]);
  }
  void Unpin(int e) {
    --pins[static_cast<size_t>(e)];
    pool->UnpinExpert(offset[static_cast<size_t>(e)]);
  }
  void AfterStep(const std::vector<int>& step) {
    if (co_placement) co_use.AddGroup(step);
    const double f = pool->expert_allocator().fragmentation();
    fragmentation_sum += f;
    fragmentation_max = std::max(fragmentation_max, f);
    ++steps;
  }
};

void BM_ChurnBuddyDefrag(benchmark::State& state) {
  for (auto _ : state) {
    moert::memory::TieredPoolOptions options;
    options.expert_bytes = kBudget;
    auto pool = moert::memory::TieredPool::Create(options);
    if (!pool.ok()) {
      state.SkipWithError(std::string(pool.status().message()).c_str());
      return;
    }
    BuddyPolicy policy(pool->get(), /*co=*/state.range(1) != 0);
    Latencies latencies;
    uint64_t peak_rss = 0, evictions = 0;
    RunChurn(Trace(state.range(0) != 0), policy, latencies, peak_rss, evictions);
    latencies.Report(state);
    const auto& d = policy.defrag.stats();
    state.counters["evictions"] = static_cast<double>(evictions);
    state.counters["failed_allocs"] = static_cast<double>(policy.failed_allocations);
    state.counters["co_placed"] = static_cast<double>(policy.co_placed);
    state.counters["defrag_runs"] = static_cast<double>(d.runs);
    state.counters["defrag_failed"] = static_cast<double>(d.failed_runs);
    state.counters["moved_MiB"] = static_cast<double>(d.bytes_moved) / kMiB;
    state.counters["defrag_ms"] = static_cast<double>(d.nanoseconds) / 1e6;
    state.counters["frag_mean"] = policy.fragmentation_sum / static_cast<double>(policy.steps);
    state.counters["frag_max"] = policy.fragmentation_max;
    state.counters["frag_after_defrag_max"] = policy.after_defrag_max;
    state.counters["peak_committed_MiB"] =
        static_cast<double>((*pool)->stats(moert::memory::Tier::kExpert).peak_committed) / kMiB;
    state.counters["peak_rss_MiB"] = static_cast<double>(peak_rss) / kMiB;
  }
}
BENCHMARK(BM_ChurnBuddyDefrag)
    ->ArgNames({"paired", "co"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// malloc/free with the same budget: the cache evicts while the requested bytes (not rounded:
// malloc does not round to powers of two) would exceed it. Fragmentation is glibc's free
// bytes held in its arenas over those plus the live bytes.
struct MallocPolicy {
  std::vector<uint8_t*> data = std::vector<uint8_t*>(64, nullptr);
  std::vector<uint64_t> bytes = std::vector<uint64_t>(64, 0);
  std::vector<int> pins = std::vector<int>(64, 0);
  uint64_t live = 0;
  double fragmentation_sum = 0;
  double fragmentation_max = 0;
  uint64_t steps = 0;

  bool Allocate(int e, uint64_t n) {
    if (live + n > kBudget) return false;
    data[static_cast<size_t>(e)] = static_cast<uint8_t*>(std::malloc(n));
    if (data[static_cast<size_t>(e)] == nullptr) return false;
    bytes[static_cast<size_t>(e)] = n;
    live += n;
    return true;
  }
  void Free(int e) {
    std::free(data[static_cast<size_t>(e)]);
    live -= bytes[static_cast<size_t>(e)];
    bytes[static_cast<size_t>(e)] = 0;
  }
  uint8_t* Data(int e) { return data[static_cast<size_t>(e)]; }
  bool Pinned(int e) const { return pins[static_cast<size_t>(e)] != 0; }
  void Pin(int e) { ++pins[static_cast<size_t>(e)]; }
  void Unpin(int e) { --pins[static_cast<size_t>(e)]; }
  void AfterStep(const std::vector<int>&) {
    const struct mallinfo2 info = mallinfo2();
    const double free_bytes = static_cast<double>(info.fordblks);
    const double f = free_bytes / (free_bytes + static_cast<double>(live));
    fragmentation_sum += f;
    fragmentation_max = std::max(fragmentation_max, f);
    ++steps;
  }
};

void BM_ChurnMalloc(benchmark::State& state) {
  for (auto _ : state) {
    MallocPolicy policy;
    Latencies latencies;
    uint64_t peak_rss = 0, evictions = 0;
    RunChurn(Trace(), policy, latencies, peak_rss, evictions);
    latencies.Report(state);
    for (int e = 0; e < 64; ++e) {
      if (policy.bytes[static_cast<size_t>(e)] != 0) policy.Free(e);  // leave nothing behind
    }
    state.counters["evictions"] = static_cast<double>(evictions);
    state.counters["frag_mean"] = policy.fragmentation_sum / static_cast<double>(policy.steps);
    state.counters["frag_max"] = policy.fragmentation_max;
    state.counters["peak_rss_MiB"] = static_cast<double>(peak_rss) / kMiB;
  }
}
BENCHMARK(BM_ChurnMalloc)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
