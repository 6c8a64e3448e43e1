// AVX2 f32 GEMM, bit-identical to the scalar reference (ukernel.h): each 8-lane
// accumulator holds the reference's two 4-lane partial sums side by side, so every
// product is added in the same lane and order, and the wider registers fit 4 rows by 3
// tokens (12 accumulators; 4 rows for a single token). Built with -mfma but no contraction
// (-ffp-contract=off on the library), as the order requires.
#include "kernels/f32-gemm/f32-dot.h"
#include "kernels/ukernel.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_F32_GEMM(moert_f32_gemm_ukernel_4x3__avx2) {
  moert::kernels::f32::GemmTile<4, 3, 4, moert::kernels::f32::Lanes8>(k, w, ldw, r0, r1, x, n, y,
                                                                      ldy);
}
