// Defragmenter: planned moves on hand-built layouts (fewest bytes, recursion, pins, budget),
// the feasibility and compaction guarantees on random layouts, moves applied to a TieredPool,
// and the churn of a 64-expert model with an LRU cache.
#include "memory/defragmenter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "memory/buddy_allocator.h"
#include "memory/tiered_pool.h"

namespace moert::memory {

void PrintTo(const Move& m, std::ostream* os) {
  *os << "{" << m.from << " -> " << m.to << ", " << m.size << "}";
}

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kUnit = 64 * kKiB;

// A 16-unit pool laid out by `blocks` of (unit, order) after filling it with unit blocks and
// re-allocating: simplest is AllocateAt on a fresh allocator.
BuddyAllocator Layout(uint64_t units, const std::vector<std::pair<uint64_t, int>>& blocks) {
  auto a = BuddyAllocator::Create(units * kUnit, kUnit);
  EXPECT_TRUE(a.ok());
  for (const auto& [unit, order] : blocks) {
    EXPECT_TRUE(a->AllocateAt(unit * kUnit, kUnit << order).ok()) << unit;
  }
  return *std::move(a);
}

Move UnitMove(uint64_t from, uint64_t to, int order) {
  return Move{from * kUnit, to * kUnit, kUnit << order};
}

void ApplyTo(BuddyAllocator& a, const std::vector<Move>& moves) {
  for (const Move& m : moves) {
    ASSERT_EQ(a.BlockSize(m.from), m.size);
    ASSERT_TRUE(a.Relocate(m.from, m.to).ok()) << m.from << " -> " << m.to;
  }
}

TEST(PlanMakeRoomTest, NothingToDoWhenABlockIsFree) {
  BuddyAllocator a = Layout(8, {{0, 0}});
  auto plan = PlanMakeRoom(a, 4 * kUnit, UINT64_MAX);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
  EXPECT_TRUE(absl::IsInvalidArgument(PlanMakeRoom(a, 9 * kUnit, UINT64_MAX).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(PlanMakeRoom(a, 8 * kUnit, UINT64_MAX).status()));
}

TEST(PlanMakeRoomTest, ClearsTheWindowWithFewestLiveBytes) {
  // Units 0, 2, 4, 5, 7 live; 1, 3, 6 free: no free pair.
  BuddyAllocator a = Layout(8, {{0, 0}, {2, 0}, {4, 0}, {5, 0}, {7, 0}});
  ASSERT_EQ(a.largest_free_block(), kUnit);
  auto plan = PlanMakeRoom(a, 2 * kUnit, UINT64_MAX);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Windows [0,2) [2,4) [6,8) hold one unit each; the highest one is cleared into the lowest
  // free unit.
  EXPECT_THAT(*plan, ::testing::ElementsAre(UnitMove(7, 1, 0)));
  ApplyTo(a, *plan);
  EXPECT_EQ(a.largest_free_block(), 2 * kUnit);
}

TEST(PlanMakeRoomTest, MakesDestinationsRecursively) {
  // [0,4): an order-1 block and a free pair; elsewhere only single free units (6 and 15).
  BuddyAllocator a = Layout(16, {{0, 1}, {4, 1}, {7, 0}, {8, 2}, {12, 0}, {13, 0}, {14, 0}});
  ASSERT_EQ(a.free_bytes(), 4 * kUnit);
  auto plan = PlanMakeRoom(a, 4 * kUnit, UINT64_MAX);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Clearing [0,4) needs a free pair for its order-1 block: clear [14,16) first (unit 14
  // goes to unit 6), then move the pair there.
  EXPECT_THAT(*plan, ::testing::ElementsAre(UnitMove(14, 6, 0), UnitMove(0, 14, 1)));
  ApplyTo(a, *plan);
  EXPECT_EQ(a.largest_free_block(), 4 * kUnit);
  // The budget bounds the work: 3 units are needed.
  EXPECT_TRUE(absl::IsResourceExhausted(
      PlanMakeRoom(Layout(16, {{0, 1}, {4, 1}, {7, 0}, {8, 2}, {12, 0}, {13, 0}, {14, 0}}),
                   4 * kUnit, 2 * kUnit)
          .status()));
  EXPECT_TRUE(
      PlanMakeRoom(Layout(16, {{0, 1}, {4, 1}, {7, 0}, {8, 2}, {12, 0}, {13, 0}, {14, 0}}),
                   4 * kUnit, 3 * kUnit)
          .ok());
}

TEST(PlanMakeRoomTest, NeverMovesPinnedBlocks) {
  BuddyAllocator a = Layout(8, {{0, 0}, {2, 0}, {4, 0}, {5, 0}, {7, 0}});
  a.Pin(7 * kUnit);
  auto plan = PlanMakeRoom(a, 2 * kUnit, UINT64_MAX);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ::testing::ElementsAre(UnitMove(2, 1, 0)));
  for (uint64_t unit : {0, 2, 4, 5}) a.Pin(unit * kUnit);
  auto blocked = PlanMakeRoom(a, 2 * kUnit, UINT64_MAX);
  ASSERT_TRUE(absl::IsResourceExhausted(blocked.status()));
  EXPECT_THAT(std::string(blocked.status().message()), ::testing::HasSubstr("pinned"));
}

// A random layout: allocate random sizes until the pool is nearly full, then free a random
// half, so free space is scattered in blocks of every order.
BuddyAllocator RandomLayout(std::mt19937_64& rng, uint64_t units) {
  auto a = BuddyAllocator::Create(units * kUnit, kUnit);
  EXPECT_TRUE(a.ok());
  std::vector<uint64_t> live;
  std::uniform_int_distribution<int> order(0, 4);
  for (int misses = 0; misses < 20;) {
    auto b = a->Allocate(kUnit << order(rng));
    if (b.ok()) {
      live.push_back(b->offset);
    } else {
      ++misses;
    }
  }
  std::shuffle(live.begin(), live.end(), rng);
  const size_t keep = live.size() / 2 + rng() % (live.size() / 2 + 1);
  for (size_t i = keep; i < live.size(); ++i) a->Free(live[i]);
  return *std::move(a);
}

TEST(PlanMakeRoomTest, AlwaysSucceedsWithoutPinsWhenEnoughIsFree) {
  std::mt19937_64 rng(7);
  int planned = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t units = trial % 3 == 0 ? 1000 : 1024;
    BuddyAllocator a = RandomLayout(rng, units);
    for (int order = 1; order <= 6; ++order) {
      const uint64_t size = kUnit << order;
      if (a.free_bytes() < size || a.largest_free_block() >= size) continue;
      auto plan = PlanMakeRoom(a, size, UINT64_MAX);
      ASSERT_TRUE(plan.ok()) << "trial " << trial << " order " << order << ": " << plan.status();
      BuddyAllocator copy = a;
      ASSERT_NO_FATAL_FAILURE(ApplyTo(copy, *plan));
      ASSERT_GE(copy.largest_free_block(), size);
      ASSERT_EQ(copy.free_bytes(), a.free_bytes());
      ++planned;
    }
  }
  EXPECT_GT(planned, 100);
}

TEST(PlanCompactionTest, ReachesTheLargestPowerOfTwoOfFreeBytes) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    BuddyAllocator a = RandomLayout(rng, trial % 2 == 0 ? 1024 : 777);
    const std::vector<Move> plan = PlanCompaction(a, UINT64_MAX);
    ASSERT_NO_FATAL_FAILURE(ApplyTo(a, plan));
    const uint64_t best = std::min(std::bit_floor(a.free_bytes() / kUnit),
                                   uint64_t{1} << a.max_order()) *
                          kUnit;
    ASSERT_EQ(a.largest_free_block(), best) << "trial " << trial;
  }
  // A tight budget moves less and never more than it.
  std::mt19937_64 rng2(12);
  BuddyAllocator a = RandomLayout(rng2, 1024);
  uint64_t moved = 0;
  for (const Move& m : PlanCompaction(a, 8 * kUnit)) moved += m.size;
  EXPECT_LE(moved, 8 * kUnit);
}

