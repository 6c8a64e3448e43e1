// The SME2 quantized GEMV/GEMM, one template over the weight format (W4, W4M, W8),
// instantiated by the kernels/<family>/*-sme2.cc files. Only clang (19+) compiles it,
// with -march=armv9-a+nosve+sme2 (cmake/MoertKernels.cmake), so it includes nothing
// but <arm_sme.h> and kernels/ukernel.h.
//
// Mapping (L = SVL / 32 int32 lanes, 4 on the smallest SVL, 16 on SVL = 512):
//  - A "pass" is L consecutive weight rows (L/8 tiles, or half a tile when L = 4).
//    Per block, SMOPA (int8 4-way outer product into a za32 tile) takes 8 steps, one
//    per 4-column word g: zn = the activation rows' word g (one lane per row), zm =
//    the pass rows' word g (one lane per row). The tile then holds every row pair's
//    exact int32 block dot product. The GEMM uses tile 0; the GEMV, which needs no
//    other tile, puts four consecutive blocks in tiles 0-3 (independent chains).
//  - The weight layout keeps a row's 32 columns together, so zm is a transpose: LD4W
//    (W4, W4M: a row's 16 bytes are 4 words) or LD4D + UZP1/UZP2 (W8: 32-byte rows)
//    de-interleave words, and SPLICE joins the tiles of a pass (they are kb blocks
//    apart). Nibbles are unpacked in registers (W4 minus 8, as ukernel.h defines it).
//  - Activation rows are kb blocks apart at any stride, so the GEMM transposes them
//    through za32 tile 3 (tiles 2 and 3 when L = 4): row i's block goes into
//    horizontal slice i, and vertical slice g is then zn. The GEMV broadcasts the word.
//  - The float part follows ukernel.h exactly, on Z registers in streaming mode:
//    scale = w.d * a.d, prod = (float)isum * scale, acc = acc + prod, as separate
//    FMUL/SCVTF/FMUL/FADD (the file is built with -ffp-contract=off, and every step
//    is an explicit intrinsic, so nothing can fuse). The GEMM keeps its accumulators
//    in ZA array vectors of za32 tile 1 and adds with the SME2 FADD to ZA (an
//    unfused IEEE add, FPCR rounding, like FADD on Z registers); it starts from +0.0
//    like the reference's `acc = 0.0f`, so even the sign of a zero matches.
// Every loop is vector-length agnostic: nothing assumes SVL = 512.
#ifndef MOERT_KERNELS_SME2_QGEMM_H_
#define MOERT_KERNELS_SME2_QGEMM_H_

#include <arm_sme.h>

#include "kernels/ukernel.h"

#if !defined(__ARM_FEATURE_SME2)
#error "kernels/sme2-qgemm.h needs -march=...+sme2"
#endif

// Everything below runs inside the kernels' streaming, ZA-owning body: helpers are
// forced inline so no call crosses a streaming-mode or ZA boundary.
#define MOERT_SME2_INLINE inline __attribute__((always_inline))

