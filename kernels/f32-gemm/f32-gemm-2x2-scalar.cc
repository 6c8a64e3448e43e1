// Scalar reference of the f32 GEMM (ukernel.h): 2 rows by 2 tokens (4 rows for a single
// token) in portable 4-lane vectors (SSE on x86-64, NEON on AArch64), whose 8
// accumulators and operands fit the 16 registers both have.
#include "kernels/f32-gemm/f32-dot.h"
#include "kernels/ukernel.h"

MOERT_DECLARE_F32_GEMM(moert_f32_gemm_ukernel_2x2__scalar) {
  moert::kernels::f32::GemmTile<2, 2, 4, moert::kernels::f32::Lanes4x2>(k, w, ldw, r0, r1, x, n, y,
                                                                        ldy);
}
