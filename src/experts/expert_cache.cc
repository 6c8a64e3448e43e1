// The expert cache: residency, pins, LRFU eviction with the lazy rule, loads through
// the loader thread, defragmentation of the pool.
#include "experts/expert_cache.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "core/status.h"
#include "core/strings.h"
#include "telemetry/platform.h"

namespace moert::experts {
namespace {

using telemetry::NowNs;

}  // namespace

uint64_t ExpertCache::BlockBytes(uint64_t runtime_bytes, uint64_t min_block_bytes) {
  return std::max(std::bit_ceil(std::max<uint64_t>(runtime_bytes, 1)), min_block_bytes);
}

uint64_t ExpertCache::ChargeBytes(uint64_t runtime_bytes) {
  return memory::PageBytes(runtime_bytes);
}

ExpertCache::ExpertCache(ExpertDirectory directory, const ExpertCacheOptions& options)
    : directory_(std::move(directory)),
      options_(options),
      registry_(telemetry::RegistryOrOwn(options.metrics)),
      metrics_(*registry_),
      defrag_(options.defrag) {}

ExpertCache::~ExpertCache() {
  // The loader thread may not outlive the pool it writes into. It drops the loads still
  // queued and waits only for the read in progress.
  loader_.reset();
}

absl::StatusOr<std::unique_ptr<ExpertCache>> ExpertCache::Create(
    ExpertDirectory directory, const ExpertCacheOptions& options) {
  std::unique_ptr<ExpertCache> cache(new ExpertCache(std::move(directory), options));
  const ExpertDirectory& dir = cache->directory_;
  cache->block_bytes_ = BlockBytes(dir.max_runtime_bytes(), options.min_block_bytes);
  cache->charge_bytes_ = std::min(ChargeBytes(dir.max_runtime_bytes()), cache->block_bytes_);
  if (options.pool_bytes < cache->charge_bytes_) {
    return absl::ResourceExhaustedError(
        StrCat("an expert pool of ", options.pool_bytes, " bytes cannot hold one expert of ",
               dir.max_runtime_bytes(), " bytes (", cache->charge_bytes_, " bytes of pages)"));
  }
  // Address space for as many of the largest experts as the budget's charges allow, each
  // in its block (unless given).
  const uint64_t experts = options.pool_bytes / cache->charge_bytes_;
  memory::TieredPoolOptions pool_options;
  pool_options.expert_bytes = options.range_bytes > 0
                                  ? options.range_bytes
                                  : std::max(options.pool_bytes, experts * cache->block_bytes_);
  pool_options.expert_min_block = options.min_block_bytes;
  pool_options.metrics = cache->registry_;
  MOERT_ASSIGN_OR_RETURN(cache->pool_, memory::TieredPool::Create(pool_options));
  cache->limit_bytes_ = options.pool_bytes;
  LoaderOptions loader_options = options.loader;
  loader_options.metrics = cache->registry_;
  MOERT_ASSIGN_OR_RETURN(cache->loader_, Loader::Create(cache->directory_, loader_options));
  cache->entries_.resize(size_t(dir.n_layer()) * size_t(dir.n_expert()));
  cache->residency_.assign(static_cast<size_t>(dir.n_layer()),
                           std::vector<uint64_t>(static_cast<size_t>(dir.n_expert() + 63) / 64, 0));
  for (int l = 0; l < dir.n_layer(); ++l) {
    if (!dir.has_layer(l)) continue;
    for (int e = 0; e < dir.n_expert(); ++e) {
      cache->entries_[cache->Index(l, e)].checksum = dir.stored_checksum(l, e);
    }
  }
  return cache;
}

absl::Status ExpertCache::CheckExpert(int layer, int expert) const {
  if (!directory_.has_layer(layer) || expert < 0 || expert >= directory_.n_expert()) {
    return absl::InvalidArgumentError(StrCat("expert (layer ", layer, ", expert ", expert,
                                             ") is not a routed expert of '", directory_.path(),
                                             "'"));
  }
  return absl::OkStatus();
}

backend::FfnView ExpertCache::View(const ExpertInfo& info, const Entry& entry) const {
  const uint8_t* base = pool_->ExpertData(entry.offset);
  const auto part = [&](ExpertPartKind kind) {
    const ExpertPart& p = info.parts[static_cast<size_t>(kind)];
    return backend::PackedView{p.format, p.rows, p.cols, base + p.block_offset};
  };
  return {part(ExpertPartKind::kGate), part(ExpertPartKind::kUp), part(ExpertPartKind::kDown)};
}

double ExpertCache::Score(const Entry& entry) const {
  if (!entry.used) return 0.0;
  const double age = static_cast<double>(step_ - entry.last_use);
  return entry.crf * std::exp2(-age / options_.frequency_half_life_steps);
}

void ExpertCache::Touch(Entry& entry) {
  entry.crf = Score(entry) + 1.0;
  entry.used = true;
  entry.last_use = step_;
  ++entry.uses;
}

void ExpertCache::MarkResident(size_t index, uint64_t offset) {
  Entry& entry = entries_[index];
  entry.resident = true;
  entry.offset = offset;
  entry.generation = ++generation_;
  by_offset_[offset] = index;
  const size_t n = static_cast<size_t>(directory_.n_expert());
  residency_[index / n][(index % n) / 64] |= uint64_t{1} << ((index % n) % 64);
}

void ExpertCache::Evict(size_t index, bool keep_pages) {
  Entry& entry = entries_[index];
  if (entry.prefetched) {
    ++counters_.prefetch_unused;
    entry.prefetched = false;
  }
  pool_->FreeExpert(entry.offset, keep_pages);
  by_offset_.erase(entry.offset);
  entry.resident = false;
  const size_t n = static_cast<size_t>(directory_.n_expert());
  residency_[index / n][(index % n) / 64] &= ~(uint64_t{1} << ((index % n) % 64));
  ++counters_.evictions;
}

bool ExpertCache::InLazyWindow(const Entry& e, int steps) const {
  const uint64_t window = static_cast<uint64_t>(std::max(0, steps));
  return (e.used && step_ - e.last_use <= window) ||
         (e.prefetched && step_ - e.prefetch_step <= window);
}

bool ExpertCache::EvictOneForPrefetch(bool keep_pages) {
  size_t best = entries_.size();
  std::tuple<double, uint64_t, size_t> best_key{};
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.resident || e.pins > 0 || e.prefetched) continue;
    if (InLazyWindow(e, options_.prefetch_protect_steps)) continue;
    const std::tuple<double, uint64_t, size_t> key{Score(e), e.used ? e.last_use : 0, i};
    if (best == entries_.size() || key < best_key) {
      best = i;
      best_key = key;
    }
  }
  if (best == entries_.size()) return false;
  Evict(best, keep_pages);
  return true;
}

