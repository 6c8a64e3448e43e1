// The expert cache: which routed experts are resident in the expert pool, loading the
// missing ones through the Loader and evicting to stay within the pool's byte budget.
//
// Residency: a bitmap per layer. Every resident expert is one block of the expert tier
// of a memory::TieredPool (a buddy allocator); the pages of its bytes are committed
// while it is resident and given back when it is evicted, so resident memory follows
// the budget. The budget counts an expert's charge, its bytes rounded up to pages
// (ChargeBytes), not its power-of-two block: the tier's address range is made large
// enough for the budget's worth of experts in blocks, and every allocation keeps the
// charged bytes within the limit (pool_bytes, or SetPoolLimit's). An OLMoE expert of
// 3.375 MiB takes a 4 MiB block but charges 3.375 MiB: 18% more experts per budget.
//
// Use: Acquire(layer, expert) makes the expert resident (a hit, or a miss that loads it
// synchronously through the loader thread; the wait is the stall time) and pins it;
// Release unpins it. A pinned expert is never evicted nor moved by defragmentation, so
// the weights Acquire returned stay valid until Release.
//
// Eviction (when an allocation fails): among resident unpinned experts, those used in
// the last `lazy_steps` steps stay (the lazy rule: an expert used at step s stays
// through steps s+1 .. s+lazy_steps) unless no other expert can be evicted; among the
// candidates, the one with the lowest recency-frequency score goes first, where the
// score is the LRFU sum over past uses of 2^-(age in steps / half_life) (ties: the least
// recently used, then the lower layer and expert). Order on an allocation failure:
// evict until enough bytes are free; when they are free but split, defragment (above
// the fragmentation threshold, moving only unpinned blocks); when nothing can be
// evicted and defragmentation cannot help: ResourceExhausted naming the budget.
//
// Prefetch (pipeline/prefetcher.h): Prefetch(layer, expert) starts an asynchronous
// load of an expert predicted to be needed soon. It takes a free block, or evicts an
// expert that is not pinned, not loading, not a prefetched expert still waiting for its
// use, and not used in the last `prefetch_protect_steps` steps; when none can go it
// backs off (counted) instead. The block is pinned while it loads (eviction and
// defragmentation keep off it). Completions are collected on the owner thread (every
// Prefetch, Acquire and BeginStep); a prefetched expert is resident and unpinned from
// then on, held by the lazy rule for its step like a used one. Acquire of an expert
// still loading waits for it (a load waited for; the wait is stall time); of one that
// finished in time, a hit and a load hidden. A failed prefetch leaves the expert not
// resident: Acquire then loads it synchronously and reports only that load's error.
// Acquire's own loads go to the front of the loader's queue.
//
// Co-placement (memory/co_placement.h; option co_placement): the cache learns, per
// layer, which experts are acquired in the same step (one forward pass of the layer: a
// token's top-k, or a batch's distinct experts) and places a newly loaded expert in the
// free buddy block of a resident partner (one used in at least half of its steps), so
// that the pair's blocks merge when both are evicted. It only picks among free blocks of
// the order needed, so it never changes which experts are resident nor their bytes.
// Layers of more than 256 experts are not tracked.
//
// Checksums: known from the file's metadata, else computed on the first load of an
// expert and verified on every later load of it. A failed load leaves the expert not
// resident and the cache usable.
//
// Deadlines (LoaderOptions::wait_deadline_ms): no wait on the loader thread outlasts
// it. Acquire and Preload then read the expert on the calling thread, into the same
// block (the late read on the loader thread is dropped, it never writes the block);
// Drain and BeginStep drop the load instead (the expert is not resident and its block
// is free at once). Both are counted (load_timeouts); the weights are the same bytes.
//
// Cancellation: CancelQueuedLoads drops every load not yet started (a cancelled
// generation's prefetches) without waiting; destruction drops them too and waits only
// for the read in progress.
//
// Not thread-safe: one thread at a time (the model's forward pass) uses the cache; the
// loader's I/O thread only touches the blocks being loaded.
#ifndef MOERT_EXPERTS_EXPERT_CACHE_H_
#define MOERT_EXPERTS_EXPERT_CACHE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/cpu/qmatmul.h"
#include "experts/expert_directory.h"
#include "experts/hot_set.h"
#include "experts/loader.h"
#include "memory/co_placement.h"
#include "memory/defragmenter.h"
#include "memory/tiered_pool.h"

