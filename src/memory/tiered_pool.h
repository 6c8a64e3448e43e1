// The runtime's memory, in three tiers over one reserved address range: a persistent bump
// arena (embeddings, attention, norms, routers, shared experts, lm head), the expert pool
// (a BuddyAllocator over an address range) and the activation tier (KV cache and a ring
// of per-layer scratch released by lifetime). Address space is reserved up front with
// PROT_NONE and MAP_NORESERVE, committed (made read/write) when allocated and given back
// (MADV_DONTNEED, then PROT_NONE again) when freed, so resident memory follows what is live.
//
// An expert block is a power of two, but only the pages of the bytes asked for are
// committed: an expert of 3.375 MiB in a 4 MiB block commits 3.375 MiB, and the rest of
// the block stays PROT_NONE (a read past the expert faults instead of reading zeros).
// The expert tier's `charged` bytes are those pages of the live blocks: what the memory
// budget counts (memory/budget.h). The tier's range (expert_bytes) may be larger than
// what the budget lets the owner hold at once, so that the blocks' rounding costs address
// space, not memory (experts/expert_cache.h keeps the charged bytes to its limit).
#ifndef MOERT_MEMORY_TIERED_POOL_H_
#define MOERT_MEMORY_TIERED_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "memory/buddy_allocator.h"
#include "telemetry/runtime_metrics.h"

namespace moert::memory {

enum class Tier { kPersistent, kExpert, kActivation };

// `bytes` (at least one) rounded up to whole pages of this system: what an expert block
// commits, and what the memory budget charges for it (ExpertCache::ChargeBytes).
uint64_t PageBytes(uint64_t bytes);
std::string_view TierName(Tier tier);

struct TieredPoolOptions {
  uint64_t persistent_bytes = 0;  // capacity of the persistent arena (may be 0)
  // The expert budget, rounded down to expert_min_block; at least one minimum block.
  uint64_t expert_bytes = 0;
  // Smallest expert block: a power of two and a multiple of the page size.
  uint64_t expert_min_block = uint64_t{64} << 10;
  uint64_t activation_bytes = 0;  // KV cache + ring (may be 0)
  // Where the tiers' used bytes and the expert tier's fragmentation are published (null:
  // a registry of the pool's own).
  std::shared_ptr<telemetry::Registry> metrics = nullptr;
};

struct TierStats {
  uint64_t reserved = 0;        // address space of the tier
  uint64_t committed = 0;       // read/write bytes (whole pages)
  uint64_t used = 0;            // bytes handed out (expert: block sizes; ring: incl. padding)
  // Expert tier: the committed pages of live blocks (the bytes asked for, rounded up to
  // pages; free blocks kept warm are not counted). Other tiers: 0.
  uint64_t charged = 0;
  uint64_t peak_committed = 0;
  uint64_t peak_used = 0;
};

// Not thread-safe: one thread (the one that runs the decode step) allocates, frees, pins and
// defragments; other threads (the loader) may only read and write the bytes of blocks they
// were given, and those must stay pinned meanwhile so that no move happens under them.
class TieredPool {
 public:
  // InvalidArgument for a bad expert geometry (see BuddyAllocator::Create, and the minimum
  // block must be a multiple of the page size); Internal when the reservation fails.
  static absl::StatusOr<std::unique_ptr<TieredPool>> Create(const TieredPoolOptions& options);

  TieredPool(const TieredPool&) = delete;
  TieredPool& operator=(const TieredPool&) = delete;
  ~TieredPool();

  // --- Persistent arena: lives as long as the pool. `alignment` is a power of two.
  absl::StatusOr<uint8_t*> AllocatePersistent(uint64_t bytes, uint64_t alignment = 64);

  // --- Expert pool. Blocks are addressed by offset; an offset stays valid until its block
  // is freed or moved (MoveExpert, or the Defragmenter, which reports the new offset).
  // ExpertData turns one into a pointer. A fresh block reads as zeros; only its first
  // `bytes`, rounded up to pages, are committed (readable).
  absl::StatusOr<Block> AllocateExpert(uint64_t bytes);
  // The block at `offset` (BuddyAllocator::AllocateAt): placement chosen by the caller, such
  // as next to the block of an expert used together with this one (memory/co_placement.h).
  absl::StatusOr<Block> AllocateExpertAt(uint64_t offset, uint64_t bytes);
  // Frees the block and gives its pages back. keep_pages: they stay committed and
  // resident ("warm") instead, and the next allocation of exactly this block takes them
  // as they are, without the page faults and kernel zeroing of fresh pages, holding the
  // freed expert's bytes, not zeros. An allocation or move that overlaps a warm block
  // otherwise gives its pages back first; ReleaseWarmExperts gives back every warm block
  // not reused. The expert cache frees its victims this way while it makes room for a
  // load, which in a full pool of same-size experts is the victim's own block.
  // Programmer errors as BuddyAllocator::Free.
  void FreeExpert(uint64_t offset, bool keep_pages = false);
  void ReleaseWarmExperts();
  uint64_t warm_expert_bytes() const;
  uint8_t* ExpertData(uint64_t offset) const { return expert_base_ + offset; }
  void PinExpert(uint64_t offset) { experts_.Pin(offset); }
  void UnpinExpert(uint64_t offset) { experts_.Unpin(offset); }
  // Moves the live unpinned block at `from` to the free range at `to` (memmove of its
  // committed bytes; commits them at `to`, gives back `from`). Errors as
  // BuddyAllocator::Relocate.
  absl::Status MoveExpert(uint64_t from, uint64_t to);
  const BuddyAllocator& expert_allocator() const { return experts_; }

