// AVX512-VNNI q4 GEMM: up to 4 A8 activation rows times W4 (symmetric int4) weight tiles (prefill).
// The block math (512-bit) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avx512vnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avx512vnni) {
  moert::kernels::vnni::QGemmW4(m, nc, kb, a, a_stride, w, c, c_stride);
}
