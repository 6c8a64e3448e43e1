// The expert cache: exact counters (its stats and the registry's), pins never evicted, the lazy rule, recency and
// frequency, defragmentation of a pool of mixed expert sizes, failed loads.
#include "experts/expert_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "experts/delta_make.h"
#include "experts/test_model.h"
#include "telemetry/metrics.h"

namespace moert::experts {
namespace {

using testing::TestModel;
using testing::ViewBytes;
using testing::TestModelOptions;

constexpr uint64_t kKiB = 1024;
const uint64_t kCharge = ExpertCache::ChargeBytes(104448);

// Two layers of 4 experts; Q8_0 gives W8 experts of 104448 bytes (a 128 KiB block),
// Q4_0 W4 experts of 55296 bytes (a 64 KiB block). The budget charges an expert its
// pages (kCharge for a W8 one), not its block: a pool of 4 * 128 KiB holds 4 of them.
TestModel Model(const std::string& name,
                std::vector<format::GgmlType> types = {format::GgmlType::kQ8_0,
                                                       format::GgmlType::kQ8_0}) {
  TestModelOptions options;
  options.layer_types = std::move(types);
  return testing::WriteTestModel(testing::TempDir(name), "m.gguf", options);
}

// range_bytes: the pool's address range (0: the cache's own; the placement tests give
// pool_bytes, so that its blocks are all the room there is).
std::unique_ptr<ExpertCache> Cache(const TestModel& model, uint64_t pool_bytes,
                                   IoMode mode = IoMode::kBuffered, uint64_t range_bytes = 0) {
  ExpertCacheOptions options;
  options.pool_bytes = pool_bytes;
  options.range_bytes = range_bytes;
  options.loader.mode = mode;
  auto cache = ExpertCache::Create(model.Directory(), options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// Acquire + Release, checking the weights.
void Use(ExpertCache& cache, const TestModel& model, int layer, int expert) {
  auto view = cache.Acquire(layer, expert);
  ASSERT_TRUE(view.ok()) << view.status();
  const ExpertInfo& info = cache.directory().info(layer, expert);
  EXPECT_EQ(ViewBytes(*view, info.runtime_bytes), model.ExpectedBlock(layer, expert))
      << "layer " << layer << " expert " << expert;
  cache.Release(layer, expert);
}

TEST(ExpertCache, BlockBytes) {
  EXPECT_EQ(ExpertCache::BlockBytes(104448, 64 * kKiB), 128 * kKiB);
  EXPECT_EQ(ExpertCache::BlockBytes(1000, 64 * kKiB), 64 * kKiB);
  EXPECT_EQ(ExpertCache::BlockBytes(128 * kKiB, 64 * kKiB), 128 * kKiB);
}

TEST(ExpertCache, ChargeBytesArePages) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(ExpertCache::ChargeBytes(1), page);
  EXPECT_EQ(ExpertCache::ChargeBytes(page), page);
  EXPECT_EQ(ExpertCache::ChargeBytes(page + 1), 2 * page);
  EXPECT_EQ(kCharge % page, 0u);
  EXPECT_GE(kCharge, 104448u);
  EXPECT_LT(kCharge, 104448u + page);
}

// An OLMoE-sized expert (3.375 MiB) takes a 4 MiB block but charges its 3.375 MiB: a
// budget of 4 blocks holds 4 experts and part of a fifth's worth, and the charges, the
// committed pages and the registry's gauge all stay within it.
TEST(ExpertCache, BudgetCountsPagesNotBlocks) {
  const TestModel model = Model("charge");
  const uint64_t budget = 5 * kCharge + kCharge / 2;  // 5.5 charges: 5 experts, not 4 blocks
  ASSERT_LT(budget, 5 * 128 * kKiB);
  auto cache = Cache(model, budget);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->capacity_experts(), 5u);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      Use(*cache, model, l, e);
      const ExpertCacheStats s = cache->stats();
      EXPECT_LE(s.used_bytes, budget);
      EXPECT_LE(s.committed_bytes, budget);
    }
  }
  const ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.resident_experts, 5u);
  EXPECT_EQ(s.used_bytes, 5 * kCharge);
  EXPECT_EQ(s.committed_bytes, 5 * kCharge);
  EXPECT_EQ(s.free_bytes, budget - 5 * kCharge);
  EXPECT_EQ(s.evictions, 3u);
  EXPECT_GE(cache->expert_region_bytes(), 5 * 128 * kKiB);  // address space, not memory
}

