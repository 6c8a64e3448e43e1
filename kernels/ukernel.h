// The contract between the operators and the microkernels: the byte layouts the
// kernels read (docs/formats.md, "Runtime formats", is the prose version) and the
// signature every quantized matrix-multiply microkernel shares.
//
// Layouts:
//  - A8 (activations): a row of K values is K/32 blocks of `moert_a8_block`: an fp32
//    scale d, the int32 sum of the 32 quantized values, and the values in [-127, 127].
//  - Weights: output rows are grouped in tiles of MOERT_NR (8) rows; a matrix of N rows
//    by K columns is ceil(N/8) tiles, tile after tile; a tile is K/32 blocks, block
//    after block; a block holds the 8 rows' data for 32 consecutive columns (structs
//    below). Rows past N in the last tile are padding: zero scales, zero values.
//  - All values little-endian; fp16 is IEEE binary16.
//
// Numerics (the same on every ISA, so every variant gives the same bits):
//  - The integer dot product of a block is exact (int32).
//  - Each output is accumulated over the blocks in order, without fused multiply-add:
//      acc = 0.0f;  for b: acc = acc + (float)isum_b * (w.d_b * a.d_b);
//    and for the asymmetric W4 (q4m) format, after that add of each block:
//                          acc = acc + (float)a.s_b * (w.m_b * a.d_b);
//    where w.d_b (w.m_b) is the fp16 scale (min) widened to float exactly.
//  - A8 quantization of 32 floats x: amax = max |x|; d = amax / 127.0f;
//    id = d != 0 ? 1.0f / d : 0.0f; q = round-half-to-even(x * id) (as
//    _mm256_cvtps_epi32 and vcvtnq_s32_f32 round) saturated to [-127, 127], and 0
//    where x * id is NaN; s = sum of q. For finite inputs with a normal d, x * id is
//    within [-127, 127] already; the saturation and the NaN rule give every ISA the
//    same bytes, and defined ones, for the rest: NaN or infinite inputs, and blocks
//    whose d is subnormal, where 1 / d overflows to infinity.
#ifndef MOERT_KERNELS_UKERNEL_H_
#define MOERT_KERNELS_UKERNEL_H_

#include <cstddef>
#include <cstdint>

// Output rows per weight tile; every weight format and every ISA uses it.
#define MOERT_NR 8
// Values per block along K.
#define MOERT_QK 32

// One 32-value block of quantized activations (40 bytes).
struct moert_a8_block {
  float d;           // scale: value = d * qs[i]
  int32_t s;         // sum of qs (the asymmetric format needs it)
  int8_t qs[MOERT_QK];
};
static_assert(sizeof(moert_a8_block) == 40, "A8 block layout");

// W4, symmetric int4 (lossless from Q4_0): value = d * (nibble - 8). Byte j of a row
// holds column j in its low nibble and column j + 16 in its high nibble (Q4_0 order).
struct moert_w4_block {
  uint16_t d[MOERT_NR];       // fp16 scale of each row
  uint8_t qs[MOERT_NR][16];  // row r's 32 nibbles
};
static_assert(sizeof(moert_w4_block) == 144, "W4 block layout");

// W4M, asymmetric int4 (lossless from Q4_1, approximate from Q4_K): value =
// d * nibble + m, nibble in [0, 15]; nibble order as W4.
struct moert_w4m_block {
  uint16_t d[MOERT_NR];  // fp16 scale
  uint16_t m[MOERT_NR];  // fp16 offset (Q4_1's m; minus Q4_K's min)
  uint8_t qs[MOERT_NR][16];
};
static_assert(sizeof(moert_w4m_block) == 160, "W4M block layout");

// W8, int8 (lossless from Q8_0): value = d * qs, qs in [-128, 127].
struct moert_w8_block {
  uint16_t d[MOERT_NR];
  int8_t qs[MOERT_NR][MOERT_QK];
};
static_assert(sizeof(moert_w8_block) == 272, "W8 block layout");

