// Scalar reference of A8 activation quantization (ukernel.h defines the rounding).
#include <cmath>

#include "kernels/ukernel.h"

void moert_q8_quant_ukernel__scalar(size_t k, const float* x, moert_a8_block* a) {
  for (size_t b = 0; b < k / MOERT_QK; ++b, x += MOERT_QK) {
    float amax = 0.0f;
    for (int j = 0; j < MOERT_QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < MOERT_QK; ++j) {
      // NaN quantizes to 0 and the rest saturates to [-127, 127] (ukernel.h): only
      // non-finite inputs and subnormal scales get there, and converting them to int
      // unsaturated is undefined. nearbyint rounds half to even in the default mode.
      const float v = x[j] * id;
      const float c = std::isnan(v) ? 0.0f : std::fmin(std::fmax(v, -127.0f), 127.0f);
      const int q = static_cast<int>(std::nearbyint(c));
      a[b].qs[j] = static_cast<int8_t>(q);
      s += q;
    }
    a[b].d = d;
    a[b].s = s;
  }
}
