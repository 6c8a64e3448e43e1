// The memory budget's ledger: KV reservations inside the budget, refusals naming the
// numbers, the pool giving bytes to KV caches down to its floor (shrink_pool) and
// getting them back, Trim's cap, and reservations from many threads at once.
#include "memory/budget.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace moert::memory {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

BudgetOptions Options(bool shrink) {
  BudgetOptions o;
  o.budget_bytes = 100 * kMiB;
  o.fixed_bytes = 30 * kMiB;
  o.pool_bytes = 40 * kMiB;
  o.pool_floor_bytes = 10 * kMiB;
  o.pool_granule = kMiB;
  o.shrink_pool = shrink;
  return o;
}

TEST(MemoryBudget, ReservationsStayInsideTheBudgetAndRefusalsNameTheNumbers) {
  MemoryBudget budget(Options(false));
  EXPECT_TRUE(budget.ReserveKv(20 * kMiB, "session 1").ok());
  EXPECT_TRUE(budget.ReserveKv(10 * kMiB, "session 2").ok());  // exactly full
  const absl::Status refused = budget.ReserveKv(1, "a KV cache of 1 positions");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(refused.message());
  EXPECT_NE(m.find("a KV cache of 1 positions needs 1 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("budget of 104857600 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("31457280 bytes of 2 KV cache(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("an expert pool of 41943040 bytes: 0 bytes free"), std::string::npos) << m;
  EXPECT_NE(m.find("would make room"), std::string::npos) << m;
  BudgetStats s = budget.stats();
  EXPECT_EQ(s.kv_bytes, 30 * kMiB);
  EXPECT_EQ(s.kv_caches, 2u);
  EXPECT_EQ(s.kv_refused, 1u);
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(budget.pool_target(), 40 * kMiB);  // never shrunk without shrink_pool
  budget.ReleaseKv(10 * kMiB);
  EXPECT_TRUE(budget.ReserveKv(10 * kMiB, "again").ok());
}

TEST(MemoryBudget, ShrinkPoolTakesFromThePoolDownToTheFloorAndGivesItBack) {
  MemoryBudget budget(Options(true));
  ASSERT_TRUE(budget.ReserveKv(30 * kMiB, "a").ok());
  EXPECT_EQ(budget.pool_target(), 40 * kMiB);
  ASSERT_TRUE(budget.ReserveKv(20 * kMiB + 5, "b").ok());  // 20 MiB + 5 from the pool
  EXPECT_EQ(budget.pool_target(), 19 * kMiB);              // rounded down to the granule
  EXPECT_EQ(budget.stats().pool_shrinks, 1u);
  const absl::Status refused = budget.ReserveKv(10 * kMiB, "c");  // below the floor
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("10485760 bytes (its floor)"), std::string::npos) << refused;
  ASSERT_TRUE(budget.ReserveKv(10 * kMiB - 5, "d").ok());  // exactly to the floor
  EXPECT_EQ(budget.pool_target(), 10 * kMiB);
  budget.ReleaseKv(10 * kMiB - 5);
  budget.ReleaseKv(20 * kMiB + 5);
  EXPECT_EQ(budget.pool_target(), 40 * kMiB);  // grown back to its load size
}

TEST(MemoryBudget, TrimCapsThePoolAboveTheFloor) {
  MemoryBudget budget(Options(false));
  budget.Trim(0.5);
  EXPECT_EQ(budget.pool_target(), 20 * kMiB);
  EXPECT_DOUBLE_EQ(budget.stats().trim_fraction, 0.5);
  budget.Trim(0);
  EXPECT_EQ(budget.pool_target(), 10 * kMiB);  // the floor
  budget.Trim(1);
  EXPECT_EQ(budget.pool_target(), 40 * kMiB);
  budget.Trim(-3);  // clamped
  EXPECT_EQ(budget.pool_target(), 10 * kMiB);
}

TEST(MemoryBudget, NoBudgetCountsButNeverRefuses) {
  BudgetOptions o;
  o.pool_bytes = 8 * kMiB;
  o.pool_floor_bytes = 2 * kMiB;
  MemoryBudget budget(o);
  EXPECT_FALSE(budget.has_budget());
  EXPECT_TRUE(budget.ReserveKv(uint64_t{1} << 40, "huge").ok());
  EXPECT_EQ(budget.stats().kv_bytes, uint64_t{1} << 40);
  EXPECT_EQ(budget.pool_target(), 8 * kMiB);
}

TEST(MemoryBudget, ConcurrentReservationsNeverPassTheBudget) {
  MemoryBudget budget(Options(false));  // 30 MiB for KV caches
  std::vector<std::thread> threads;
  std::vector<int> granted(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        if (budget.ReserveKv(kMiB, "thread").ok()) {
          ++granted[static_cast<size_t>(t)];
          if (i % 2 == 0) {
            budget.ReleaseKv(kMiB);
            --granted[static_cast<size_t>(t)];
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int total = 0;
  for (int g : granted) total += g;
  EXPECT_EQ(budget.stats().kv_bytes, static_cast<uint64_t>(total) * kMiB);
  EXPECT_LE(budget.stats().kv_bytes, 30 * kMiB);
  EXPECT_EQ(total, 30);  // 400 keeps wanted, 30 fit
}

}  // namespace
}  // namespace moert::memory
