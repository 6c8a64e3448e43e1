// AVX512-VBMI q4s24 GEMM: up to 4 A8 activation rows times W4S24 (2:4 sparse int4) weight
// tiles (prefill); each block's pair codes are expanded once for all rows
// (vnni::W4S24Vbmi in kernels/vnni-qgemm.h).
#include "kernels/ukernels-avx512vbmi.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__avx512vbmi) {
  moert::kernels::avx2::QGemm4<moert::kernels::vnni::W4S24Vbmi>(m, nc, kb, a, a_stride, w, c,
                                                                 c_stride);
}