namespace moert::kernels::sme2 {

// Block b of the tile that holds weight row `row`.
template <typename Block>
MOERT_SME2_INLINE const Block* BlockOf(const void* w, size_t kb, size_t b,
                                       size_t row) __arm_streaming {
  return static_cast<const Block*>(w) + (row / MOERT_NR) * kb + b;
}

// Pass rows are gathered tile by tile: segment s (min(L, 8) rows, or min(L/2, 8) for
// 64-bit lanes) fills lanes [s * seg, (s+1) * seg). Segments are built last to first:
// SPLICE keeps the first `seg` lanes of its first operand (pg) and appends the second.
// Rows of tiles that do not exist (>= rows_total) read as zero, and are never loaded.

// The fp16 array at byte `offset` of each block (d or m), one float lane per pass
// row [n0, n0 + L). Widening fp16 -> fp32 is exact, as core::Fp16ToFloat.
template <typename Block>
MOERT_SME2_INLINE svfloat32_t LoadScales(const void* w, size_t kb, size_t b, size_t n0,
                                         size_t rows_total, size_t offset) __arm_streaming {
  const uint64_t lanes = svcntw();
  const uint64_t seg = lanes < MOERT_NR ? lanes : MOERT_NR;
  const svbool_t pg = svwhilelt_b32_u64(0, seg);
  svuint32_t bits = svdup_n_u32(0);
  for (uint64_t s = lanes / seg; s-- > 0;) {
    const size_t row = n0 + s * seg;
    svuint32_t x = svdup_n_u32(0);
    if (row < rows_total) {
      const char* blk = reinterpret_cast<const char*>(BlockOf<Block>(w, kb, b, row));
      // Zero-extending halfword loads: each fp16 in the low half of its lane.
      x = svld1uh_u32(pg, reinterpret_cast<const uint16_t*>(blk + offset) + row % MOERT_NR);
    }
    bits = s + 1 == lanes / seg ? x : svsplice_u32(pg, x, bits);
  }
  // FCVT reads the even (low) half of each 32-bit lane.
  return svcvt_f32_f16_x(svptrue_b32(), svreinterpret_f16_u32(bits));
}

// The 16-byte rows (W4/W4M qs at byte `offset`) of the pass, de-interleaved by LD4W:
// word q (q = 0..3) of every pass row, one row per lane.
template <typename Block>
MOERT_SME2_INLINE svint32x4_t LoadRows16(const void* w, size_t kb, size_t b, size_t n0,
                                         size_t rows_total, size_t offset) __arm_streaming {
  const uint64_t lanes = svcntw();
  const uint64_t seg = lanes < MOERT_NR ? lanes : MOERT_NR;
  const svbool_t pg = svwhilelt_b32_u64(0, seg);
  const svint32_t zero = svdup_n_s32(0);
  svint32x4_t v = svcreate4_s32(zero, zero, zero, zero);
  for (uint64_t s = lanes / seg; s-- > 0;) {
    const size_t row = n0 + s * seg;
    svint32x4_t x = svcreate4_s32(zero, zero, zero, zero);
    if (row < rows_total) {
      const char* blk = reinterpret_cast<const char*>(BlockOf<Block>(w, kb, b, row));
      x = svld4_s32(pg, reinterpret_cast<const int32_t*>(blk + offset + 16 * (row % MOERT_NR)));
    }
    if (s + 1 == lanes / seg) {
      v = x;
    } else {
      v = svcreate4_s32(svsplice_s32(pg, svget4_s32(x, 0), svget4_s32(v, 0)),
                        svsplice_s32(pg, svget4_s32(x, 1), svget4_s32(v, 1)),
                        svsplice_s32(pg, svget4_s32(x, 2), svget4_s32(v, 2)),
                        svsplice_s32(pg, svget4_s32(x, 3), svget4_s32(v, 3)));
    }
  }
  return v;
}

// One half of a pass of 32-byte rows (W8 qs): LD4D de-interleaves the doublewords of
// rows [row0, row0 + L/2), one row per 64-bit lane.
template <typename Block>
MOERT_SME2_INLINE svint64x4_t LoadRows32Half(const void* w, size_t kb, size_t b, size_t row0,
                                             size_t rows_total, size_t offset) __arm_streaming {
  const uint64_t half = svcntd();
  const uint64_t seg = half < MOERT_NR ? half : MOERT_NR;
  const svbool_t pg = svwhilelt_b64_u64(0, seg);
  const svint64_t zero = svdup_n_s64(0);
  svint64x4_t v = svcreate4_s64(zero, zero, zero, zero);
  for (uint64_t s = half / seg; s-- > 0;) {
    const size_t row = row0 + s * seg;
    svint64x4_t x = svcreate4_s64(zero, zero, zero, zero);
    if (row < rows_total) {
      const char* blk = reinterpret_cast<const char*>(BlockOf<Block>(w, kb, b, row));
      x = svld4_s64(pg, reinterpret_cast<const int64_t*>(blk + offset + 32 * (row % MOERT_NR)));
    }
    if (s + 1 == half / seg) {
      v = x;
    } else {
      v = svcreate4_s64(svsplice_s64(pg, svget4_s64(x, 0), svget4_s64(v, 0)),
                        svsplice_s64(pg, svget4_s64(x, 1), svget4_s64(v, 1)),
                        svsplice_s64(pg, svget4_s64(x, 2), svget4_s64(v, 2)),
                        svsplice_s64(pg, svget4_s64(x, 3), svget4_s64(v, 3)));
    }
  }
  return v;
}

// The low (high) nibble of every byte, minus kBias, as int8.
template <int kBias>
MOERT_SME2_INLINE svint8_t LowNibbles(svint32_t words) __arm_streaming {
  const svbool_t all = svptrue_b8();
  const svint8_t v = svreinterpret_s8_u8(svand_n_u8_x(all, svreinterpret_u8_s32(words), 0x0F));
  if constexpr (kBias != 0) return svsub_n_s8_x(all, v, kBias);
  return v;
}
template <int kBias>
MOERT_SME2_INLINE svint8_t HighNibbles(svint32_t words) __arm_streaming {
  const svbool_t all = svptrue_b8();
  const svint8_t v = svreinterpret_s8_u8(svlsr_n_u8_x(all, svreinterpret_u8_s32(words), 4));
  if constexpr (kBias != 0) return svsub_n_s8_x(all, v, kBias);
  return v;
}

// W4/W4M: byte j of a row holds column j (low nibble) and column j + 16 (high nibble),
// so the low nibbles of word q are columns 4q..4q+3 (word q) and the high ones word
// q + 4.
template <typename Block, int kBias>
MOERT_SME2_INLINE void NibbleWeights(const void* w, size_t kb, size_t b, size_t n0,
                                     size_t rows_total, svint8x4_t& lo,
                                     svint8x4_t& hi) __arm_streaming {
  const svint32x4_t rows =
      LoadRows16<Block>(w, kb, b, n0, rows_total, __builtin_offsetof(Block, qs));
  lo = svcreate4_s8(LowNibbles<kBias>(svget4_s32(rows, 0)), LowNibbles<kBias>(svget4_s32(rows, 1)),
                    LowNibbles<kBias>(svget4_s32(rows, 2)), LowNibbles<kBias>(svget4_s32(rows, 3)));
  hi = svcreate4_s8(
      HighNibbles<kBias>(svget4_s32(rows, 0)), HighNibbles<kBias>(svget4_s32(rows, 1)),
      HighNibbles<kBias>(svget4_s32(rows, 2)), HighNibbles<kBias>(svget4_s32(rows, 3)));
}

// W8: the low (even) or high (odd) words of doubleword q across both halves of a pass.
MOERT_SME2_INLINE svint8_t EvenWords(svint64_t h0, svint64_t h1) __arm_streaming {
  return svreinterpret_s8_s32(svuzp1_s32(svreinterpret_s32_s64(h0), svreinterpret_s32_s64(h1)));
}
MOERT_SME2_INLINE svint8_t OddWords(svint64_t h0, svint64_t h1) __arm_streaming {
  return svreinterpret_s8_s32(svuzp2_s32(svreinterpret_s32_s64(h0), svreinterpret_s32_s64(h1)));
}

// zm operands: words 0..3 in `lo`, 4..7 in `hi` (word g = columns 4g..4g+3 of every
// pass row, one row per 32-bit lane, as int8).

// Symmetric int4 (value = nibble - 8).
struct W4 {
  using Block = moert_w4_block;
  static constexpr bool kHasMin = false;
  static MOERT_SME2_INLINE void Weights(const void* w, size_t kb, size_t b, size_t n0,
                                        size_t rows_total, svint8x4_t& lo,
                                        svint8x4_t& hi) __arm_streaming {
    NibbleWeights<Block, 8>(w, kb, b, n0, rows_total, lo, hi);
  }
};

// Asymmetric int4 (value = d * nibble + m): nibbles as they are, plus the offset term.
struct W4M {
  using Block = moert_w4m_block;
  static constexpr bool kHasMin = true;
  static MOERT_SME2_INLINE void Weights(const void* w, size_t kb, size_t b, size_t n0,
                                        size_t rows_total, svint8x4_t& lo,
                                        svint8x4_t& hi) __arm_streaming {
    NibbleWeights<Block, 0>(w, kb, b, n0, rows_total, lo, hi);
  }
};

// int8: UZP1/UZP2 of the pass's two halves split each doubleword q into words 2q and
// 2q + 1 and put all L rows in one vector.
struct W8 {
  using Block = moert_w8_block;
  static constexpr bool kHasMin = false;
  static MOERT_SME2_INLINE void Weights(const void* w, size_t kb, size_t b, size_t n0,
                                        size_t rows_total, svint8x4_t& lo,
                                        svint8x4_t& hi) __arm_streaming {
    const size_t offset = __builtin_offsetof(Block, qs);
    const svint64x4_t h0 = LoadRows32Half<Block>(w, kb, b, n0, rows_total, offset);
    const svint64x4_t h1 = LoadRows32Half<Block>(w, kb, b, n0 + svcntd(), rows_total, offset);
    lo = svcreate4_s8(EvenWords(svget4_s64(h0, 0), svget4_s64(h1, 0)),
                      OddWords(svget4_s64(h0, 0), svget4_s64(h1, 0)),
                      EvenWords(svget4_s64(h0, 1), svget4_s64(h1, 1)),
                      OddWords(svget4_s64(h0, 1), svget4_s64(h1, 1)));
    hi = svcreate4_s8(EvenWords(svget4_s64(h0, 2), svget4_s64(h1, 2)),
                      OddWords(svget4_s64(h0, 2), svget4_s64(h1, 2)),
                      EvenWords(svget4_s64(h0, 3), svget4_s64(h1, 3)),
                      OddWords(svget4_s64(h0, 3), svget4_s64(h1, 3)));
  }
};

// Block dot products of every (activation row, pass row) pair into za32 tile kTile.
template <uint64_t kTile>
MOERT_SME2_INLINE void Mopa(svint8x4_t a_lo, svint8x4_t a_hi, svint8x4_t w_lo,
                            svint8x4_t w_hi) __arm_streaming __arm_inout("za") {
  const svbool_t all = svptrue_b8();
  svzero_mask_za(0x11 << kTile);  // za32 tile t = za64 tiles t and t + 4
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_lo, 0), svget4_s8(w_lo, 0));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_lo, 1), svget4_s8(w_lo, 1));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_lo, 2), svget4_s8(w_lo, 2));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_lo, 3), svget4_s8(w_lo, 3));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_hi, 0), svget4_s8(w_hi, 0));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_hi, 1), svget4_s8(w_hi, 1));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_hi, 2), svget4_s8(w_hi, 2));
  svmopa_za32_s8_m(kTile, all, all, svget4_s8(a_hi, 3), svget4_s8(w_hi, 3));
}

