// BuddyAllocator: geometry and edge cases, then a property test of random alloc/free/move
// sequences against an oracle that keeps the live intervals.
#include "memory/buddy_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace moert::memory {

void PrintTo(const Block& b, std::ostream* os) { *os << "{" << b.offset << ", " << b.size << "}"; }

namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMin = 64 * kKiB;

std::vector<Block> FreeBlocks(const BuddyAllocator& a) {
  std::vector<Block> blocks;
  a.ForEachFreeBlock(0, [&](const Block& b) { blocks.push_back(b); });
  std::sort(blocks.begin(), blocks.end(),
            [](const Block& x, const Block& y) { return x.offset < y.offset; });
  return blocks;
}

std::vector<Block> LiveBlocks(const BuddyAllocator& a) {
  std::vector<Block> blocks;
  a.ForEachLiveBlock([&](const Block& b) { blocks.push_back(b); });
  return blocks;
}

TEST(BuddyAllocatorTest, RejectsBadGeometry) {
  EXPECT_TRUE(absl::IsInvalidArgument(BuddyAllocator::Create(1 << 20, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BuddyAllocator::Create(1 << 20, 3 * kKiB).status()));
  // Minimum block bigger than the pool.
  auto too_big = BuddyAllocator::Create(32 * kKiB, kMin);
  ASSERT_TRUE(absl::IsInvalidArgument(too_big.status()));
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("larger than the pool"));
  EXPECT_TRUE(BuddyAllocator::Create(kMin, kMin).ok());  // a single block
}

TEST(BuddyAllocatorTest, PoolNotAPowerOfTwoIsCoveredByAlignedBlocks) {
  // 7.5 minimum blocks: the half block is unused; 7 = 4 + 2 + 1.
  auto a = BuddyAllocator::Create(7 * kMin + kMin / 2, kMin);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->pool_bytes(), 7 * kMin);
  EXPECT_EQ(a->max_order(), 2);
  EXPECT_EQ(a->free_bytes(), 7 * kMin);
  EXPECT_EQ(a->largest_free_block(), 4 * kMin);
  const std::vector<Block> initial = {{0, 4 * kMin}, {4 * kMin, 2 * kMin}, {6 * kMin, kMin}};
  EXPECT_EQ(FreeBlocks(*a), initial);
  EXPECT_NEAR(a->fragmentation(), 1.0 - 4.0 / 7.0, 1e-12);

  // Every block allocated: 4 + 2 + 1 units exactly.
  auto b4 = a->Allocate(4 * kMin);
  auto b2 = a->Allocate(2 * kMin);
  auto b1 = a->Allocate(1);
  ASSERT_TRUE(b4.ok() && b2.ok() && b1.ok());
  EXPECT_EQ(*b4, (Block{0, 4 * kMin}));
  EXPECT_EQ(*b2, (Block{4 * kMin, 2 * kMin}));
  EXPECT_EQ(*b1, (Block{6 * kMin, kMin}));
  EXPECT_EQ(a->free_bytes(), 0u);
  EXPECT_EQ(a->fragmentation(), 0.0);
  // The top blocks never merge with each other.
  a->Free(b1->offset);
  a->Free(b2->offset);
  EXPECT_EQ(a->largest_free_block(), 2 * kMin);
  a->Free(b4->offset);
  EXPECT_EQ(FreeBlocks(*a), initial);
}

TEST(BuddyAllocatorTest, ZeroAndOversizedRequests) {
  auto a = BuddyAllocator::Create(6 * kMin, kMin);  // 4 + 2
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a->Allocate(0).status()));
  auto over_pool = a->Allocate(6 * kMin + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(over_pool.status()));
  EXPECT_THAT(std::string(over_pool.status().message()), HasSubstr("larger than the pool"));
  // Fits the pool but not its largest block (4 units): can never succeed.
  auto over_block = a->Allocate(5 * kMin);
  EXPECT_TRUE(absl::IsInvalidArgument(over_block.status()));
  EXPECT_THAT(std::string(over_block.status().message()), HasSubstr("largest block"));
  EXPECT_EQ(a->OrderFor(5 * kMin), -1);
  EXPECT_EQ(a->RoundUp(5 * kMin), 0u);
  EXPECT_EQ(a->RoundUp(1), kMin);
  EXPECT_EQ(a->RoundUp(kMin + 1), 2 * kMin);
  EXPECT_EQ(a->stats().failed_allocations, 0u);  // invalid requests are not "failed"
}

