// Buddy allocator over an offset range [0, pool): the block algorithm of the expert pool.
// It is pure bookkeeping (no memory, no I/O) so it can be tested exhaustively; TieredPool
// maps its offsets onto reserved address space and the Defragmenter plans moves on a copy.
#ifndef MOERT_MEMORY_BUDDY_ALLOCATOR_H_
#define MOERT_MEMORY_BUDDY_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::memory {

// A block of the pool: `size` bytes at `offset`; both are multiples of the minimum block and
// `offset` is aligned to `size` (a power-of-two multiple of the minimum block).
struct Block {
  uint64_t offset = 0;
  uint64_t size = 0;
  friend bool operator==(const Block&, const Block&) = default;
};

struct BuddyStats {
  uint64_t pool_bytes = 0;          // usable bytes: the pool rounded down to the minimum block
  uint64_t free_bytes = 0;          // pool_bytes - live_bytes
  uint64_t live_bytes = 0;          // sum of live block sizes (requests rounded up)
  uint64_t largest_free_block = 0;  // the largest request that can succeed right now
  double fragmentation = 0.0;       // 1 - largest_free_block / free_bytes; 0 when nothing free
  uint64_t live_blocks = 0;
  uint64_t pinned_blocks = 0;
  uint64_t failed_allocations = 0;  // Allocate calls that returned ResourceExhausted
  // Release builds only (NDEBUG): Free/Pin/Unpin of an offset where no live block starts
  // (or Unpin of an unpinned block). Debug builds abort on these programmer errors.
  uint64_t invalid_operations = 0;
  std::vector<uint64_t> allocations_by_order;  // successful Allocate/AllocateAt ever, by order
  std::vector<uint64_t> live_blocks_by_order;
};

// Orders run from the minimum block (order 0, a power of two) to the largest power-of-two
// block that fits the pool. A pool that is not a power of two is covered by the largest
// aligned power-of-two blocks (its binary decomposition); blocks merge only with a buddy that
// lies wholly inside the pool, so those top blocks never merge with each other. Bytes past the
// last whole minimum block are not used.
//
// Data structures: per order a bitmap of free blocks and an intrusive doubly-linked free list
// whose links live in side arrays indexed by minimum-block number, so a specific block is
// unlinked in O(1) when its buddy frees. Allocate, Free, AllocateAt, IsFreeBlock and Relocate
// are O(number of orders) = O(log(pool / min block)).
//
// Pins: a pinned block (pin count > 0) is never moved by Relocate (and so never by the
// Defragmenter). The expert cache pins experts a kernel is reading.
//
// Not thread-safe; the owner serializes calls. Copyable: the Defragmenter plans on a copy.
class BuddyAllocator {
 public:
  // `min_block_bytes` must be a power of two no larger than `pool_bytes`, and the pool must
  // hold fewer than 2^32 minimum blocks. InvalidArgument otherwise.
  static absl::StatusOr<BuddyAllocator> Create(uint64_t pool_bytes, uint64_t min_block_bytes);

  // A block of the smallest order that holds `bytes`. InvalidArgument for 0 bytes or a request
  // larger than the largest block the pool can ever hold; ResourceExhausted (naming the
  // request, the free bytes and the largest free block) when no free block is big enough now.
  absl::StatusOr<Block> Allocate(uint64_t bytes);

  // Like Allocate, but the block must start at `offset` (aligned to the rounded size and
  // wholly free). FailedPrecondition when that range is not free, InvalidArgument when
  // misaligned or outside the pool. Splits the enclosing free block around it.
  absl::StatusOr<Block> AllocateAt(uint64_t offset, uint64_t bytes);
  // Whether AllocateAt(offset, bytes) would succeed now: the block of RoundUp(bytes) at
  // `offset` is aligned, inside the pool and wholly free. Changes nothing. O(orders).
  bool IsFreeBlock(uint64_t offset, uint64_t bytes) const;

  // Returns the live block starting at `offset` to the pool and merges it with free buddies.
  // An offset where no live block starts is a programmer error: debug builds abort with a
  // message; release builds ignore the call and count it in stats().invalid_operations.
  // Freeing a pinned block drops its pins (debug builds abort: the cache freed a block that a
  // kernel may still read).
  void Free(uint64_t offset);

