// TieredPool: commit on use and give-back on free (counters, and the kernel's view through
// mincore), budget errors per tier, the activation ring's lifetimes, and expert moves.
#include "memory/tiered_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "telemetry/metrics.h"

namespace moert::memory {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// The machine's page size (4 KiB on most x86 machines, 16 KiB on recent Android).
const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

uint64_t RoundUpToPage(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// Pages of [p, p + bytes) that the kernel reports resident.
uint64_t ResidentPages(const void* p, uint64_t bytes) {
  const uint64_t page = kPage;
  const auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{page - 1};
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> vec((end - begin + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return ~uint64_t{0};
  uint64_t resident = 0;
  for (unsigned char v : vec) resident += v & 1u;
  return resident;
}

// Residency as mincore reports it, where it can: qemu-user refuses mincore on
// PROT_NONE ranges (pages given back), and there the check is left out; the
// committed counters are still checked.
#define EXPECT_RESIDENT(p, bytes, n)                                \
  if (const uint64_t resident = ResidentPages(p, bytes);            \
      resident == ~uint64_t{0}) {                                   \
  } else                                                            \
    EXPECT_EQ(resident, n)

std::unique_ptr<TieredPool> MakePool(uint64_t persistent, uint64_t expert, uint64_t activation) {
  TieredPoolOptions options;
  options.persistent_bytes = persistent;
  options.expert_bytes = expert;
  options.activation_bytes = activation;
  auto pool = TieredPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(TieredPoolTest, RejectsBadExpertGeometry) {
  TieredPoolOptions options;
  options.expert_bytes = 1 * kMiB;
  options.expert_min_block = 2 * kMiB;  // bigger than the pool
  auto pool = TieredPool::Create(options);
  ASSERT_TRUE(absl::IsInvalidArgument(pool.status()));
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("expert pool"));
  options.expert_min_block = 1024;  // below a page
  EXPECT_TRUE(absl::IsInvalidArgument(TieredPool::Create(options).status()));
}

TEST(TieredPoolTest, ReservesWithoutCommitting) {
  auto pool = MakePool(8 * kMiB, 64 * kMiB, 16 * kMiB);
  ASSERT_NE(pool, nullptr);
  for (Tier tier : {Tier::kPersistent, Tier::kExpert, Tier::kActivation}) {
    EXPECT_EQ(pool->stats(tier).committed, 0u) << TierName(tier);
    EXPECT_EQ(pool->stats(tier).used, 0u) << TierName(tier);
  }
  EXPECT_EQ(pool->stats(Tier::kPersistent).reserved, 8 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).reserved, 64 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kActivation).reserved, 16 * kMiB);
  // Expert blocks are aligned in memory to the minimum block.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->ExpertData(0)) % (64 * kKiB), 0u);
}

// FreeExpert(keep_pages): the block's pages stay committed and resident, and the next
// allocation of exactly that block takes them with the old bytes; what is not reused
// goes back with ReleaseWarmExperts, or when an allocation overlaps it.
TEST(TieredPoolTest, WarmExpertBlocksAreReusedInPlace) {
  auto pool = MakePool(0, 16 * kMiB, 0);
  ASSERT_NE(pool, nullptr);
  auto block = pool->AllocateExpert(4 * kMiB);
  ASSERT_TRUE(block.ok()) << block.status();
  uint8_t* data = pool->ExpertData(block->offset);
  std::memset(data, 0xab, block->size);
  pool->FreeExpert(block->offset, /*keep_pages=*/true);
  EXPECT_EQ(pool->stats(Tier::kExpert).used, 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 4 * kMiB);  // still there
  EXPECT_EQ(pool->warm_expert_bytes(), 4 * kMiB);
  EXPECT_RESIDENT(data, block->size, block->size / kPage);
  auto again = pool->AllocateExpert(4 * kMiB);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->offset, block->offset);
  EXPECT_EQ(pool->warm_expert_bytes(), 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 4 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).used, 4 * kMiB);
  EXPECT_EQ(data[0], 0xab);  // the freed block's bytes, not fresh zeros
  EXPECT_EQ(data[4 * kMiB - 1], 0xab);
  EXPECT_RESIDENT(data, block->size, block->size / kPage);

