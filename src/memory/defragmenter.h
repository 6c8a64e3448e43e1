// Defragmentation of the expert pool: when an expert allocation fails although enough bytes
// are free, move a few live (unpinned) blocks so that a free block of the needed order
// appears, with bounded work per call so a decode step never stalls long.
//
// Planning is pure (it runs on a copy of the BuddyAllocator and returns a list of moves);
// Defragmenter applies a plan to a TieredPool with memmove and tells the owner of each moved
// block its new offset.
#ifndef MOERT_MEMORY_DEFRAGMENTER_H_
#define MOERT_MEMORY_DEFRAGMENTER_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/buddy_allocator.h"
#include "memory/tiered_pool.h"

namespace moert::memory {

// One step of a plan: the live block at `from` moves to the free range at `to`. Each move is
// valid after the previous ones of its plan have been applied, in order.
struct Move {
  uint64_t from = 0;
  uint64_t to = 0;
  uint64_t size = 0;
  friend bool operator==(const Move&, const Move&) = default;
};

// Moves that leave a free block of the order a request of `bytes` needs, touching only
// unpinned blocks and moving at most `max_bytes_moved` bytes. Empty when such a block is
// already free. Policy: pick the aligned window of that order with the fewest live bytes
// (no pinned block, not part of a larger live block; ties go to the highest window, so data
// drifts to the low end), and move each block in it (largest first) to the best-fitting free
// block outside the window (smallest order, then lowest offset); when no such block exists,
// make one the same way, recursively, outside every window being cleared. When pinned
// blocks leave a window's blocks nowhere to go, that window is undone and the next one tried
// (at most 64 window clears per plan). Without pins this
// always succeeds when free_bytes >= RoundUp(bytes) and the budget allows: a window with the
// fewest live bytes has at most as many live bytes as there are free bytes outside it.
// Errors: InvalidArgument for a request the pool can never hold; ResourceExhausted when not
// enough bytes are free, or pins or the budget prevent a plan.
absl::StatusOr<std::vector<Move>> PlanMakeRoom(const BuddyAllocator& allocator, uint64_t bytes,
                                               uint64_t max_bytes_moved);

// Full compaction bounded by `max_bytes_moved`: moves that make the largest free block as
// large as the budget and pins allow, up to the largest power of two <= free_bytes (the best
// a buddy allocator can do). Empty when nothing can be improved.
std::vector<Move> PlanCompaction(const BuddyAllocator& allocator, uint64_t max_bytes_moved);

struct DefragmenterOptions {
  // AllocateExpert defragments only above this fragmentation (1 - largest free / free).
  // Note that a request that fails while free_bytes >= its rounded size always finds
  // fragmentation >= 0.5, since the largest free block is then at most half the free bytes.
  double fragmentation_threshold = 0.3;
  // The most bytes one call may move (memmove cost bounds the stall of a decode step).
  uint64_t max_bytes_moved_per_call = uint64_t{64} << 20;
};

struct DefragmenterStats {
  uint64_t runs = 0;         // MakeRoom / Compact calls (including AllocateExpert's)
  uint64_t failed_runs = 0;  // no plan within pins and budget
  uint64_t bytes_moved = 0;
  uint64_t blocks_moved = 0;
  uint64_t max_bytes_moved_in_a_run = 0;
  uint64_t nanoseconds = 0;  // time spent planning and moving
};

// Called once per moved block, after its bytes are at the new offset.
using RelocationCallback =
    absl::FunctionRef<void(uint64_t old_offset, uint64_t new_offset, uint64_t size)>;

// Not thread-safe; use from the thread that owns the TieredPool.
class Defragmenter {
 public:
  explicit Defragmenter(DefragmenterOptions options = {}) : options_(options) {}

  // TieredPool::AllocateExpert, and when that fails with ResourceExhausted while the rounded
  // request fits the free bytes and fragmentation is above the threshold: MakeRoom, then one
  // more try. Otherwise (the caller must evict) the allocator's ResourceExhausted is returned.
  absl::StatusOr<Block> AllocateExpert(TieredPool& pool, uint64_t bytes,
                                       RelocationCallback on_move);

  // Applies PlanMakeRoom with this defragmenter's budget.
  absl::Status MakeRoom(TieredPool& pool, uint64_t bytes, RelocationCallback on_move);

  // Applies PlanCompaction with this defragmenter's budget (for idle time).
  absl::Status Compact(TieredPool& pool, RelocationCallback on_move);

  const DefragmenterStats& stats() const { return stats_; }
  const DefragmenterOptions& options() const { return options_; }

 private:
  absl::Status Apply(TieredPool& pool, const std::vector<Move>& moves,
                     RelocationCallback on_move);

  DefragmenterOptions options_;
  DefragmenterStats stats_;
};

}  // namespace moert::memory

#endif  // MOERT_MEMORY_DEFRAGMENTER_H_
