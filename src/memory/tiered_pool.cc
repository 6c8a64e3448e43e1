// TieredPool: one PROT_NONE reservation split into the three tiers; mprotect commits,
// madvise(MADV_DONTNEED) + mprotect(PROT_NONE) gives pages back.
#include "memory/tiered_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"

namespace moert::memory {
namespace {

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

uint64_t AlignUpAddress(const uint8_t* base, uint64_t offset, uint64_t alignment) {
  const auto address = reinterpret_cast<uintptr_t>(base) + offset;
  return AlignUp(address, alignment) - reinterpret_cast<uintptr_t>(base);
}

}  // namespace

uint64_t PageBytes(uint64_t bytes) {
  static const uint64_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<uint64_t>(p) : uint64_t{4096};
  }();
  return AlignUp(std::max<uint64_t>(bytes, 1), page);
}

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kPersistent:
      return "persistent arena";
    case Tier::kExpert:
      return "expert pool";
    case Tier::kActivation:
      return "activation tier";
  }
  return "unknown tier";
}

absl::StatusOr<std::unique_ptr<TieredPool>> TieredPool::Create(const TieredPoolOptions& options) {
  const long page_long = sysconf(_SC_PAGESIZE);
  const uint64_t page = page_long > 0 ? static_cast<uint64_t>(page_long) : 4096;
  auto experts = BuddyAllocator::Create(options.expert_bytes, options.expert_min_block);
  if (!experts.ok()) {
    return absl::InvalidArgumentError(
        StrCat("expert pool: ", std::string(experts.status().message())));
  }
  if (options.expert_min_block % page != 0) {
    return absl::InvalidArgumentError(StrCat("expert pool: minimum block of ",
                                             options.expert_min_block,
                                             " bytes is not a multiple of the page size (", page,
                                             " bytes)"));
  }
  const uint64_t persistent = AlignUp(options.persistent_bytes, page);
  const uint64_t activation = AlignUp(options.activation_bytes, page);
  const uint64_t expert = experts->pool_bytes();
  // Room to align the expert base to its minimum block (the mapping is only page-aligned).
  const uint64_t map_bytes = persistent + options.expert_min_block + expert + activation;
  void* map = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (map == MAP_FAILED) {
    return absl::InternalError(StrCat("tiered pool: cannot reserve ", map_bytes,
                                      " bytes of address space: ", std::strerror(errno)));
  }
  return std::unique_ptr<TieredPool>(new TieredPool(options, page, static_cast<uint8_t*>(map),
                                                    map_bytes, *std::move(experts)));
}

TieredPool::TieredPool(const TieredPoolOptions& options, uint64_t page, uint8_t* map,
                       uint64_t map_bytes, BuddyAllocator experts)
    : page_(page),
      map_(map),
      map_bytes_(map_bytes),
      persistent_base_(map),
      persistent_capacity_(options.persistent_bytes),
      expert_base_(nullptr),
      experts_(std::move(experts)),
      activation_base_(nullptr),
      activation_capacity_(options.activation_bytes),
      registry_(telemetry::RegistryOrOwn(options.metrics)),
      metrics_(*registry_),
      used_gauges_{&metrics_.persistent_used_bytes, &metrics_.expert_used_bytes,
                   &metrics_.activation_used_bytes} {
  const uint64_t persistent = AlignUp(options.persistent_bytes, page);
  expert_base_ = map + AlignUpAddress(map, persistent, options.expert_min_block);
  activation_base_ = expert_base_ + experts_.pool_bytes();
  tier_stats(Tier::kPersistent).reserved = persistent;
  tier_stats(Tier::kExpert).reserved = experts_.pool_bytes();
  tier_stats(Tier::kActivation).reserved = AlignUp(options.activation_bytes, page);
  activation_page_refs_.assign(AlignUp(options.activation_bytes, page) / page, 0);
}

