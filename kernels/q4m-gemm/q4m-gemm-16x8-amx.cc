// AMX-INT8 q4m GEMM: up to 16 A8 activation rows times W4M (asymmetric int4) weight
// tiles (prefill). The loop is kernels/amx-qgemm.h's.
#include "kernels/amx-qgemm.h"
#include "kernels/ukernels-amx.h"

MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_16x8__amx) {
  moert::kernels::amx::Gemm<moert::kernels::amx::AmxTiles, moert::kernels::amx::W4M>(
      m, nc, kb, a, a_stride, w, c, c_stride);
}