TEST(ExpertCache, CountersAreExact) {
  const TestModel model = Model("counters");
  auto cache = Cache(model, 4 * 128 * kKiB);  // 4 experts
  ASSERT_NE(cache, nullptr);
  const uint64_t file_bytes = cache->directory().info(0, 0).file_bytes;
  Use(*cache, model, 0, 0);  // miss
  Use(*cache, model, 0, 1);  // miss
  Use(*cache, model, 0, 0);  // hit
  cache->BeginStep();
  Use(*cache, model, 1, 3);  // miss
  Use(*cache, model, 0, 1);  // hit
  Use(*cache, model, 0, 1);  // hit
  ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.hits, 3u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.loads, 3u);
  EXPECT_EQ(s.failed_loads, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.bytes_loaded, 3 * file_bytes);  // buffered: exactly the file bytes
  EXPECT_DOUBLE_EQ(s.hit_rate(), 0.5);
  EXPECT_EQ(s.resident_experts, 3u);
  EXPECT_EQ(s.used_bytes, 3 * kCharge);
  EXPECT_EQ(s.free_bytes, 4 * 128 * kKiB - 3 * kCharge);
  EXPECT_EQ(s.capacity_experts, 4u);
  EXPECT_EQ(s.pinned_experts, 0u);
  EXPECT_EQ(cache->uses(0, 1), 3u);
  EXPECT_EQ(cache->residency(0), std::vector<uint64_t>{0b0011});
  EXPECT_EQ(cache->residency(1), std::vector<uint64_t>{0b1000});
  // Resident pages are committed; evicting gives them back.
  EXPECT_EQ(s.committed_bytes, 3 * kCharge);
  cache->EvictAll();
  s = cache->stats();
  EXPECT_EQ(s.committed_bytes, 0u);
  EXPECT_EQ(s.evictions, 3u);
  EXPECT_EQ(s.resident_experts, 0u);
  EXPECT_EQ(cache->residency(0), std::vector<uint64_t>{0});
}

TEST(ExpertCache, PublishesLoadsBytesAndPoolStateToTheRegistry) {
  const TestModel model = Model("metrics");
  ExpertCacheOptions options;
  options.pool_bytes = 4 * 128 * kKiB;
  options.loader.mode = IoMode::kBuffered;
  options.metrics = std::make_shared<telemetry::Registry>();
  auto created = ExpertCache::Create(model.Directory(), options);
  ASSERT_TRUE(created.ok()) << created.status();
  ExpertCache& cache = **created;
  const telemetry::Registry& registry = *options.metrics;
  const uint64_t file_bytes = cache.directory().info(0, 0).file_bytes;
  Use(cache, model, 0, 0);  // miss
  Use(cache, model, 0, 1);  // miss
  Use(cache, model, 0, 0);  // hit
  ASSERT_EQ(cache.Prefetch(1, 2), ExpertCache::PrefetchResult::kStarted);
  cache.Drain();
  Use(cache, model, 1, 2);  // prefetched
  Use(cache, model, 1, 2);  // hit
  const ExpertCacheStats s = cache.stats();
  EXPECT_EQ(registry.Read("moert_expert_loads_total", {"hit"}), 2);
  EXPECT_EQ(registry.Read("moert_expert_loads_total", {"prefetched"}), 1);
  EXPECT_EQ(registry.Read("moert_expert_loads_total", {"miss"}), 2);
  EXPECT_EQ(s.hits, 3u);  // the stats count a prefetch in time as a hit
  EXPECT_EQ(registry.Read("moert_expert_read_bytes_total"), static_cast<double>(3 * file_bytes));
  EXPECT_EQ(registry.Read("moert_expert_stall_seconds_total"), static_cast<double>(s.stall_ns) / 1e9);
  EXPECT_EQ(registry.Read("moert_pool_used_bytes", {"expert"}), static_cast<double>(3 * kCharge));
  EXPECT_EQ(registry.Read("moert_pool_fragmentation_ratio", {"expert"}), s.fragmentation);
  cache.EvictAll();
  EXPECT_EQ(registry.Read("moert_pool_used_bytes", {"expert"}), 0);
  EXPECT_EQ(registry.Read("moert_pool_fragmentation_ratio", {"expert"}), 0);
}