namespace moert::experts {

struct ExpertCacheOptions {
  uint64_t pool_bytes = 0;  // the expert budget: the charges of the experts held at once
  // The expert tier's address range (0: room for pool_bytes' worth of the largest
  // experts, each in its block). Tests of placement set it to pool_bytes.
  uint64_t range_bytes = 0;
  uint64_t min_block_bytes = uint64_t{64} << 10;
  int lazy_steps = 2;
  // Prefetch never evicts an expert used in the last this many steps (the lazy window).
  int prefetch_protect_steps = 2;
  double frequency_half_life_steps = 8;
  LoaderOptions loader;
  memory::DefragmenterOptions defrag;
  // Place experts used together in buddy blocks (see the class comment). Off by default:
  // on the churn traces of moert-bench-memory (BM_ChurnBuddyDefrag/paired:1/co:1) it
  // changed fragmentation and defragmentation by under 0.3%, either way. The buddy
  // allocator's LIFO free lists already put experts loaded one after another in buddy
  // blocks, and with a full pool the defragmenter runs after the first eviction, before
  // the partner would be evicted too. Outputs are the same either way.
  bool co_placement = false;
  memory::CoUseOptions co_use;
  // Where the cache, its loader and its pool publish (null: a registry of the cache's
  // own).
  std::shared_ptr<telemetry::Registry> metrics = nullptr;
};

struct ExpertCacheStats {
  uint64_t hits = 0;            // Acquire of a resident expert
  uint64_t misses = 0;          // Acquire that had to load (counted once a block was found)
  uint64_t evictions = 0;
  uint64_t lazy_evictions = 0;  // evictions inside the lazy window (nothing else could go)
  uint64_t loads = 0;           // loads finished (misses and preloads), failed ones included
  uint64_t failed_loads = 0;
  uint64_t preloads = 0;        // experts loaded by Preload
  uint64_t bytes_loaded = 0;    // bytes read from the file (alignment padding included)
  uint64_t stall_ns = 0;        // time Acquire waited for loads
  // Prefetch (asynchronous loads of predicted experts).
  uint64_t prefetches = 0;         // loads Prefetch started
  uint64_t prefetch_backoffs = 0;  // Prefetch calls that found no block it may take
  uint64_t loads_hidden = 0;       // prefetched experts that were resident when acquired
  uint64_t loads_waited = 0;       // loads Acquire waited for (synchronous + late prefetches)
  uint64_t prefetch_late = 0;      // of those, prefetches still loading at Acquire
  uint64_t prefetch_unused = 0;    // prefetched experts evicted before any use
  uint64_t prefetch_failed = 0;    // prefetches whose load failed
  uint64_t prefetch_cancelled = 0; // prefetches dropped before their read started
  // Loads whose wait passed LoaderOptions::wait_deadline_ms: read by the waiting thread
  // itself (the same bytes), or, for prefetches no Acquire was waiting for (Drain), dropped.
  uint64_t load_timeouts = 0;
  // Streaming (StartLoad): a layer's misses loading while its other experts compute.
  uint64_t streamed = 0;           // loads StartLoad started (promoted prefetches not counted)
  uint64_t streamed_hidden = 0;    // of those, finished before their Acquire (misses
                                   // all the same: the layer had routed to them)
  uint64_t loads_in_flight = 0;    // now
  uint64_t defrag_runs = 0;
  uint64_t defrag_bytes_moved = 0;
  uint64_t co_placed = 0;  // blocks allocated as the buddy of a partner's block
  // The pool now.
  uint64_t pool_bytes = 0;       // the budget of the pool now (its limit): charged bytes
  uint64_t block_bytes = 0;      // the block one (largest) expert takes
  uint64_t charge_bytes = 0;     // what it charges: its bytes rounded up to pages
  uint64_t capacity_experts = 0; // experts of that size the pool holds at once
  uint64_t used_bytes = 0;       // charged by the resident and loading experts
  uint64_t free_bytes = 0;       // pool_bytes - used_bytes
  uint64_t largest_free_block = 0;
  double fragmentation = 0;
  uint64_t committed_bytes = 0;       // read/write pages of the tier now
  uint64_t peak_committed_bytes = 0;
  uint64_t resident_experts = 0;
  uint64_t pinned_experts = 0;

