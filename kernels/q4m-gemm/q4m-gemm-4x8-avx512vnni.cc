// AVX512-VNNI q4m GEMM: up to 4 A8 activation rows times W4M (asymmetric int4) weight tiles
// (prefill). The block math (512-bit) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avx512vnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__avx512vnni) {
  moert::kernels::avx2::QGemm4<moert::kernels::vnni::W4Mx512>(m, nc, kb, a, a_stride, w, c,
                                                              c_stride);
}
