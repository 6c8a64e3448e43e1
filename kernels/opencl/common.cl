// Prepended to every moert OpenCL program: the packed layouts of kernels/ukernel.h
// (A8 activation blocks, W4 and W8 weight tiles of 8 rows by 32 columns) and the
// exact integer dot product of one weight row's block with one activation block.
//
// Options the host passes (backend/opencl/device.cc, KernelVariant::BuildOptions):
//   MOERT_WFMT=4|8        weight format of the matmul kernels (W4 or W8)
//   MOERT_GEMV_KSPLIT     work-items per GEMV output row (1: exact CPU block order)
//   MOERT_GEMM_MR         activation rows per GEMM work-item
//   MOERT_CL_FP16, MOERT_CL_SUBGROUPS, MOERT_CL_INT_DOT: the device has the extension.
//   MOERT_CL_SUBGROUPS_POLYFILL  tests only: the work-group acts as one sub-group,
//                         reduced in local memory, so the sub-group code runs on PoCL.
//   MOERT_CL_INT_DOT_POLYFILL  tests only: software versions of the integer dot product
//                         builtins, so that the MOERT_INT_DOT code runs on devices
//                         without the extension (PoCL) and is checked against the CPU.
//   MOERT_CL_ARM_DOT      the device has cl_arm_integer_dot_product_accumulate_int8
//                         (Mali drivers without the khr extension).
//   MOERT_CL_ARM_DOT_POLYFILL  tests only: arm_dot_acc in software, as above.

// Helpers are `static inline`: a plain `inline` is C99's inline definition, which
// emits no body, so a compiler that chooses not to inline one (clang does for
// w_row_dot's loop) leaves a call to an undefined function.

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

static inline int hsum16(int16 v) {
  int8 a = v.lo + v.hi;
  int4 b = a.lo + a.hi;
  int2 c = b.lo + b.hi;
  return c.x + c.y;
}

// Sum of the 16 products of two char16 vectors (exact in int32): the baseline path.
static inline int dot16(char16 a, char16 b) { return hsum16(convert_int16(a) * convert_int16(b)); }

// The tuned integer path (MOERT_INT_DOT == 1): 4 bytes packed in a uint, multiplied and
// summed by cl_khr_integer_dot_product's packed builtins. The packed form is the one
// every device with the extension must support (the char4 form is optional), and it
// needs no byte unpacking. acc + the 4 products, saturated; the sums of a block
// (|sum| <= 32 * 128 * 128) never saturate, so the result is exact, like dot16's.
// The guard is the extension macro, which the compiler defines for every OpenCL C
// version the device compiles; the feature macro __opencl_c_integer_dot_product_*
// exists only when compiling as OpenCL C 3.0 (-cl-std=CL3.0), which the host does not
// ask for, so guarding on it alone would leave a device with the extension on the
// baseline path.
#if defined(MOERT_CL_INT_DOT_POLYFILL)
#define MOERT_INT_DOT 1
static inline int moert_dot_acc_ss(uint a, uint b, int acc) {
  const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b));
  return add_sat(acc, (p.x + p.y) + (p.z + p.w));
}
static inline int moert_dot_acc_us(uint a, uint b, int acc) {
  const int4 p = convert_int4(as_uchar4(a)) * convert_int4(as_char4(b));
  return add_sat(acc, (p.x + p.y) + (p.z + p.w));
}
#elif defined(MOERT_CL_INT_DOT) && \
    (defined(cl_khr_integer_dot_product) || \
     defined(__opencl_c_integer_dot_product_input_4x8bit_packed))
#define MOERT_INT_DOT 1
#define moert_dot_acc_ss(a, b, acc) dot_acc_sat_4x8packed_ss_int((a), (b), (acc))
#define moert_dot_acc_us(a, b, acc) dot_acc_sat_4x8packed_us_int((a), (b), (acc))
#elif defined(MOERT_CL_ARM_DOT_POLYFILL) || \
    (defined(MOERT_CL_ARM_DOT) && defined(cl_arm_integer_dot_product_accumulate_int8))