  double hit_rate() const {
    return hits + misses == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(hits + misses);
  }
};

class ExpertCache {
 public:
  // The pool block an expert of `runtime_bytes` takes: the smallest power of two
  // >= runtime_bytes and >= min_block_bytes.
  static uint64_t BlockBytes(uint64_t runtime_bytes, uint64_t min_block_bytes);
  // What the budget charges for an expert of `runtime_bytes`: the pages it commits.
  static uint64_t ChargeBytes(uint64_t runtime_bytes);

  // ResourceExhausted naming both numbers when the pool cannot hold even one expert;
  // errors of TieredPool::Create and Loader::Create otherwise.
  static absl::StatusOr<std::unique_ptr<ExpertCache>> Create(ExpertDirectory directory,
                                                             const ExpertCacheOptions& options);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  const ExpertDirectory& directory() const { return directory_; }

  // The step clock of the lazy rule and the recency scores: one step per forward pass
  // (a decode step, or one micro-batch of a prefill).
  void BeginStep();
  uint64_t step() const { return step_; }

  // Makes (layer, expert) resident and pins it; the weights stay valid until Release.
  // InvalidArgument for an expert outside the directory. A failed load (DataLoss naming
  // the layer, expert and file offset) or no room in the pool (ResourceExhausted naming
  // the budget) leaves the expert not resident and nothing pinned by this call.
  absl::StatusOr<backend::FfnView> Acquire(int layer, int expert);
  // Unpins what Acquire pinned.
  void Release(int layer, int expert);

  bool IsResident(int layer, int expert) const;
  bool IsPinned(int layer, int expert) const;
  // Bit e of word e / 64: expert e of `layer` is resident.
  const std::vector<uint64_t>& residency(int layer) const;
  uint64_t uses(int layer, int expert) const;
  // The pool offset of a resident (or loading) expert's block; nullopt otherwise.
  std::optional<uint64_t> BlockOffset(int layer, int expert) const;

  // Where a resident expert's weights are: the byte offset of its block in the expert
  // region, and a number that changes whenever the block's bytes are written anew (a
  // load, a defragmentation move), so a copy elsewhere (a device's view of the region)
  // knows when to refresh. nullopt when not resident.
  struct Placement {
    uint64_t offset = 0;
    uint64_t generation = 0;
  };
  std::optional<Placement> PlacementOf(int layer, int expert) const;
  // The pool's expert region: ExpertData(0) and its size in bytes. Every block lies in
  // it; its pages outside the resident blocks are not committed (not readable).
  uint8_t* expert_region() const;
  uint64_t expert_region_bytes() const;

  // Evicts every unpinned expert (tests; giving memory back when idle).
  void EvictAll();
  // Evicts the resident unpinned experts no Acquire has used (a hot-set preload not
  // needed yet); returns how many went.
  size_t EvictUnused();
  // Keeps the charged bytes at or below `bytes` from now on (rounded down to a charge,
  // at least one charge, at most pool_bytes): evicts unpinned experts down to it now, and
  // allocations evict before they pass it. The pool's memory budget (memory/budget.h)
  // sets it when KV caches or a trim take bytes from the pool. A pool's full size:
  // pool_bytes.
  void SetPoolLimit(uint64_t bytes);
  // Compacts the pool now (the degrade policy's defragment): moves unpinned blocks so the
  // largest free block grows, at most DefragmenterOptions::max_bytes_moved_per_call bytes.
  absl::Status Defragment();
  uint64_t pool_limit() const { return limit_bytes_; }

