// A8 activation quantization on NEON, byte-identical to the scalar reference:
// vmaxnmq keeps fmax's "a NaN loses" rule, d and 1/d are computed in scalar float as
// the reference does, and vcvtnq_s32_f32 rounds half to even like nearbyint (NaN to 0,
// the rest saturated), then a clamp to [-127, 127] saturates as the reference does.
// Built with +dotprod (the sum of the values is two sdots against ones).
#include <arm_neon.h>

#include "kernels/ukernel.h"

void moert_q8_quant_ukernel__neon(size_t k, const float* x, moert_a8_block* a) {
  const int8x16_t ones = vdupq_n_s8(1);
  const int32x4_t q_min = vdupq_n_s32(-127);
  const int32x4_t q_max = vdupq_n_s32(127);
  for (size_t b = 0; b < k / MOERT_QK; ++b, x += MOERT_QK) {
    float32x4_t v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) v[j] = vld1q_f32(x + 4 * j);
    float32x4_t m0 = vmaxnmq_f32(vabsq_f32(v[0]), vabsq_f32(v[1]));
    float32x4_t m1 = vmaxnmq_f32(vabsq_f32(v[2]), vabsq_f32(v[3]));
    float32x4_t m2 = vmaxnmq_f32(vabsq_f32(v[4]), vabsq_f32(v[5]));
    float32x4_t m3 = vmaxnmq_f32(vabsq_f32(v[6]), vabsq_f32(v[7]));
    m0 = vmaxnmq_f32(vmaxnmq_f32(m0, m1), vmaxnmq_f32(m2, m3));
    // The reference's amax starts at 0: a block of NaNs has amax 0, not NaN.
    const float amax = vmaxnmvq_f32(vmaxnmq_f32(m0, vdupq_n_f32(0.0f)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float32x4_t vid = vdupq_n_f32(id);
    int32x4_t q[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      q[j] = vmaxq_s32(vminq_s32(vcvtnq_s32_f32(vmulq_f32(v[j], vid)), q_max), q_min);
    }
    // Keep the low byte of each int32 (within [-127, 127]), as the reference's cast to
    // int8_t does.
    const int16x8_t h0 = vuzp1q_s16(vreinterpretq_s16_s32(q[0]), vreinterpretq_s16_s32(q[1]));
    const int16x8_t h1 = vuzp1q_s16(vreinterpretq_s16_s32(q[2]), vreinterpretq_s16_s32(q[3]));
    const int16x8_t h2 = vuzp1q_s16(vreinterpretq_s16_s32(q[4]), vreinterpretq_s16_s32(q[5]));
    const int16x8_t h3 = vuzp1q_s16(vreinterpretq_s16_s32(q[6]), vreinterpretq_s16_s32(q[7]));
    const int8x16_t lo = vuzp1q_s8(vreinterpretq_s8_s16(h0), vreinterpretq_s8_s16(h1));
    const int8x16_t hi = vuzp1q_s8(vreinterpretq_s8_s16(h2), vreinterpretq_s8_s16(h3));
    vst1q_s8(a[b].qs, lo);
    vst1q_s8(a[b].qs + 16, hi);
    a[b].d = d;
    a[b].s = vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, ones), hi, ones));
  }
}
