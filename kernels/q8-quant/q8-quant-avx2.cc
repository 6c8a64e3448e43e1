// AVX2 A8 activation quantization, bit-identical to the scalar reference (ukernel.h):
// amax with max(|x|, amax) (a NaN input is skipped, as std::fmax skips it), the same
// scalar d = amax / 127 and id = 1 / d, NaN products zeroed and the rest clamped to
// [-127, 127] as the reference does, then round half to even with cvtps2dq. The int32
// values are narrowed by their low byte (mask, then non-saturating packs), as the
// reference's static_cast<int8_t> narrows them.
#include <immintrin.h>

#include <cstdint>

#include "kernels/ukernel.h"
#include "kernels/ukernels-avx2.h"

void moert_q8_quant_ukernel__avx2(size_t k, const float* x, moert_a8_block* a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i low_byte = _mm256_set1_epi32(0xFF);
  const __m256 lo = _mm256_set1_ps(-127.0f);
  const __m256 hi = _mm256_set1_ps(127.0f);
  // The packs interleave the 4-byte groups of q[0..3] lane by lane; this puts them back.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t b = 0; b < k / MOERT_QK; ++b, x += MOERT_QK) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 8 * j);
      // max(abs, amax) returns amax when abs is NaN, as fmax(amax, abs) does.
      amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      __m256 p = _mm256_mul_ps(v[j], vid);
      p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));  // NaN -> 0
      q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(p, lo), hi));
      sum = _mm256_add_epi32(sum, q[j]);
      q[j] = _mm256_and_si256(q[j], low_byte);
    }
    const __m256i q01 = _mm256_packus_epi32(q[0], q[1]);
    const __m256i q23 = _mm256_packus_epi32(q[2], q[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(q01, q23), unshuffle);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a[b].qs), bytes);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 1, 1, 1)));
    a[b].d = d;
    a[b].s = _mm_cvtsi128_si32(s4);
  }
}