// --- Applied to a TieredPool.

// Writes `tag` at both ends and the middle of a block (touching three pages keeps the churn
// fast; MoveExpertKeepsBytesAndRefusesPinnedBlocks checks every byte of a move).
void Stamp(uint8_t* p, uint64_t size, uint64_t tag) {
  for (uint64_t at : {uint64_t{0}, size / 2, size - sizeof(tag)}) {
    std::memcpy(p + at, &tag, sizeof(tag));
  }
}
bool HasStamp(const uint8_t* p, uint64_t size, uint64_t tag) {
  for (uint64_t at : {uint64_t{0}, size / 2, size - sizeof(tag)}) {
    if (std::memcmp(p + at, &tag, sizeof(tag)) != 0) return false;
  }
  return true;
}

TEST(DefragmenterTest, AllocationTriggersMovesAndOwnersFollow) {
  TieredPoolOptions options;
  options.expert_bytes = 16 * kMiB;
  options.expert_min_block = 1 * kMiB;
  auto created = TieredPool::Create(options);
  ASSERT_TRUE(created.ok());
  TieredPool& pool = **created;
  // 16 blocks of 1 MiB, every other one freed: 8 MiB free, largest 1 MiB.
  std::map<uint64_t, uint64_t> owner;  // offset -> tag
  for (uint64_t i = 0; i < 16; ++i) {
    auto b = pool.AllocateExpert(1 * kMiB);
    ASSERT_TRUE(b.ok());
    Stamp(pool.ExpertData(b->offset), b->size, 1000 + i);
    owner[b->offset] = 1000 + i;
  }
  for (uint64_t i = 0; i < 16; i += 2) {
    pool.FreeExpert(i * kMiB);
    owner.erase(i * kMiB);
  }
  pool.PinExpert(15 * kMiB);
  EXPECT_DOUBLE_EQ(pool.expert_allocator().fragmentation(), 1.0 - 1.0 / 8.0);

  Defragmenter defrag;
  uint64_t callbacks = 0;
  auto on_move = [&](uint64_t from, uint64_t to, uint64_t size) {
    ASSERT_NE(from, 15 * kMiB);  // pinned
    ASSERT_EQ(size, 1 * kMiB);
    ASSERT_TRUE(owner.count(from) == 1 && owner.count(to) == 0);
    owner[to] = owner[from];
    owner.erase(from);
    ++callbacks;
  };
  auto big = defrag.AllocateExpert(pool, 4 * kMiB, on_move);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->size, 4 * kMiB);
  EXPECT_EQ(defrag.stats().runs, 1u);
  EXPECT_EQ(defrag.stats().blocks_moved, callbacks);
  EXPECT_EQ(defrag.stats().bytes_moved, callbacks * kMiB);
  EXPECT_EQ(callbacks, 2u);  // a 4 MiB window held two live blocks
  EXPECT_EQ(pool.expert_allocator().BlockSize(15 * kMiB), 1 * kMiB);
  for (const auto& [offset, tag] : owner) {
    EXPECT_EQ(pool.expert_allocator().BlockSize(offset), 1 * kMiB);
    EXPECT_TRUE(HasStamp(pool.ExpertData(offset), 1 * kMiB, tag)) << offset;
  }
  EXPECT_EQ(pool.stats(Tier::kExpert).committed, 12 * kMiB);

  // Not enough free bytes: the cache must evict; no moves.
  auto too_big = defrag.AllocateExpert(pool, 8 * kMiB, on_move);
  EXPECT_TRUE(absl::IsResourceExhausted(too_big.status()));
  EXPECT_EQ(defrag.stats().runs, 1u);

  // Full compaction with the rest: the largest block becomes the 4 MiB that are free.
  ASSERT_TRUE(defrag.Compact(pool, on_move).ok());
  EXPECT_EQ(pool.expert_allocator().largest_free_block(), 4 * kMiB);
  for (const auto& [offset, tag] : owner) {
    EXPECT_TRUE(HasStamp(pool.ExpertData(offset), 1 * kMiB, tag)) << offset;
  }
}