TieredPool::~TieredPool() { munmap(map_, map_bytes_); }

absl::Status TieredPool::Commit(uint8_t* p, uint64_t bytes, Tier tier) {
  if (bytes == 0) return absl::OkStatus();
  if (mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) {
    return absl::ResourceExhaustedError(StrCat(TierName(tier), ": cannot commit ", bytes,
                                               " bytes: ", std::strerror(errno)));
  }
  TierStats& s = tier_stats(tier);
  s.committed += bytes;
  s.peak_committed = std::max(s.peak_committed, s.committed);
  return absl::OkStatus();
}

void TieredPool::Decommit(uint8_t* p, uint64_t bytes, Tier tier) {
  if (bytes == 0) return;
  // Both calls only fail for ranges outside the mapping, which would be a bug here.
  [[maybe_unused]] const int advised = madvise(p, bytes, MADV_DONTNEED);
  [[maybe_unused]] const int protected_ = mprotect(p, bytes, PROT_NONE);
  assert(advised == 0 && protected_ == 0);
  tier_stats(tier).committed -= bytes;
}

void TieredPool::AddUsed(Tier tier, uint64_t bytes) {
  TierStats& s = tier_stats(tier);
  s.used += bytes;
  s.peak_used = std::max(s.peak_used, s.used);
  Publish(tier);
}

void TieredPool::SubUsed(Tier tier, uint64_t bytes) {
  tier_stats(tier).used -= bytes;
  Publish(tier);
}

void TieredPool::Publish(Tier tier) {
  // The expert tier publishes what the budget counts: its charged pages, not its blocks.
  const TierStats& s = tier_stats(tier);
  used_gauges_[static_cast<size_t>(tier)]->Set(
      static_cast<double>(tier == Tier::kExpert ? s.charged : s.used));
  if (tier == Tier::kExpert) metrics_.expert_fragmentation.Set(experts_.fragmentation());
}

TierStats TieredPool::stats(Tier tier) const { return stats_[static_cast<size_t>(tier)]; }

bool TieredPool::Contains(Tier tier, const void* p, uint64_t bytes) const {
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  switch (tier) {
    case Tier::kPersistent:
      base = persistent_base_;
      size = persistent_capacity_;
      break;
    case Tier::kExpert:
      base = expert_base_;
      size = experts_.pool_bytes();
      break;
    case Tier::kActivation:
      base = activation_base_;
      size = activation_capacity_;
      break;
  }
  const auto address = reinterpret_cast<uintptr_t>(p);
  const auto begin = reinterpret_cast<uintptr_t>(base);
  return address >= begin && bytes <= size && address - begin <= size - bytes;
}

// --- Persistent arena.

absl::StatusOr<uint8_t*> TieredPool::AllocatePersistent(uint64_t bytes, uint64_t alignment) {
  if (bytes == 0 || alignment == 0 || !std::has_single_bit(alignment)) {
    return absl::InvalidArgumentError(StrCat("persistent arena: bad request of ", bytes,
                                             " bytes aligned to ", alignment));
  }
  const uint64_t offset = AlignUpAddress(persistent_base_, persistent_top_, alignment);
  if (offset > persistent_capacity_ || bytes > persistent_capacity_ - offset) {
    return absl::ResourceExhaustedError(
        StrCat("persistent arena: cannot allocate ", bytes, " bytes: ",
               persistent_capacity_ - std::min(persistent_top_, persistent_capacity_),
               " of ", persistent_capacity_, " bytes free"));
  }
  const uint64_t committed_end = tier_stats(Tier::kPersistent).committed;
  const uint64_t new_end = AlignUp(offset + bytes, page_);
  if (new_end > committed_end) {
    absl::Status status =
        Commit(persistent_base_ + committed_end, new_end - committed_end, Tier::kPersistent);
    if (!status.ok()) return status;
  }
  AddUsed(Tier::kPersistent, offset + bytes - persistent_top_);
  persistent_top_ = offset + bytes;
  return persistent_base_ + offset;
}

