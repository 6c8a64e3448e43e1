// AVX512-VBMI q4s24 GEMV: one A8 activation row times W4S24 (2:4 sparse int4) weight tiles
// (decode). The pair codes are expanded with vpmultishiftqb and vpermi2b, the kept
// activations gathered with vpermb (vnni::W4S24Vbmi in kernels/vnni-qgemm.h).
#include "kernels/ukernels-avx512vbmi.h"
#include "kernels/vnni-qgemm.h"

MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avx512vbmi) {
  moert::kernels::avx2::QGemv<moert::kernels::vnni::W4S24Vbmi>(m, nc, kb, a, a_stride, w, c,
                                                                c_stride);
}
