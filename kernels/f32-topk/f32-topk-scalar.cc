// Scalar reference of f32 top-k (ukernel.h defines the order): k passes of argmax over
// the values not taken yet. O(n * k), written for obviousness, not speed: the ISA
// variants are checked against it.
#include <cassert>
#include <cmath>

#include "kernels/ukernel.h"

namespace {

// Whether value a ranks strictly above value b. The lower index wins a tie, which
// the strict comparison gives by scanning in index order and keeping the first best.
// +0.0 == -0.0 under `>` already; NaN ranks below every number.
bool RanksAbove(float a, float b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a > b;
}

}  // namespace

void moert_f32_topk_ukernel__scalar(size_t n, const float* x, size_t k, uint32_t* indices) {
  assert(k >= 1 && k <= n && n <= MOERT_TOPK_MAX_N);
  bool taken[MOERT_TOPK_MAX_N] = {};
  for (size_t r = 0; r < k; ++r) {
    size_t best = n;  // none yet
    for (size_t i = 0; i < n; ++i) {
      if (taken[i]) continue;
      if (best == n || RanksAbove(x[i], x[best])) best = i;
    }
    taken[best] = true;
    indices[r] = static_cast<uint32_t>(best);
  }
}
