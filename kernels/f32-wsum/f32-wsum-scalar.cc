// Scalar reference of the f32 weighted row sum (ukernel.h) in portable 4-lane vectors
// (SSE on x86-64, NEON on AArch64): the lane width does not change a bit.
#include "kernels/f32-wsum/f32-wsum.h"
#include "kernels/ukernel.h"

MOERT_DECLARE_F32_WSUM(moert_f32_wsum_ukernel__scalar) {
  moert::kernels::f32::WeightedRowSum<4>(n, w, v, v_stride, dv, out);
}
