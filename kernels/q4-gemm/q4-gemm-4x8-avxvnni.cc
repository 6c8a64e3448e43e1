// AVX-VNNI q4 GEMM: up to 4 A8 activation rows times W4 (symmetric int4) weight tiles (prefill).
// The block math (256-bit) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avxvnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avxvnni) {
  moert::kernels::avx2::QGemm4<moert::kernels::vnni::W4>(m, nc, kb, a, a_stride, w, c, c_stride);
}
