// Scalar reference of the q4 GEMV (one activation row, 8-row weight tiles).
#include "kernels/scalar-qgemm.h"
#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__scalar) {
  moert::kernels::scalar::QGemm<moert_w4_block>(m, nc, kb, a, a_stride, w, c, c_stride);
}
