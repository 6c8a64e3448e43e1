// AVX2 + F16C KV widening (ukernel.h). vcvtph2ps is exact and quiets a NaN keeping its
// payload, as the scalar reference does; it does not consult MXCSR's denormal flags. A
// q8_0 block's 32 values are sign-extended 8 at a time, converted (exact) and multiplied
// by the block's scale: one rounding, as the reference's.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ukernel.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__avx2) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(a));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(b));
  }
  for (; i + 8 <= n; i += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(a));
  }
  if (i < n) {
    uint16_t tail[8] = {};
    std::memcpy(tail, src + 2 * i, (n - i) * 2);
    float out[8];
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tail))));
    std::memcpy(dst + i, out, (n - i) * sizeof(float));
  }
}

MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__avx2) {
  for (size_t b = 0; b < n; ++b, src += 34, dst += 32) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
    for (int j = 0; j < 32; j += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + j));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
      _mm256_storeu_ps(dst + j, _mm256_mul_ps(v, d));
    }
  }
}
