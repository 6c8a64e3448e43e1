// W4A8 / W8A8 GEMM (MOERT_WFMT = 4 or 8): y[i][row] = w row . a row i for m activation
// rows. A work-item computes one weight row for MOERT_GEMM_MR activation rows, reading
// each weight block once for all of them; every output keeps the block order of
// kernels/ukernel.h, so the bits equal the CPU's GEMM and GEMV.
__kernel void gemm(__global const uchar* w_base, ulong w_off, __global const uchar* a_base,
                   ulong a_off, __global uchar* y_base, ulong y_off, int n, int kb, int m,
                   int y_stride) {
  const int row = (int)get_global_id(0);
  const int i0 = (int)get_global_id(1) * MOERT_GEMM_MR;
  if (row >= n || i0 >= m) return;
  __global const uchar* w = w_base + w_off;
  __global const a8_block* a = (__global const a8_block*)(a_base + a_off) + (size_t)i0 * kb;
  __global float* y = (__global float*)(y_base + y_off);
  const int rows = min(MOERT_GEMM_MR, m - i0);
  const int r = row % MOERT_NR;
  float acc[MOERT_GEMM_MR];
  for (int i = 0; i < MOERT_GEMM_MR; ++i) acc[i] = 0.0f;
  __global const uchar* blk = w_block(w, row, kb, 0);
  for (int b = 0; b < kb; ++b, blk += W_BLOCK_BYTES) {
    const float dw = vload_half(r, (__global const half*)blk);
    __global const uchar* q = blk + 16 + r * W_ROW_BYTES;
    const w_part q0 = w_lo(q);
    const w_part q1 = w_hi(q);
    for (int i = 0; i < MOERT_GEMM_MR; ++i) {
      if (i < rows) {
        __global const a8_block* ab = a + (size_t)i * kb + b;
        const int isum = w_isum(q0, q1, ab);
        const float scale = dw * ab->d;
        acc[i] = acc[i] + (float)isum * scale;
      }
    }
  }
  for (int i = 0; i < rows; ++i) y[(size_t)(i0 + i) * y_stride + row] = acc[i];
}