  // Starts loading (layer, expert) in the background (see the class comment).
  enum class PrefetchResult { kStarted, kPresent, kBackedOff, kInvalid };
  PrefetchResult Prefetch(int layer, int expert);
  // Whether (layer, expert) is being loaded by a prefetch.
  bool IsLoading(int layer, int expert) const;
  // Drops a prefetch of (layer, expert) whose read has not started (its layer routed
  // elsewhere): the block is freed. true when one was dropped.
  bool CancelPrefetch(int layer, int expert);
  // Streaming a layer's misses (the pipeline): starts the load of an expert needed now,
  // at the front of the loader's queue, evicting like Acquire but never waiting (an
  // expert a prefetch is loading is moved to the front instead). The block stays
  // pinned for the Acquire that follows: Acquire waits for the load if it has not
  // finished (a load waited for) or finds it done (streamed_hidden: hidden behind the
  // compute of the layer's other experts); both are misses. A promoted prefetch counts
  // as a prefetch: late if Acquire waits, hidden (a hit) if not. A failed load leaves the expert not
  // resident and Acquire loads it synchronously. An expert started and never acquired
  // is unpinned at the next BeginStep. false: nothing started (resident, invalid, or no
  // block without waiting): Acquire loads it synchronously.
  bool StartLoad(int layer, int expert);
  // Collects finished prefetches (never blocks).
  void Poll();
  // Waits for every prefetch in flight and collects it (each wait up to the loader's
  // deadline; one past it is dropped: that expert stays not resident).
  void Drain();
  // Drops every load still queued, prefetches and StartLoad's alike (a generation was
  // cancelled): their blocks are freed, and the read in progress, if any, finishes
  // later as usual. Never waits. Returns the count dropped.
  size_t CancelQueuedLoads();
  // Experts of the largest size the pool holds at once.
  uint64_t capacity_experts() const;

  // An expert hot update rewrote the file (renamed a new one over it) and changed only
  // the bytes of the experts `changed` ((layer, expert) pairs); `updated` is the new
  // file's directory. Between steps: finishes the loads in flight (read from the old
  // file), reads from the new file from now on (a new loader), takes `updated`'s
  // checksums and evicts the changed experts, so their next Acquire reads the new bytes;
  // every other resident expert stays (its bytes did not change). FailedPrecondition
  // naming why when it cannot: `updated` places experts elsewhere or in another layout,
  // a changed expert is pinned or outside the directory; Loader::Create's errors. On
  // error the cache and its loader are as they were.
  absl::Status SwitchToUpdatedFile(const ExpertDirectory& updated,
                                   std::span<const std::pair<int, int>> changed);

  // Loads the given experts in order while they fit without evicting anything (first
  // asking the kernel to read them ahead in buffered and mmap modes). Experts already
  // resident or outside the directory are skipped; a failed load is skipped too and its
  // error returned after the rest was tried. *loaded (may be null) gets the count.
  absl::Status Preload(std::span<const HotExpert> experts, size_t* loaded = nullptr);
  // The most used experts (uses > 0), most used first (ties: lower layer, expert), at
  // most `max` of them.
  std::vector<HotExpert> HotExperts(size_t max) const;

  ExpertCacheStats stats() const;
  Loader& loader() { return *loader_; }
  const Loader& loader() const { return *loader_; }

 private:
  struct Entry {
    bool resident = false;
    uint64_t offset = 0;
    uint32_t pins = 0;
    bool used = false;
    uint64_t last_use = 0;
    double crf = 0;  // LRFU score as of last_use
    uint64_t uses = 0;
    std::optional<uint64_t> checksum;
    bool loading = false;     // a prefetch is reading it into the block at `offset`
    bool prefetched = false;  // resident by a prefetch and not acquired since
    bool needed = false;      // loading (or loaded) by StartLoad, pinned for Acquire
    bool promoted = false;    // needed, and started as a prefetch
    uint64_t prefetch_step = 0;
    uint64_t generation = 0;  // Placement::generation
    Loader::Ticket ticket;
  };