TEST(BuddyAllocatorTest, ExhaustionNamesRequestAndLargestFreeBlock) {
  auto a = BuddyAllocator::Create(8 * kMin, kMin);
  ASSERT_TRUE(a.ok());
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 8; ++i) offsets.push_back(a->Allocate(kMin)->offset);
  for (int i = 0; i < 8; i += 2) a->Free(offsets[static_cast<size_t>(i)]);
  EXPECT_EQ(a->free_bytes(), 4 * kMin);
  EXPECT_EQ(a->largest_free_block(), kMin);
  EXPECT_DOUBLE_EQ(a->fragmentation(), 0.75);
  auto failed = a->Allocate(kMin + 5);
  ASSERT_TRUE(absl::IsResourceExhausted(failed.status()));
  const std::string message(failed.status().message());
  EXPECT_THAT(message, HasSubstr(std::to_string(kMin + 5) + " bytes"));
  EXPECT_THAT(message, HasSubstr("largest free block " + std::to_string(kMin)));
  EXPECT_THAT(message, HasSubstr(std::to_string(4 * kMin) + " bytes free"));
  EXPECT_EQ(a->stats().failed_allocations, 1u);
}

TEST(BuddyAllocatorTest, SplitsAndMergesBuddies) {
  auto a = BuddyAllocator::Create(16 * kMin, kMin);
  ASSERT_TRUE(a.ok());
  auto x = a->Allocate(kMin);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->offset, 0u);
  // Splitting 16 leaves 8, 4, 2, 1 free.
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{kMin, kMin},
                                               {2 * kMin, 2 * kMin},
                                               {4 * kMin, 4 * kMin},
                                               {8 * kMin, 8 * kMin}}));
  auto y = a->Allocate(2 * kMin);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->offset, 2 * kMin);
  EXPECT_EQ(a->BlockSize(y->offset), 2 * kMin);
  EXPECT_EQ(a->BlockSize(kMin), 0u);  // free
  a->Free(x->offset);
  a->Free(y->offset);
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{0, 16 * kMin}}));
  const BuddyStats s = a->stats();
  EXPECT_EQ(s.allocations_by_order[0], 1u);
  EXPECT_EQ(s.allocations_by_order[1], 1u);
  EXPECT_EQ(s.live_blocks, 0u);
}

TEST(BuddyAllocatorTest, AllocateAtRelocateAndPins) {
  auto a = BuddyAllocator::Create(8 * kMin, kMin);
  ASSERT_TRUE(a.ok());
  auto x = a->AllocateAt(6 * kMin, 2 * kMin);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(*x, (Block{6 * kMin, 2 * kMin}));
  EXPECT_TRUE(absl::IsFailedPrecondition(a->AllocateAt(6 * kMin, kMin).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a->AllocateAt(kMin, 2 * kMin).status()));  // misaligned
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{0, 4 * kMin}, {4 * kMin, 2 * kMin}}));

  a->Pin(x->offset);
  a->Pin(x->offset);
  EXPECT_TRUE(a->IsPinned(x->offset));
  EXPECT_TRUE(absl::IsFailedPrecondition(a->Relocate(x->offset, 0)));
  a->Unpin(x->offset);
  EXPECT_TRUE(a->IsPinned(x->offset));  // counted
  a->Unpin(x->offset);
  EXPECT_FALSE(a->IsPinned(x->offset));
  EXPECT_TRUE(absl::IsFailedPrecondition(a->Relocate(x->offset, 6 * kMin)));  // not free
  EXPECT_TRUE(absl::IsInvalidArgument(a->Relocate(x->offset, kMin)));        // misaligned
  ASSERT_TRUE(a->Relocate(x->offset, 0).ok());
  EXPECT_EQ(a->BlockSize(0), 2 * kMin);
  EXPECT_EQ(a->BlockSize(6 * kMin), 0u);
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{2 * kMin, 2 * kMin}, {4 * kMin, 4 * kMin}}));
  EXPECT_EQ(a->stats().allocations_by_order[1], 1u);  // a move is not an allocation
  EXPECT_EQ(a->live_blocks(), 1u);
}