TEST(DefragmenterTest, BudgetBoundsTheWorkOfOneCall) {
  TieredPoolOptions options;
  options.expert_bytes = 16 * kMiB;
  options.expert_min_block = 1 * kMiB;
  auto created = TieredPool::Create(options);
  ASSERT_TRUE(created.ok());
  TieredPool& pool = **created;
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(pool.AllocateExpert(1 * kMiB).ok());
  for (uint64_t i = 0; i < 16; i += 2) pool.FreeExpert(i * kMiB);
  DefragmenterOptions defrag_options;
  defrag_options.max_bytes_moved_per_call = 1 * kMiB;  // a 4 MiB window needs 2 MiB moved
  Defragmenter defrag(defrag_options);
  auto failed = defrag.AllocateExpert(pool, 4 * kMiB, [](uint64_t, uint64_t, uint64_t) {});
  ASSERT_TRUE(absl::IsResourceExhausted(failed.status()));
  EXPECT_THAT(std::string(failed.status().message()), ::testing::HasSubstr("budget"));
  EXPECT_EQ(defrag.stats().failed_runs, 1u);
  EXPECT_EQ(defrag.stats().bytes_moved, 0u);
}

// --- Churn: a 64-expert model with mixed expert sizes behind an LRU cache.

struct ChurnTrace {
  std::vector<uint64_t> expert_bytes;          // per expert
  std::vector<std::vector<int>> steps;         // experts routed per decode step
};