// W4S24, 2:4 structured-sparse int4: in each group of 4 columns (8 groups per block)
// two values are kept, 16 per row and block. Which two is a 3-bit pair code per group
// (4 choose 2 = 6 pairs), so a row-block is 2 (d) + 3 (codes) + 8 (nibbles) = 13 bytes
// (3.25 bits a weight) against W4's 18.
//  - pc[r]: row r's 8 pair codes as a 24-bit little-endian number p = pc[r][0] |
//    pc[r][1] << 8 | pc[r][2] << 16; group g's code is (p >> 3g) & 7 and keeps columns
//    4g + moert_w4s24_pairs[code][0] and 4g + moert_w4s24_pairs[code][1] (in increasing
//    order). Codes 6 and 7 are never written; they read as the pairs of codes 0 and 5,
//    so every byte pattern has one meaning on every ISA.
//  - qs[r][j] (j = 0..7): kept value j in the low nibble, kept value j + 8 in the high
//    nibble, kept value k being group k / 2's first (k even) or second (k odd) column
//    (so the low nibbles read columns 0..15, the high ones columns 16..31).
// value = d * (nibble - 8). The codes come before the nibbles so that a 16-byte load
// from any row's codes stays inside the block.
// (The first layout, GGUF type 0x4D3, spent 2 bits on each kept value's position:
// 14 bytes a row-block. It is no longer read; see docs/formats.md.)
struct moert_w4s24_block {
  uint16_t d[MOERT_NR];
  uint8_t pc[MOERT_NR][3];
  uint8_t qs[MOERT_NR][8];
};
static_assert(sizeof(moert_w4s24_block) == 104, "W4S24 block layout");

// The two columns (within its group of 4) that each W4S24 pair code keeps.
inline constexpr uint8_t moert_w4s24_pairs[8][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2},
                                                    {1, 3}, {2, 3}, {0, 1}, {2, 3}};

// Group g's (0..7) pair code in a row's 3 code bytes.
inline int moert_w4s24_code(const uint8_t* pc, int g) {
  const uint32_t p = static_cast<uint32_t>(pc[0]) | static_cast<uint32_t>(pc[1]) << 8 |
                     static_cast<uint32_t>(pc[2]) << 16;
  return static_cast<int>((p >> (3 * g)) & 7);
}

// Quantizes k floats (k a multiple of 32) to k/32 A8 blocks at `a`.
typedef void (*moert_q8_quant_ukernel_fn)(size_t k, const float* x, moert_a8_block* a);

// c[i][n] = sum over K of a[i] * w[n] for i < m and n < nc, written (not added) to
// c + i * c_stride + n. `m` is at most the kernel's MR (1 for a GEMV kernel); `nc`
// may be any count >= 1 (the last tile is partial when nc % 8 != 0); `kb` = K / 32
// >= 1; row i of the activations starts at (const char*)a + i * a_stride; `w` points
// at the first tile to compute.
typedef void (*moert_qgemm_ukernel_fn)(size_t m, size_t nc, size_t kb, const moert_a8_block* a,
                                       size_t a_stride, const void* w, float* c,
                                       size_t c_stride);

// Scalar references (always built). ISA variants are declared in ukernels-<isa>.h,
// one header per ISA, and exist only where the compiler builds that ISA.
void moert_q8_quant_ukernel__scalar(size_t k, const float* x, moert_a8_block* a);

#define MOERT_DECLARE_QGEMM(name)                                                          \
  void name(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,      \
            const void* w, float* c, size_t c_stride)

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__scalar);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__scalar);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__scalar);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__scalar);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__scalar);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__scalar);
MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__scalar);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__scalar);

