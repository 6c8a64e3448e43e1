// AVX2 q4m GEMV: one A8 activation row times W4M (asymmetric int4) weight tiles (decode).
// The block math is in kernels/avx2-qgemm.h.
#include "kernels/avx2-qgemm.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__avx2) {
  moert::kernels::avx2::QGemv<moert::kernels::avx2::W4M>(m, nc, kb, a, a_stride, w, c, c_stride);
}