// Experts of 0.75, 1.5, 3 and 6 MiB over 64 KiB minimum blocks (12, 24, 48 and 96 blocks of
// `min_block` bytes); top-4 routing over a Zipf-like popularity whose ranking drifts every 100
// steps. bench/memory_bench.cc replays the same trace at full size.
ChurnTrace MakeChurnTrace(uint64_t seed, int steps, uint64_t min_block) {
  ChurnTrace trace;
  std::mt19937_64 rng(seed);
  const uint64_t sizes[] = {12 * min_block, 24 * min_block, 48 * min_block, 96 * min_block};
  for (int e = 0; e < 64; ++e) trace.expert_bytes.push_back(sizes[rng() % 4]);
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
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    trace.steps.push_back(chosen);
  }
  return trace;
}

// The pure policy without memory: BuddyAllocator + PlanMakeRoom, exactly what
// Defragmenter::AllocateExpert does to a TieredPool minus the memmove. Runs the trace fast.
class SimulatedPool {
 public:
  SimulatedPool(uint64_t bytes, uint64_t min_block, DefragmenterOptions options)
      : alloc_(*BuddyAllocator::Create(bytes, min_block)), options_(options) {}

  absl::StatusOr<Block> Allocate(uint64_t bytes, RelocationCallback on_move) {
    absl::StatusOr<Block> block = alloc_.Allocate(bytes);
    if (block.ok() || alloc_.fragmentation() <= options_.fragmentation_threshold ||
        alloc_.free_bytes() < alloc_.RoundUp(bytes)) {
      return block;
    }
    ++runs_;
    absl::StatusOr<std::vector<Move>> plan =
        PlanMakeRoom(alloc_, bytes, options_.max_bytes_moved_per_call);
    if (!plan.ok()) return plan.status();
    for (const Move& m : *plan) {
      EXPECT_TRUE(alloc_.Relocate(m.from, m.to).ok());
      on_move(m.from, m.to, m.size);
    }
    return alloc_.Allocate(bytes);
  }
  void Free(uint64_t offset) { alloc_.Free(offset); }
  void Pin(uint64_t offset) { alloc_.Pin(offset); }
  void Unpin(uint64_t offset) { alloc_.Unpin(offset); }
  const BuddyAllocator& allocator() const { return alloc_; }
  uint64_t runs() const { return runs_; }
  uint8_t* Data(uint64_t) { return nullptr; }

 private:
  BuddyAllocator alloc_;
  DefragmenterOptions options_;
  uint64_t runs_ = 0;
};

