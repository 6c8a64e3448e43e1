// Buddy allocator: bitmaps and intrusive free lists per order over minimum-block numbers.
#include "memory/buddy_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <utility>

#include "core/strings.h"
#include "telemetry/platform.h"

namespace moert::memory {
namespace {

bool TestBit(const std::vector<uint64_t>& bits, uint64_t i) {
  return (bits[i >> 6] >> (i & 63)) & 1u;
}
void SetBit(std::vector<uint64_t>& bits, uint64_t i) { bits[i >> 6] |= uint64_t{1} << (i & 63); }
void ClearBit(std::vector<uint64_t>& bits, uint64_t i) {
  bits[i >> 6] &= ~(uint64_t{1} << (i & 63));
}

}  // namespace

absl::StatusOr<BuddyAllocator> BuddyAllocator::Create(uint64_t pool_bytes,
                                                      uint64_t min_block_bytes) {
  if (min_block_bytes == 0 || !std::has_single_bit(min_block_bytes)) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: minimum block of ",
                                             min_block_bytes, " bytes is not a power of two"));
  }
  if (min_block_bytes > pool_bytes) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: minimum block of ",
                                             min_block_bytes, " bytes is larger than the pool of ",
                                             pool_bytes, " bytes"));
  }
  const int min_shift = std::countr_zero(min_block_bytes);
  const uint64_t units = pool_bytes >> min_shift;
  if (units >= kNil) {
    return absl::InvalidArgumentError(
        StrCat("buddy allocator: pool of ", pool_bytes, " bytes has ", units,
               " minimum blocks of ", min_block_bytes, " bytes; at most ", kNil - 1, " allowed"));
  }
  const int max_order = static_cast<int>(std::bit_width(units)) - 1;
  return BuddyAllocator(min_block_bytes, min_shift, static_cast<uint32_t>(units), max_order);
}

BuddyAllocator::BuddyAllocator(uint64_t min_block, int min_shift, uint32_t units, int max_order)
    : min_block_(min_block),
      min_shift_(min_shift),
      units_(units),
      max_order_(max_order),
      next_(units, kNil),
      prev_(units, kNil),
      order_(units, 0),
      pins_(units, 0),
      live_bits_((units + 63) / 64, 0),
      free_bits_(static_cast<size_t>(max_order) + 1),
      free_head_(static_cast<size_t>(max_order) + 1, kNil),
      allocations_by_order_(static_cast<size_t>(max_order) + 1, 0),
      live_by_order_(static_cast<size_t>(max_order) + 1, 0) {
  for (int k = 0; k <= max_order_; ++k) {
    const uint64_t blocks = uint64_t{units_} >> k;
    free_bits_[static_cast<size_t>(k)].assign((blocks + 63) / 64, 0);
  }
  // Cover [0, units) with its binary decomposition, largest block first: each block starts
  // at the sum of the larger ones, which is a multiple of its own size, so all are aligned.
  uint32_t unit = 0;
  for (int k = max_order_; k >= 0; --k) {
    if ((units_ >> k) & 1u) {
      InsertFree(unit, k);
      unit += uint32_t{1} << k;
    }
  }
}

int BuddyAllocator::OrderFor(uint64_t bytes) const {
  if (bytes == 0) return -1;
  const uint64_t units = ((bytes - 1) >> min_shift_) + 1;
  const int order = static_cast<int>(std::bit_width(units - 1));
  return order > max_order_ ? -1 : order;
}

uint64_t BuddyAllocator::RoundUp(uint64_t bytes) const {
  const int order = OrderFor(bytes);
  return order < 0 ? 0 : OrderBytes(order);
}

bool BuddyAllocator::IsFreeAt(uint32_t unit, int order) const {
  return TestBit(free_bits_[static_cast<size_t>(order)], unit >> order);
}

void BuddyAllocator::InsertFree(uint32_t unit, int order) {
  const auto k = static_cast<size_t>(order);
  SetBit(free_bits_[k], unit >> order);
  order_[unit] = static_cast<uint8_t>(order);
  prev_[unit] = kNil;
  next_[unit] = free_head_[k];
  if (free_head_[k] != kNil) prev_[free_head_[k]] = unit;
  free_head_[k] = unit;
  free_bytes_ += OrderBytes(order);
}

void BuddyAllocator::RemoveFree(uint32_t unit, int order) {
  const auto k = static_cast<size_t>(order);
  ClearBit(free_bits_[k], unit >> order);
  if (prev_[unit] != kNil) {
    next_[prev_[unit]] = next_[unit];
  } else {
    free_head_[k] = next_[unit];
  }
  if (next_[unit] != kNil) prev_[next_[unit]] = prev_[unit];
  next_[unit] = prev_[unit] = kNil;
  free_bytes_ -= OrderBytes(order);
}

void BuddyAllocator::MarkLive(uint32_t unit, int order) {
  SetBit(live_bits_, unit);
  order_[unit] = static_cast<uint8_t>(order);
  pins_[unit] = 0;
  ++live_blocks_;
  ++live_by_order_[static_cast<size_t>(order)];
}

