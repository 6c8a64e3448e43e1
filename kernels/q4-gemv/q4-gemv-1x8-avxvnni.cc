// AVX-VNNI q4 GEMV: one A8 activation row times W4 (symmetric int4) weight tiles (decode).
// The block math (256-bit) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avxvnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__avxvnni) {
  moert::kernels::avx2::QGemv<moert::kernels::vnni::W4>(m, nc, kb, a, a_stride, w, c, c_stride);
}