TEST(ExpertCache, PinnedExpertsAreNeverEvicted) {
  const TestModel model = Model("pins");
  auto cache = Cache(model, 2 * 128 * kKiB);  // 2 experts
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Acquire(0, 0).ok());
  ASSERT_TRUE(cache->Acquire(0, 1).ok());
  for (int i = 0; i < 5; ++i) cache->BeginStep();
  // Both pinned: no room, and the error names the budget.
  auto third = cache->Acquire(1, 0);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("limited to 262144 bytes (memory budget)"),
            std::string::npos)
      << third.status();
  EXPECT_TRUE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 1));
  EXPECT_FALSE(cache->IsResident(1, 0));
  EXPECT_EQ(cache->stats().evictions, 0u);
  EXPECT_EQ(cache->stats().misses, 2u);  // the refused one never started a load
  // Unpinning one makes room; the other stays.
  cache->Release(0, 0);
  Use(*cache, model, 1, 0);
  EXPECT_FALSE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 1));
  EXPECT_TRUE(cache->IsPinned(0, 1));
  // Several pins on one expert: it stays pinned until the last Release.
  ASSERT_TRUE(cache->Acquire(0, 1).ok());
  cache->Release(0, 1);
  EXPECT_TRUE(cache->IsPinned(0, 1));
  cache->Release(0, 1);
  EXPECT_FALSE(cache->IsPinned(0, 1));
}

TEST(ExpertCache, PoolLimitEvictsDownToItAndAllocationsKeepUnderIt) {
  const TestModel model = Model("limit");
  auto cache = Cache(model, 4 * 128 * kKiB);  // 4 experts
  ASSERT_NE(cache, nullptr);
  for (int e = 0; e < 4; ++e) Use(*cache, model, 0, e);
  Use(*cache, model, 1, 0);  // full: one evicted for it
  EXPECT_EQ(cache->stats().used_bytes, 4 * kCharge);
  // The victim's block was reused; no page is left committed outside a live block.
  EXPECT_EQ(cache->stats().committed_bytes, 4 * kCharge);

  // Down to 2 experts (rounded down to a charge): two evicted now.
  cache->SetPoolLimit(2 * kCharge + 1000);
  ExpertCacheStats s = cache->stats();
  EXPECT_EQ(cache->pool_limit(), 2 * kCharge);
  EXPECT_EQ(s.pool_bytes, 2 * kCharge);
  EXPECT_EQ(s.capacity_experts, 2u);
  EXPECT_EQ(s.used_bytes, 2 * kCharge);
  EXPECT_EQ(s.committed_bytes, 2 * kCharge);  // their pages given back
  EXPECT_EQ(s.free_bytes, 0u);
  // Every later load stays under the limit, the weights still right.
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      Use(*cache, model, l, e);
      EXPECT_LE(cache->stats().used_bytes, 2 * kCharge);
    }
  }
  // Two pinned and a third wanted: the limit's error, the cache usable after it.
  ASSERT_TRUE(cache->Acquire(0, 0).ok());
  ASSERT_TRUE(cache->Acquire(0, 1).ok());
  auto third = cache->Acquire(1, 1);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("limited to " + std::to_string(2 * kCharge) +
                                          " bytes (memory budget)"),
            std::string::npos)
      << third.status();
  cache->Release(0, 0);
  cache->Release(0, 1);
  // Prefetches and preloads keep to the limit too: they evict what they may, else back
  // off (a prefetch) or stop (a preload), and never take the pool past it.
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      cache->Prefetch(l, e);
      EXPECT_LE(cache->stats().used_bytes, 2 * kCharge) << "prefetch of " << l << "/" << e;
    }
  }
  cache->Drain();
  EXPECT_LE(cache->stats().used_bytes, 2 * kCharge);
  cache->EvictAll();
  const std::vector<HotExpert> hot = {{0, 0, 5}, {0, 1, 4}, {1, 2, 3}, {1, 3, 2}};
  size_t preloaded = 0;
  ASSERT_TRUE(cache->Preload(hot, &preloaded).ok());
  EXPECT_EQ(preloaded, 2u);
  EXPECT_EQ(cache->stats().used_bytes, 2 * kCharge);
  // Never below one charge, never above the pool; raising it lets the pool fill again.
  cache->SetPoolLimit(0);
  EXPECT_EQ(cache->pool_limit(), kCharge);
  EXPECT_EQ(cache->stats().used_bytes, kCharge);
  cache->SetPoolLimit(uint64_t{1} << 40);
  EXPECT_EQ(cache->pool_limit(), 4 * 128 * kKiB);
  for (int e = 0; e < 4; ++e) Use(*cache, model, 1, e);
  EXPECT_EQ(cache->stats().used_bytes, 4 * kCharge);
}

