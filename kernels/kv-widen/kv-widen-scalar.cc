// Scalar reference of the KV widening kernels (ukernel.h): core::Fp16ToFloat rebuilds a
// half's bits as a float's with integer operations, so the result is the same under
// every floating-point mode (flush-to-zero included) and on every target.
#include <cstdint>
#include <cstring>

#include "core/fp16.h"
#include "kernels/ukernel.h"

namespace {

uint16_t LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

}  // namespace

MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__scalar) {
  for (size_t i = 0; i < n; ++i) dst[i] = moert::core::Fp16ToFloat(LoadHalf(src + 2 * i));
}

MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__scalar) {
  for (size_t b = 0; b < n; ++b, src += 34, dst += 32) {
    const float d = moert::core::Fp16ToFloat(LoadHalf(src));
    for (size_t j = 0; j < 32; ++j) {
      int8_t q;
      std::memcpy(&q, src + 2 + j, 1);
      dst[j] = static_cast<float>(q) * d;
    }
  }
}
