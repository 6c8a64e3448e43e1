// AVX512-VNNI q4s24 GEMV: one A8 activation row times W4S24 (2:4 sparse int4) weight tiles
// (decode). The block math (512-bit vpdpbusd) is in kernels/vnni-qgemm.h.
#include "kernels/ukernels-avx512vnni.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avx512vnni) {
  moert::kernels::avx2::QGemv<moert::kernels::vnni::W4S24x512>(m, nc, kb, a, a_stride, w, c, c_stride);
}
