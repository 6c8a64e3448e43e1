// q4m GEMV on NEON dotprod: one activation row against 8-row W4M tiles, bit-identical
// to the scalar reference. Nibbles are at most 15, so they are valid int8 as they
// are: per row an and, a ushr and two sdots. The 4-lane partial sums of 4 rows reduce
// (vpaddq) to a row per lane; the float part adds the scale term, then the offset term
// (float)a.s * (m * a.d), as ukernel.h orders them.
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

// One activation row against tiles of 8 rows.
void Q4mGemv(size_t nc, size_t kb, const moert_a8_block* a, const moert_w4m_block* tile, float* c) {
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc_lo = vdupq_n_f32(0.0f);
    float32x4_t acc_hi = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w4m_block& blk = tile[b];
      const int8x16_t a_lo = vld1q_s8(a[b].qs);
      const int8x16_t a_hi = vld1q_s8(a[b].qs + 16);
      int32x4_t row[MOERT_NR];
#pragma GCC unroll 8
      for (int r = 0; r < MOERT_NR; ++r) {
        const uint8x16_t q = vld1q_u8(blk.qs[r]);
        row[r] = vdotq_s32(zero, vreinterpretq_s8_u8(vandq_u8(q, mask)), a_lo);
        row[r] = vdotq_s32(row[r], vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), a_hi);
      }
      float32x4_t d_lo, d_hi, m_lo, m_hi;
      neon::LoadFp16x8(blk.d, &d_lo, &d_hi);
      neon::LoadFp16x8(blk.m, &m_lo, &m_hi);
      const float32x4_t ad = vdupq_n_f32(a[b].d);
      const float32x4_t as = vdupq_n_f32(static_cast<float>(a[b].s));
      acc_lo = neon::AddBlock(acc_lo, neon::ReduceRows(row[0], row[1], row[2], row[3]),
                              vmulq_f32(d_lo, ad));
      acc_hi = neon::AddBlock(acc_hi, neon::ReduceRows(row[4], row[5], row[6], row[7]),
                              vmulq_f32(d_hi, ad));
      acc_lo = vaddq_f32(acc_lo, vmulq_f32(as, vmulq_f32(m_lo, ad)));
      acc_hi = vaddq_f32(acc_hi, vmulq_f32(as, vmulq_f32(m_hi, ad)));
    }
    neon::StoreTile(c + n0, neon::TileRows(nc, n0), acc_lo, acc_hi);
  }
}

}  // namespace

MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__neondot) {
  // m is 1 by contract; more rows would be computed one after another.
  for (size_t i = 0; i < m; ++i) {
    Q4mGemv(nc, kb, neon::ActivationRow(a, a_stride, i), static_cast<const moert_w4m_block*>(w),
            c + i * c_stride);
  }
}