// --- Expert pool.

absl::StatusOr<Block> TieredPool::AllocateExpert(uint64_t bytes) {
  return CommitExpert(experts_.Allocate(bytes), bytes);
}

absl::StatusOr<Block> TieredPool::AllocateExpertAt(uint64_t offset, uint64_t bytes) {
  return CommitExpert(experts_.AllocateAt(offset, bytes), bytes);
}

absl::StatusOr<Block> TieredPool::CommitExpert(absl::StatusOr<Block> block, uint64_t bytes) {
  if (!block.ok()) {
    return absl::Status(block.status().code(),
                        StrCat("expert pool: ", std::string(block.status().message())));
  }
  const uint64_t need = std::min(PageBytes(bytes), block->size);
  uint8_t* base = expert_base_ + block->offset;
  const auto warm = std::find_if(warm_.begin(), warm_.end(), [&](const WarmBlock& w) {
    return w.offset == block->offset && w.size == block->size;
  });
  if (warm != warm_.end()) {
    // Its pages are committed and resident already: commit or give back the difference.
    const uint64_t have = warm->committed;
    warm_.erase(warm);
    if (need > have) {
      if (absl::Status status = Commit(base + have, need - have, Tier::kExpert); !status.ok()) {
        Decommit(base, have, Tier::kExpert);
        experts_.Free(block->offset);
        return status;
      }
    } else {
      Decommit(base + need, have - need, Tier::kExpert);
    }
  } else {
    ReleaseWarmOverlapping(block->offset, block->size);
    if (absl::Status status = Commit(base, need, Tier::kExpert); !status.ok()) {
      experts_.Free(block->offset);
      return status;
    }
  }
  expert_committed_[block->offset] = need;
  tier_stats(Tier::kExpert).charged += need;
  AddUsed(Tier::kExpert, block->size);
  return block;
}

void TieredPool::FreeExpert(uint64_t offset, bool keep_pages) {
  const uint64_t size = experts_.BlockSize(offset);
  experts_.Free(offset);  // reports a bad offset
  if (size == 0) return;
  const auto it = expert_committed_.find(offset);
  const uint64_t committed = it != expert_committed_.end() ? it->second : 0;
  if (it != expert_committed_.end()) expert_committed_.erase(it);
  tier_stats(Tier::kExpert).charged -= committed;
  if (keep_pages) {
    warm_.push_back({offset, size, committed});
  } else {
    Decommit(expert_base_ + offset, committed, Tier::kExpert);
  }
  SubUsed(Tier::kExpert, size);
}

void TieredPool::ReleaseWarmOverlapping(uint64_t offset, uint64_t size) {
  std::erase_if(warm_, [&](const WarmBlock& w) {
    if (w.offset >= offset + size || offset >= w.offset + w.size) return false;
    Decommit(expert_base_ + w.offset, w.committed, Tier::kExpert);
    return true;
  });
}

void TieredPool::ReleaseWarmExperts() {
  for (const WarmBlock& w : warm_) Decommit(expert_base_ + w.offset, w.committed, Tier::kExpert);
  warm_.clear();
}

uint64_t TieredPool::warm_expert_bytes() const {
  uint64_t bytes = 0;
  for (const WarmBlock& w : warm_) bytes += w.committed;
  return bytes;
}