  // --- Activation tier. Static allocations (the KV cache) come from its bottom and live
  // until ResetActivations; they may only be made while no ring allocation is live. Ring
  // allocations carry a lifetime tag (for example a step * layers + layer counter) that must
  // not decrease from one allocation to the next; ReleaseActivations(t) frees, oldest first,
  // every allocation tagged <= t, which is the ring's in-order release.
  absl::StatusOr<uint8_t*> AllocateActivationStatic(uint64_t bytes, uint64_t alignment = 64);
  absl::StatusOr<uint8_t*> AllocateActivation(uint64_t bytes, uint64_t lifetime,
                                              uint64_t alignment = 64);
  void ReleaseActivations(uint64_t lifetime);
  void ResetActivations();  // frees static and ring allocations
  size_t live_activations() const { return ring_.size(); }

  TierStats stats(Tier tier) const;
  // True when [p, p + bytes) lies in the tier's address range.
  bool Contains(Tier tier, const void* p, uint64_t bytes) const;
  uint64_t page_size() const { return page_; }

 private:
  struct RingEntry {
    uint64_t begin;  // ring position where this entry's span starts (the old head)
    uint64_t data;   // ring position of the bytes (0 after a wrap, else >= begin)
    uint64_t end;    // ring position just past the bytes: the next entry's begin
    uint64_t lifetime;
  };

  TieredPool(const TieredPoolOptions& options, uint64_t page, uint8_t* map, uint64_t map_bytes,
             BuddyAllocator experts);

  // Commits the first `bytes` (rounded up to pages) of a block the allocator just handed
  // out (freeing it on failure), or takes a warm block's pages as they are (committing
  // or giving back the difference).
  absl::StatusOr<Block> CommitExpert(absl::StatusOr<Block> block, uint64_t bytes);
  // Gives back the pages of every warm block that overlaps [offset, offset + size).
  void ReleaseWarmOverlapping(uint64_t offset, uint64_t size);
  absl::Status Commit(uint8_t* p, uint64_t bytes, Tier tier);
  void Decommit(uint8_t* p, uint64_t bytes, Tier tier);
  // Page reference counts over the activation tier: pages are committed when the first
  // allocation touching them arrives and given back when the last one is released.
  absl::Status RefActivationPages(uint64_t begin, uint64_t end);
  void UnrefActivationPages(uint64_t begin, uint64_t end);
  absl::Status ActivationExhausted(uint64_t bytes, std::string_view what) const;
  uint64_t RingFreeBytes() const;

  TierStats& tier_stats(Tier tier) { return stats_[static_cast<size_t>(tier)]; }
  void AddUsed(Tier tier, uint64_t bytes);
  void SubUsed(Tier tier, uint64_t bytes);
  // Sets the tier's gauges from its stats.
  void Publish(Tier tier);

  uint64_t page_;
  uint8_t* map_;
  uint64_t map_bytes_;

  uint8_t* persistent_base_;
  uint64_t persistent_capacity_;
  uint64_t persistent_top_ = 0;

  uint8_t* expert_base_;
  BuddyAllocator experts_;
  struct WarmBlock {
    uint64_t offset;
    uint64_t size;       // the block
    uint64_t committed;  // its committed bytes (from its start)
  };
  // Free expert blocks still committed, and each live block's committed bytes.
  std::vector<WarmBlock> warm_;
  absl::flat_hash_map<uint64_t, uint64_t> expert_committed_;

  uint8_t* activation_base_;
  uint64_t activation_capacity_;
  uint64_t static_top_ = 0;  // the ring is [static_top_, activation_capacity_)
  std::vector<std::pair<uint64_t, uint64_t>> static_ranges_;
  std::deque<RingEntry> ring_;
  uint64_t ring_head_ = 0;  // positions relative to static_top_
  uint64_t ring_tail_ = 0;
  bool ring_wrapped_ = false;  // live span is [tail, size) + [0, head)
  std::vector<uint32_t> activation_page_refs_;

  TierStats stats_[3];
  std::shared_ptr<telemetry::Registry> registry_;
  telemetry::PoolMetrics metrics_;
  telemetry::Gauge* used_gauges_[3];  // by Tier
};

}  // namespace moert::memory

#endif  // MOERT_MEMORY_TIERED_POOL_H_