// The real thing: Defragmenter over a TieredPool.
class RealPool {
 public:
  RealPool(uint64_t bytes, uint64_t min_block, DefragmenterOptions options) : defrag_(options) {
    TieredPoolOptions pool_options;
    pool_options.expert_min_block = min_block;
    pool_options.expert_bytes = bytes;
    pool_ = *TieredPool::Create(pool_options);
  }
  absl::StatusOr<Block> Allocate(uint64_t bytes, RelocationCallback on_move) {
    return defrag_.AllocateExpert(*pool_, bytes, on_move);
  }
  void Free(uint64_t offset) { pool_->FreeExpert(offset); }
  void Pin(uint64_t offset) { pool_->PinExpert(offset); }
  void Unpin(uint64_t offset) { pool_->UnpinExpert(offset); }
  const BuddyAllocator& allocator() const { return pool_->expert_allocator(); }
  uint64_t runs() const { return defrag_.stats().runs; }
  uint8_t* Data(uint64_t offset) { return pool_->ExpertData(offset); }
  const Defragmenter& defrag() const { return defrag_; }
  TierStats tier_stats() const { return pool_->stats(Tier::kExpert); }

 private:
  std::unique_ptr<TieredPool> pool_;
  Defragmenter defrag_;
};

struct ChurnResult {
  uint64_t misses = 0;
  uint64_t evictions = 0;
  // Allocations that failed although free_bytes >= the rounded request: with pins, and
  // those of them that succeed in planning once every pin is dropped.
  uint64_t failed_with_room = 0;
  uint64_t failed_because_of_pins = 0;
  // Fragmentation once an allocation that needed defragmentation succeeded, and the least
  // any buddy layout could have had then (1 - largest power of two <= free / free).
  std::vector<double> after_defrag;
  double worst_best_possible = 0.0;
  double Quantile(double q) const {
    if (after_defrag.empty()) return 0.0;
    return after_defrag[static_cast<size_t>(q * static_cast<double>(after_defrag.size() - 1))];
  }
  double Mean() const {
    double sum = 0.0;
    for (double f : after_defrag) sum += f;
    return after_defrag.empty() ? 0.0 : sum / static_cast<double>(after_defrag.size());
  }
};

