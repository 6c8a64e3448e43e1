// AVX2 q4m GEMM: up to 4 A8 activation rows times W4M (asymmetric int4) weight tiles (prefill);
// each block's weights are unpacked into registers once for all rows. The block math is
// in kernels/avx2-qgemm.h.
#include "kernels/avx2-qgemm.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__avx2) {
  moert::kernels::avx2::QGemm4<moert::kernels::avx2::W4M>(m, nc, kb, a, a_stride, w, c, c_stride);
}