absl::Status TieredPool::MoveExpert(uint64_t from, uint64_t to) {
  if (absl::Status status = experts_.CanRelocate(from, to); !status.ok()) {
    return absl::Status(status.code(), StrCat("expert pool: ", std::string(status.message())));
  }
  const uint64_t size = experts_.BlockSize(from);
  const auto it = expert_committed_.find(from);
  const uint64_t committed = it != expert_committed_.end() ? it->second : size;
  ReleaseWarmOverlapping(to, size);
  if (absl::Status status = Commit(expert_base_ + to, committed, Tier::kExpert); !status.ok()) {
    return status;
  }
  std::memmove(expert_base_ + to, expert_base_ + from, committed);
  [[maybe_unused]] absl::Status moved = experts_.Relocate(from, to);
  assert(moved.ok());
  Decommit(expert_base_ + from, committed, Tier::kExpert);
  if (it != expert_committed_.end()) expert_committed_.erase(it);
  expert_committed_[to] = committed;
  Publish(Tier::kExpert);  // the fragmentation moved
  return absl::OkStatus();
}

// --- Activation tier.

absl::Status TieredPool::RefActivationPages(uint64_t begin, uint64_t end) {
  const uint64_t first = begin / page_;
  const uint64_t last = (end - 1) / page_;
  // Commit the runs of pages nobody references yet; undo them all if one fails.
  std::vector<std::pair<uint64_t, uint64_t>> committed;
  for (uint64_t p = first; p <= last;) {
    if (activation_page_refs_[p] != 0) {
      ++p;
      continue;
    }
    uint64_t q = p;
    while (q <= last && activation_page_refs_[q] == 0) ++q;
    absl::Status status =
        Commit(activation_base_ + p * page_, (q - p) * page_, Tier::kActivation);
    if (!status.ok()) {
      for (const auto& [a, b] : committed) {
        Decommit(activation_base_ + a * page_, (b - a) * page_, Tier::kActivation);
      }
      return status;
    }
    committed.emplace_back(p, q);
    p = q;
  }
  for (uint64_t p = first; p <= last; ++p) ++activation_page_refs_[p];
  return absl::OkStatus();
}

void TieredPool::UnrefActivationPages(uint64_t begin, uint64_t end) {
  const uint64_t first = begin / page_;
  const uint64_t last = (end - 1) / page_;
  for (uint64_t p = first; p <= last;) {
    if (--activation_page_refs_[p] != 0) {
      ++p;
      continue;
    }
    uint64_t q = p + 1;
    while (q <= last && activation_page_refs_[q] == 1) {
      activation_page_refs_[q] = 0;
      ++q;
    }
    Decommit(activation_base_ + p * page_, (q - p) * page_, Tier::kActivation);
    p = q;
  }
}

uint64_t TieredPool::RingFreeBytes() const {
  const uint64_t size = activation_capacity_ - static_top_;
  if (ring_.empty()) return size;
  return ring_wrapped_ ? ring_tail_ - ring_head_ : (size - ring_head_) + ring_tail_;
}

absl::Status TieredPool::ActivationExhausted(uint64_t bytes, std::string_view what) const {
  std::string message =
      StrCat("activation tier: cannot allocate ", bytes, " bytes ", what, ": ",
             RingFreeBytes(), " of ", activation_capacity_ - static_top_,
             " ring bytes free (not all contiguous), ", static_top_, " bytes static");
  if (!ring_.empty()) {
    StrAppend(&message, ", oldest live lifetime ", ring_.front().lifetime);
  }
  return absl::ResourceExhaustedError(message);
}

absl::StatusOr<uint8_t*> TieredPool::AllocateActivationStatic(uint64_t bytes,
                                                              uint64_t alignment) {
  if (bytes == 0 || alignment == 0 || !std::has_single_bit(alignment)) {
    return absl::InvalidArgumentError(StrCat("activation tier: bad static request of ", bytes,
                                             " bytes aligned to ", alignment));
  }
  if (!ring_.empty()) {
    return absl::FailedPreconditionError(
        StrCat("activation tier: static allocation of ", bytes, " bytes while ", ring_.size(),
               " ring allocations are live"));
  }
  const uint64_t offset = AlignUpAddress(activation_base_, static_top_, alignment);
  if (offset > activation_capacity_ || bytes > activation_capacity_ - offset) {
    return ActivationExhausted(bytes, "(static)");
  }
  MOERT_RETURN_IF_ERROR(RefActivationPages(offset, offset + bytes));
  AddUsed(Tier::kActivation, offset + bytes - static_top_);
  static_ranges_.emplace_back(offset, offset + bytes);
  static_top_ = offset + bytes;
  ring_head_ = ring_tail_ = 0;
  ring_wrapped_ = false;
  return activation_base_ + offset;
}