  // Not reused: given back.
  pool->FreeExpert(again->offset, /*keep_pages=*/true);
  pool->ReleaseWarmExperts();
  EXPECT_EQ(pool->warm_expert_bytes(), 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 0u);
  EXPECT_RESIDENT(data, 4 * kMiB, 0u);

  // Two warm 4 MiB buddies under one 8 MiB block: given back, then committed afresh.
  auto a = pool->AllocateExpert(4 * kMiB);
  auto b = pool->AllocateExpert(4 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(pool->ExpertData(a->offset), 0xcd, 4 * kMiB);
  std::memset(pool->ExpertData(b->offset), 0xcd, 4 * kMiB);
  pool->FreeExpert(a->offset, /*keep_pages=*/true);
  pool->FreeExpert(b->offset, /*keep_pages=*/true);
  auto big = pool->AllocateExpert(8 * kMiB);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(pool->warm_expert_bytes(), 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 8 * kMiB);
  EXPECT_EQ(pool->ExpertData(big->offset)[0], 0);  // fresh pages
  EXPECT_EQ(pool->ExpertData(big->offset)[8 * kMiB - 1], 0);
  pool->FreeExpert(big->offset);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 0u);
}

TEST(TieredPoolTest, ExpertCommitAndGiveBackAreObservable) {
  auto pool = MakePool(0, 16 * kMiB, 0);
  ASSERT_NE(pool, nullptr);
  // 3 MiB and one byte: a 4 MiB block, of which the pages of the bytes asked for are
  // committed and charged.
  const uint64_t bytes = 3 * kMiB + 1;
  const uint64_t pages = 3 * kMiB + kPage;
  auto block = pool->AllocateExpert(bytes);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->size, 4 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, pages);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, pages);
  EXPECT_EQ(pool->stats(Tier::kExpert).used, 4 * kMiB);
  uint8_t* data = pool->ExpertData(block->offset);
  EXPECT_RESIDENT(data, pages, 0u);  // committed, not yet touched
  std::memset(data, 0xab, pages);
  EXPECT_RESIDENT(data, pages, pages / kPage);
  const uint64_t offset = block->offset;
  pool->FreeExpert(offset);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).used, 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).peak_committed, pages);
  EXPECT_RESIDENT(data, 4 * kMiB, 0u);  // given back
  // The same range again reads as fresh zeros.
  auto again = pool->AllocateExpert(4 * kMiB);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->offset, offset);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 4 * kMiB);
  EXPECT_EQ(data[0], 0);
  EXPECT_EQ(data[4 * kMiB - 1], 0);
}

