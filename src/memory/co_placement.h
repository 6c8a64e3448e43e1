// Co-placement of blocks that are used together: the expert cache learns, per layer, which
// experts are routed in the same step, and places a newly loaded expert in the buddy block of
// its partner when that is free. A pair placed as buddies is likely evicted together too (the
// same recency and frequency), and then its two blocks merge into one of the next order
// instead of leaving two holes beside other live blocks, which a larger expert can use
// without defragmentation.
//
// Measured (moert-bench-memory, BM_ChurnBuddyDefrag/paired:*/co:*): no gain worth the name
// on an LRU-driven full pool, because (1) the allocator's LIFO free lists already make
// blocks allocated one after another buddies, so a pair loaded in one step is co-placed
// anyway, and (2) the defragmenter runs as soon as the free bytes suffice, usually after
// the first eviction, so the partner is rarely evicted in time for the merge to matter.
//
// Placement only chooses which free block of the needed order an expert gets: it never
// splits a larger block (the buddy of a live block of that order is a free block of exactly
// that order), never changes which experts are resident, and never changes their bytes.
#ifndef MOERT_MEMORY_CO_PLACEMENT_H_
#define MOERT_MEMORY_CO_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "memory/buddy_allocator.h"

namespace moert::memory {

struct CoUseOptions {
  // A group (the distinct experts of one step and layer) larger than this is ignored: a long
  // prefill batch routes to most experts at once, which says nothing about pairs.
  int max_group = 16;
  // A partner of item a is an item b with co_uses(a, b) >= min_co_uses and
  // co_uses(a, b) >= min_fraction * uses(a).
  uint32_t min_co_uses = 4;
  double min_fraction = 0.5;
  // When some item's use count reaches this, every count of the set is halved, so that old
  // co-use fades as routing drifts (the fractions are kept).
  uint32_t halve_at = 1024;
};

// Pair co-occurrence counts of a set of `n` items (the experts of one layer): n * n uint32
// (256 KiB for 256 items), so sets larger than kMaxItems are not tracked. Not thread-safe.
class CoUseCounts {
 public:
  static constexpr int kMaxItems = 256;

  // 1 <= n <= kMaxItems (a programmer error otherwise).
  explicit CoUseCounts(int n, const CoUseOptions& options = {});

  // Records one group of distinct items in [0, n) used together (programmer errors: an
  // item out of range or listed twice). Groups larger than max_group are ignored.
  void AddGroup(std::span<const int> items);

  int size() const { return n_; }
  // Groups (not ignored) that held `item`.
  uint32_t uses(int item) const { return uses_[static_cast<size_t>(item)]; }
  // Groups that held both.
  uint32_t co_uses(int a, int b) const { return co_[Pair(a, b)]; }
  // The partners of `item` (see CoUseOptions), most co-used first (ties: lower item).
  std::vector<int> Partners(int item) const;

 private:
  size_t Pair(int a, int b) const {
    return static_cast<size_t>(a) * static_cast<size_t>(n_) + static_cast<size_t>(b);
  }

  int n_;
  CoUseOptions options_;
  std::vector<uint32_t> uses_;
  std::vector<uint32_t> co_;  // symmetric; the diagonal is unused
};

// Where a block for `bytes` can go next to a partner: the buddy of the first live block in
// `partner_offsets` whose size is RoundUp(bytes), when that buddy is wholly free. nullopt when
// there is none (no partner block of that order, or every such buddy is taken).
std::optional<uint64_t> BuddyOfPartner(const BuddyAllocator& allocator, uint64_t bytes,
                                       std::span<const uint64_t> partner_offsets);

}  // namespace moert::memory

#endif  // MOERT_MEMORY_CO_PLACEMENT_H_
