// AArch64 NEON KV widening (ukernel.h). fcvtl is exact and, with FPCR.DN clear (Linux's
// default), quiets a NaN keeping its payload, as the scalar reference does; half
// subnormals convert exactly whatever FPCR.FZ says (FZ16 governs halves, and is clear).
// A q8_0 block's 32 values are widened to int32 8 at a time, converted (exact) and
// multiplied by the block's scale: one rounding, as the reference's.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/ukernel.h"
#include "kernels/ukernels-neon.h"

MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__neon) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(src + 2 * i));
    vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
  }
  if (i < n) {
    uint8_t tail[16] = {};
    std::memcpy(tail, src + 2 * i, (n - i) * 2);
    const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(tail));
    float out[8];
    vst1q_f32(out, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(out + 4, vcvt_high_f32_f16(h));
    std::memcpy(dst + i, out, (n - i) * sizeof(float));
  }
}

MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__neon) {
  for (size_t b = 0; b < n; ++b, src += 34, dst += 32) {
    uint8_t half[8] = {src[0], src[1]};
    const float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(half))), 0);
    for (int j = 0; j < 32; j += 16) {
      const int8x16_t q = vld1q_s8(reinterpret_cast<const int8_t*>(src + 2 + j));
      const int16x8_t lo = vmovl_s8(vget_low_s8(q));
      const int16x8_t hi = vmovl_high_s8(q);
      vst1q_f32(dst + j, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
      vst1q_f32(dst + j + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
      vst1q_f32(dst + j + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
      vst1q_f32(dst + j + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
    }
  }
}