TEST(ExpertCache, EvictUnusedDropsPreloadedExpertsNoStepUsed) {
  const TestModel model = Model("unused");
  auto cache = Cache(model, 4 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  const std::vector<HotExpert> hot = {{0, 0, 5}, {0, 1, 4}, {1, 2, 3}};
  size_t loaded = 0;
  ASSERT_TRUE(cache->Preload(hot, &loaded).ok());
  EXPECT_EQ(loaded, 3u);
  Use(*cache, model, 0, 1);
  EXPECT_EQ(cache->EvictUnused(), 2u);
  EXPECT_FALSE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 1));
  EXPECT_FALSE(cache->IsResident(1, 2));
  EXPECT_EQ(cache->stats().committed_bytes, kCharge);
}

TEST(ExpertCache, LazyRuleKeepsRecentlyUsedExperts) {
  const TestModel model = Model("lazy");
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  // A is used often at step 0; B once at step 3. At step 4, B (age 1) is inside the
  // lazy window although its score is far lower: A (age 4) goes.
  for (int i = 0; i < 5; ++i) Use(*cache, model, 0, 0);
  for (int i = 0; i < 3; ++i) cache->BeginStep();
  Use(*cache, model, 0, 1);
  cache->BeginStep();
  Use(*cache, model, 1, 0);
  EXPECT_FALSE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 1));
  EXPECT_EQ(cache->stats().lazy_evictions, 0u);
}

TEST(ExpertCache, LazyWindowIsTwoStepsAfterTheLastUse) {
  const TestModel model = Model("lazy-window");
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  // B is used at step 0, A at step 1 (many times, so its score is higher).
  Use(*cache, model, 0, 1);
  cache->BeginStep();
  for (int i = 0; i < 5; ++i) Use(*cache, model, 0, 0);
  cache->BeginStep();  // step 2: B (age 2) is still inside the window, so is A
  Use(*cache, model, 1, 0);
  // Both were protected: the lower score (B) went, counted as a lazy eviction.
  EXPECT_FALSE(cache->IsResident(0, 1));
  EXPECT_TRUE(cache->IsResident(0, 0));
  EXPECT_EQ(cache->stats().lazy_evictions, 1u);
  // Step 4: A (age 3) has left the window, C (age 2) has not: A goes although its
  // score is higher.
  cache->BeginStep();
  cache->BeginStep();
  Use(*cache, model, 1, 1);
  EXPECT_FALSE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(1, 0));
  EXPECT_EQ(cache->stats().lazy_evictions, 1u);
  EXPECT_EQ(cache->stats().evictions, 2u);
}

TEST(ExpertCache, FrequencyOutweighsRecencyOutsideTheLazyWindow) {
  const TestModel model = Model("lrfu");
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  for (int i = 0; i < 5; ++i) Use(*cache, model, 0, 0);  // A: 5 uses at step 0
  cache->BeginStep();
  Use(*cache, model, 0, 1);  // B: 1 use at step 1
  for (int i = 0; i < 4; ++i) cache->BeginStep();
  // Step 5: both outside the window; A's score 5 * 2^(-5/8) beats B's 2^(-4/8): LRU
  // would evict A, LRFU evicts B.
  Use(*cache, model, 1, 0);
  EXPECT_TRUE(cache->IsResident(0, 0));
  EXPECT_FALSE(cache->IsResident(0, 1));
  // Much later the old uses have decayed: now recency wins.
  for (int i = 0; i < 40; ++i) cache->BeginStep();
  Use(*cache, model, 1, 0);
  for (int i = 0; i < 3; ++i) cache->BeginStep();
  Use(*cache, model, 1, 1);
  EXPECT_FALSE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(1, 0));
}