absl::StatusOr<Block> BuddyAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("buddy allocator: request of 0 bytes");
  }
  if (bytes > pool_bytes()) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: request of ", bytes,
                                             " bytes is larger than the pool of ", pool_bytes(),
                                             " bytes"));
  }
  const int order = OrderFor(bytes);
  if (order < 0) {
    return absl::InvalidArgumentError(
        StrCat("buddy allocator: request of ", bytes, " bytes is larger than the largest block ",
               "the pool can hold (", OrderBytes(max_order_), " bytes)"));
  }
  int k = order;
  while (k <= max_order_ && free_head_[static_cast<size_t>(k)] == kNil) ++k;
  if (k > max_order_) {
    ++failed_allocations_;
    return absl::ResourceExhaustedError(
        StrCat("buddy allocator: no free block for a request of ", bytes, " bytes (block of ",
               OrderBytes(order), " bytes): ", free_bytes_, " bytes free, largest free block ",
               largest_free_block(), " bytes"));
  }
  const uint32_t unit = free_head_[static_cast<size_t>(k)];
  RemoveFree(unit, k);
  while (k > order) {
    --k;
    InsertFree(unit + (uint32_t{1} << k), k);
  }
  MarkLive(unit, order);
  ++allocations_by_order_[static_cast<size_t>(order)];
  return Block{uint64_t{unit} << min_shift_, OrderBytes(order)};
}

bool BuddyAllocator::TakeFreeAt(uint32_t unit, int order) {
  for (int k = order; k <= max_order_; ++k) {
    uint32_t head = unit & ~((uint32_t{1} << k) - 1);
    if (uint64_t{head} + (uint64_t{1} << k) > units_) return false;
    if (!IsFreeAt(head, k)) continue;
    RemoveFree(head, k);
    while (k > order) {
      --k;
      const uint32_t half = uint32_t{1} << k;
      if (unit >= head + half) {
        InsertFree(head, k);
        head += half;
      } else {
        InsertFree(head + half, k);
      }
    }
    return true;
  }
  return false;
}

absl::StatusOr<Block> BuddyAllocator::AllocateAt(uint64_t offset, uint64_t bytes) {
  const int order = OrderFor(bytes);
  if (order < 0) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: cannot place a request of ", bytes,
                                             " bytes (pool of ", pool_bytes(), " bytes)"));
  }
  const uint64_t size = OrderBytes(order);
  if (offset % size != 0 || offset >= pool_bytes() || size > pool_bytes() - offset) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: a block of ", size,
                                             " bytes cannot start at offset ", offset,
                                             " (misaligned or past the pool of ", pool_bytes(),
                                             " bytes)"));
  }
  const auto unit = static_cast<uint32_t>(offset >> min_shift_);
  if (!TakeFreeAt(unit, order)) {
    return absl::FailedPreconditionError(StrCat("buddy allocator: the ", size,
                                                " bytes at offset ", offset, " are not free"));
  }
  MarkLive(unit, order);
  ++allocations_by_order_[static_cast<size_t>(order)];
  return Block{offset, size};
}

bool BuddyAllocator::InFreeBlock(uint32_t unit, int order) const {
  for (int k = order; k <= max_order_; ++k) {
    const uint32_t head = unit & ~((uint32_t{1} << k) - 1);
    if (uint64_t{head} + (uint64_t{1} << k) > units_) return false;
    if (IsFreeAt(head, k)) return true;
  }
  return false;
}

bool BuddyAllocator::IsFreeBlock(uint64_t offset, uint64_t bytes) const {
  const int order = OrderFor(bytes);
  if (order < 0) return false;
  const uint64_t size = OrderBytes(order);
  if (offset % size != 0 || offset >= pool_bytes() || size > pool_bytes() - offset) return false;
  return InFreeBlock(static_cast<uint32_t>(offset >> min_shift_), order);
}

uint32_t BuddyAllocator::LiveUnit(uint64_t offset) const {
  if (offset % min_block_ != 0 || offset >= pool_bytes()) return kNil;
  const auto unit = static_cast<uint32_t>(offset >> min_shift_);
  return TestBit(live_bits_, unit) ? unit : kNil;
}

void BuddyAllocator::ReportMisuse(const char* what, uint64_t offset) {
#ifndef NDEBUG
  telemetry::Log(telemetry::LogLevel::kError,
                 StrCat("BuddyAllocator: ", what, " at offset ", offset));
  std::abort();
#else
  (void)what;
  (void)offset;
  ++invalid_operations_;
#endif
}

void BuddyAllocator::Release(uint32_t unit) {
  int k = order_[unit];
  ClearBit(live_bits_, unit);
  if (pins_[unit] != 0) {
    pins_[unit] = 0;
    --pinned_blocks_;
  }
  --live_blocks_;
  --live_by_order_[static_cast<size_t>(k)];
  while (k < max_order_) {
    const uint32_t buddy = unit ^ (uint32_t{1} << k);
    if (uint64_t{buddy} + (uint64_t{1} << k) > units_ || !IsFreeAt(buddy, k)) break;
    RemoveFree(buddy, k);
    unit = std::min(unit, buddy);
    ++k;
  }
  InsertFree(unit, k);
}

