// q4m GEMM on NEON i8mm: up to 4 activation rows against 8-row W4M tiles,
// bit-identical to the scalar reference. As the q4 i8mm kernel (activation pairs
// interleaved 8 columns at a time, LD2 of 64-bit elements interleaving each weight
// row pair, 32 SMMLAs per block), with the unsigned nibbles used as they are (at most
// 15, valid int8) and the offset term (float)a.s * (m * a.d) added after the scale
// term of each block, as ukernel.h orders them.
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

template <size_t M>
void Q4mGemm(size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
             const moert_w4m_block* tile, float* c, size_t c_stride) {
  constexpr size_t P = (M + 1) / 2;  // activation row pairs; an odd M repeats its last row
  const moert_a8_block* arow[2 * P];
#pragma GCC unroll 4
  for (size_t i = 0; i < 2 * P; ++i) arow[i] = neon::ActivationRow(a, a_stride, i < M ? i : M - 1);
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc[M][2];
#pragma GCC unroll 4
    for (size_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w4m_block& blk = tile[b];
      int8x16_t act[P][4];
#pragma GCC unroll 2
      for (size_t q = 0; q < P; ++q) {
        neon::InterleaveActivations(arow[2 * q][b].qs, arow[2 * q + 1][b].qs, act[q]);
      }
      float32x4_t d[2];
      neon::LoadFp16x8(blk.d, &d[0], &d[1]);
      float32x4_t mn[2];
      neon::LoadFp16x8(blk.m, &mn[0], &mn[1]);
      // Half tile h (weight rows 4h to 4h+3) is two weight row pairs.
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        int32x4_t sum[P][2];
#pragma GCC unroll 2
        for (int pp = 0; pp < 2; ++pp) {
          const int r = 4 * h + 2 * pp;
          // val[0] = [row r bytes 0-7 | row r+1 bytes 0-7], val[1] the bytes 8-15; their
          // low nibbles are columns 0-7 and 8-15, their high nibbles columns 16-31.
          const uint64x2x2_t raw = vld2q_u64(reinterpret_cast<const uint64_t*>(blk.qs[r]));
          const uint8x16_t r0 = vreinterpretq_u8_u64(raw.val[0]);
          const uint8x16_t r1 = vreinterpretq_u8_u64(raw.val[1]);
          const int8x16_t wts[4] = {
              vreinterpretq_s8_u8(vandq_u8(r0, mask)), vreinterpretq_s8_u8(vandq_u8(r1, mask)),
              vreinterpretq_s8_u8(vshrq_n_u8(r0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(r1, 4))};
#pragma GCC unroll 2
          for (size_t q = 0; q < P; ++q) {
            sum[q][pp] = zero;
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) sum[q][pp] = vmmlaq_s32(sum[q][pp], act[q][k], wts[k]);
          }
        }
#pragma GCC unroll 2
        for (size_t q = 0; q < P; ++q) {
          int32x4_t rows[2];
          neon::SplitPairSums(sum[q][0], sum[q][1], &rows[0], &rows[1]);
#pragma GCC unroll 2
          for (size_t j = 0; j < 2; ++j) {
            const size_t i = 2 * q + j;
            if (i >= M) break;  // the repeated last row of an odd M
            const float32x4_t ad = vdupq_n_f32(arow[i][b].d);
            acc[i][h] = neon::AddBlock(acc[i][h], rows[j], vmulq_f32(d[h], ad));
            const float32x4_t as = vdupq_n_f32(static_cast<float>(arow[i][b].s));
            acc[i][h] = vaddq_f32(acc[i][h], vmulq_f32(as, vmulq_f32(mn[h], ad)));
          }
        }
      }
    }
    const size_t rows = neon::TileRows(nc, n0);
#pragma GCC unroll 4
    for (size_t i = 0; i < M; ++i)
      neon::StoreTile(c + i * c_stride + n0, rows, acc[i][0], acc[i][1]);
  }
}

}  // namespace

MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__neoni8mm) {
  neon::ForRowChunks(
      m, a, a_stride, c, c_stride, [&](auto rows, const moert_a8_block* a_rows, float* c_rows) {
        Q4mGemm<decltype(rows)::value>(nc, kb, a_rows, a_stride,
                                       static_cast<const moert_w4m_block*>(w), c_rows, c_stride);
      });
}
