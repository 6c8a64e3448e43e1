// AMX-INT8 q8 GEMM: up to 16 A8 activation rows times W8 (int8) weight tiles
// (prefill). The loop is kernels/amx-qgemm.h's.
#include "kernels/amx-qgemm.h"
#include "kernels/ukernels-amx.h"

MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_16x8__amx) {
  moert::kernels::amx::Gemm<moert::kernels::amx::AmxTiles, moert::kernels::amx::W8>(
      m, nc, kb, a, a_stride, w, c, c_stride);
}
