// q8 GEMM on NEON i8mm: up to 4 activation rows against 8-row W8 tiles, bit-identical
// to the scalar reference. SMMLA multiplies a 2x8 int8 matrix (two activation rows, 8
// columns) by an 8x2 one (two weight rows) into 2x2 int32 sums (exact: int8 weights
// times activations in [-127, 127]). LD4 of 64-bit elements over two weight rows' 64
// bytes interleaves the pair 8 columns at a time with no shuffle; the activation
// pairs are interleaved with vzip. 32 SMMLAs per block for 4 x 8 outputs, then the
// sums regrouped with rows in lanes for the float part (multiply, then add, no FMA).
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

template <size_t M>
void Q8Gemm(size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
            const moert_w8_block* tile, float* c, size_t c_stride) {
  constexpr size_t P = (M + 1) / 2;  // activation row pairs; an odd M repeats its last row
  const moert_a8_block* arow[2 * P];
#pragma GCC unroll 4
  for (size_t i = 0; i < 2 * P; ++i) arow[i] = neon::ActivationRow(a, a_stride, i < M ? i : M - 1);
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc[M][2];
#pragma GCC unroll 4
    for (size_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w8_block& blk = tile[b];
      int8x16_t act[P][4];
#pragma GCC unroll 2
      for (size_t q = 0; q < P; ++q) {
        neon::InterleaveActivations(arow[2 * q][b].qs, arow[2 * q + 1][b].qs, act[q]);
      }
      float32x4_t d[2];
      neon::LoadFp16x8(blk.d, &d[0], &d[1]);
      // Half tile h (weight rows 4h to 4h+3) is two weight row pairs.
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        int32x4_t sum[P][2];
#pragma GCC unroll 2
        for (int pp = 0; pp < 2; ++pp) {
          const int r = 4 * h + 2 * pp;
          // val[k] = [row r columns 8k-8k+7 | row r+1 columns 8k-8k+7].
          const int64x2x4_t raw = vld4q_s64(reinterpret_cast<const int64_t*>(blk.qs[r]));
          const int8x16_t wts[4] = {
              vreinterpretq_s8_s64(raw.val[0]), vreinterpretq_s8_s64(raw.val[1]),
              vreinterpretq_s8_s64(raw.val[2]), vreinterpretq_s8_s64(raw.val[3])};
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
            acc[i][h] =
                neon::AddBlock(acc[i][h], rows[j], vmulq_f32(d[h], vdupq_n_f32(arow[i][b].d)));
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

MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__neoni8mm) {
  neon::ForRowChunks(
      m, a, a_stride, c, c_stride, [&](auto rows, const moert_a8_block* a_rows, float* c_rows) {
        Q8Gemm<decltype(rows)::value>(nc, kb, a_rows, a_stride,
                                      static_cast<const moert_w8_block*>(w), c_rows, c_stride);
      });
}
