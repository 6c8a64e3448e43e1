// AVX-VNNI q4s24 GEMV: one A8 activation row times W4S24 (2:4 sparse int4) weight tiles
// (decode). The block math (256-bit, VEX vpdpbusd) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avxvnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avxvnni) {
  moert::kernels::avx2::QGemv<moert::kernels::vnni::W4S24>(m, nc, kb, a, a_stride, w, c, c_stride);
}