bool ExpertCache::EvictOne(bool keep_pages) {
  // Two candidate sets: outside the lazy window, and (only if that one is empty) inside.
  size_t best = entries_.size();
  bool best_lazy = true;
  std::tuple<double, uint64_t, size_t> best_key{};
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.resident || e.pins > 0) continue;
    const bool lazy = InLazyWindow(e, options_.lazy_steps);
    const std::tuple<double, uint64_t, size_t> key{Score(e), e.used ? e.last_use : 0, i};
    if (best == entries_.size() || (best_lazy && !lazy) || (lazy == best_lazy && key < best_key)) {
      best = i;
      best_lazy = lazy;
      best_key = key;
    }
  }
  if (best == entries_.size()) return false;
  if (best_lazy) ++counters_.lazy_evictions;
  Evict(best, keep_pages);
  return true;
}

void ExpertCache::OnMove(uint64_t from, uint64_t to) {
  auto it = by_offset_.find(from);
  if (it == by_offset_.end()) return;  // not one of ours: cannot happen
  const size_t index = it->second;
  by_offset_.erase(it);
  by_offset_[to] = index;
  entries_[index].offset = to;
  entries_[index].generation = ++generation_;
}

void ExpertCache::NoteUse(int layer, int expert) {
  if (!options_.co_placement || directory_.n_expert() > memory::CoUseCounts::kMaxItems) return;
  if (layer != group_layer_ || step_ != group_step_) {
    CloseCoUseGroup();
    group_layer_ = layer;
    group_step_ = step_;
  }
  if (std::find(group_.begin(), group_.end(), expert) == group_.end()) group_.push_back(expert);
}

void ExpertCache::CloseCoUseGroup() {
  if (group_layer_ >= 0 && !group_.empty()) {
    co_use_.resize(static_cast<size_t>(directory_.n_layer()));
    std::unique_ptr<memory::CoUseCounts>& counts = co_use_[static_cast<size_t>(group_layer_)];
    if (counts == nullptr) {
      counts = std::make_unique<memory::CoUseCounts>(directory_.n_expert(), options_.co_use);
    }
    counts->AddGroup(group_);
  }
  group_.clear();
}