// Layer 0: 128 KiB experts, layer 1: 64 KiB experts, in a 256 KiB pool.
TEST(ExpertCache, DefragmentsWhenFreeBytesAreSplit) {
  const TestModel model = Model("defrag", {format::GgmlType::kQ8_0, format::GgmlType::kQ4_0});
  auto cache = Cache(model, 256 * kKiB, IoMode::kBuffered, 256 * kKiB);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->directory().info(1, 0).runtime_bytes, 55296u);
  // Four small experts fill the pool; 0 and 2 are used more than 1 and 3.
  for (int e = 0; e < 4; ++e) Use(*cache, model, 1, e);
  Use(*cache, model, 1, 0);
  Use(*cache, model, 1, 2);
  // Placements (what a device's view of the pool follows): one generation per load.
  std::vector<ExpertCache::Placement> before;
  for (int e = 0; e < 4; ++e) {
    const std::optional<ExpertCache::Placement> p = cache->PlacementOf(1, e);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->offset, cache->BlockOffset(1, e));
    for (const ExpertCache::Placement& q : before) EXPECT_NE(q.generation, p->generation);
    before.push_back(*p);
  }
  EXPECT_EQ(cache->PlacementOf(0, 0), std::nullopt);
  for (int i = 0; i < 5; ++i) cache->BeginStep();
  // A big expert: evicting 1 and 3 frees 128 KiB in two separate halves; the
  // defragmenter moves one small expert to join them.
  Use(*cache, model, 0, 0);
  // The moved expert has a new offset and a new generation; the one left in place
  // keeps both; the new expert's generation is new too.
  int moved = 0;
  for (int e : {0, 2}) {
    const std::optional<ExpertCache::Placement> p = cache->PlacementOf(1, e);
    ASSERT_TRUE(p.has_value());
    const ExpertCache::Placement& b = before[static_cast<size_t>(e)];
    EXPECT_EQ(p->offset != b.offset, p->generation != b.generation) << "expert " << e;
    moved += p->offset != b.offset;
  }
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(cache->PlacementOf(1, 1), std::nullopt);
  ASSERT_TRUE(cache->PlacementOf(0, 0).has_value());
  for (const ExpertCache::Placement& b : before) {
    EXPECT_GT(cache->PlacementOf(0, 0)->generation, b.generation);
  }
  const ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_FALSE(cache->IsResident(1, 1));
  EXPECT_FALSE(cache->IsResident(1, 3));
  EXPECT_EQ(s.defrag_runs, 1u);
  EXPECT_EQ(s.defrag_bytes_moved, 64 * kKiB);
  EXPECT_EQ(s.used_bytes, 2 * ExpertCache::ChargeBytes(55296) + kCharge);
  // The moved expert's bytes moved with it.
  Use(*cache, model, 1, 0);
  Use(*cache, model, 1, 2);
  EXPECT_EQ(cache->stats().misses, 5u);
}

TEST(ExpertCache, DefragmentCompactsSplitFreeBytes) {
  const TestModel model = Model("defragment");
  auto cache = Cache(model, 4 * 128 * kKiB, IoMode::kBuffered, 4 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  // Four blocks in use; 1 and 3 go, leaving two free blocks that are not buddies.
  for (int e = 0; e < 4; ++e) ASSERT_TRUE(cache->Acquire(0, e).ok());
  cache->Release(0, 1);
  cache->Release(0, 3);
  cache->EvictAll();
  cache->Release(0, 0);
  cache->Release(0, 2);
  ASSERT_EQ(cache->stats().fragmentation, 0.5);
  ASSERT_TRUE(cache->Defragment().ok());
  const ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.fragmentation, 0.0);
  EXPECT_EQ(s.largest_free_block, 2 * 128 * kKiB);
  EXPECT_TRUE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 2));
  Use(*cache, model, 0, 0);  // the moved expert's bytes moved with it
  Use(*cache, model, 0, 2);
  EXPECT_EQ(cache->stats().misses, 4u);
}