// Arm's extension: arm_dot_acc(char4, char4, int), acc + the 4 products (not
// saturating: a block's sums never come near the int32 range). It has no unsigned x
// signed form, and needs none here: the only unsigned operand is W4's nibbles (0..15),
// which as chars are the same values.
#if defined(MOERT_CL_ARM_DOT_POLYFILL)
static inline int moert_arm_dot_acc(char4 a, char4 b, int acc) {
  const int4 p = convert_int4(a) * convert_int4(b);
  return acc + ((p.x + p.y) + (p.z + p.w));
}
#else
#pragma OPENCL EXTENSION cl_arm_integer_dot_product_accumulate_int8 : enable
#define moert_arm_dot_acc(a, b, acc) arm_dot_acc((a), (b), (acc))
#endif
#define MOERT_INT_DOT 1
#define moert_dot_acc_ss(a, b, acc) moert_arm_dot_acc(as_char4(a), as_char4(b), (acc))
#define moert_dot_acc_us(a, b, acc) moert_arm_dot_acc(as_char4(a), as_char4(b), (acc))
#else
#define MOERT_INT_DOT 0
#endif

#if MOERT_INT_DOT
// acc + the 16 products of a and b (bytes packed 4 to a uint; signed x signed, and
// unsigned a x signed b).
static inline int dot16_acc_ss(uint4 a, uint4 b, int acc) {
  acc = moert_dot_acc_ss(a.x, b.x, acc);
  acc = moert_dot_acc_ss(a.y, b.y, acc);
  acc = moert_dot_acc_ss(a.z, b.z, acc);
  return moert_dot_acc_ss(a.w, b.w, acc);
}
static inline int dot16_acc_us(uint4 a, uint4 b, int acc) {
  acc = moert_dot_acc_us(a.x, b.x, acc);
  acc = moert_dot_acc_us(a.y, b.y, acc);
  acc = moert_dot_acc_us(a.z, b.z, acc);
  return moert_dot_acc_us(a.w, b.w, acc);
}
#endif