// An LRU expert cache over `pool`: hits refresh, misses allocate and on failure evict the
// least recently used expert not pinned. With `pin`, each expert is pinned from its load
// until the end of its step (a kernel reads it), so allocations happen around pinned blocks.
template <typename Pool>
ChurnResult RunChurn(Pool& pool, const ChurnTrace& trace, bool pin,
                     const DefragmenterOptions& options) {
  ChurnResult result;
  const BuddyAllocator& alloc = pool.allocator();
  const bool has_bytes = pool.Data(0) != nullptr;
  constexpr uint64_t kNone = UINT64_MAX;
  std::vector<uint64_t> offset_of(64, kNone);
  std::vector<uint64_t> loads(64, 0);
  std::map<uint64_t, int> expert_at;  // offset -> expert
  std::list<int> lru;                 // front: most recently used
  std::set<uint64_t> pinned;
  auto tag = [&](int e) { return static_cast<uint64_t>(e) * 1000000 + loads[static_cast<size_t>(e)]; };
  auto on_move = [&](uint64_t from, uint64_t to, uint64_t size) {
    EXPECT_EQ(pinned.count(from), 0u) << "a pinned block moved";
    auto it = expert_at.find(from);
    ASSERT_NE(it, expert_at.end());
    const int e = it->second;
    EXPECT_EQ(alloc.RoundUp(trace.expert_bytes[static_cast<size_t>(e)]), size);
    expert_at.erase(it);
    EXPECT_EQ(expert_at.count(to), 0u);
    expert_at[to] = e;
    offset_of[static_cast<size_t>(e)] = to;
  };
  for (const std::vector<int>& step : trace.steps) {
    for (int e : step) {
      const auto ue = static_cast<size_t>(e);
      if (offset_of[ue] != kNone) {
        if (has_bytes) {
          EXPECT_TRUE(HasStamp(pool.Data(offset_of[ue]), trace.expert_bytes[ue], tag(e)))
              << "expert " << e << " lost its bytes";
        }
        lru.remove(e);
      } else {
        ++result.misses;
        const uint64_t bytes = trace.expert_bytes[ue];
        const uint64_t rounded = alloc.RoundUp(bytes);
        while (true) {
          const uint64_t runs_before = pool.runs();
          absl::StatusOr<Block> block = pool.Allocate(bytes, on_move);
          if (block.ok()) {
            if (pool.runs() != runs_before) {
              result.after_defrag.push_back(alloc.fragmentation());
              if (alloc.free_bytes() != 0) {
                const double free = static_cast<double>(alloc.free_bytes());
                result.worst_best_possible = std::max(
                    result.worst_best_possible,
                    1.0 - static_cast<double>(std::bit_floor(alloc.free_bytes())) / free);
              }
            }
            offset_of[ue] = block->offset;
            expert_at[block->offset] = e;
            ++loads[ue];
            // Only the bytes asked for are committed (the rest of the block is not).
            if (has_bytes) Stamp(pool.Data(block->offset), bytes, tag(e));
            break;
          }
          EXPECT_TRUE(absl::IsResourceExhausted(block.status())) << block.status();
          if (alloc.free_bytes() >= rounded) {
            ++result.failed_with_room;
            BuddyAllocator unpinned = alloc;
            for (uint64_t offset : pinned) unpinned.Unpin(offset);
            if (PlanMakeRoom(unpinned, bytes, options.max_bytes_moved_per_call).ok()) {
              ++result.failed_because_of_pins;
            } else {
              ADD_FAILURE() << block.status();
            }
          }
          auto victim = std::find_if(lru.rbegin(), lru.rend(), [&](int v) {
            return pinned.count(offset_of[static_cast<size_t>(v)]) == 0;
          });
          if (victim == lru.rend()) {
            ADD_FAILURE() << "nothing to evict";
            return result;
          }
          const int v = *victim;
          lru.erase(std::next(victim).base());
          pool.Free(offset_of[static_cast<size_t>(v)]);
          expert_at.erase(offset_of[static_cast<size_t>(v)]);
          offset_of[static_cast<size_t>(v)] = kNone;
          ++result.evictions;
        }
      }
      lru.push_front(e);
      if (pin) {
        pool.Pin(offset_of[ue]);
        pinned.insert(offset_of[ue]);
      }
    }
    for (uint64_t offset : pinned) pool.Unpin(offset);
    pinned.clear();
  }
  for (int e = 0; e < 64; ++e) {
    const auto ue = static_cast<size_t>(e);
    if (offset_of[ue] == kNone || !has_bytes) continue;
    EXPECT_TRUE(HasStamp(pool.Data(offset_of[ue]), trace.expert_bytes[ue], tag(e)));
  }
  std::sort(result.after_defrag.begin(), result.after_defrag.end());
  return result;
}

void PrintChurn(const char* name, const ChurnResult& r, uint64_t runs) {
  const auto over = static_cast<size_t>(
      r.after_defrag.end() - std::upper_bound(r.after_defrag.begin(), r.after_defrag.end(), 0.04));
  std::printf(
      "%s: %llu misses, %llu evictions, %llu defragmentations, %llu failures with room (%llu "
      "caused by pins)\n  fragmentation after defragmentation: mean %.4f p50 %.4f p90 %.4f "
      "p99 %.4f max %.4f, %zu of %zu above 0.04; worst best-possible %.4f\n",
      name, static_cast<unsigned long long>(r.misses),
      static_cast<unsigned long long>(r.evictions), static_cast<unsigned long long>(runs),
      static_cast<unsigned long long>(r.failed_with_room),
      static_cast<unsigned long long>(r.failed_because_of_pins), r.Mean(), r.Quantile(0.5),
      r.Quantile(0.9), r.Quantile(0.99), r.Quantile(1.0), over, r.after_defrag.size(),
      r.worst_best_possible);
}

// 80 MiB of 64 KiB blocks for a third of the rounded expert bytes; the default budget of
// 64 MiB per defragmentation.
constexpr uint64_t kChurnPoolBlocks = 1280;
constexpr uint64_t kChurnBudgetBlocks = 1024;

