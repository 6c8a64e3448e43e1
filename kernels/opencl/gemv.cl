// W4A8 / W8A8 GEMV (MOERT_WFMT = 4 or 8): y[row] = w row . a for one A8 activation row.
// MOERT_GEMV_KSPLIT == 1: one work-item per row, blocks in order, the same bits as the
// CPU kernels. > 1: work-items split a row's blocks and add their partial sums in a
// tree (GPUs: more rows' bytes in flight), a few ulps from the CPU's order; with
// sub-groups (MOERT_SUBGROUPS), by sub-group reductions instead of local memory.
__kernel void gemv(__global const uchar* w_base, ulong w_off, __global const uchar* a_base,
                   ulong a_off, __global uchar* y_base, ulong y_off, int n, int kb
#if MOERT_GEMV_KSPLIT > 1
                   , __local float* red
#endif
) {
  __global const uchar* w = w_base + w_off;
  __global const a8_block* a = (__global const a8_block*)(a_base + a_off);
  __global float* y = (__global float*)(y_base + y_off);
#if MOERT_GEMV_KSPLIT == 1
  const int row = (int)get_global_id(0);
  if (row >= n) return;
  y[row] = w_row_dot(w, row, kb, a);
#else
  // Local size (KSPLIT, rows per group): lane = get_local_id(0) takes blocks lane,
  // lane + KSPLIT, ...
  const int lane = (int)get_local_id(0);
  const int row = (int)get_global_id(1);
  const int slot = (int)get_local_id(1) * MOERT_GEMV_KSPLIT;
  float acc = 0.0f;
  if (row < n) {
    const int r = row % MOERT_NR;
    for (int b = lane; b < kb; b += MOERT_GEMV_KSPLIT) {
      acc = w_accumulate(acc, w_block(w, row, kb, b), r, a + b);
    }
  }
#if MOERT_SUBGROUPS
  // Work-items are numbered row-major (the KSPLIT lanes of a row are consecutive), so
  // when the sub-group size is a multiple of KSPLIT and divides the work-group, each
  // sub-group holds whole rows: they are summed by sub-group reductions, one per row
  // of the sub-group (the other rows' items add 0), without barriers. The condition
  // depends on sizes only, so the whole work-group takes the same branch.
  const int sg = (int)moert_sg_size();
  const int items = (int)(get_local_size(0) * get_local_size(1));
  if (sg >= MOERT_GEMV_KSPLIT && sg % MOERT_GEMV_KSPLIT == 0 && items % sg == 0) {
    const int rows_per_sg = sg / MOERT_GEMV_KSPLIT;
    const int mine = (int)get_local_id(1) % rows_per_sg;
    for (int j = 0; j < rows_per_sg; ++j) {
      const float sum = moert_sg_reduce_add(mine == j ? acc : 0.0f, red);
      if (mine == j && lane == 0 && row < n) y[row] = sum;
    }
    return;
  }
#endif
  red[slot + lane] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = MOERT_GEMV_KSPLIT / 2; s > 0; s >>= 1) {
    if (lane < s) red[slot + lane] = red[slot + lane] + red[slot + lane + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lane == 0 && row < n) y[row] = red[slot];
#endif
}