// The sum of v over the n work-items (a power of two) of linear local ids lid = 0..n-1,
// as a tree in local memory `red` (one float per work-item): the same order for every
// caller (wg_reduce_sum, and the sub-group polyfill below). Every work-item calls it.
static inline float tree_sum(float v, __local float* red, int lid, int n) {
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

// Sub-group reductions (MOERT_SUBGROUPS == 1): moert_sg_size() is the size of every
// sub-group of a work-group whose size it divides, and moert_sg_reduce_add(v, red) the
// sum of v over the caller's sub-group (every work-item of the sub-group must call
// it). `red` is local scratch of one float per work-item, used by the polyfill only.
#if defined(MOERT_CL_SUBGROUPS_POLYFILL)
#define MOERT_SUBGROUPS 1
static inline uint moert_sg_size(void) {
  return (uint)(get_local_size(0) * get_local_size(1) * get_local_size(2));
}
// The work-group's tree sum over linear local ids (a power-of-two work-group).
static inline float moert_sg_reduce_add(float v, __local float* red) {
  const int lid = (int)(get_local_id(0) +
                        get_local_size(0) * (get_local_id(1) + get_local_size(1) * get_local_id(2)));
  return tree_sum(v, red, lid, (int)moert_sg_size());
}
#elif defined(MOERT_CL_SUBGROUPS) && \
    (defined(cl_khr_subgroups) || defined(__opencl_c_subgroups) || defined(cl_intel_subgroups))
#ifdef cl_khr_subgroups
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif
#define MOERT_SUBGROUPS 1
#define moert_sg_size() get_max_sub_group_size()
#define moert_sg_reduce_add(v, red) sub_group_reduce_add(v)
#else
#define MOERT_SUBGROUPS 0
#endif

#ifdef MOERT_WFMT
// One weight row of one block in registers, as two halves (columns 0-15 and 16-31):
// w_lo / w_hi load them, w_isum is their exact integer dot product with an activation
// block. The GEMM loads a row once for several activation blocks.
#if MOERT_WFMT == 4
#define W_BLOCK_BYTES 144
#define W_ROW_BYTES 16
// Byte j of a W4 row: column j in the low nibble, j + 16 in the high one.
#if MOERT_INT_DOT
// The nibbles stay unsigned (0..15): sum (n - 8) * a = sum n * a - 8 * sum a, and the
// A8 block carries sum a (s).
typedef uint4 w_part;
static inline w_part w_lo(__global const uchar* q) {
  return as_uint4(vload16(0, q)) & (uint4)(0x0F0F0F0Fu);
}
static inline w_part w_hi(__global const uchar* q) {
  return (as_uint4(vload16(0, q)) >> (uint4)(4)) & (uint4)(0x0F0F0F0Fu);
}
static inline int w_isum(w_part lo, w_part hi, __global const a8_block* a) {
  const int acc = dot16_acc_us(lo, as_uint4(vload16(0, a->qs)), -8 * a->s);
  return dot16_acc_us(hi, as_uint4(vload16(1, a->qs)), acc);
}
#else
typedef char16 w_part;
static inline w_part w_lo(__global const uchar* q) {
  return as_char16(vload16(0, q) & (uchar16)(15)) - (char16)(8);
}
static inline w_part w_hi(__global const uchar* q) {
  return as_char16(vload16(0, q) >> (uchar16)(4)) - (char16)(8);
}
#endif
#elif MOERT_WFMT == 8
#define W_BLOCK_BYTES 272
#define W_ROW_BYTES 32
#if MOERT_INT_DOT
typedef uint4 w_part;
static inline w_part w_lo(__global const uchar* q) { return as_uint4(vload16(0, q)); }
static inline w_part w_hi(__global const uchar* q) { return as_uint4(vload16(1, q)); }
static inline int w_isum(w_part lo, w_part hi, __global const a8_block* a) {
  const int acc = dot16_acc_ss(lo, as_uint4(vload16(0, a->qs)), 0);
  return dot16_acc_ss(hi, as_uint4(vload16(1, a->qs)), acc);
}
#else
typedef char16 w_part;
static inline w_part w_lo(__global const uchar* q) { return vload16(0, (__global const char*)q); }
static inline w_part w_hi(__global const uchar* q) { return vload16(1, (__global const char*)q); }
#endif
#else
#error "MOERT_WFMT must be 4 or 8"
#endif

#if !MOERT_INT_DOT
static inline int w_isum(w_part lo, w_part hi, __global const a8_block* a) {
  return dot16(lo, vload16(0, a->qs)) + dot16(hi, vload16(1, a->qs));
}
#endif

// Block b of output row `row` of a packed matrix with kb blocks per row.
static inline __global const uchar* w_block(__global const uchar* w, int row, int kb, int b) {
  return w + ((size_t)(row / MOERT_NR) * (size_t)kb + (size_t)b) * W_BLOCK_BYTES;
}

// acc + the contribution of one block, exactly as kernels/ukernel.h defines it.
static inline float w_accumulate(float acc, __global const uchar* blk, int r,
                          __global const a8_block* a) {
  __global const uchar* q = blk + 16 + r * W_ROW_BYTES;
  const int isum = w_isum(w_lo(q), w_hi(q), a);
  const float scale = vload_half(r, (__global const half*)blk) * a->d;
  return acc + (float)isum * scale;
}

// Output row `row` of w against one activation row (kb blocks): the CPU kernels' bits.
static inline float w_row_dot(__global const uchar* w, int row, int kb, __global const a8_block* a) {
  const int r = row % MOERT_NR;
  __global const uchar* blk = w_block(w, row, kb, 0);
  float acc = 0.0f;
  for (int b = 0; b < kb; ++b, blk += W_BLOCK_BYTES) acc = w_accumulate(acc, blk, r, a + b);
  return acc;
}
#endif  // MOERT_WFMT

static inline float moert_silu(float x) { return x / (1.0f + exp(-x)); }

// Tree reductions over a work-group of power-of-two size in local memory `red`
// (tree_sum, above, is the sum's tree).
static inline float wg_reduce_sum(float v, __local float* red) {
  return tree_sum(v, red, (int)get_local_id(0), (int)get_local_size(0));
}

static inline float wg_reduce_max(float v, __local float* red) {
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

// Where expert e's weights start past each part's offset in the fused MoE kernels:
// e * expert_bytes (stacked experts), or offsets[e] (ulong) when has_offsets (experts
// in an expert pool's blocks: the part offsets are then the parts' places in a block).
static inline size_t expert_start(int e, ulong expert_bytes, __global const uchar* offsets_base,
                                  ulong offsets_off, int has_offsets) {
  return has_offsets ? (size_t)((__global const ulong*)(offsets_base + offsets_off))[e]
                     : (size_t)e * expert_bytes;
}