// A warm block reused by a smaller or a larger expert commits or gives back the
// difference, and a move copies and commits only the committed bytes.
TEST(TieredPoolTest, WarmReuseAndMovesKeepToTheBytesAskedFor) {
  auto pool = MakePool(0, 16 * kMiB, 0);
  ASSERT_NE(pool, nullptr);
  auto block = pool->AllocateExpert(3 * kMiB);
  ASSERT_TRUE(block.ok()) << block.status();
  std::memset(pool->ExpertData(block->offset), 0x5a, 3 * kMiB);
  pool->FreeExpert(block->offset, /*keep_pages=*/true);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 0u);
  EXPECT_EQ(pool->warm_expert_bytes(), 3 * kMiB);
  auto smaller = pool->AllocateExpert(2 * kMiB + kPage);
  ASSERT_TRUE(smaller.ok());
  ASSERT_EQ(smaller->offset, block->offset);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 2 * kMiB + kPage);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 2 * kMiB + kPage);
  EXPECT_EQ(pool->ExpertData(smaller->offset)[2 * kMiB], 0x5a);  // kept, not fresh
  pool->FreeExpert(smaller->offset, /*keep_pages=*/true);
  auto larger = pool->AllocateExpert(4 * kMiB);
  ASSERT_TRUE(larger.ok());
  ASSERT_EQ(larger->offset, block->offset);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 4 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 4 * kMiB);
  EXPECT_EQ(pool->ExpertData(larger->offset)[0], 0x5a);
  EXPECT_EQ(pool->ExpertData(larger->offset)[4 * kMiB - 1], 0);  // a page committed afresh
  pool->FreeExpert(larger->offset);
  ASSERT_EQ(pool->stats(Tier::kExpert).committed, 0u);

  // A move: the committed bytes travel, the rest of the destination stays uncommitted.
  auto a = pool->AllocateExpert(3 * kMiB);
  ASSERT_TRUE(a.ok());
  std::memset(pool->ExpertData(a->offset), 0x77, 3 * kMiB);
  const uint64_t to = a->offset == 0 ? 8 * kMiB : 0;
  ASSERT_TRUE(pool->MoveExpert(a->offset, to).ok());
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 3 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 3 * kMiB);
  EXPECT_EQ(pool->ExpertData(to)[0], 0x77);
  EXPECT_EQ(pool->ExpertData(to)[3 * kMiB - 1], 0x77);
  EXPECT_RESIDENT(pool->ExpertData(to), 3 * kMiB, 3 * kMiB / kPage);
  EXPECT_RESIDENT(pool->ExpertData(a->offset), 4 * kMiB, 0u);
  pool->FreeExpert(to);
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 0u);
  EXPECT_EQ(pool->stats(Tier::kExpert).charged, 0u);
}

TEST(TieredPoolTest, ExpertBudgetErrorNamesTierRequestAndFree) {
  auto pool = MakePool(0, 8 * kMiB, 0);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->AllocateExpert(4 * kMiB).ok());
  ASSERT_TRUE(pool->AllocateExpert(2 * kMiB).ok());
  auto failed = pool->AllocateExpert(3 * kMiB);
  ASSERT_TRUE(absl::IsResourceExhausted(failed.status()));
  const std::string message(failed.status().message());
  EXPECT_THAT(message, HasSubstr("expert pool"));
  EXPECT_THAT(message, HasSubstr(std::to_string(3 * kMiB) + " bytes"));
  EXPECT_THAT(message, HasSubstr(std::to_string(2 * kMiB) + " bytes free"));
  EXPECT_TRUE(absl::IsInvalidArgument(pool->AllocateExpert(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(pool->AllocateExpert(9 * kMiB).status()));
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 6 * kMiB);
}