MOERT_SME2_INLINE const moert_a8_block* ARow(const moert_a8_block* a, size_t a_stride,
                                             size_t i) __arm_streaming {
  return reinterpret_cast<const moert_a8_block*>(reinterpret_cast<const char*>(a) + i * a_stride);
}

// Words first..first+3 of an activation block's values, each broadcast to all lanes.
MOERT_SME2_INLINE svint8x4_t BroadcastWords(const int8_t* qs, int first) __arm_streaming {
  int32_t v[4];
  __builtin_memcpy(v, qs + 4 * first, sizeof(v));
  return svcreate4_s8(
      svreinterpret_s8_s32(svdup_n_s32(v[0])), svreinterpret_s8_s32(svdup_n_s32(v[1])),
      svreinterpret_s8_s32(svdup_n_s32(v[2])), svreinterpret_s8_s32(svdup_n_s32(v[3])));
}

MOERT_SME2_INLINE svint8x4_t AsBytes(svint32x4_t v) __arm_streaming {
  return svcreate4_s8(
      svreinterpret_s8_s32(svget4_s32(v, 0)), svreinterpret_s8_s32(svget4_s32(v, 1)),
      svreinterpret_s8_s32(svget4_s32(v, 2)), svreinterpret_s8_s32(svget4_s32(v, 3)));
}