// --- f32 top-k (the MoE router's expert choice) ---
//
// Writes the indices of the k largest values of x[0..n) to indices[0..k), in
// descending order of value. The order is total, so the output is unique:
//  - equal values (+0.0 and -0.0 are equal) go to the lower index first;
//  - NaN (any sign or payload) ranks below every number, -inf included; NaNs among
//    themselves go by lower index.
// Requires 1 <= k <= n <= MOERT_TOPK_MAX_N. Every ISA variant gives exactly the scalar
// reference's output for every input.
#define MOERT_TOPK_MAX_N 256

typedef void (*moert_f32_topk_ukernel_fn)(size_t n, const float* x, size_t k,
                                          uint32_t* indices);

#define MOERT_DECLARE_TOPK(name) \
  void name(size_t n, const float* x, size_t k, uint32_t* indices)

MOERT_DECLARE_TOPK(moert_f32_topk_ukernel__scalar);

// --- f32 GEMM (the fp32 reference path's matmuls) ---
//
// y[t * ldy + r] = dot(w + r * ldw, x + t * k) over k values, for rows r in [r0, r1)
// of w (row-major, ldw >= k floats from one row to the next: a matrix's rows, or one
// head's slice of a KV cache's rows) and tokens t in [0, n) of x (k floats a row), each
// dot product in this order: two
// 4-lane partial sums over the blocks of 8 (lane j of the first adds the products of
// elements 8b + j, of the second 8b + 4 + j), s = first + second lane-wise, then
// (s[0] + s[1]) + (s[2] + s[3]), then the remaining k % 8 products one by one; every
// operation a float multiply or add, no fused multiply-add. So a value is the same bits
// on every ISA, for any tile shape and any split of the rows between threads.
typedef void (*moert_f32_gemm_ukernel_fn)(size_t k, const float* w, size_t ldw, size_t r0,
                                          size_t r1, const float* x, size_t n, float* y,
                                          size_t ldy);

#define MOERT_DECLARE_F32_GEMM(name)                                                              \
  void name(size_t k, const float* w, size_t ldw, size_t r0, size_t r1, const float* x, size_t n, \
            float* y, size_t ldy)

MOERT_DECLARE_F32_GEMM(moert_f32_gemm_ukernel_2x2__scalar);

// --- f32 weighted row sum (attention's values) ---
//
// out[d] = out[d] + w[0] * v[d] + w[1] * v[v_stride + d] + ... + w[n - 1] * v[(n - 1) *
// v_stride + d] for d in [0, dv): each element adds the rows' products to what out
// holds, in the order of the rows, every operation a float multiply or add (no fused
// multiply-add): the same bits on every ISA. So rows split into consecutive calls sum
// to the bits of one call, and a zero-filled out gives the sum from 0.0f.
typedef void (*moert_f32_wsum_ukernel_fn)(size_t n, const float* w, const float* v, size_t v_stride,
                                          size_t dv, float* out);

#define MOERT_DECLARE_F32_WSUM(name) \
  void name(size_t n, const float* w, const float* v, size_t v_stride, size_t dv, float* out)

MOERT_DECLARE_F32_WSUM(moert_f32_wsum_ukernel__scalar);

// --- typed KV cache rows widened to f32 (attention over an f16 or q8_0 cache) ---
//
// f16: n halves (2 bytes each, little-endian, any alignment) at src to n floats, each
// exact (ggml's GGML_FP16_TO_FP32): subnormal halves become normal floats, a NaN keeps
// its sign and payload and comes out quiet.
// q8_0: n whole q8_0 blocks (34 bytes each: a half scale d, then 32 int8 q; any
// alignment) to 32 * n floats, each (float)q * (float)d in one float multiply (ggml's
// dequantize_row_q8_0). Both give the same bits on every ISA.
typedef void (*moert_f16_widen_ukernel_fn)(size_t n, const uint8_t* src, float* dst);
typedef void (*moert_q8_0_widen_ukernel_fn)(size_t n, const uint8_t* src, float* dst);

#define MOERT_DECLARE_KV_WIDEN(name) void name(size_t n, const uint8_t* src, float* dst)

MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__scalar);
MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__scalar);

#endif  // MOERT_KERNELS_UKERNEL_H_
