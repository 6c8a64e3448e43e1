// Defragmenter: move planning on a copy of the buddy allocator, and its application to the
// expert pool of a TieredPool.
#include "memory/defragmenter.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "core/strings.h"

namespace moert::memory {
namespace {

struct Range {
  uint64_t begin;
  uint64_t end;
  bool Intersects(uint64_t b, uint64_t e) const { return b < end && begin < e; }
};

// Plans on its own copy of the allocator, applying each move to the copy as it is planned.
class Planner {
 public:
  Planner(const BuddyAllocator& allocator, uint64_t budget) : sim_(allocator), budget_(budget) {}

  // Offset of a free range of `order` outside every excluded window, made free by moves when
  // needed; nullopt (with failure_ set) when pins or the budget prevent it.
  std::optional<uint64_t> MakeFree(int order) {
    if (std::optional<uint64_t> free = FindFree(order)) return free;
    const std::vector<Candidate> candidates = Windows(order);
    if (candidates.empty()) {
      failure_ = StrCat("no window of ", sim_.OrderBytes(order),
                        " bytes without pinned blocks outside the ones being cleared");
      return std::nullopt;
    }
    // Pinned blocks can leave a window's blocks nowhere to go; then undo and try the next
    // window, a bounded number of times in all.
    for (const Candidate& c : candidates) {
      if (moved_ + c.live > budget_) {
        failure_ = StrCat("defragmentation needs to move at least ", moved_ + c.live,
                          " bytes, over the budget of ", budget_, " bytes");
        return std::nullopt;  // the other candidates hold even more
      }
      if (attempts_ == kMaxWindowAttempts) {
        failure_ = StrCat("gave up after clearing ", kMaxWindowAttempts, " windows");
        return std::nullopt;
      }
      ++attempts_;
      const size_t moves_mark = moves_.size();
      const uint64_t moved_mark = moved_;
      const size_t excluded_mark = excluded_.size();
      if (Clear(c.window)) return c.window.begin;
      // Undo, newest first: each reverse move finds its source free again.
      while (moves_.size() > moves_mark) {
        const Move m = moves_.back();
        moves_.pop_back();
        [[maybe_unused]] absl::Status undone = sim_.Relocate(m.to, m.from);
        assert(undone.ok());
      }
      moved_ = moved_mark;
      excluded_.resize(excluded_mark);
    }
    return std::nullopt;
  }

  const BuddyAllocator& sim() const { return sim_; }
  std::vector<Move>& moves() { return moves_; }
  const std::string& failure() const { return failure_; }

 private:
  static constexpr int kMaxWindowAttempts = 64;

  struct Candidate {
    Range window;
    uint64_t live;
  };

  // Moves every block of `window` out of it (and out of the other excluded windows).
  bool Clear(const Range& window) {
    std::vector<Block> blocks;
    sim_.ForEachLiveBlock([&](const Block& b) {
      if (b.offset >= window.begin && b.offset < window.end) blocks.push_back(b);
    });
    // Largest first: they need the rarest destinations, best found before small blocks
    // scatter into them.
    std::stable_sort(blocks.begin(), blocks.end(),
                     [](const Block& a, const Block& b) { return a.size > b.size; });
    excluded_.push_back(window);
    for (const Block& b : blocks) {
      std::optional<uint64_t> to = MakeFree(sim_.OrderFor(b.size));
      if (!to) return false;
      if (moved_ + b.size > budget_) {
        failure_ = StrCat("defragmentation needs to move more than the budget of ", budget_,
                          " bytes");
        return false;
      }
      if (absl::Status s = sim_.Relocate(b.offset, *to); !s.ok()) {
        failure_ = StrCat("defragmentation planner: ", std::string(s.message()));
        return false;
      }
      moves_.push_back(Move{b.offset, *to, b.size});
      moved_ += b.size;
    }
    excluded_.pop_back();
    return true;
  }

  bool Excluded(uint64_t begin, uint64_t end) const {
    for (const Range& r : excluded_) {
      if (r.Intersects(begin, end)) return true;
    }
    return false;
  }

  // Best fit outside the excluded windows: the smallest order >= `order`, then lowest offset.
  std::optional<uint64_t> FindFree(int order) const {
    std::optional<Block> best;
    sim_.ForEachFreeBlock(order, [&](const Block& b) {
      if (Excluded(b.offset, b.offset + b.size)) return;
      if (!best || b.size < best->size || (b.size == best->size && b.offset < best->offset)) {
        best = b;
      }
    });
    if (!best) return std::nullopt;
    return best->offset;
  }

  // The aligned windows of `order` that could be cleared: inside the pool, outside the
  // excluded windows, holding no pinned block and not (part of) one live block. Fewest live
  // bytes first; ties go to the highest window, so data drifts to the low end.
  std::vector<Candidate> Windows(int order) const {
    const uint64_t window_bytes = sim_.OrderBytes(order);
    const uint64_t windows = sim_.pool_bytes() / window_bytes;  // whole windows only
    std::vector<uint64_t> live(windows, 0);
    std::vector<uint8_t> blocked(windows, 0);
    sim_.ForEachLiveBlock([&](const Block& b) {
      const uint64_t first = b.offset / window_bytes;
      if (b.size >= window_bytes) {
        for (uint64_t w = first; w < std::min(windows, first + b.size / window_bytes); ++w) {
          blocked[w] = 1;
        }
        return;
      }
      if (first >= windows) return;
      live[first] += b.size;
      if (sim_.IsPinned(b.offset)) blocked[first] = 1;
    });
    for (const Range& r : excluded_) {
      for (uint64_t w = r.begin / window_bytes; w < windows && w * window_bytes < r.end; ++w) {
        blocked[w] = 1;
      }
    }
    std::vector<Candidate> candidates;
    for (uint64_t w = windows; w-- > 0;) {
      if (!blocked[w]) {
        candidates.push_back(Candidate{Range{w * window_bytes, (w + 1) * window_bytes}, live[w]});
      }
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) { return a.live < b.live; });
    return candidates;
  }

