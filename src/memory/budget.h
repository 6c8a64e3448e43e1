// The memory budget as a ledger shared by a model and every session on it: what is
// charged once (the weights outside the expert pool, scratch), the expert pool's limit,
// and one reservation per KV cache. A KV cache is reserved in full when it is made (its
// pages are committed as positions fill, but the budget holds the worst case), so the
// sum never passes the budget. A cache that does not fit either fails with
// ResourceExhausted naming the numbers or, with shrink_pool, takes the bytes from the
// expert pool down to its floor; the pool grows back, up to its size at load, as caches
// go. Trim (the app's or the device's memory pressure) caps the pool below that.
//
// The pool's limit is only a target here: the owner of the pool (the thread that runs
// the forward pass) reads pool_target() before each step and evicts down to it. Every
// call is thread-safe.
#ifndef MOERT_MEMORY_BUDGET_H_
#define MOERT_MEMORY_BUDGET_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace moert::memory {

struct BudgetOptions {
  uint64_t budget_bytes = 0;  // 0: no budget (every reservation fits; the ledger still counts)
  uint64_t fixed_bytes = 0;   // charged for as long as the ledger lives
  uint64_t pool_bytes = 0;    // the expert pool's size at load (0: no pool)
  uint64_t pool_floor_bytes = 0;  // the least shrink_pool and Trim leave it (<= pool_bytes)
  uint64_t pool_granule = 1;      // the pool shrinks and grows in these steps (a block)
  bool shrink_pool = false;       // a KV cache that does not fit takes bytes from the pool
};

struct BudgetStats {
  uint64_t budget_bytes = 0;
  uint64_t fixed_bytes = 0;
  uint64_t pool_bytes = 0;        // the pool's limit now (target)
  uint64_t pool_load_bytes = 0;   // its size at load
  uint64_t pool_floor_bytes = 0;
  uint64_t kv_bytes = 0;          // reserved by live KV caches
  uint64_t kv_caches = 0;
  uint64_t kv_refused = 0;        // reservations that failed
  uint64_t pool_shrinks = 0;      // reservations that took bytes from the pool
  uint64_t free_bytes = 0;        // budget - fixed - pool - kv (0 without a budget)
  double trim_fraction = 1;       // Trim's cap on the pool, as a fraction of its load size
};

class MemoryBudget {
 public:
  explicit MemoryBudget(const BudgetOptions& options);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Reserves `bytes` for a KV cache; `what` names it in the error ("a KV cache of 4096
  // positions"). ResourceExhausted naming the budget and what holds it when it does
  // not fit (with shrink_pool: not even with the pool at its floor).
  absl::Status ReserveKv(uint64_t bytes, const std::string& what);
  // Gives back a reservation ReserveKv made.
  void ReleaseKv(uint64_t bytes);

  // Caps the pool at `fraction` (in [0, 1]) of its size at load, never below the floor;
  // 1: no cap. The pool grows back to what the KV caches leave when the cap is lifted.
  void Trim(double fraction);

  // The pool's limit the owner should keep to: its load size, less what KV caches took
  // from it, capped by Trim, rounded down to the granule, never below the floor.
  uint64_t pool_target() const;
  BudgetStats stats() const;
  bool has_budget() const { return options_.budget_bytes > 0; }

 private:
  uint64_t PoolTargetLocked() const;

  const BudgetOptions options_;
  mutable std::mutex mutex_;
  uint64_t kv_bytes_ = 0;
  uint64_t kv_caches_ = 0;
  uint64_t kv_refused_ = 0;
  uint64_t pool_shrinks_ = 0;
  double trim_fraction_ = 1;
};

}  // namespace moert::memory

#endif  // MOERT_MEMORY_BUDGET_H_