TEST(BuddyAllocatorTest, AllocateAtSplitsTheEnclosingFreeBlock) {
  auto a = BuddyAllocator::Create(16 * kMin, kMin);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->IsFreeBlock(5 * kMin, kMin));
  EXPECT_FALSE(a->IsFreeBlock(5 * kMin, 2 * kMin));  // misaligned for its rounded size
  ASSERT_TRUE(a->AllocateAt(5 * kMin, kMin).ok());
  // 16 splits into 8 + 8, 4 + 4, 2 + 2 and 1 + 1 around unit 5; the rest stays free.
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{0, 4 * kMin},
                                               {4 * kMin, kMin},
                                               {6 * kMin, 2 * kMin},
                                               {8 * kMin, 8 * kMin}}));
  EXPECT_FALSE(a->IsFreeBlock(5 * kMin, kMin));
  EXPECT_FALSE(a->IsFreeBlock(4 * kMin, 2 * kMin));  // holds the live block
  EXPECT_TRUE(a->IsFreeBlock(4 * kMin, kMin));       // its buddy
  EXPECT_TRUE(a->IsFreeBlock(8 * kMin, 5 * kMin));   // rounds to 8, wholly free
  EXPECT_FALSE(a->IsFreeBlock(0, 0));
  EXPECT_FALSE(a->IsFreeBlock(0, 17 * kMin));
  // Its buddy taken by AllocateAt too: freeing both merges back to one block.
  ASSERT_TRUE(a->AllocateAt(4 * kMin, kMin).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a->AllocateAt(4 * kMin, kMin).status()));
  EXPECT_EQ(a->stats().failed_allocations, 0u);  // not an exhaustion
  a->Free(5 * kMin);
  a->Free(4 * kMin);
  EXPECT_EQ(FreeBlocks(*a), (std::vector<Block>{{0, 16 * kMin}}));
  EXPECT_EQ(a->stats().allocations_by_order[0], 2u);
}

TEST(BuddyAllocatorTest, FreeingAnUnknownOffsetIsAProgrammerError) {
  auto a = BuddyAllocator::Create(8 * kMin, kMin);
  ASSERT_TRUE(a.ok());
  auto x = a->Allocate(2 * kMin);
  ASSERT_TRUE(x.ok());
#ifndef NDEBUG
  EXPECT_DEATH(a->Free(kMin), "Free: no live block starts at offset 65536");
  EXPECT_DEATH(a->Unpin(x->offset), "Unpin: no pinned block");
  a->Pin(x->offset);
  EXPECT_DEATH(a->Free(x->offset), "Free: the block is pinned");
#else
  a->Free(kMin);           // inside a live block, not its start
  a->Free(6 * kMin);       // free space
  a->Free(100 * kMin);     // outside the pool
  a->Unpin(x->offset);     // not pinned
  EXPECT_EQ(a->stats().invalid_operations, 4u);
  EXPECT_EQ(a->BlockSize(x->offset), 2 * kMin);  // untouched
  EXPECT_EQ(a->free_bytes(), 6 * kMin);
#endif
}

// --- Property test.

// Largest aligned power-of-two window (order <= max_order) wholly inside one free interval
// of the oracle's free space: what a fully merging buddy allocator must report.
uint64_t OracleLargestFree(const std::map<uint64_t, uint64_t>& live, uint64_t pool,
                           uint64_t min_block, int max_order) {
  uint64_t best = 0;
  auto consider = [&](uint64_t begin, uint64_t end) {
    for (int k = max_order; k >= 0; --k) {
      const uint64_t size = min_block << k;
      if (size <= best) break;
      const uint64_t start = (begin + size - 1) / size * size;
      if (start + size <= end) {
        best = size;
        break;
      }
    }
  };
  uint64_t cursor = 0;
  for (const auto& [offset, size] : live) {
    if (offset > cursor) consider(cursor, offset);
    cursor = offset + size;
  }
  if (pool > cursor) consider(cursor, pool);
  return best;
}

