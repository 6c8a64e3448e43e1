// A8 quantization (kernels/ukernel.h): each work-item turns one 32-float block of x
// into one moert_a8_block, with the CPU quantizer's arithmetic (amax / 127, 1 / d,
// round half to even, NaN to 0, saturated to [-127, 127]) so that the blocks are the
// same bits.
__kernel void q8_quant(__global const uchar* x_base, ulong x_off, __global uchar* a_base,
                       ulong a_off, int n_blocks) {
  const int blk = (int)get_global_id(0);
  if (blk >= n_blocks) return;
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)blk * MOERT_QK;
  __global a8_block* a = (__global a8_block*)(a_base + a_off) + blk;
  float amax = 0.0f;
  for (int j = 0; j < MOERT_QK; ++j) amax = fmax(amax, fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int s = 0;
  for (int j = 0; j < MOERT_QK; ++j) {
    const int q = clamp(convert_int_sat_rte(x[j] * id), -127, 127);
    a->qs[j] = (char)q;
    s += q;
  }
  a->d = d;
  a->s = s;
}