// Co-placement: in a pool of four 128 KiB blocks, experts 3 and 5 of layer 0 are routed
// together for four steps. Then 3 and 2 stay pinned while 1 and 6 fill the pool and leave:
// the holes are 3's buddy and 2's buddy, the latter freed last (the one first fit takes).
// 5 comes back (acquired, or prefetched), then 7, used alone. With co-placement 5 lands in
// 3's buddy, so when 3 and 5 go their blocks merge; without it 7 takes 3's buddy and the
// free space is two single blocks.
void CoPlacementScenario(bool co_placement, bool prefetch) {
  SCOPED_TRACE(::testing::Message() << "co_placement " << co_placement << " prefetch "
                                    << prefetch);
  TestModelOptions model_options;
  model_options.n_expert = 8;
  const TestModel model =
      testing::WriteTestModel(testing::TempDir("co-placement"), "m.gguf", model_options);
  constexpr uint64_t kBlock = 128 * kKiB;
  ExpertCacheOptions options;
  options.pool_bytes = 4 * kBlock;
  options.range_bytes = 4 * kBlock;
  options.co_placement = co_placement;
  auto created = ExpertCache::Create(model.Directory(), options);
  ASSERT_TRUE(created.ok()) << created.status();
  ExpertCache& cache = **created;
  for (int i = 0; i < 4; ++i) {
    cache.BeginStep();
    Use(cache, model, 0, 3);
    Use(cache, model, 0, 5);
  }
  cache.EvictAll();
  cache.BeginStep();
  ASSERT_TRUE(cache.Acquire(0, 3).ok());
  Use(cache, model, 0, 1);
  ASSERT_TRUE(cache.Acquire(0, 2).ok());
  Use(cache, model, 0, 6);
  ASSERT_EQ(cache.BlockOffset(0, 3), std::optional<uint64_t>(0));
  ASSERT_EQ(cache.BlockOffset(0, 2), std::optional<uint64_t>(2 * kBlock));
  cache.EvictAll();
  EXPECT_EQ(cache.BlockOffset(0, 1), std::nullopt);

  cache.BeginStep();
  if (prefetch) {
    ASSERT_EQ(cache.Prefetch(0, 5), ExpertCache::PrefetchResult::kStarted);
    cache.Drain();
  }
  Use(cache, model, 0, 5);  // checks the bytes too
  const std::optional<uint64_t> at = cache.BlockOffset(0, 5);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(*at == (0 ^ kBlock), co_placement) << *at;
  ASSERT_TRUE(cache.Acquire(0, 7).ok());
  ExpertCacheStats s = cache.stats();
  EXPECT_EQ(s.co_placed, co_placement ? 1u : 0u);
  EXPECT_EQ(s.loads_hidden, prefetch ? 1u : 0u);
  EXPECT_EQ(s.free_bytes, 4 * kBlock - 4 * kCharge);  // the budget's: 4 charges used

  // 3 and 5 go, 2 and 7 stay.
  cache.Release(0, 3);
  cache.EvictAll();
  s = cache.stats();
  EXPECT_FALSE(cache.IsResident(0, 3));
  EXPECT_FALSE(cache.IsResident(0, 5));
  EXPECT_EQ(s.free_bytes, 4 * kBlock - 2 * kCharge);
  EXPECT_EQ(s.largest_free_block, co_placement ? 2 * kBlock : kBlock);
  EXPECT_EQ(s.fragmentation, co_placement ? 0.0 : 0.5);
  cache.Release(0, 2);
  cache.Release(0, 7);
}

TEST(ExpertCache, ExpertsUsedTogetherArePlacedAsBuddies) {
  CoPlacementScenario(/*co_placement=*/true, /*prefetch=*/false);
  CoPlacementScenario(/*co_placement=*/false, /*prefetch=*/false);
}

TEST(ExpertCache, PrefetchPlacesNextToAPartnerToo) {
  CoPlacementScenario(/*co_placement=*/true, /*prefetch=*/true);
  CoPlacementScenario(/*co_placement=*/false, /*prefetch=*/true);
}

TEST(ExpertCache, FailedLoadLeavesNothingBehind) {
  const TestModel model = Model("failed");
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  Use(*cache, model, 0, 0);
  cache->loader().InjectFault(0, 1, LoaderFault::kIoError);
  auto bad = cache->Acquire(0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("layer 0, expert 1"), std::string::npos);
  EXPECT_FALSE(cache->IsResident(0, 1));
  ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.failed_loads, 1u);
  EXPECT_EQ(s.used_bytes, kCharge);
  EXPECT_EQ(s.pinned_experts, 0u);
  Use(*cache, model, 0, 1);  // and then it works
  EXPECT_EQ(cache->stats().resident_experts, 2u);
}

TEST(ExpertCache, ChecksumOfTheFirstLoadIsVerifiedLater) {
  const TestModel model = Model("verify");
  auto cache = Cache(model, 2 * 128 * kKiB, IoMode::kDirect);
  ASSERT_NE(cache, nullptr);
  Use(*cache, model, 1, 1);
  cache->EvictAll();
  cache->loader().InjectFault(1, 1, LoaderFault::kChecksumMismatch);
  auto bad = cache->Acquire(1, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos);
  Use(*cache, model, 1, 1);
}