std::optional<memory::Block> ExpertCache::AllocateNextToPartner(const ExpertInfo& info) {
  if (!options_.co_placement || static_cast<size_t>(info.layer) >= co_use_.size() ||
      co_use_[static_cast<size_t>(info.layer)] == nullptr) {
    return std::nullopt;
  }
  std::vector<uint64_t> offsets;
  for (int partner : co_use_[static_cast<size_t>(info.layer)]->Partners(info.expert)) {
    const Entry& e = entries_[Index(info.layer, partner)];
    if (e.resident || e.loading) offsets.push_back(e.offset);
  }
  const std::optional<uint64_t> at =
      memory::BuddyOfPartner(pool_->expert_allocator(), info.runtime_bytes, offsets);
  if (!at) return std::nullopt;
  // A failure here (committing the pages) is left to the ordinary path to report.
  absl::StatusOr<memory::Block> block = pool_->AllocateExpertAt(*at, info.runtime_bytes);
  if (!block.ok()) return std::nullopt;
  ++counters_.co_placed;
  return *block;
}

absl::StatusOr<memory::Block> ExpertCache::AllocateBlock(const ExpertInfo& info, bool wait) {
  // The victims' blocks that were not reused go back on the way out.
  const auto release_warm = absl::MakeCleanup([this] { pool_->ReleaseWarmExperts(); });
  const uint64_t need = BlockBytes(info.runtime_bytes, options_.min_block_bytes);
  while (true) {
    // The charged bytes must stay within the limit (the budget, or SetPoolLimit's): room
    // is made the same way as in a full range.
    const bool over_limit = OverLimit(info);
    if (!over_limit) {
      if (std::optional<memory::Block> near = AllocateNextToPartner(info)) return *near;
      absl::StatusOr<memory::Block> block = defrag_.AllocateExpert(
          *pool_, info.runtime_bytes,
          [this](uint64_t from, uint64_t to, uint64_t) { OnMove(from, to); });
      if (block.ok() || !absl::IsResourceExhausted(block.status())) return block;
    }
    if (EvictOne(/*keep_pages=*/true)) continue;
    if (wait && !in_flight_.empty()) {
      // Prefetched blocks are pinned while they load: wait, then they may go.
      Drain();
      continue;
    }
    if (over_limit) {
      return absl::ResourceExhaustedError(StrCat(
          "the expert pool, limited to ", limit_bytes_,
          " bytes (memory budget), cannot hold layer ", info.layer, ", expert ", info.expert, " (",
          ChargeBytes(info.runtime_bytes), " bytes of pages): ",
          pool_->stats(memory::Tier::kExpert).charged, " bytes in use and nothing else to evict"));
    }
    const memory::BuddyStats s = pool_->expert_allocator().stats();
    return absl::ResourceExhaustedError(
        StrCat("the expert pool's range of ", s.pool_bytes, " bytes cannot hold layer ", info.layer,
               ", expert ", info.expert, " (", info.runtime_bytes, " bytes, a block of ", need,
               "): ", s.free_bytes, " bytes free, largest free block ", s.largest_free_block, ", ",
               s.pinned_blocks, " experts pinned and nothing else to evict"));
  }
}

void ExpertCache::AddStall(uint64_t ns) {
  counters_.stall_ns += ns;
  metrics_.stall_ns.Increment(ns);
}