// (float)isum * (w.d * a.d), rounded after each step as ukernel.h defines it.
MOERT_SME2_INLINE svfloat32_t Product(svint32_t isum, svfloat32_t wd, float ad) __arm_streaming {
  const svbool_t all = svptrue_b32();
  return svmul_f32_x(all, svcvt_f32_s32_x(all, isum), svmul_n_f32_x(all, wd, ad));
}

// The W4M term (float)a.s * (w.m * a.d).
MOERT_SME2_INLINE svfloat32_t Offset(svfloat32_t wm, float ad, float as) __arm_streaming {
  const svbool_t all = svptrue_b32();
  return svmul_n_f32_x(all, svmul_n_f32_x(all, wm, ad), as);
}

// GEMV, one block: the row's word g broadcast as zn (so every row of the tile holds
// the same sums) against the pass's weights, into za32 tile kTile.
template <uint64_t kTile, typename Format>
MOERT_SME2_INLINE void GemvMopa(const moert_a8_block& ab, const void* w, size_t kb, size_t b,
                                size_t n0, size_t rows_total) __arm_streaming __arm_inout("za") {
  const svint8x4_t a_lo = BroadcastWords(ab.qs, 0);
  const svint8x4_t a_hi = BroadcastWords(ab.qs, 4);
  svint8x4_t w_lo, w_hi;
  Format::Weights(w, kb, b, n0, rows_total, w_lo, w_hi);
  Mopa<kTile>(a_lo, a_hi, w_lo, w_hi);
}