absl::StatusOr<uint8_t*> TieredPool::AllocateActivation(uint64_t bytes, uint64_t lifetime,
                                                        uint64_t alignment) {
  if (bytes == 0 || alignment == 0 || !std::has_single_bit(alignment)) {
    return absl::InvalidArgumentError(StrCat("activation tier: bad ring request of ", bytes,
                                             " bytes aligned to ", alignment));
  }
  if (!ring_.empty() && lifetime < ring_.back().lifetime) {
    return absl::InvalidArgumentError(StrCat("activation tier: lifetime ", lifetime,
                                             " is older than the newest live lifetime ",
                                             ring_.back().lifetime));
  }
  if (ring_.empty()) {
    ring_head_ = ring_tail_ = 0;
    ring_wrapped_ = false;
  }
  const uint64_t size = activation_capacity_ - static_top_;
  // Ring positions are relative to static_top_; alignment is of the real address.
  const uint8_t* ring_base = activation_base_ + static_top_;
  auto aligned = [&](uint64_t position) { return AlignUpAddress(ring_base, position, alignment); };
  RingEntry entry{ring_head_, aligned(ring_head_), 0, lifetime};
  bool wraps = false;
  if (!ring_wrapped_) {
    if (entry.data > size || bytes > size - entry.data) {
      // Skip the tail end of the ring and start again at its bottom, below the oldest entry.
      entry.data = aligned(0);
      wraps = true;
      if (ring_.empty() || entry.data > ring_tail_ || bytes > ring_tail_ - entry.data) {
        return ActivationExhausted(bytes, StrCat("(lifetime ", lifetime, ")"));
      }
    }
  } else if (entry.data > ring_tail_ || bytes > ring_tail_ - entry.data) {
    return ActivationExhausted(bytes, StrCat("(lifetime ", lifetime, ")"));
  }
  entry.end = entry.data + bytes;
  MOERT_RETURN_IF_ERROR(RefActivationPages(static_top_ + entry.data, static_top_ + entry.end));
  const uint64_t span = wraps ? (size - entry.begin) + entry.end : entry.end - entry.begin;
  AddUsed(Tier::kActivation, span);
  ring_wrapped_ = ring_wrapped_ || wraps;
  ring_head_ = entry.end;
  ring_.push_back(entry);
  return activation_base_ + static_top_ + entry.data;
}

void TieredPool::ReleaseActivations(uint64_t lifetime) {
  const uint64_t size = activation_capacity_ - static_top_;
  while (!ring_.empty() && ring_.front().lifetime <= lifetime) {
    const RingEntry entry = ring_.front();
    ring_.pop_front();
    UnrefActivationPages(static_top_ + entry.data, static_top_ + entry.end);
    const bool wrap_entry = entry.data < entry.begin;
    SubUsed(Tier::kActivation,
            wrap_entry ? (size - entry.begin) + entry.end : entry.end - entry.begin);
    if (wrap_entry) ring_wrapped_ = false;
    ring_tail_ = entry.end;
  }
  if (ring_.empty()) {
    ring_head_ = ring_tail_ = 0;
    ring_wrapped_ = false;
  }
}

void TieredPool::ResetActivations() {
  ReleaseActivations(UINT64_MAX);
  for (const auto& [begin, end] : static_ranges_) UnrefActivationPages(begin, end);
  static_ranges_.clear();
  SubUsed(Tier::kActivation, static_top_);
  static_top_ = 0;
}

}  // namespace moert::memory
