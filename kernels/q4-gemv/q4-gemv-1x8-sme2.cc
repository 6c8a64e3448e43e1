// The W4 (symmetric int4) GEMV on SME2: kernels/sme2-qgemm.h's Gemv over W4.
#include "kernels/sme2-qgemm.h"
#include "kernels/ukernels-sme2.h"

__arm_locally_streaming __arm_new("za") MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__sme2) {
  moert::kernels::sme2::Gemv<moert::kernels::sme2::W4>(m, nc, kb, a, a_stride, w, c, c_stride);
}