TEST(TieredPoolTest, PersistentArenaBumpsAndCommitsPages) {
  auto pool = MakePool(1 * kMiB, 64 * kKiB, 0);
  ASSERT_NE(pool, nullptr);
  auto a = pool->AllocatePersistent(100);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 64, 0u);
  EXPECT_EQ(pool->stats(Tier::kPersistent).committed, kPage);
  auto b = pool->AllocatePersistent(10000, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 4096, 0u);
  EXPECT_EQ(*b, *a + 4096);
  EXPECT_EQ(pool->stats(Tier::kPersistent).used, 4096u + 10000u);
  EXPECT_EQ(pool->stats(Tier::kPersistent).committed, RoundUpToPage(4096u + 10000u));
  std::memset(*b, 1, 10000);  // writable
  EXPECT_TRUE(pool->Contains(Tier::kPersistent, *b, 10000));
  auto failed = pool->AllocatePersistent(1 * kMiB);
  ASSERT_TRUE(absl::IsResourceExhausted(failed.status()));
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("persistent arena"));
  EXPECT_THAT(std::string(failed.status().message()),
              HasSubstr(std::to_string(1 * kMiB - 14096) + " of " + std::to_string(1 * kMiB)));
  EXPECT_TRUE(absl::IsInvalidArgument(pool->AllocatePersistent(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(pool->AllocatePersistent(8, 3).status()));
}

TEST(TieredPoolTest, UsedBytesOfEveryTierAreGaugesOfTheRegistry) {
  TieredPoolOptions options;
  options.persistent_bytes = 1 * kMiB;
  options.expert_bytes = 256 * kKiB;
  options.activation_bytes = 64 * kKiB;
  options.metrics = std::make_shared<telemetry::Registry>();
  auto created = TieredPool::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  TieredPool& pool = **created;
  const telemetry::Registry& registry = *options.metrics;
  const auto used = [&](const char* tier) { return registry.Read("moert_pool_used_bytes", {tier}); };
  ASSERT_TRUE(pool.AllocatePersistent(100).ok());
  EXPECT_EQ(used("persistent"), 100);
  auto a = pool.AllocateExpert(64 * kKiB);
  auto b = pool.AllocateExpert(64 * kKiB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(used("expert"), static_cast<double>(128 * kKiB));
  // Freeing the first block leaves 64 KiB and 128 KiB free apart: a third fragmented.
  pool.FreeExpert(a->offset);
  EXPECT_EQ(used("expert"), static_cast<double>(64 * kKiB));
  EXPECT_EQ(registry.Read("moert_pool_fragmentation_ratio", {"expert"}), 1.0 - 2.0 / 3.0);
  ASSERT_TRUE(pool.AllocateActivation(16 * kKiB, 0).ok());
  EXPECT_EQ(used("activation"), static_cast<double>(pool.stats(Tier::kActivation).used));
  EXPECT_GE(used("activation"), static_cast<double>(16 * kKiB));
  pool.ResetActivations();
  EXPECT_EQ(used("activation"), 0);
}

TEST(TieredPoolTest, ActivationRingReleasesByLifetimeInOrder) {
  auto pool = MakePool(0, 64 * kKiB, 64 * kKiB);  // a 16-page ring
  ASSERT_NE(pool, nullptr);
  const TierStats empty = pool->stats(Tier::kActivation);
  EXPECT_EQ(empty.committed, 0u);
  // Layer scratch: 3 layers of step 0, 4 pages each.
  std::vector<uint8_t*> scratch;
  for (uint64_t layer = 0; layer < 3; ++layer) {
    auto p = pool->AllocateActivation(16 * kKiB, layer);
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(*p, static_cast<int>(layer + 1), 16 * kKiB);
    scratch.push_back(*p);
  }
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 48 * kKiB);
  EXPECT_EQ(pool->stats(Tier::kActivation).used, 48 * kKiB);
  EXPECT_RESIDENT(scratch[0], 48 * kKiB, 12u);
  // A lifetime older than the newest live one is refused.
  EXPECT_TRUE(absl::IsInvalidArgument(pool->AllocateActivation(64, 1).status()));
  // 32 KiB do not fit (16 KiB left at the end, nothing below the oldest entry).
  auto full = pool->AllocateActivation(32 * kKiB, 3);
  ASSERT_TRUE(absl::IsResourceExhausted(full.status()));
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("activation tier"));
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("oldest live lifetime 0"));

  // Release layers 0 and 1: their pages go back, layer 2 keeps its bytes.
  pool->ReleaseActivations(1);
  EXPECT_EQ(pool->live_activations(), 1u);
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 16 * kKiB);
  EXPECT_RESIDENT(scratch[0], 32 * kKiB, 0u);
  EXPECT_EQ(scratch[2][0], 3);
  EXPECT_EQ(scratch[2][16 * kKiB - 1], 3);

  // 24 KiB do not fit at the end (16 KiB), so the ring wraps to its bottom.
  auto wrapped = pool->AllocateActivation(24 * kKiB, 3);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_EQ(*wrapped, scratch[0]);
  EXPECT_EQ((*wrapped)[0], 0);  // fresh pages
  // The skipped 16 KiB at the end count as used until the wrapping entry is released.
  EXPECT_EQ(pool->stats(Tier::kActivation).used, 16 * kKiB + 16 * kKiB + 24 * kKiB);
  auto next = pool->AllocateActivation(8 * kKiB, 3);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, scratch[0] + 24 * kKiB);
  EXPECT_TRUE(absl::IsResourceExhausted(pool->AllocateActivation(1, 4).status()));  // full
  pool->ReleaseActivations(2);
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 32 * kKiB);
  // The skipped end stays used until the wrapping entry goes.
  EXPECT_EQ(pool->stats(Tier::kActivation).used, 16 * kKiB + 24 * kKiB + 8 * kKiB);
  pool->ReleaseActivations(3);
  EXPECT_EQ(pool->live_activations(), 0u);
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 0u);
  EXPECT_EQ(pool->stats(Tier::kActivation).used, 0u);
  EXPECT_EQ(pool->stats(Tier::kActivation).peak_used, 64 * kKiB);
  // After emptying, any lifetime may start again.
  EXPECT_TRUE(pool->AllocateActivation(64, 0).ok());
}

