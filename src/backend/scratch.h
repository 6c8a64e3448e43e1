// Scratch buffers on a backend, one per slot, each grown on demand and reused across
// calls: a slot's buffer may move when it grows, so fetch a slot once for each use.
#ifndef MOERT_BACKEND_SCRATCH_H_
#define MOERT_BACKEND_SCRATCH_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "core/status.h"

namespace moert::backend {

class ScratchBuffers {
 public:
  ScratchBuffers(Backend& backend, int slots)
      : b_(backend), buffers_(static_cast<size_t>(slots)) {}

  // At least `bytes` in slot `slot` (its earlier content lost when it grows).
  absl::StatusOr<TensorRef> Get(int slot, size_t bytes) {
    std::unique_ptr<Buffer>& b = buffers_[static_cast<size_t>(slot)];
    if (b == nullptr || b->size() < bytes) {
      b.reset();
      MOERT_ASSIGN_OR_RETURN(b, b_.Allocate(std::max<size_t>(bytes, 256)));
    }
    return TensorRef(b);
  }

 private:
  Backend& b_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_SCRATCH_H_