absl::StatusOr<backend::FfnView> ExpertCache::Acquire(int layer, int expert) {
  MOERT_RETURN_IF_ERROR(CheckExpert(layer, expert));
  NoteUse(layer, expert);
  const size_t index = Index(layer, expert);
  const ExpertInfo& info = directory_.info(layer, expert);
  Entry& entry = entries_[index];
  Poll();
  if (entry.loading) {
    // A prefetch or StartLoad that has not finished: wait for it rather than read twice.
    const uint64_t start = NowNs();
    const bool needed = entry.needed;
    const bool promoted = entry.promoted;
    Collect(index);
    AddStall(NowNs() - start);
    if (entry.resident) {
      ++counters_.misses;
      metrics_.miss.Increment();
      ++counters_.loads_waited;
      if (!needed || promoted) ++counters_.prefetch_late;
      if (needed) {
        entry.needed = false;  // StartLoad's pin is this Acquire's
        entry.promoted = false;
      } else {
        ++entry.pins;
        pool_->PinExpert(entry.offset);
      }
      entry.prefetched = false;
      Touch(entry);
      return View(info, entry);
    }
    // The load failed: a synchronous load below.
  }
  if (entry.resident && entry.needed) {
    // StartLoad's load finished while the layer's other experts computed.
    if (entry.promoted) {
      ++counters_.hits;  // a prefetch in time for the compute
      ++counters_.loads_hidden;
      metrics_.prefetched.Increment();
    } else {
      ++counters_.misses;
      ++counters_.streamed_hidden;
      metrics_.miss.Increment();
    }
    entry.needed = false;  // its pin is this Acquire's
    entry.promoted = false;
    Touch(entry);
    return View(info, entry);
  }
  if (entry.resident) {
    ++counters_.hits;
    if (entry.prefetched) {
      ++counters_.loads_hidden;
      entry.prefetched = false;
      metrics_.prefetched.Increment();
    } else {
      metrics_.hit.Increment();
    }
    Touch(entry);
    ++entry.pins;
    pool_->PinExpert(entry.offset);
    return View(info, entry);
  }
  MOERT_ASSIGN_OR_RETURN(const memory::Block block, AllocateBlock(info));
  ++counters_.misses;
  ++counters_.loads_waited;
  metrics_.miss.Increment();
  pool_->PinExpert(block.offset);  // the defragmenter keeps off a block being loaded
  const uint64_t start = NowNs();
  const Loader::Ticket ticket =
      loader_->Submit(info, pool_->ExpertData(block.offset), entry.checksum, /*urgent=*/true);
  LoadResult result = loader_->Wait(ticket);
  AddStall(NowNs() - start);
  if (result.timed_out) ++counters_.load_timeouts;
  ++counters_.loads;
  counters_.bytes_loaded += result.bytes_read;
  if (!result.status.ok()) {
    ++counters_.failed_loads;
    pool_->UnpinExpert(block.offset);
    pool_->FreeExpert(block.offset);
    return result.status;
  }
  if (!entry.checksum) entry.checksum = result.checksum;
  MarkResident(index, block.offset);
  entry.pins = 1;
  Touch(entry);
  return View(info, entry);
}

void ExpertCache::Release(int layer, int expert) {
  if (!CheckExpert(layer, expert).ok()) return;
  Entry& entry = entries_[Index(layer, expert)];
  if (!entry.resident || entry.pins == 0) return;
  --entry.pins;
  pool_->UnpinExpert(entry.offset);
}

ExpertCache::PrefetchResult ExpertCache::Prefetch(int layer, int expert) {
  if (!CheckExpert(layer, expert).ok()) return PrefetchResult::kInvalid;
  Poll();
  const size_t index = Index(layer, expert);
  Entry& entry = entries_[index];
  if (entry.resident || entry.loading) return PrefetchResult::kPresent;
  // A full queue would block the compute thread: back off instead.
  if (loader_->queued() >= loader_->queue_capacity()) {
    ++counters_.prefetch_backoffs;
    return PrefetchResult::kBackedOff;
  }
  const ExpertInfo& info = directory_.info(layer, expert);
  absl::StatusOr<memory::Block> block;
  // The victims' blocks that were not reused go back on the way out.
  const auto release_warm = absl::MakeCleanup([this] { pool_->ReleaseWarmExperts(); });
  while (true) {
    // A prefetch keeps to SetPoolLimit's limit as a miss does (AllocateBlock): room
    // under it is made by eviction, or the prefetch backs off.
    if (!OverLimit(info)) {
      if (std::optional<memory::Block> near = AllocateNextToPartner(info)) {
        block = *near;
        break;
      }
      block = pool_->AllocateExpert(info.runtime_bytes);
      if (block.ok()) break;
      if (!absl::IsResourceExhausted(block.status())) {
        ++counters_.prefetch_backoffs;
        return PrefetchResult::kBackedOff;
      }
    }
    if (!EvictOneForPrefetch(/*keep_pages=*/true)) {
      ++counters_.prefetch_backoffs;
      return PrefetchResult::kBackedOff;
    }
  }
  pool_->PinExpert(block->offset);
  entry.loading = true;
  entry.offset = block->offset;
  entry.ticket = loader_->Submit(info, pool_->ExpertData(block->offset), entry.checksum);
  in_flight_.push_back(index);
  ++counters_.prefetches;
  return PrefetchResult::kStarted;
}

