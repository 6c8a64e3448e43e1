// q8 GEMM on NEON dotprod: up to 4 activation rows against 8-row W8 tiles,
// bit-identical to the scalar reference. Two sdots per row and activation row (exact:
// int8 weights times activations in [-127, 127]); each half tile's weights are loaded
// once per block and used for every activation row.
#include <arm_neon.h>

#include "kernels/neon-qgemm.h"
#include "kernels/ukernel.h"

namespace neon = moert::kernels::neon;

namespace {

template <size_t M>
void Q8Gemm(size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
            const moert_w8_block* tile, float* c, size_t c_stride) {
  const moert_a8_block* arow[M];
#pragma GCC unroll 4
  for (size_t i = 0; i < M; ++i) arow[i] = neon::ActivationRow(a, a_stride, i);
  const int32x4_t zero = vdupq_n_s32(0);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    float32x4_t acc[M][2];
#pragma GCC unroll 4
    for (size_t i = 0; i < M; ++i) acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < kb; ++b) {
      const moert_w8_block& blk = tile[b];
      float32x4_t d[2];
      neon::LoadFp16x8(blk.d, &d[0], &d[1]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        int8x16_t wl[4], wh[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          wl[r] = vld1q_s8(blk.qs[4 * h + r]);
          wh[r] = vld1q_s8(blk.qs[4 * h + r] + 16);
        }
#pragma GCC unroll 4
        for (size_t i = 0; i < M; ++i) {
          const int8_t* aq = neon::Reload(arow[i][b].qs);
          const int8x16_t a_lo = vld1q_s8(aq);
          const int8x16_t a_hi = vld1q_s8(aq + 16);
          int32x4_t row[4];
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            row[r] = vdotq_s32(vdotq_s32(zero, wl[r], a_lo), wh[r], a_hi);
          }
          acc[i][h] = neon::AddBlock(acc[i][h], neon::ReduceRows(row[0], row[1], row[2], row[3]),
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

MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__neondot) {
  neon::ForRowChunks(
      m, a, a_stride, c, c_stride, [&](auto rows, const moert_a8_block* a_rows, float* c_rows) {
        Q8Gemm<decltype(rows)::value>(nc, kb, a_rows, a_stride,
                                      static_cast<const moert_w8_block*>(w), c_rows, c_stride);
      });
}