void CheckAgainstOracle(const BuddyAllocator& a, const std::map<uint64_t, uint64_t>& live) {
  const BuddyStats s = a.stats();
  uint64_t live_bytes = 0;
  std::vector<uint64_t> by_order(static_cast<size_t>(a.max_order()) + 1, 0);
  for (const auto& [offset, size] : live) {
    live_bytes += size;
    ++by_order[static_cast<size_t>(std::countr_zero(size / a.min_block_bytes()))];
  }
  ASSERT_EQ(s.free_bytes, a.pool_bytes() - live_bytes);
  ASSERT_EQ(s.live_bytes, live_bytes);
  ASSERT_EQ(s.live_blocks, live.size());
  ASSERT_EQ(s.live_blocks_by_order, by_order);
  const uint64_t largest =
      OracleLargestFree(live, a.pool_bytes(), a.min_block_bytes(), a.max_order());
  ASSERT_EQ(s.largest_free_block, largest);
  const double fragmentation =
      s.free_bytes == 0 ? 0.0
                        : 1.0 - static_cast<double>(largest) / static_cast<double>(s.free_bytes);
  ASSERT_DOUBLE_EQ(s.fragmentation, fragmentation);
  // The free lists hold exactly the complement of the live blocks.
  uint64_t free_sum = 0;
  std::vector<Block> free_blocks = FreeBlocks(a);
  for (const Block& b : free_blocks) {
    ASSERT_EQ(b.offset % b.size, 0u);
    ASSERT_LE(b.offset + b.size, a.pool_bytes());
    auto next = live.lower_bound(b.offset);
    if (next != live.end()) {
      ASSERT_GE(next->first, b.offset + b.size);
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second, b.offset);
    }
    free_sum += b.size;
  }
  ASSERT_EQ(free_sum, s.free_bytes);
}

struct PropertyCase {
  uint64_t pool_bytes;
  uint64_t seed;
};

class BuddyAllocatorPropertyTest : public ::testing::TestWithParam<PropertyCase> {};

