// AVX2 q4 GEMM: up to 4 A8 activation rows times W4 (symmetric int4) weight tiles (prefill);
// each block's weights are unpacked into registers once for all rows (rows in lanes,
// W4Steps, for two or more). The block math is
// in kernels/avx2-qgemm.h.
#include "kernels/avx2-qgemm.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avx2) {
  namespace avx2 = moert::kernels::avx2;
  // One row: W4's layout (a cheaper preparation); more: W4Steps, whose preparation pays
  // for itself over the rows.
  if (m == 1) {
    avx2::QGemm4<avx2::W4>(m, nc, kb, a, a_stride, w, c, c_stride);
  } else {
    avx2::QGemm4<avx2::W4Steps>(m, nc, kb, a, a_stride, w, c, c_stride);
  }
}
