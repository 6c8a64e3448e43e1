// Co-placement: pair co-use counts and the buddy of a partner block.
#include "memory/co_placement.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace moert::memory {

CoUseCounts::CoUseCounts(int n, const CoUseOptions& options)
    : n_(n),
      options_(options),
      uses_(static_cast<size_t>(n), 0),
      co_(static_cast<size_t>(n) * static_cast<size_t>(n), 0) {
  assert(n >= 1 && n <= kMaxItems);
}

void CoUseCounts::AddGroup(std::span<const int> items) {
  if (items.size() > static_cast<size_t>(std::max(options_.max_group, 0))) return;
  bool halve = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const int a = items[i];
    assert(a >= 0 && a < n_);
    uint32_t& uses = uses_[static_cast<size_t>(a)];
    halve = halve || ++uses >= options_.halve_at;
    for (size_t j = i + 1; j < items.size(); ++j) {
      const int b = items[j];
      assert(b >= 0 && b < n_ && b != a);
      ++co_[Pair(a, b)];
      ++co_[Pair(b, a)];
    }
  }
  if (!halve) return;
  // Halving (rounding down) keeps co_uses(a, b) <= min(uses(a), uses(b)).
  for (uint32_t& u : uses_) u /= 2;
  for (uint32_t& c : co_) c /= 2;
}

std::vector<int> CoUseCounts::Partners(int item) const {
  const double uses = static_cast<double>(uses_[static_cast<size_t>(item)]);
  const uint32_t min_co = std::max(options_.min_co_uses,
                                   static_cast<uint32_t>(std::ceil(options_.min_fraction * uses)));
  std::vector<int> partners;
  for (int b = 0; b < n_; ++b) {
    if (b != item && co_[Pair(item, b)] >= std::max<uint32_t>(min_co, 1)) partners.push_back(b);
  }
  std::stable_sort(partners.begin(), partners.end(),
                   [&](int x, int y) { return co_[Pair(item, x)] > co_[Pair(item, y)]; });
  return partners;
}

std::optional<uint64_t> BuddyOfPartner(const BuddyAllocator& allocator, uint64_t bytes,
                                       std::span<const uint64_t> partner_offsets) {
  const uint64_t size = allocator.RoundUp(bytes);
  if (size == 0) return std::nullopt;
  for (const uint64_t offset : partner_offsets) {
    if (allocator.BlockSize(offset) != size) continue;
    const uint64_t buddy = offset ^ size;
    if (allocator.IsFreeBlock(buddy, size)) return buddy;
  }
  return std::nullopt;
}

}  // namespace moert::memory
