// Owned packed matrices (see matrix.h).
#include "backend/matrix.h"

#include <cstdlib>
#include <new>

namespace moert::backend {

void PackedMatrix::Free::operator()(uint8_t* p) const { std::free(p); }

PackedMatrix::PackedMatrix(WeightFormat format, int64_t groups, int64_t rows, int64_t cols)
    : format_(format), groups_(groups), rows_(rows), cols_(cols),
      group_bytes_(PackedBytes(format, rows, cols)) {
  // Rounded up to the alignment, as aligned_alloc requires.
  const size_t total = (group_bytes_ * static_cast<size_t>(groups) + 63) / 64 * 64;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, total == 0 ? 64 : total));
  if (p == nullptr) throw std::bad_alloc();
  bytes_.reset(p);
}

}  // namespace moert::backend
