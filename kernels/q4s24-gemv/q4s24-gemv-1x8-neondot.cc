// q4s24 (2:4 sparse) GEMV on NEON dotprod: one activation row against 8-row W4S24
// tiles, bit-identical to the scalar reference. Rows go in pairs (neon-qgemm.h,
// W4S24Unpacker): the 3-bit pair codes become vqtbl1q indices that gather each kept
// value's activation from its half block, so one sdot per half covers two rows (16
// multiply-adds per row and block, half of W4's). A pair's sums sit in lanes
// [r, r, r+1, r+1], so one vpaddq gives 4 rows in lanes for the float part (multiply,
// then add, no FMA).
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

// One activation row against tiles of 8 rows.
void Q4s24Gemv(size_t nc, size_t kb, const moert_a8_block* a, const moert_w4s24_block* tile,
               float* c) {
  const neon::W4S24Unpacker unpack;
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc_lo = vdupq_n_f32(0.0f);
    float32x4_t acc_hi = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w4s24_block& blk = tile[b];
      const int8x16_t a_lo = vld1q_s8(a[b].qs);
      const int8x16_t a_hi = vld1q_s8(a[b].qs + 16);
      int32x4_t pair[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const neon::W4S24Pair wp = unpack.Pair(vld1q_u8(blk.qs[2 * p]), vld1_u8(blk.pc[2 * p]));
        pair[p] = vdotq_s32(zero, wp.w_lo, vqtbl1q_s8(a_lo, wp.col_lo));
        pair[p] = vdotq_s32(pair[p], wp.w_hi, vqtbl1q_s8(a_hi, wp.col_hi));
      }
      float32x4_t d_lo, d_hi;
      neon::LoadFp16x8(blk.d, &d_lo, &d_hi);
      const float32x4_t ad = vdupq_n_f32(a[b].d);
      acc_lo = neon::AddBlock(acc_lo, vpaddq_s32(pair[0], pair[1]), vmulq_f32(d_lo, ad));
      acc_hi = neon::AddBlock(acc_hi, vpaddq_s32(pair[2], pair[3]), vmulq_f32(d_hi, ad));
    }
    neon::StoreTile(c + n0, neon::TileRows(nc, n0), acc_lo, acc_hi);
  }
}

}  // namespace

MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__neondot) {
  // m is 1 by contract; more rows would be computed one after another.
  for (size_t i = 0; i < m; ++i) {
    Q4s24Gemv(nc, kb, neon::ActivationRow(a, a_stride, i), static_cast<const moert_w4s24_block*>(w),
              c + i * c_stride);
  }
}