// GEMV, one block's float part: acc = acc + (float)isum * (w.d * a.d) [+ the W4M
// offset term], row 0 of za32 tile kTile holding isum.
template <uint64_t kTile, typename Format>
MOERT_SME2_INLINE svfloat32_t GemvAccumulate(svfloat32_t acc, const moert_a8_block& ab,
                                             const void* w, size_t kb, size_t b, size_t n0,
                                             size_t rows_total) __arm_streaming __arm_in("za") {
  using Block = typename Format::Block;
  const svbool_t all = svptrue_b32();
  const svint32_t isum = svread_hor_za32_s32_m(svdup_n_s32(0), all, kTile, 0);
  const svfloat32_t wd = LoadScales<Block>(w, kb, b, n0, rows_total, __builtin_offsetof(Block, d));
  acc = svadd_f32_x(all, acc, Product(isum, wd, ab.d));
  if constexpr (Format::kHasMin) {
    const svfloat32_t wm =
        LoadScales<Block>(w, kb, b, n0, rows_total, __builtin_offsetof(Block, m));
    acc = svadd_f32_x(all, acc, Offset(wm, ab.d, static_cast<float>(ab.s)));
  }
  return acc;
}

// One activation row against all weight rows (m == 1 per call is the GEMV contract;
// larger m is taken row by row). Blocks go four at a time into the four za32 tiles,
// so their SMOPA chains are independent; the float part then takes them in order.
// The accumulator lives in a Z register.
template <typename Format>
MOERT_SME2_INLINE void Gemv(size_t m, size_t nc, size_t kb, const moert_a8_block* a,
                            size_t a_stride, const void* w, float* c,
                            size_t c_stride) __arm_streaming __arm_inout("za") {
  const uint64_t lanes = svcntw();
  const size_t rows_total = (nc + MOERT_NR - 1) / MOERT_NR * MOERT_NR;
  for (size_t i = 0; i < m; ++i) {
    const moert_a8_block* a_row = ARow(a, a_stride, i);
    for (size_t n0 = 0; n0 < nc; n0 += lanes) {
      svfloat32_t acc = svdup_n_f32(0.0f);
      for (size_t b = 0; b < kb; b += 4) {
        const size_t nb = kb - b < 4 ? kb - b : 4;
        GemvMopa<0, Format>(a_row[b], w, kb, b, n0, rows_total);
        if (nb > 1) GemvMopa<1, Format>(a_row[b + 1], w, kb, b + 1, n0, rows_total);
        if (nb > 2) GemvMopa<2, Format>(a_row[b + 2], w, kb, b + 2, n0, rows_total);
        if (nb > 3) GemvMopa<3, Format>(a_row[b + 3], w, kb, b + 3, n0, rows_total);
        acc = GemvAccumulate<0, Format>(acc, a_row[b], w, kb, b, n0, rows_total);
        if (nb > 1)
          acc = GemvAccumulate<1, Format>(acc, a_row[b + 1], w, kb, b + 1, n0, rows_total);
        if (nb > 2)
          acc = GemvAccumulate<2, Format>(acc, a_row[b + 2], w, kb, b + 2, n0, rows_total);
        if (nb > 3)
          acc = GemvAccumulate<3, Format>(acc, a_row[b + 3], w, kb, b + 3, n0, rows_total);
      }
      const size_t left = nc - n0;
      svst1_f32(svwhilelt_b32_u64(0, left < lanes ? left : lanes), c + i * c_stride + n0, acc);
    }
  }
}