TEST(DefragmenterTest, ChurnWithoutPinsNeverFailsWhileEnoughIsFree) {
  const ChurnTrace trace = MakeChurnTrace(42, 10000, kUnit);
  DefragmenterOptions options;
  options.max_bytes_moved_per_call = kChurnBudgetBlocks * kUnit;
  SimulatedPool pool(kChurnPoolBlocks * kUnit, kUnit, options);
  const ChurnResult r = RunChurn(pool, trace, /*pin=*/false, options);
  PrintChurn("churn without pins", r, pool.runs());
  EXPECT_EQ(r.failed_with_room, 0u);
  EXPECT_GT(pool.runs(), 100u);  // the trace does need defragmentation
  // The target: fragmentation <= 0.04 after defragmentation. Met on average; the
  // largest values cannot be: at some of these points no buddy layout of the free bytes
  // gets under worst_best_possible (free bytes far from a power of two).
  EXPECT_LE(r.Mean(), 0.04);
  EXPECT_GT(r.worst_best_possible, 0.04);
}

TEST(DefragmenterTest, ChurnWithPinsFailsOnlyWherePinsBlock) {
  const ChurnTrace trace = MakeChurnTrace(42, 10000, kUnit);
  DefragmenterOptions options;
  options.max_bytes_moved_per_call = kChurnBudgetBlocks * kUnit;
  SimulatedPool pool(kChurnPoolBlocks * kUnit, kUnit, options);
  const ChurnResult r = RunChurn(pool, trace, /*pin=*/true, options);
  PrintChurn("churn with pins", r, pool.runs());
  // Pinned blocks can make a request impossible however much is free; every such failure
  // must be one that planning without the pins solves, and they stay rare.
  EXPECT_EQ(r.failed_with_room, r.failed_because_of_pins);
  EXPECT_LE(r.failed_with_room * 1000, r.misses);
  EXPECT_GT(pool.runs(), 100u);
  EXPECT_LE(r.Mean(), 0.04);
}

// A SlowTest (run by ctest as memory_test.slow, x86 CI step only): the kernel's page work
// under ASan or qemu would take minutes.
TEST(DefragmenterSlowTest, ChurnInATieredPoolMatchesThePolicyAndKeepsBytes) {
  // The allocator only sees multiples of the minimum block, so running the trace with a
  // one-page minimum block instead of 64 KiB gives the same allocations, frees and moves as
  // full size while memmove and page faults cost 16 times less. The first 2000 steps (the
  // kernel's page work makes all 10000 slow) must match the simulated policy exactly, and
  // every expert must keep its bytes through the moves.
  const auto min_block = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const ChurnTrace trace = MakeChurnTrace(42, 2000, min_block);
  DefragmenterOptions options;
  options.max_bytes_moved_per_call = kChurnBudgetBlocks * min_block;
  RealPool pool(kChurnPoolBlocks * min_block, min_block, options);
  const ChurnResult r = RunChurn(pool, trace, /*pin=*/true, options);
  SimulatedPool sim(kChurnPoolBlocks * min_block, min_block, options);
  const ChurnResult expected = RunChurn(sim, trace, /*pin=*/true, options);
  PrintChurn("churn with pins, TieredPool, 2000 steps", r, pool.runs());
  EXPECT_EQ(r.misses, expected.misses);
  EXPECT_EQ(r.evictions, expected.evictions);
  EXPECT_EQ(pool.runs(), sim.runs());
  EXPECT_EQ(r.after_defrag, expected.after_defrag);
  EXPECT_EQ(r.failed_with_room, r.failed_because_of_pins);
  const DefragmenterStats& s = pool.defrag().stats();
  EXPECT_GT(s.blocks_moved, 0u);
  EXPECT_LE(s.max_bytes_moved_in_a_run, options.max_bytes_moved_per_call);
  // Resident memory follows what is live: the pages of the bytes the live experts asked
  // for, within their blocks.
  const BuddyStats b = pool.allocator().stats();
  EXPECT_EQ(pool.tier_stats().committed, pool.tier_stats().charged);
  EXPECT_GT(pool.tier_stats().charged, 0u);
  EXPECT_LE(pool.tier_stats().charged, b.live_bytes);
  EXPECT_EQ(pool.tier_stats().used, b.live_bytes);
}

}  // namespace
}  // namespace moert::memory
