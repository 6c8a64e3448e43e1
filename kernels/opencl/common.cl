// Prepended to every moert OpenCL program: the packed layouts of kernels/ukernel.h
// (A8 activation blocks, W4 and W8 weight tiles of 8 rows by 32 columns) and the
// exact integer dot product of one weight row's block with one activation block.
//
// Options the host passes (backend/opencl/device.cc, KernelVariant::BuildOptions):
//   MOERT_WFMT=4|8        weight format of the matmul kernels (W4 or W8)
//   MOERT_GEMV_KSPLIT     work-items per GEMV output row (1: exact CPU block order)
//   MOERT_GEMM_MR         activation rows per GEMM work-item
//   MOERT_CL_FP16, MOERT_CL_SUBGROUPS, MOERT_CL_INT_DOT: the device has the extension.

// The CPU numerics add products without fused multiply-add; so must the kernels.
#pragma OPENCL FP_CONTRACT OFF

#ifdef MOERT_CL_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

#define MOERT_QK 32
#define MOERT_NR 8

// kernels/ukernel.h moert_a8_block: 40 bytes.
typedef struct {
  float d;
  int s;
  char qs[MOERT_QK];
} a8_block;

inline int hsum16(int16 v) {
  int8 a = v.lo + v.hi;
  int4 b = a.lo + a.hi;
  int2 c = b.lo + b.hi;
  return c.x + c.y;
}

// Sum of the 16 products of two char16 vectors (exact in int32).
#if defined(MOERT_CL_INT_DOT) && defined(__opencl_c_integer_dot_product_input_4x8bit)
#pragma OPENCL EXTENSION cl_khr_integer_dot_product : enable
inline int dot16(char16 a, char16 b) {
  return dot(a.s0123, b.s0123) + dot(a.s4567, b.s4567) + dot(a.s89ab, b.s89ab) +
         dot(a.scdef, b.scdef);
}
#else
inline int dot16(char16 a, char16 b) { return hsum16(convert_int16(a) * convert_int16(b)); }
#endif

// W4 row of one block (16 bytes: column j in the low nibble, j + 16 in the high one).
inline int w4_row_dot(__global const uchar* q, __global const char* aq) {
  const uchar16 b = vload16(0, q);
  const char16 lo = as_char16(b & (uchar16)(15)) - (char16)(8);
  const char16 hi = as_char16(b >> (uchar16)(4)) - (char16)(8);
  return dot16(lo, vload16(0, aq)) + dot16(hi, vload16(1, aq));
}

// W8 row of one block (32 int8 values).
inline int w8_row_dot(__global const char* q, __global const char* aq) {
  return dot16(vload16(0, q), vload16(0, aq)) + dot16(vload16(1, q), vload16(1, aq));
}

#ifdef MOERT_WFMT
#if MOERT_WFMT == 4
#define W_BLOCK_BYTES 144
#define W_ROW_BYTES 16
#define W_ROW_DOT(q, aq) w4_row_dot((q), (aq))
#elif MOERT_WFMT == 8
#define W_BLOCK_BYTES 272
#define W_ROW_BYTES 32
#define W_ROW_DOT(q, aq) w8_row_dot((__global const char*)(q), (aq))
#else
#error "MOERT_WFMT must be 4 or 8"
#endif

// Block b of output row `row` of a packed matrix with kb blocks per row.
inline __global const uchar* w_block(__global const uchar* w, int row, int kb, int b) {
  return w + ((size_t)(row / MOERT_NR) * (size_t)kb + (size_t)b) * W_BLOCK_BYTES;
}

// acc + the contribution of one block, exactly as kernels/ukernel.h defines it.
inline float w_accumulate(float acc, __global const uchar* blk, int r,
                          __global const a8_block* a) {
  const int isum = W_ROW_DOT(blk + 16 + r * W_ROW_BYTES, a->qs);
  const float scale = vload_half(r, (__global const half*)blk) * a->d;
  return acc + (float)isum * scale;
}

// Output row `row` of w against one activation row (kb blocks): the CPU kernels' bits.
inline float w_row_dot(__global const uchar* w, int row, int kb, __global const a8_block* a) {
  const int r = row % MOERT_NR;
  __global const uchar* blk = w_block(w, row, kb, 0);
  float acc = 0.0f;
  for (int b = 0; b < kb; ++b, blk += W_BLOCK_BYTES) acc = w_accumulate(acc, blk, r, a + b);
  return acc;
}
#endif  // MOERT_WFMT

inline float moert_silu(float x) { return x / (1.0f + exp(-x)); }

// Tree reductions over a work-group of power-of-two size in local memory `red`.
inline float wg_reduce_sum(float v, __local float* red) {
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = n / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = red[lid] + red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline float wg_reduce_max(float v, __local float* red) {
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = n / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}