bool ExpertCache::IsLoading(int layer, int expert) const {
  return CheckExpert(layer, expert).ok() && entries_[Index(layer, expert)].loading;
}

void ExpertCache::Collect(size_t index, OnDeadline on_deadline) {
  Entry& entry = entries_[index];
  LoadResult result = loader_->Wait(entry.ticket, on_deadline);
  entry.ticket.reset();
  entry.loading = false;
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), index));
  if (result.timed_out) ++counters_.load_timeouts;
  const bool given_up = result.timed_out && on_deadline == OnDeadline::kGiveUp;
  if (!given_up) ++counters_.loads;
  counters_.bytes_loaded += result.bytes_read;
  if (!result.status.ok()) {
    if (!given_up) ++counters_.failed_loads;
    if (!given_up && (!entry.needed || entry.promoted)) ++counters_.prefetch_failed;
    entry.needed = false;
    entry.promoted = false;
    pool_->UnpinExpert(entry.offset);
    pool_->FreeExpert(entry.offset);
    return;
  }
  if (!entry.checksum) entry.checksum = result.checksum;
  MarkResident(index, entry.offset);
  if (entry.needed) {
    entry.pins = 1;  // held for the Acquire that follows (the block stays pinned)
    return;
  }
  pool_->UnpinExpert(entry.offset);
  entry.prefetched = true;
  entry.prefetch_step = step_;
}

bool ExpertCache::CancelPrefetch(int layer, int expert) {
  if (!CheckExpert(layer, expert).ok()) return false;
  const size_t index = Index(layer, expert);
  Entry& entry = entries_[index];
  if (!entry.loading || entry.needed) return false;
  return DropQueued(index);
}

bool ExpertCache::DropQueued(size_t index) {
  Entry& entry = entries_[index];
  if (!loader_->Cancel(entry.ticket)) return false;
  entry.ticket.reset();
  entry.loading = false;
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), index));
  pool_->UnpinExpert(entry.offset);
  pool_->FreeExpert(entry.offset);
  if (entry.needed) {
    entry.needed = false;  // a StartLoad whose Acquire never came (a failed forward)
    entry.promoted = false;
  } else {
    ++counters_.prefetch_cancelled;
  }
  return true;
}

size_t ExpertCache::CancelQueuedLoads() {
  size_t dropped = 0;
  for (size_t i = 0; i < in_flight_.size();) {
    if (DropQueued(in_flight_[i])) {
      ++dropped;  // erased in_flight_[i]
    } else {
      ++i;
    }
  }
  return dropped;
}

bool ExpertCache::StartLoad(int layer, int expert) {
  if (!CheckExpert(layer, expert).ok()) return false;
  Poll();
  const size_t index = Index(layer, expert);
  Entry& entry = entries_[index];
  if (entry.resident || entry.needed) return false;
  if (entry.loading) {  // a prefetch: first in line now
    loader_->Promote(entry.ticket);
    entry.promoted = true;
  } else {
    const ExpertInfo& info = directory_.info(layer, expert);
    absl::StatusOr<memory::Block> block = AllocateBlock(info, /*wait=*/false);
    if (!block.ok()) return false;
    pool_->PinExpert(block->offset);  // the defragmenter keeps off a block being loaded
    entry.loading = true;
    entry.offset = block->offset;
    entry.ticket = loader_->Submit(info, pool_->ExpertData(block->offset), entry.checksum,
                                   /*urgent=*/true);
    in_flight_.push_back(index);
    ++counters_.streamed;
  }
  entry.needed = true;
  started_.push_back(index);
  return true;
}

void ExpertCache::BeginStep() {
  ++step_;
  Poll();
  // Experts StartLoad loaded that no Acquire took (a forward pass that failed part-way).
  for (size_t index : started_) {
    Entry& entry = entries_[index];
    if (!entry.needed) continue;
    if (entry.loading) Collect(index, OnDeadline::kGiveUp);
    if (entry.needed && entry.resident) {
      entry.pins = 0;
      pool_->UnpinExpert(entry.offset);
    }
    entry.needed = false;
    entry.promoted = false;
  }
  started_.clear();
}

