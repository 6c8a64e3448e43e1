// Scalar reference of the q8 GEMM (up to 4 activation rows, 8-row weight tiles).
#include "kernels/scalar-qgemm.h"
#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__scalar) {
  moert::kernels::scalar::QGemm<moert_w8_block>(m, nc, kb, a, a_stride, w, c, c_stride);
}
