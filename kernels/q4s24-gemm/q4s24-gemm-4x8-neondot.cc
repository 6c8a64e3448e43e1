// q4s24 (2:4 sparse) GEMM on NEON dotprod: up to 4 activation rows against 8-row
// W4S24 tiles, bit-identical to the scalar reference. As the 1x8 GEMV (rows in pairs,
// pair codes turned into vqtbl1q gather indices, one sdot per half and row pair), with
// each pair's weights and gather indices built once per block and used for every
// activation row.
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

template <size_t M>
void Q4s24Gemm(size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
               const moert_w4s24_block* tile, float* c, size_t c_stride) {
  const moert_a8_block* arow[M];
#pragma GCC unroll 4
  for (size_t i = 0; i < M; ++i) arow[i] = neon::ActivationRow(a, a_stride, i);
  const neon::W4S24Unpacker unpack;
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc[M][2];
#pragma GCC unroll 4
    for (size_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w4s24_block& blk = tile[b];
      float32x4_t d[2];
      neon::LoadFp16x8(blk.d, &d[0], &d[1]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        int32x4_t pair[M][2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) {
          const int r = 4 * h + 2 * p;
          const neon::W4S24Pair wp = unpack.Pair(vld1q_u8(blk.qs[r]), vld1_u8(blk.pc[r]));
#pragma GCC unroll 4
          for (size_t i = 0; i < M; ++i) {
            const int8_t* aq = neon::Reload(arow[i][b].qs);
            const int8x16_t g_lo = vqtbl1q_s8(vld1q_s8(aq), wp.col_lo);
            const int8x16_t g_hi = vqtbl1q_s8(vld1q_s8(aq + 16), wp.col_hi);
            pair[i][p] = vdotq_s32(vdotq_s32(zero, wp.w_lo, g_lo), wp.w_hi, g_hi);
          }
        }
#pragma GCC unroll 4
        for (size_t i = 0; i < M; ++i) {
          acc[i][h] = neon::AddBlock(acc[i][h], vpaddq_s32(pair[i][0], pair[i][1]),
                                     vmulq_f32(d[h], vdupq_n_f32(arow[i][b].d)));
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

MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__neondot) {
  neon::ForRowChunks(
      m, a, a_stride, c, c_stride, [&](auto rows, const moert_a8_block* a_rows, float* c_rows) {
        Q4s24Gemm<decltype(rows)::value>(
            nc, kb, a_rows, a_stride, static_cast<const moert_w4s24_block*>(w), c_rows, c_stride);
      });
}
