// The W8 (int8) GEMV on SME2: kernels/sme2-qgemm.h's Gemv over W8.
#include "kernels/sme2-qgemm.h"
#include "kernels/ukernels-sme2.h"

__arm_locally_streaming __arm_new("za") MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__sme2) {
  moert::kernels::sme2::Gemv<moert::kernels::sme2::W8>(m, nc, kb, a, a_stride, w, c, c_stride);
}