  BuddyAllocator sim_;
  uint64_t budget_;
  uint64_t moved_ = 0;
  int attempts_ = 0;
  std::vector<Range> excluded_;
  std::vector<Move> moves_;
  std::string failure_;
};

int FloorLog2(uint64_t x) { return static_cast<int>(std::bit_width(x)) - 1; }

}  // namespace

absl::StatusOr<std::vector<Move>> PlanMakeRoom(const BuddyAllocator& allocator, uint64_t bytes,
                                               uint64_t max_bytes_moved) {
  const int order = allocator.OrderFor(bytes);
  if (order < 0) {
    return absl::InvalidArgumentError(StrCat("defragmentation: a request of ", bytes,
                                             " bytes never fits a pool of ",
                                             allocator.pool_bytes(), " bytes"));
  }
  const uint64_t size = allocator.OrderBytes(order);
  if (allocator.largest_free_block() >= size) return std::vector<Move>{};
  if (allocator.free_bytes() < size) {
    return absl::ResourceExhaustedError(StrCat("defragmentation: a block of ", size,
                                               " bytes cannot be made from ",
                                               allocator.free_bytes(), " free bytes"));
  }
  Planner planner(allocator, max_bytes_moved);
  if (!planner.MakeFree(order)) {
    return absl::ResourceExhaustedError(StrCat("defragmentation: cannot make a free block of ",
                                               size, " bytes: ", planner.failure()));
  }
  if (planner.sim().largest_free_block() < size) {
    return absl::InternalError(StrCat("defragmentation: planned moves left no free block of ",
                                      size, " bytes"));
  }
  return std::move(planner.moves());
}

std::vector<Move> PlanCompaction(const BuddyAllocator& allocator, uint64_t max_bytes_moved) {
  if (allocator.free_bytes() == 0) return {};
  const int best = std::min(FloorLog2(allocator.free_bytes() / allocator.min_block_bytes()),
                            allocator.max_order());
  const int current = allocator.largest_free_block() == 0
                          ? -1
                          : FloorLog2(allocator.largest_free_block() /
                                      allocator.min_block_bytes());
  // The largest target the budget allows; smaller targets are cheaper, so try downwards.
  for (int order = best; order > current; --order) {
    Planner planner(allocator, max_bytes_moved);
    if (planner.MakeFree(order)) return std::move(planner.moves());
  }
  return {};
}

absl::Status Defragmenter::Apply(TieredPool& pool, const std::vector<Move>& moves,
                                 RelocationCallback on_move) {
  uint64_t moved = 0;
  for (const Move& m : moves) {
    if (absl::Status s = pool.MoveExpert(m.from, m.to); !s.ok()) {
      stats_.max_bytes_moved_in_a_run = std::max(stats_.max_bytes_moved_in_a_run, moved);
      return s;
    }
    on_move(m.from, m.to, m.size);
    moved += m.size;
    stats_.bytes_moved += m.size;
    ++stats_.blocks_moved;
  }
  stats_.max_bytes_moved_in_a_run = std::max(stats_.max_bytes_moved_in_a_run, moved);
  return absl::OkStatus();
}

absl::Status Defragmenter::MakeRoom(TieredPool& pool, uint64_t bytes,
                                    RelocationCallback on_move) {
  const auto start = std::chrono::steady_clock::now();
  ++stats_.runs;
  absl::StatusOr<std::vector<Move>> plan =
      PlanMakeRoom(pool.expert_allocator(), bytes, options_.max_bytes_moved_per_call);
  absl::Status status = plan.ok() ? Apply(pool, *plan, on_move) : plan.status();
  if (!status.ok()) ++stats_.failed_runs;
  stats_.nanoseconds += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           start)
          .count());
  return status;
}

absl::Status Defragmenter::Compact(TieredPool& pool, RelocationCallback on_move) {
  const auto start = std::chrono::steady_clock::now();
  ++stats_.runs;
  absl::Status status = Apply(
      pool, PlanCompaction(pool.expert_allocator(), options_.max_bytes_moved_per_call), on_move);
  if (!status.ok()) ++stats_.failed_runs;
  stats_.nanoseconds += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           start)
          .count());
  return status;
}

absl::StatusOr<Block> Defragmenter::AllocateExpert(TieredPool& pool, uint64_t bytes,
                                                   RelocationCallback on_move) {
  absl::StatusOr<Block> block = pool.AllocateExpert(bytes);
  if (block.ok() || !absl::IsResourceExhausted(block.status())) return block;
  const BuddyAllocator& allocator = pool.expert_allocator();
  if (allocator.fragmentation() <= options_.fragmentation_threshold ||
      allocator.free_bytes() < allocator.RoundUp(bytes)) {
    return block;
  }
  if (absl::Status s = MakeRoom(pool, bytes, on_move); !s.ok()) {
    return absl::Status(block.status().code(), StrCat(std::string(block.status().message()),
                                                      "; ", std::string(s.message())));
  }
  return pool.AllocateExpert(bytes);
}

}  // namespace moert::memory