TEST(TieredPoolTest, StaticActivationsSitBelowTheRing) {
  auto pool = MakePool(0, 64 * kKiB, 64 * kKiB);
  ASSERT_NE(pool, nullptr);
  auto kv = pool->AllocateActivationStatic(20 * kKiB);
  ASSERT_TRUE(kv.ok());
  std::memset(*kv, 7, 20 * kKiB);
  auto s = pool->AllocateActivation(40 * kKiB, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_GE(*s, *kv + 20 * kKiB);
  EXPECT_TRUE(absl::IsFailedPrecondition(pool->AllocateActivationStatic(64).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(pool->AllocateActivation(8 * kKiB, 1).status()));
  pool->ReleaseActivations(0);
  EXPECT_EQ((*kv)[20 * kKiB - 1], 7);  // the KV cache survives ring releases
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 20 * kKiB);
  pool->ResetActivations();
  EXPECT_EQ(pool->stats(Tier::kActivation).committed, 0u);
  EXPECT_EQ(pool->stats(Tier::kActivation).used, 0u);
  EXPECT_RESIDENT(*kv, 20 * kKiB, 0u);
}

TEST(TieredPoolTest, MoveExpertKeepsBytesAndRefusesPinnedBlocks) {
  auto pool = MakePool(0, 4 * kMiB, 0);
  ASSERT_NE(pool, nullptr);
  auto a = pool->AllocateExpert(1 * kMiB);
  auto b = pool->AllocateExpert(1 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint64_t i = 0; i < 1 * kMiB; ++i) {
    pool->ExpertData(b->offset)[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  pool->PinExpert(b->offset);
  EXPECT_TRUE(absl::IsFailedPrecondition(pool->MoveExpert(b->offset, 2 * kMiB)));
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 2 * kMiB);
  pool->UnpinExpert(b->offset);
  EXPECT_TRUE(absl::IsFailedPrecondition(pool->MoveExpert(b->offset, a->offset)));  // live
  ASSERT_TRUE(pool->MoveExpert(b->offset, 3 * kMiB).ok());
  const uint8_t* moved = pool->ExpertData(3 * kMiB);
  for (uint64_t i = 0; i < 1 * kMiB; ++i) {
    ASSERT_EQ(moved[i], static_cast<uint8_t>(i * 131 + 7)) << i;
  }
  EXPECT_EQ(pool->stats(Tier::kExpert).committed, 2 * kMiB);
  EXPECT_EQ(pool->stats(Tier::kExpert).used, 2 * kMiB);
  EXPECT_RESIDENT(pool->ExpertData(b->offset), 1 * kMiB, 0u);  // old range given back
  EXPECT_EQ(pool->expert_allocator().BlockSize(3 * kMiB), 1 * kMiB);
}

}  // namespace
}  // namespace moert::memory
