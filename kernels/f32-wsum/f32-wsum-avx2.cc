// AVX2 f32 weighted row sum (ukernel.h): 8 lanes, 32 elements in registers per pass
// over the rows; bit-identical to the scalar reference (each element's order is the
// rows', and -ffp-contract=off on the library keeps multiply and add apart).
#include "kernels/f32-wsum/f32-wsum.h"
#include "kernels/ukernel.h"
#include "kernels/ukernels-avx2.h"

MOERT_DECLARE_F32_WSUM(moert_f32_wsum_ukernel__avx2) {
  moert::kernels::f32::WeightedRowSum<8>(n, w, v, v_stride, dv, out);
}