void ExpertCache::Poll() {
  for (size_t i = 0; i < in_flight_.size();) {
    const size_t index = in_flight_[i];
    if (loader_->Done(entries_[index].ticket)) {
      Collect(index);  // erases in_flight_[i]
    } else {
      ++i;
    }
  }
}

void ExpertCache::Drain() {
  // Nobody needs these bytes now: past the deadline a load is dropped, not read here.
  while (!in_flight_.empty()) Collect(in_flight_.front(), OnDeadline::kGiveUp);
}

absl::Status ExpertCache::SwitchToUpdatedFile(const ExpertDirectory& updated,
                                               std::span<const std::pair<int, int>> changed) {
  if (const std::string why = directory_.LayoutDifference(updated); !why.empty()) {
    return absl::FailedPreconditionError(
        StrCat(directory_.path(), ": the updated file cannot be read in place: ", why));
  }
  for (const auto& [layer, expert] : changed) {
    MOERT_RETURN_IF_ERROR(CheckExpert(layer, expert));
    if (entries_[Index(layer, expert)].pins > 0) {
      return absl::FailedPreconditionError(StrCat("expert ", expert, " of layer ", layer,
                                                  " is in use: it cannot be replaced now"));
    }
  }
  // The loads in flight read the old file, whose bytes the new one shares but for the
  // changed experts, which are evicted below.
  CancelQueuedLoads();
  Drain();
  LoaderOptions loader_options = options_.loader;
  loader_options.metrics = registry_;
  // The directory's path now names the new file; the old loader keeps the old one open
  // until it goes.
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader,
                         Loader::Create(directory_, loader_options));
  loader_.swap(loader);
  loader.reset();
  directory_.AdoptChecksums(updated);
  for (const auto& [layer, expert] : changed) {
    const size_t index = Index(layer, expert);
    Entry& entry = entries_[index];
    if (entry.resident) Evict(index);
    entry.checksum = directory_.stored_checksum(layer, expert);  // nullopt: taken at load
  }
  return absl::OkStatus();
}

uint64_t ExpertCache::capacity_experts() const { return limit_bytes_ / charge_bytes_; }

bool ExpertCache::IsResident(int layer, int expert) const {
  return CheckExpert(layer, expert).ok() && entries_[Index(layer, expert)].resident;
}

bool ExpertCache::IsPinned(int layer, int expert) const {
  return CheckExpert(layer, expert).ok() && entries_[Index(layer, expert)].pins > 0;
}

const std::vector<uint64_t>& ExpertCache::residency(int layer) const {
  return residency_[static_cast<size_t>(layer)];
}

uint64_t ExpertCache::uses(int layer, int expert) const {
  return CheckExpert(layer, expert).ok() ? entries_[Index(layer, expert)].uses : 0;
}

std::optional<uint64_t> ExpertCache::BlockOffset(int layer, int expert) const {
  if (!CheckExpert(layer, expert).ok()) return std::nullopt;
  const Entry& e = entries_[Index(layer, expert)];
  if (!e.resident && !e.loading) return std::nullopt;
  return e.offset;
}

std::optional<ExpertCache::Placement> ExpertCache::PlacementOf(int layer, int expert) const {
  if (!CheckExpert(layer, expert).ok()) return std::nullopt;
  const Entry& e = entries_[Index(layer, expert)];
  if (!e.resident) return std::nullopt;
  return Placement{e.offset, e.generation};
}

uint8_t* ExpertCache::expert_region() const { return pool_->ExpertData(0); }

uint64_t ExpertCache::expert_region_bytes() const {
  return pool_->expert_allocator().stats().pool_bytes;
}

void ExpertCache::EvictAll() {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].resident && entries_[i].pins == 0) Evict(i);
  }
}

size_t ExpertCache::EvictUnused() {
  size_t evicted = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.resident && e.pins == 0 && e.uses == 0) {
      Evict(i);
      ++evicted;
    }
  }
  return evicted;
}

absl::Status ExpertCache::Defragment() {
  return defrag_.Compact(*pool_,
                         [this](uint64_t from, uint64_t to, uint64_t) { OnMove(from, to); });
}

bool ExpertCache::OverLimit(const ExpertInfo& info) const {
  return pool_->stats(memory::Tier::kExpert).charged + ChargeBytes(info.runtime_bytes) >
         limit_bytes_;
}

void ExpertCache::SetPoolLimit(uint64_t bytes) {
  limit_bytes_ = std::clamp(bytes / charge_bytes_ * charge_bytes_, charge_bytes_,
                            std::max(options_.pool_bytes, charge_bytes_));
  while (pool_->stats(memory::Tier::kExpert).charged > limit_bytes_ && EvictOne()) {
  }
}