TEST_P(BuddyAllocatorPropertyTest, RandomSequencesMatchOracle) {
  const PropertyCase c = GetParam();
  auto created = BuddyAllocator::Create(c.pool_bytes, kMin);
  ASSERT_TRUE(created.ok());
  BuddyAllocator& a = *created;
  const std::vector<Block> initial = FreeBlocks(a);
  std::mt19937_64 rng(c.seed);
  std::map<uint64_t, uint64_t> live;  // offset -> size
  // Sizes log-uniform from 1 byte to a quarter of the pool, so every order is exercised.
  std::uniform_real_distribution<double> log_size(
      0.0, std::log2(static_cast<double>(c.pool_bytes) / 4.0));
  std::uniform_int_distribution<int> op(0, 99);
  auto random_live = [&]() {
    auto it = live.begin();
    std::advance(it, static_cast<long>(rng() % live.size()));
    return it;
  };
  uint64_t failures = 0;
  uint64_t placed = 0, not_placed = 0;  // AllocateAt outcomes
  for (int step = 0; step < 4000; ++step) {
    const int kind = op(rng);
    if (kind >= 45 && kind < 55) {
      // AllocateAt (and IsFreeBlock) of a random aligned block: succeeds exactly when the
      // oracle has the range wholly free, and then splits the enclosing free block.
      const int order = static_cast<int>(rng() % static_cast<uint64_t>(a.max_order() + 1));
      const uint64_t size = a.OrderBytes(order);
      const uint64_t offset = rng() % (a.pool_bytes() / size) * size;
      const uint64_t bytes = order == 0 ? 1 + rng() % size : size / 2 + 1 + rng() % (size / 2);
      bool oracle_free = true;
      auto next = live.lower_bound(offset);
      if (next != live.end() && next->first < offset + size) oracle_free = false;
      if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > offset) {
        oracle_free = false;
      }
      ASSERT_EQ(a.IsFreeBlock(offset, bytes), oracle_free) << offset << " " << size;
      // Misaligned or past the pool: never free, InvalidArgument, nothing changes.
      if (order > 0) {
        ASSERT_FALSE(a.IsFreeBlock(offset + kMin, bytes));
        ASSERT_TRUE(absl::IsInvalidArgument(a.AllocateAt(offset + kMin, bytes).status()));
      }
      ASSERT_FALSE(a.IsFreeBlock(a.pool_bytes(), bytes));
      ASSERT_TRUE(absl::IsInvalidArgument(a.AllocateAt(a.pool_bytes(), bytes).status()));
      auto block = a.AllocateAt(offset, bytes);
      if (oracle_free) {
        ASSERT_TRUE(block.ok()) << block.status();
        ASSERT_EQ(*block, (Block{offset, size}));
        live[offset] = size;
        ++placed;
      } else {
        ASSERT_TRUE(absl::IsFailedPrecondition(block.status())) << block.status();
        ++not_placed;
      }
    } else if (kind < 55 || live.empty()) {
      const auto bytes = std::max<uint64_t>(1, static_cast<uint64_t>(std::exp2(log_size(rng))));
      const uint64_t oracle_largest =
          OracleLargestFree(live, a.pool_bytes(), a.min_block_bytes(), a.max_order());
      auto block = a.Allocate(bytes);
      if (!block.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(block.status())) << block.status();
        ASSERT_LT(oracle_largest, a.RoundUp(bytes));  // fails only when nothing fits
        ++failures;
      } else {
        ASSERT_GE(oracle_largest, block->size);
        ASSERT_EQ(block->size, a.RoundUp(bytes));
        ASSERT_GE(block->size, bytes);
        ASSERT_EQ(block->offset % block->size, 0u);
        ASSERT_LE(block->offset + block->size, a.pool_bytes());
        auto next = live.lower_bound(block->offset);
        if (next != live.end()) {
          ASSERT_GE(next->first, block->offset + block->size);
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second, block->offset);
        }
        live[block->offset] = block->size;
      }
    } else if (kind < 92) {
      auto it = random_live();
      ASSERT_EQ(a.BlockSize(it->first), it->second);
      a.Free(it->first);
      live.erase(it);
    } else {
      // Move a random live block to the lowest free place that holds it (if any).
      auto it = random_live();
      std::optional<uint64_t> to;
      a.ForEachFreeBlock(std::countr_zero(it->second / kMin), [&](const Block& b) {
        if (!to || b.offset < *to) to = b.offset;
      });
      if (!to) continue;
      ASSERT_TRUE(a.Relocate(it->first, *to).ok());
      const uint64_t size = it->second;
      live.erase(it);
      live[*to] = size;
    }
    ASSERT_NO_FATAL_FAILURE(CheckAgainstOracle(a, live)) << "step " << step;
  }
  std::vector<Block> oracle_live;
  for (const auto& [offset, size] : live) oracle_live.push_back(Block{offset, size});
  EXPECT_EQ(LiveBlocks(a), oracle_live);
  EXPECT_GT(failures, 0u);  // the sequence did reach exhaustion
  EXPECT_GT(placed, 0u);    // and AllocateAt both succeeded and was refused
  EXPECT_GT(not_placed, 0u);
  EXPECT_EQ(a.stats().failed_allocations, failures);
  // Everything freed merges back to the original blocks.
  for (const auto& [offset, size] : live) a.Free(offset);
  EXPECT_EQ(FreeBlocks(a), initial);
  EXPECT_EQ(a.free_bytes(), a.pool_bytes());
  EXPECT_EQ(a.live_blocks(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, BuddyAllocatorPropertyTest,
                         ::testing::Values(PropertyCase{256 * kMin, 1}, PropertyCase{256 * kMin, 2},
                                           PropertyCase{1024 * kMin, 3},
                                           PropertyCase{1000 * kMin, 4},  // not a power of two
                                           PropertyCase{777 * kMin + 12345, 5},
                                           PropertyCase{4096 * kMin, 6}));

}  // namespace
}  // namespace moert::memory
