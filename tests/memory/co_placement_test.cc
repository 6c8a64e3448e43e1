// Co-placement: co-use counts and partners, the buddy of a partner block, and the point of it
// all: a pair placed as buddies merges into the next order when both are freed.
#include "memory/co_placement.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace moert::memory {
namespace {

constexpr uint64_t kMin = 64 * 1024;

void AddGroupTimes(CoUseCounts& counts, std::vector<int> group, int times) {
  for (int i = 0; i < times; ++i) counts.AddGroup(group);
}

TEST(CoUseCountsTest, CountsGroupsAndPairs) {
  CoUseCounts counts(8);
  AddGroupTimes(counts, {3, 5}, 4);
  counts.AddGroup(std::vector<int>{3, 1, 6});
  counts.AddGroup(std::vector<int>{2});
  counts.AddGroup(std::vector<int>{});
  EXPECT_EQ(counts.uses(3), 5u);
  EXPECT_EQ(counts.uses(5), 4u);
  EXPECT_EQ(counts.uses(2), 1u);
  EXPECT_EQ(counts.uses(0), 0u);
  EXPECT_EQ(counts.co_uses(3, 5), 4u);
  EXPECT_EQ(counts.co_uses(5, 3), 4u);
  EXPECT_EQ(counts.co_uses(1, 6), 1u);
  EXPECT_EQ(counts.co_uses(2, 3), 0u);
  EXPECT_EQ(counts.Partners(3), std::vector<int>{5});
  EXPECT_EQ(counts.Partners(5), std::vector<int>{3});
  EXPECT_TRUE(counts.Partners(1).empty());  // one co-use is below min_co_uses
  EXPECT_TRUE(counts.Partners(0).empty());
}

TEST(CoUseCountsTest, PartnersNeedTheFractionAndAreSortedByCoUse) {
  CoUseOptions options;
  options.min_co_uses = 2;
  options.min_fraction = 0.5;
  CoUseCounts counts(6, options);
  // 0 is used 10 times: with 1 in 6 groups, 2 in 5, 3 in 4 (below half of 10).
  AddGroupTimes(counts, {0, 1, 2}, 5);
  AddGroupTimes(counts, {0, 1, 3}, 1);
  AddGroupTimes(counts, {0, 3}, 3);
  AddGroupTimes(counts, {0, 4}, 1);
  EXPECT_EQ(counts.uses(0), 10u);
  EXPECT_EQ(counts.Partners(0), (std::vector<int>{1, 2}));
  // From 3's side, 0 is in every one of its 4 groups.
  EXPECT_EQ(counts.Partners(3), (std::vector<int>{0}));
  // Ties go to the lower item.
  EXPECT_EQ(counts.Partners(2), (std::vector<int>{0, 1}));
}

TEST(CoUseCountsTest, LargeGroupsAreIgnored) {
  CoUseOptions options;
  options.max_group = 3;
  CoUseCounts counts(8, options);
  AddGroupTimes(counts, {0, 1, 2, 3}, 10);
  EXPECT_EQ(counts.uses(0), 0u);
  EXPECT_EQ(counts.co_uses(0, 1), 0u);
  AddGroupTimes(counts, {0, 1, 2}, 4);
  EXPECT_EQ(counts.co_uses(0, 1), 4u);
}

TEST(CoUseCountsTest, CountsHalveSoOldCoUseFades) {
  CoUseOptions options;
  options.halve_at = 8;
  options.min_co_uses = 2;
  CoUseCounts counts(4, options);
  AddGroupTimes(counts, {0, 1}, 7);
  EXPECT_EQ(counts.uses(0), 7u);
  EXPECT_EQ(counts.co_uses(0, 1), 7u);
  counts.AddGroup(std::vector<int>{0, 2});  // 0 reaches 8: everything halves
  EXPECT_EQ(counts.uses(0), 4u);
  EXPECT_EQ(counts.uses(1), 3u);
  EXPECT_EQ(counts.co_uses(0, 1), 3u);
  EXPECT_EQ(counts.co_uses(0, 2), 0u);
  EXPECT_EQ(counts.Partners(0), std::vector<int>{1});
  // The routing drifts: 0 now goes with 2. At 8 uses of 0 the counts halve again (0: 4,
  // with 1: 1, with 2: 2), and 1 is no longer its partner.
  AddGroupTimes(counts, {0, 2}, 4);
  EXPECT_EQ(counts.uses(0), 4u);
  EXPECT_EQ(counts.co_uses(0, 2), 2u);
  EXPECT_EQ(counts.Partners(0), std::vector<int>{2});
}

TEST(BuddyOfPartnerTest, TheFreeBuddyOfABlockOfTheSameOrder) {
  auto created = BuddyAllocator::Create(16 * kMin, kMin);
  ASSERT_TRUE(created.ok());
  BuddyAllocator& a = *created;
  ASSERT_TRUE(a.AllocateAt(0, 2 * kMin).ok());     // order 1 at 0: buddy at 2 is free
  ASSERT_TRUE(a.AllocateAt(4 * kMin, kMin).ok());  // order 0 at 4: buddy at 5 is free
  ASSERT_TRUE(a.AllocateAt(6 * kMin, kMin).ok());  // order 0 at 6 ...
  ASSERT_TRUE(a.AllocateAt(7 * kMin, kMin).ok());  // ... whose buddy is taken
  const std::vector<uint64_t> all = {0, 4 * kMin, 6 * kMin, 7 * kMin};
  // Order 0: 0 is of order 1 (skipped), 4's buddy is free.
  EXPECT_EQ(BuddyOfPartner(a, kMin, all), std::optional<uint64_t>(5 * kMin));
  EXPECT_EQ(BuddyOfPartner(a, 1000, all), std::optional<uint64_t>(5 * kMin));  // rounds up
  // The first partner in the list wins; a taken buddy is skipped.
  const std::vector<uint64_t> taken_first = {6 * kMin, 4 * kMin};
  EXPECT_EQ(BuddyOfPartner(a, kMin, taken_first), std::optional<uint64_t>(5 * kMin));
  EXPECT_EQ(BuddyOfPartner(a, kMin, std::vector<uint64_t>{6 * kMin}), std::nullopt);
  // Order 1: only the block at 0 has it.
  EXPECT_EQ(BuddyOfPartner(a, 2 * kMin, all), std::optional<uint64_t>(2 * kMin));
  // Order 2: no partner of that order; a free offset or a bad size is no partner either.
  EXPECT_EQ(BuddyOfPartner(a, 4 * kMin, all), std::nullopt);
  EXPECT_EQ(BuddyOfPartner(a, kMin, std::vector<uint64_t>{12 * kMin}), std::nullopt);
  EXPECT_EQ(BuddyOfPartner(a, 0, all), std::nullopt);
  EXPECT_EQ(BuddyOfPartner(a, 32 * kMin, all), std::nullopt);
  EXPECT_EQ(BuddyOfPartner(a, kMin, {}), std::nullopt);
}

// Two pairs used together and a third block: placed as buddies, each pair frees into one
// block of the next order; placed first-fit, the same frees leave scattered single holes.
TEST(BuddyOfPartnerTest, BuddiesMergeWhenBothAreFreed) {
  for (const bool co_place : {false, true}) {
    SCOPED_TRACE(co_place ? "co-placed" : "first fit");
    auto created = BuddyAllocator::Create(4 * kMin, kMin);
    ASSERT_TRUE(created.ok());
    BuddyAllocator& a = *created;
    // A at 0 and X at 1, Y at 2; then X leaves: holes at 1 (A's buddy) and 3 (Y's buddy),
    // the latter freed last, so first fit takes it.
    const uint64_t pa = a.Allocate(kMin)->offset;
    const uint64_t px = a.Allocate(kMin)->offset;
    const uint64_t py = a.Allocate(kMin)->offset;
    const uint64_t pz = a.Allocate(kMin)->offset;
    ASSERT_EQ(pa, 0u);
    ASSERT_EQ(px, kMin);
    a.Free(px);
    a.Free(pz);
    // B, used with A.
    std::optional<uint64_t> at;
    if (co_place) at = BuddyOfPartner(a, kMin, std::vector<uint64_t>{pa});
    const uint64_t pb = at ? a.AllocateAt(*at, kMin)->offset : a.Allocate(kMin)->offset;
    EXPECT_EQ(pb == (pa ^ kMin), co_place);
    // Then C, used alone, takes the remaining hole; then A and B go.
    ASSERT_TRUE(a.Allocate(kMin).ok());
    a.Free(pa);
    a.Free(pb);
    EXPECT_EQ(a.largest_free_block(), co_place ? 2 * kMin : kMin);
    EXPECT_EQ(a.fragmentation(), co_place ? 0.0 : 0.5);
    (void)py;
  }
}

}  // namespace
}  // namespace moert::memory