absl::Status ExpertCache::Preload(std::span<const HotExpert> experts, size_t* loaded) {
  if (loaded != nullptr) *loaded = 0;
  std::vector<const HotExpert*> wanted;
  for (const HotExpert& e : experts) {
    if (CheckExpert(e.layer, e.expert).ok() && !entries_[Index(e.layer, e.expert)].resident &&
        !entries_[Index(e.layer, e.expert)].loading) {
      wanted.push_back(&e);
    }
  }
  for (const HotExpert* e : wanted) loader_->AdviseWillNeed(directory_.info(e->layer, e->expert));
  struct Pending {
    size_t index;
    uint64_t offset;
    Loader::Ticket ticket;
  };
  std::vector<Pending> pending;
  for (const HotExpert* e : wanted) {
    const size_t index = Index(e->layer, e->expert);
    if (entries_[index].resident) continue;  // listed twice
    bool queued = false;
    for (const Pending& p : pending) queued = queued || p.index == index;
    if (queued) continue;
    const ExpertInfo& info = directory_.info(e->layer, e->expert);
    if (OverLimit(info)) break;  // at the memory budget's limit: the rest stays on disk
    absl::StatusOr<memory::Block> block = pool_->AllocateExpert(info.runtime_bytes);
    if (!block.ok()) break;  // full: the rest stays on disk
    pool_->PinExpert(block->offset);
    pending.push_back(
        {index, block->offset,
         loader_->Submit(info, pool_->ExpertData(block->offset), entries_[index].checksum)});
  }
  absl::Status first_error;
  for (Pending& p : pending) {
    LoadResult result = loader_->Wait(p.ticket);
    if (result.timed_out) ++counters_.load_timeouts;
    ++counters_.loads;
    counters_.bytes_loaded += result.bytes_read;
    pool_->UnpinExpert(p.offset);
    if (!result.status.ok()) {
      ++counters_.failed_loads;
      pool_->FreeExpert(p.offset);
      if (first_error.ok()) first_error = result.status;
      continue;
    }
    Entry& entry = entries_[p.index];
    if (!entry.checksum) entry.checksum = result.checksum;
    MarkResident(p.index, p.offset);
    ++counters_.preloads;
    if (loaded != nullptr) ++*loaded;
  }
  return first_error;
}

std::vector<HotExpert> ExpertCache::HotExperts(size_t max) const {
  std::vector<HotExpert> hot;
  for (int l = 0; l < directory_.n_layer(); ++l) {
    if (!directory_.has_layer(l)) continue;
    for (int e = 0; e < directory_.n_expert(); ++e) {
      const uint64_t uses = entries_[Index(l, e)].uses;
      if (uses > 0) hot.push_back({l, e, uses});
    }
  }
  std::stable_sort(hot.begin(), hot.end(),
                   [](const HotExpert& a, const HotExpert& b) { return a.uses > b.uses; });
  if (hot.size() > max) hot.resize(max);
  return hot;
}

ExpertCacheStats ExpertCache::stats() const {
  ExpertCacheStats s = counters_;
  const memory::DefragmenterStats& d = defrag_.stats();
  s.defrag_runs = d.runs;
  s.defrag_bytes_moved = d.bytes_moved;
  const memory::BuddyStats b = pool_->expert_allocator().stats();
  s.pool_bytes = limit_bytes_;
  s.block_bytes = block_bytes_;
  s.charge_bytes = charge_bytes_;
  s.capacity_experts = limit_bytes_ / charge_bytes_;
  const uint64_t charged = pool_->stats(memory::Tier::kExpert).charged;
  s.used_bytes = charged;
  s.free_bytes = limit_bytes_ > charged ? limit_bytes_ - charged : 0;
  s.largest_free_block = b.largest_free_block;
  s.fragmentation = b.fragmentation;
  const memory::TierStats t = pool_->stats(memory::Tier::kExpert);
  s.committed_bytes = t.committed;
  s.peak_committed_bytes = t.peak_committed;
  s.resident_experts = by_offset_.size();
  s.loads_in_flight = in_flight_.size();
  for (const Entry& e : entries_) s.pinned_experts += e.resident && e.pins > 0 ? 1 : 0;
  return s;
}

}  // namespace moert::experts