  ExpertCache(ExpertDirectory directory, const ExpertCacheOptions& options);

  size_t Index(int layer, int expert) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(directory_.n_expert()) +
           static_cast<size_t>(expert);
  }
  absl::Status CheckExpert(int layer, int expert) const;
  backend::FfnView View(const ExpertInfo& info, const Entry& entry) const;
  double Score(const Entry& entry) const;
  void Touch(Entry& entry);
  // Whether loading `info` would take the charged bytes past limit_bytes_ (every
  // allocation checks: a miss, a prefetch, a preload).
  bool OverLimit(const ExpertInfo& info) const;
  // A block for `info`, evicting and defragmenting as the class comment says. The
  // victims' pages stay committed until the block is found (TieredPool's warm blocks), so
  // that a block that is a victim's own is reused without new page faults.
  // wait: when nothing can be evicted, wait for the prefetches in flight (else fail).
  absl::StatusOr<memory::Block> AllocateBlock(const ExpertInfo& info, bool wait = true);
  // keep_pages: the victim's block stays warm (TieredPool::FreeExpert).
  bool EvictOne(bool keep_pages = false);
  // Evicts one expert Prefetch may take (see the class comment); false: none.
  bool EvictOneForPrefetch(bool keep_pages = false);
  // Whether the lazy rule holds `entry` (used, or prefetched, in the window).
  bool InLazyWindow(const Entry& entry, int steps) const;
  // Finishes the prefetch of entry `index` (waits when it has not finished).
  void Collect(size_t index, OnDeadline on_deadline = OnDeadline::kReadHere);
  // Takes the load of entry `index` out of the loader's queue if it has not started
  // (frees its block); false when it has.
  bool DropQueued(size_t index);
  void Evict(size_t index, bool keep_pages = false);
  void MarkResident(size_t index, uint64_t offset);
  // Co-placement: adds `expert` to the group of (step, layer), first closing the previous
  // group into its layer's counts when this is another step or layer.
  void NoteUse(int layer, int expert);
  void CloseCoUseGroup();
  // The free buddy of a resident partner's block, allocated; nullopt when there is none.
  std::optional<memory::Block> AllocateNextToPartner(const ExpertInfo& info);
  void OnMove(uint64_t from, uint64_t to);
  // Time Acquire waited for a load: the stats' and the registry's.
  void AddStall(uint64_t ns);

  ExpertDirectory directory_;
  ExpertCacheOptions options_;
  std::shared_ptr<telemetry::Registry> registry_;
  telemetry::ExpertCacheMetrics metrics_;
  std::unique_ptr<memory::TieredPool> pool_;
  memory::Defragmenter defrag_;
  std::unique_ptr<Loader> loader_;
  std::vector<Entry> entries_;
  std::vector<std::vector<uint64_t>> residency_;
  absl::flat_hash_map<uint64_t, size_t> by_offset_;  // resident block offset -> entry
  uint64_t step_ = 0;
  uint64_t generation_ = 0;  // the last Placement::generation handed out
  uint64_t block_bytes_ = 0;
  uint64_t charge_bytes_ = 0;
  uint64_t limit_bytes_ = 0;       // SetPoolLimit's; options_.pool_bytes until then
  std::vector<size_t> in_flight_;  // entries a prefetch or StartLoad is loading
  std::vector<size_t> started_;    // entries StartLoad started this step
  ExpertCacheStats counters_;  // the counting fields only
  // Co-placement: per layer, made at the layer's first counted group.
  std::vector<std::unique_ptr<memory::CoUseCounts>> co_use_;
  int group_layer_ = -1;
  uint64_t group_step_ = 0;
  std::vector<int> group_;  // distinct experts acquired in (group_step_, group_layer_)
};

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_EXPERT_CACHE_H_
