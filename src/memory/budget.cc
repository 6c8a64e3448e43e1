// The memory budget's ledger (budget.h).
#include "memory/budget.h"

#include <algorithm>
#include <cmath>

#include "core/strings.h"

namespace moert::memory {

MemoryBudget::MemoryBudget(const BudgetOptions& options) : options_(options) {}

absl::Status MemoryBudget::ReserveKv(uint64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t budget = options_.budget_bytes;
  if (budget > 0) {
    const uint64_t held = options_.fixed_bytes + kv_bytes_;
    const uint64_t with_pool = held + options_.pool_bytes + bytes;
    const uint64_t with_floor = held + options_.pool_floor_bytes + bytes;
    const bool fits = with_pool <= budget;
    if (!fits && !(options_.shrink_pool && with_floor <= budget)) {
      ++kv_refused_;
      const uint64_t pool = options_.shrink_pool ? options_.pool_floor_bytes : options_.pool_bytes;
      return absl::ResourceExhaustedError(StrCat(
          what, " needs ", bytes, " bytes, but the memory budget of ", budget, " bytes holds ",
          options_.fixed_bytes, " bytes of weights and scratch, ", kv_bytes_, " bytes of ",
          kv_caches_, " KV cache(s) and an expert pool of ", pool, " bytes",
          options_.shrink_pool ? " (its floor)" : "", ": ",
          budget > held + pool ? budget - held - pool : 0, " bytes free",
          options_.shrink_pool || options_.pool_bytes == 0
              ? std::string()
              : StrCat("; letting the pool shrink down to its floor of ",
                       options_.pool_floor_bytes, " bytes (shrink_pool) ",
                       with_floor <= budget ? "would make room" : "would not be enough")));
    }
    if (!fits) ++pool_shrinks_;
  }
  kv_bytes_ += bytes;
  ++kv_caches_;
  return absl::OkStatus();
}

void MemoryBudget::ReleaseKv(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  kv_bytes_ -= std::min(bytes, kv_bytes_);
  if (kv_caches_ > 0) --kv_caches_;
}

void MemoryBudget::Trim(double fraction) {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_fraction_ = std::isfinite(fraction) ? std::clamp(fraction, 0.0, 1.0) : 1.0;
}

uint64_t MemoryBudget::PoolTargetLocked() const {
  uint64_t target = options_.pool_bytes;
  if (options_.budget_bytes > 0) {
    const uint64_t held = options_.fixed_bytes + kv_bytes_;
    target = std::min(target, options_.budget_bytes > held ? options_.budget_bytes - held : 0);
  }
  if (trim_fraction_ < 1) {
    target = std::min(target, static_cast<uint64_t>(trim_fraction_ *
                                                    static_cast<double>(options_.pool_bytes)));
  }
  const uint64_t granule = std::max<uint64_t>(options_.pool_granule, 1);
  target = target / granule * granule;
  return std::max(target, std::min(options_.pool_floor_bytes, options_.pool_bytes));
}

uint64_t MemoryBudget::pool_target() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return PoolTargetLocked();
}

BudgetStats MemoryBudget::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  BudgetStats s;
  s.budget_bytes = options_.budget_bytes;
  s.fixed_bytes = options_.fixed_bytes;
  s.pool_bytes = PoolTargetLocked();
  s.pool_load_bytes = options_.pool_bytes;
  s.pool_floor_bytes = options_.pool_floor_bytes;
  s.kv_bytes = kv_bytes_;
  s.kv_caches = kv_caches_;
  s.kv_refused = kv_refused_;
  s.pool_shrinks = pool_shrinks_;
  const uint64_t held = s.fixed_bytes + s.pool_bytes + s.kv_bytes;
  s.free_bytes = s.budget_bytes > held ? s.budget_bytes - held : 0;
  s.trim_fraction = trim_fraction_;
  return s;
}

}  // namespace moert::memory