TEST(ExpertCache, ChecksumsFromMetadataCatchTheFirstLoad) {
  TestModelOptions options;
  options.write_checksums = true;
  const TestModel model = testing::WriteTestModel(testing::TempDir("meta"), "m.gguf", options);
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  cache->loader().InjectFault(0, 2, LoaderFault::kChecksumMismatch);
  auto bad = cache->Acquire(0, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos);
  Use(*cache, model, 0, 2);
}

TEST(ExpertCache, PoolTooSmallForOneExpert) {
  const TestModel model = Model("tiny-pool");
  ExpertCacheOptions options;
  options.pool_bytes = 64 * kKiB;
  auto cache = ExpertCache::Create(model.Directory(), options);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(cache.status().message().find("65536"), std::string::npos) << cache.status();
  EXPECT_NE(cache.status().message().find(std::to_string(kCharge)), std::string::npos)
      << cache.status();
}

TEST(ExpertCache, OutsideTheDirectoryIsInvalidArgument) {
  const TestModel model = Model("outside");
  auto cache = Cache(model, 2 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Acquire(2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Acquire(0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Acquire(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// A hot update renames a new file over the model with only some experts' bytes changed:
// the cache reads the new file from then on, evicts the changed experts (their next
// load has the new bytes) and keeps the others resident.
TEST(ExpertCache, SwitchToUpdatedFileReplacesOnlyTheChangedExperts) {
  const TestModel model = Model("switch");
  auto cache = Cache(model, 8 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) Use(*cache, model, l, e);
  }
  const std::vector<std::pair<int, int>> changed = {{0, 1}, {1, 3}};
  auto bytes = PerturbExperts(*model.file, changed, 0.5, 3, 2);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string staged = model.path + ".new";
  {
    std::ofstream out(staged, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
    ASSERT_TRUE(out.flush());
  }
  ASSERT_EQ(std::rename(staged.c_str(), model.path.c_str()), 0);
  TestModel updated;
  updated.path = model.path;
  updated.options = model.options;
  auto file = format::GgufFile::Open(model.path);
  ASSERT_TRUE(file.ok()) << file.status();
  updated.file = std::move(*file);
  for (const auto& [l, e] : changed) {
    ASSERT_NE(updated.ExpectedBlock(l, e), model.ExpectedBlock(l, e)) << l << "/" << e;
  }

  // Pinned: refused, nothing changed.
  ASSERT_TRUE(cache->Acquire(0, 1).ok());
  const absl::Status pinned = cache->SwitchToUpdatedFile(updated.Directory(), changed);
  EXPECT_EQ(pinned.code(), absl::StatusCode::kFailedPrecondition) << pinned;
  EXPECT_NE(pinned.message().find("expert 1 of layer 0 is in use"), std::string::npos) << pinned;
  cache->Release(0, 1);
  EXPECT_TRUE(cache->IsResident(0, 1));

  const absl::Status switched = cache->SwitchToUpdatedFile(updated.Directory(), changed);
  ASSERT_TRUE(switched.ok()) << switched;
  const uint64_t loads = cache->stats().misses;
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      const bool is_changed = (l == 0 && e == 1) || (l == 1 && e == 3);
      EXPECT_EQ(cache->IsResident(l, e), !is_changed) << l << "/" << e;
      Use(*cache, updated, l, e);  // the new bytes for the changed, the same for the rest
    }
  }
  EXPECT_EQ(cache->stats().misses, loads + 2);
  // And once evicted, every expert loads from the new file again.
  cache->EvictAll();
  Use(*cache, updated, 0, 1);
  Use(*cache, updated, 0, 0);
}

TEST(ExpertCache, SwitchToUpdatedFileRefusesAnotherLayout) {
  const TestModel model = Model("switch-layout");
  auto cache = Cache(model, 8 * 128 * kKiB);
  ASSERT_NE(cache, nullptr);
  Use(*cache, model, 0, 0);
  const TestModel other = Model("switch-other", {format::GgmlType::kQ4_0, format::GgmlType::kQ8_0});
  const absl::Status refused = cache->SwitchToUpdatedFile(other.Directory(), {{{0, 0}}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("cannot be read in place"), std::string::npos) << refused;
  // The cache is as it was: the expert stays resident and loads still work.
  EXPECT_TRUE(cache->IsResident(0, 0));
  cache->EvictAll();
  Use(*cache, model, 0, 0);
}

}  // namespace
}  // namespace moert::experts
