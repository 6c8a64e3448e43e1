// Locks a model's dense weights (everything outside the expert pool) into RAM with
// mlock, llama.cpp's --mlock: under memory pressure the kernel then never pages them
// out, so a phone's decode does not stall on re-reading them. Best effort, as in
// llama.cpp: a lock the system refuses (RLIMIT_MEMLOCK, no privilege) leaves the
// weights as they are and says why.
#ifndef MOERT_MODEL_WEIGHT_LOCK_H_
#define MOERT_MODEL_WEIGHT_LOCK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/graph.h"

namespace moert::model {

// The byte ranges of every dense weight `w` holds (matrices, packed matrices, vectors);
// the routed experts' matrices are empty with an expert pool, and skipped.
std::vector<std::pair<const void*, size_t>> DenseWeightRanges(const ModelWeights& w);

// Holds mlock on ranges; unlocks them when destroyed (before the weights are freed).
class WeightLock {
 public:
  WeightLock() = default;
  WeightLock(const WeightLock&) = delete;
  WeightLock& operator=(const WeightLock&) = delete;
  ~WeightLock();

  // Locks each range; stops at the first the system refuses, unlocking what it had
  // locked, and keeps the reason (error()).
  void Lock(std::vector<std::pair<const void*, size_t>> ranges);

  uint64_t locked_bytes() const { return locked_bytes_; }
  // Empty when every range is locked (or none was asked); else why not, with the
  // numbers: "mlock of 1048576 bytes failed: Cannot allocate memory (RLIMIT_MEMLOCK
  // 65536 bytes); the weights stay unlocked".
  const std::string& error() const { return error_; }

 private:
  void UnlockAll();

  std::vector<std::pair<const void*, size_t>> locked_;
  uint64_t locked_bytes_ = 0;
  std::string error_;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_WEIGHT_LOCK_H_