void BuddyAllocator::Free(uint64_t offset) {
  const uint32_t unit = LiveUnit(offset);
  if (unit == kNil) return ReportMisuse("Free: no live block starts", offset);
#ifndef NDEBUG
  if (pins_[unit] != 0) return ReportMisuse("Free: the block is pinned", offset);
#endif
  Release(unit);
}

uint64_t BuddyAllocator::BlockSize(uint64_t offset) const {
  const uint32_t unit = LiveUnit(offset);
  return unit == kNil ? 0 : OrderBytes(order_[unit]);
}

void BuddyAllocator::Pin(uint64_t offset) {
  const uint32_t unit = LiveUnit(offset);
  if (unit == kNil) return ReportMisuse("Pin: no live block starts", offset);
  if (pins_[unit]++ == 0) ++pinned_blocks_;
}

void BuddyAllocator::Unpin(uint64_t offset) {
  const uint32_t unit = LiveUnit(offset);
  if (unit == kNil || pins_[unit] == 0) {
    return ReportMisuse("Unpin: no pinned block starts", offset);
  }
  if (--pins_[unit] == 0) --pinned_blocks_;
}

bool BuddyAllocator::IsPinned(uint64_t offset) const {
  const uint32_t unit = LiveUnit(offset);
  return unit != kNil && pins_[unit] != 0;
}

absl::Status BuddyAllocator::CanRelocate(uint64_t from, uint64_t to) const {
  const uint32_t unit = LiveUnit(from);
  if (unit == kNil) {
    return absl::FailedPreconditionError(
        StrCat("buddy allocator: no live block at offset ", from, " to relocate"));
  }
  if (pins_[unit] != 0) {
    return absl::FailedPreconditionError(
        StrCat("buddy allocator: the block at offset ", from, " is pinned"));
  }
  const int order = order_[unit];
  const uint64_t size = OrderBytes(order);
  if (to % size != 0 || to >= pool_bytes() || size > pool_bytes() - to) {
    return absl::InvalidArgumentError(StrCat("buddy allocator: a block of ", size,
                                             " bytes cannot move to offset ", to));
  }
  if (InFreeBlock(static_cast<uint32_t>(to >> min_shift_), order)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      StrCat("buddy allocator: the ", size, " bytes at offset ", to, " are not free"));
}

absl::Status BuddyAllocator::Relocate(uint64_t from, uint64_t to) {
  if (absl::Status status = CanRelocate(from, to); !status.ok()) return status;
  const auto from_unit = static_cast<uint32_t>(from >> min_shift_);
  const auto to_unit = static_cast<uint32_t>(to >> min_shift_);
  const int order = order_[from_unit];
  TakeFreeAt(to_unit, order);  // cannot fail: CanRelocate checked it
  Release(from_unit);
  MarkLive(to_unit, order);
  return absl::OkStatus();
}

void BuddyAllocator::ForEachLiveBlock(absl::FunctionRef<void(const Block&)> fn) const {
  for (size_t w = 0; w < live_bits_.size(); ++w) {
    uint64_t word = live_bits_[w];
    while (word != 0) {
      const auto unit = static_cast<uint32_t>(w * 64 + static_cast<size_t>(std::countr_zero(word)));
      word &= word - 1;
      fn(Block{uint64_t{unit} << min_shift_, OrderBytes(order_[unit])});
    }
  }
}

void BuddyAllocator::ForEachFreeBlock(int min_order,
                                      absl::FunctionRef<void(const Block&)> fn) const {
  for (int k = std::max(min_order, 0); k <= max_order_; ++k) {
    for (uint32_t u = free_head_[static_cast<size_t>(k)]; u != kNil; u = next_[u]) {
      fn(Block{uint64_t{u} << min_shift_, OrderBytes(k)});
    }
  }
}

uint64_t BuddyAllocator::largest_free_block() const {
  for (int k = max_order_; k >= 0; --k) {
    if (free_head_[static_cast<size_t>(k)] != kNil) return OrderBytes(k);
  }
  return 0;
}

double BuddyAllocator::fragmentation() const {
  if (free_bytes_ == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_block()) / static_cast<double>(free_bytes_);
}

BuddyStats BuddyAllocator::stats() const {
  BuddyStats s;
  s.pool_bytes = pool_bytes();
  s.free_bytes = free_bytes_;
  s.live_bytes = pool_bytes() - free_bytes_;
  s.largest_free_block = largest_free_block();
  s.fragmentation = fragmentation();
  s.live_blocks = live_blocks_;
  s.pinned_blocks = pinned_blocks_;
  s.failed_allocations = failed_allocations_;
  s.invalid_operations = invalid_operations_;
  s.allocations_by_order = allocations_by_order_;
  s.live_blocks_by_order = live_by_order_;
  return s;
}

}  // namespace moert::memory