// Up to MOERT_SME2_GEMM_MR (16) activation rows against all weight rows; any m works,
// rows are taken L at a time (one chunk at SVL = 512, four at SVL = 128).
// Accumulators: ZA array vectors 1 + 4j + k*L (j < L/4, k < 4) hold row 4j + k; they
// are exactly the slices of za32 tile 1, so zeroing that tile resets them.
template <typename Format>
MOERT_SME2_INLINE void Gemm(size_t m, size_t nc, size_t kb, const moert_a8_block* a,
                            size_t a_stride, const void* w, float* c,
                            size_t c_stride) __arm_streaming __arm_inout("za") {
  using Block = typename Format::Block;
  const uint64_t lanes = svcntw();
  const size_t rows_total = (nc + MOERT_NR - 1) / MOERT_NR * MOERT_NR;
  const svbool_t all = svptrue_b32();
  for (size_t n0 = 0; n0 < nc; n0 += lanes) {
    const size_t left = nc - n0;
    const svbool_t store = svwhilelt_b32_u64(0, left < lanes ? left : lanes);
    for (size_t i0 = 0; i0 < m; i0 += lanes) {
      const size_t mc = m - i0 < lanes ? m - i0 : lanes;
      svzero_mask_za(0x22);  // za32 tile 1: the accumulators, +0.0
      for (size_t b = 0; b < kb; ++b) {
        // Transpose the activation rows' words through ZA (rows >= mc keep stale
        // data: they only reach tile 0 rows that are never read).
        svint32x4_t a_lo, a_hi;
        if (lanes >= 8) {
          const svbool_t eight = svwhilelt_b32_u64(0, 8);
          for (size_t i = 0; i < mc; ++i) {
            svld1_hor_za32(3, static_cast<uint32_t>(i), eight, ARow(a, a_stride, i0 + i)[b].qs);
          }
          a_lo = svread_ver_za32_s32_vg4(3, 0);
          a_hi = svread_ver_za32_s32_vg4(3, 4);
        } else {  // L = 4: a row's 8 words span two tiles' slices
          for (size_t i = 0; i < mc; ++i) {
            const int8_t* qs = ARow(a, a_stride, i0 + i)[b].qs;
            svld1_hor_za32(2, static_cast<uint32_t>(i), all, qs);
            svld1_hor_za32(3, static_cast<uint32_t>(i), all, qs + 16);
          }
          a_lo = svread_ver_za32_s32_vg4(2, 0);
          a_hi = svread_ver_za32_s32_vg4(3, 0);
        }
        svint8x4_t w_lo, w_hi;
        Format::Weights(w, kb, b, n0, rows_total, w_lo, w_hi);
        Mopa<0>(AsBytes(a_lo), AsBytes(a_hi), w_lo, w_hi);

        const svfloat32_t wd =
            LoadScales<Block>(w, kb, b, n0, rows_total, __builtin_offsetof(Block, d));
        svfloat32_t wm = wd;
        if constexpr (Format::kHasMin) {
          wm = LoadScales<Block>(w, kb, b, n0, rows_total, __builtin_offsetof(Block, m));
        }
        for (size_t j = 0; 4 * j < mc; ++j) {
          const svint32x4_t isum = svread_hor_za32_s32_vg4(0, static_cast<uint32_t>(4 * j));
          // Rows past mc get a zero scale (their sums are stale but finite) and are
          // never stored.
          float ad[4], as[4];
          for (size_t k = 0; k < 4; ++k) {
            const size_t i = 4 * j + k;
            const moert_a8_block* ab = i < mc ? &ARow(a, a_stride, i0 + i)[b] : nullptr;
            ad[k] = ab != nullptr ? ab->d : 0.0f;
            as[k] = ab != nullptr ? static_cast<float>(ab->s) : 0.0f;
          }
          const uint32_t slice = static_cast<uint32_t>(1 + 4 * j);
          svadd_za32_f32_vg1x4(slice, svcreate4_f32(Product(svget4_s32(isum, 0), wd, ad[0]),
                                                    Product(svget4_s32(isum, 1), wd, ad[1]),
                                                    Product(svget4_s32(isum, 2), wd, ad[2]),
                                                    Product(svget4_s32(isum, 3), wd, ad[3])));
          if constexpr (Format::kHasMin) {
            svadd_za32_f32_vg1x4(slice,
                                 svcreate4_f32(Offset(wm, ad[0], as[0]), Offset(wm, ad[1], as[1]),
                                               Offset(wm, ad[2], as[2]), Offset(wm, ad[3], as[3])));
          }
        }
      }
      for (size_t j = 0; 4 * j < mc; ++j) {
        const svfloat32x4_t acc = svread_za32_f32_vg1x4(static_cast<uint32_t>(1 + 4 * j));
        float* row = c + (i0 + 4 * j) * c_stride + n0;
        svst1_f32(store, row, svget4_f32(acc, 0));
        if (4 * j + 1 < mc) svst1_f32(store, row + c_stride, svget4_f32(acc, 1));
        if (4 * j + 2 < mc) svst1_f32(store, row + 2 * c_stride, svget4_f32(acc, 2));
        if (4 * j + 3 < mc) svst1_f32(store, row + 3 * c_stride, svget4_f32(acc, 3));
      }
    }
  }
}

}  // namespace moert::kernels::sme2

#endif  // MOERT_KERNELS_SME2_QGEMM_H_