  // Size of the live block starting at `offset`; 0 when no live block starts there.
  uint64_t BlockSize(uint64_t offset) const;
  bool IsLive(uint64_t offset) const { return BlockSize(offset) != 0; }

  // Pin counts. Pin/Unpin of a non-live offset (or Unpin at count 0) is a programmer error,
  // handled like an invalid Free.
  void Pin(uint64_t offset);
  void Unpin(uint64_t offset);
  bool IsPinned(uint64_t offset) const;

  // Moves the bookkeeping of the live, unpinned block at `from` to `to` (aligned to its size,
  // wholly free): afterwards `to` is live with the same size and `from` is freed and merged.
  // Copying the bytes is the caller's job (TieredPool::MoveExpert). CanRelocate says whether
  // Relocate would succeed, without changing anything.
  absl::Status CanRelocate(uint64_t from, uint64_t to) const;
  absl::Status Relocate(uint64_t from, uint64_t to);

  // Geometry.
  uint64_t min_block_bytes() const { return min_block_; }
  uint64_t pool_bytes() const { return static_cast<uint64_t>(units_) << min_shift_; }
  int max_order() const { return max_order_; }
  uint64_t OrderBytes(int order) const { return min_block_ << order; }
  // The order a request of `bytes` gets; -1 for 0 bytes or more than the largest block.
  int OrderFor(uint64_t bytes) const;
  // The block size a request of `bytes` gets; 0 when it can never be allocated.
  uint64_t RoundUp(uint64_t bytes) const;

  // Visits every live block in offset order. O(pool / min block / 64 + live blocks).
  void ForEachLiveBlock(absl::FunctionRef<void(const Block&)> fn) const;
  // Visits every free block of order >= `min_order` (by order, then free-list order).
  void ForEachFreeBlock(int min_order, absl::FunctionRef<void(const Block&)> fn) const;

  // Cheap summaries: O(1) or O(orders).
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free_block() const;
  double fragmentation() const;
  uint64_t live_blocks() const { return live_blocks_; }
  BuddyStats stats() const;

 private:
  static constexpr uint32_t kNil = 0xffffffffu;

  BuddyAllocator(uint64_t min_block, int min_shift, uint32_t units, int max_order);

  bool IsFreeAt(uint32_t unit, int order) const;
  // Whether the aligned range of `order` at `unit` lies in some free block (of that order or
  // an enclosing larger one).
  bool InFreeBlock(uint32_t unit, int order) const;
  void InsertFree(uint32_t unit, int order);
  void RemoveFree(uint32_t unit, int order);
  void MarkLive(uint32_t unit, int order);
  // Takes the free range of `order` starting at `unit` out of the free lists (splitting the
  // free block that holds it); false when it is not wholly free.
  bool TakeFreeAt(uint32_t unit, int order);
  // Frees the live block at `unit` and merges with free buddies.
  void Release(uint32_t unit);
  // The unit of the live block starting at `offset`, or kNil.
  uint32_t LiveUnit(uint64_t offset) const;
  void ReportMisuse(const char* what, uint64_t offset);

  uint64_t min_block_;
  int min_shift_;
  uint32_t units_;  // minimum blocks in the pool
  int max_order_;

  // Indexed by the first minimum block of a block.
  std::vector<uint32_t> next_;  // free-list links (valid while the block is free)
  std::vector<uint32_t> prev_;
  std::vector<uint8_t> order_;  // order of the free or live block starting here
  std::vector<uint32_t> pins_;  // pin count of the live block starting here
  std::vector<uint64_t> live_bits_;                // bit u: a live block starts at unit u
  std::vector<std::vector<uint64_t>> free_bits_;  // per order: bit i: block i is free
  std::vector<uint32_t> free_head_;               // per order: first free block, or kNil

  uint64_t free_bytes_ = 0;
  uint64_t live_blocks_ = 0;
  uint64_t pinned_blocks_ = 0;
  uint64_t failed_allocations_ = 0;
  uint64_t invalid_operations_ = 0;
  std::vector<uint64_t> allocations_by_order_;
  std::vector<uint64_t> live_by_order_;
};

}  // namespace moert::memory

#endif  // MOERT_MEMORY_BUDDY_ALLOCATOR_H_
