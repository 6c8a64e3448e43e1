// What the NEON dotprod and i8mm quantized matmul kernels share: the float part of
// ukernel.h's numerics with 4 weight rows in the 4 lanes of a vector, fp16 widening,
// the store of a (possibly partial) 8-row tile, the split of a GEMM's rows into
// compile-time counts, the SMMLA operand interleaving and the W4S24 unpacking. Only
// baseline AArch64 NEON here: sdot and smmla stay in the kernel files, which are
// built with their own -march flags.
#ifndef MOERT_KERNELS_NEON_QGEMM_H_
#define MOERT_KERNELS_NEON_QGEMM_H_

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/ukernel.h"

namespace moert::kernels::neon {
// Compiled for NEON dotprod and for i8mm (their kernel files' -march): an inline
// namespace per build keeps each one's inline functions and template instantiations
// apart, so the linker cannot give i8mm code to a dotprod-only CPU (kernels.isa_symbols).
#if defined(__ARM_FEATURE_MATMUL_INT8)
inline namespace isa_neoni8mm {
#else
inline namespace isa_neondot {
#endif

// Totals of 4 rows whose dot products are spread over 4 lanes each: lane r of the
// result is row r's sum (integer adds, so any order is exact).
inline int32x4_t ReduceRows(int32x4_t r0, int32x4_t r1, int32x4_t r2, int32x4_t r3) {
  return vpaddq_s32(vpaddq_s32(r0, r1), vpaddq_s32(r2, r3));
}

// One block's step for 4 rows in lanes: acc + (float)isum * scale, a multiply then an
// add (never fused), as the scalar reference rounds it.
inline float32x4_t AddBlock(float32x4_t acc, int32x4_t isum, float32x4_t scale) {
  return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(isum), scale));
}

// The 8 fp16 values at p (a block's d or m) widened, exactly, to rows 0-3 and 4-7.
inline void LoadFp16x8(const uint16_t* p, float32x4_t* lo, float32x4_t* hi) {
  const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
  *lo = vcvt_f32_f16(vget_low_f16(h));
  *hi = vcvt_high_f32_f16(h);
}

// Writes a tile's 8 outputs to c, or only the first `rows` (the last, partial tile:
// nothing past the matrix's last column is touched).
inline void StoreTile(float* c, size_t rows, float32x4_t lo, float32x4_t hi) {
  if (rows == MOERT_NR) {
    vst1q_f32(c, lo);
    vst1q_f32(c + 4, hi);
    return;
  }
  float tmp[MOERT_NR];
  vst1q_f32(tmp, lo);
  vst1q_f32(tmp + 4, hi);
  for (size_t r = 0; r < rows; ++r) c[r] = tmp[r];
}

inline size_t TileRows(size_t nc, size_t n0) { return nc - n0 < MOERT_NR ? nc - n0 : MOERT_NR; }

inline const moert_a8_block* ActivationRow(const moert_a8_block* a, size_t a_stride, size_t i) {
  return reinterpret_cast<const moert_a8_block*>(reinterpret_cast<const char*>(a) + i * a_stride);
}

// p itself, hidden from the optimizer so that loads through it are not merged with
// earlier loads of the same bytes. The GEMMs re-read a block's activations (32 bytes,
// from L1) for each half tile instead of keeping every row's in registers: GCC would
// otherwise keep them and spill the accumulators.
template <typename T>
inline const T* Reload(const T* p) {
  asm volatile("" : "+r"(p));
  return p;
}

// For SMMLA (2x8 times 8x2): the 32 activations of two rows' blocks interleaved 8
// columns at a time, out[c] = [row0's columns 8c-8c+7 | row1's columns 8c-8c+7].
inline void InterleaveActivations(const int8_t* row0, const int8_t* row1, int8x16_t out[4]) {
  const int64x2_t lo0 = vreinterpretq_s64_s8(vld1q_s8(row0));
  const int64x2_t hi0 = vreinterpretq_s64_s8(vld1q_s8(row0 + 16));
  const int64x2_t lo1 = vreinterpretq_s64_s8(vld1q_s8(row1));
  const int64x2_t hi1 = vreinterpretq_s64_s8(vld1q_s8(row1 + 16));
  out[0] = vreinterpretq_s8_s64(vzip1q_s64(lo0, lo1));
  out[1] = vreinterpretq_s8_s64(vzip2q_s64(lo0, lo1));
  out[2] = vreinterpretq_s8_s64(vzip1q_s64(hi0, hi1));
  out[3] = vreinterpretq_s8_s64(vzip2q_s64(hi0, hi1));
}

// SMMLA sums of activation rows (i0, i1) against weight rows (r, r+1) and (r+2, r+3),
// s01 = [i0.w(r), i0.w(r+1), i1.w(r), i1.w(r+1)] and s23 alike, regrouped with the 4
// weight rows in lanes: *row0 for i0, *row1 for i1.
inline void SplitPairSums(int32x4_t s01, int32x4_t s23, int32x4_t* row0, int32x4_t* row1) {
  const int64x2_t a = vreinterpretq_s64_s32(s01);
  const int64x2_t b = vreinterpretq_s64_s32(s23);
  *row0 = vreinterpretq_s32_s64(vzip1q_s64(a, b));
  *row1 = vreinterpretq_s32_s64(vzip2q_s64(a, b));
}

// The GEMM kernels are templates over the row count M (1-4) so that their loops over
// rows unroll and their accumulators stay in registers; this calls
// f(std::integral_constant<size_t, M>, a_rows, c_rows) for m rows in chunks of 4
// (m is at most 4 by contract; more would still be computed correctly).
template <typename F>
inline void ForRowChunks(size_t m, const moert_a8_block* a, size_t a_stride, float* c,
                         size_t c_stride, F&& f) {
  for (; m >= 4; m -= 4, a = ActivationRow(a, a_stride, 4), c += 4 * c_stride) {
    f(std::integral_constant<size_t, 4>{}, a, c);
  }
  switch (m) {
    case 1:
      f(std::integral_constant<size_t, 1>{}, a, c);
      break;
    case 2:
      f(std::integral_constant<size_t, 2>{}, a, c);
      break;
    case 3:
      f(std::integral_constant<size_t, 3>{}, a, c);
      break;
    default:
      break;
  }
}

// Rows 2p and 2p + 1 of a W4S24 block, arranged so that one sdot serves both rows:
// w_lo = [row 2p's kept values 0-7 | row 2p+1's kept values 0-7] as signed
// (nibble - 8), w_hi the same for kept values 8-15; col_lo / col_hi hold, per lane,
// the column of its kept value within its half block (kept values 0-7 read columns
// 0-15, kept values 8-15 columns 16-31), a vqtbl1q index into that half's 16
// activations. Then sdot(sdot(0, w_lo, tbl(a_lo, col_lo)), w_hi, tbl(a_hi, col_hi))
// has row 2p's dot product in lanes 0-1 and row 2p+1's in lanes 2-3.
struct W4S24Pair {
  int8x16_t w_lo, w_hi;
  uint8x16_t col_lo, col_hi;
};

class W4S24Unpacker {
 public:
  W4S24Unpacker()
      : xor88_(vdupq_n_u8(0x88)),
        mask7_(vdupq_n_u16(7)),
        second_(vdupq_n_u16(0x0800)),
        place_lo_(vld1q_u8(kPlaceLo)),
        place_hi_(vld1q_u8(kPlaceHi)),
        shift_lo_(vld1q_s16(kShiftLo)),
        shift_hi_(vld1q_s16(kShiftHi)),
        columns_(vld1q_u8(kColumns)),
        base_(vld1q_u8(kBase)) {}

  // qs: the 16 bytes at blk.qs[2p]; pc: the 8 bytes at blk.pc[2p] (the two rows' codes
  // in bytes 0-5; bytes 6-7 lie inside the block and only feed discarded bits).
  W4S24Pair Pair(uint8x16_t qs, uint8x8_t pc) const {
    W4S24Pair out;
    // nibble ^ 8, read as a signed 4-bit value, is nibble - 8.
    const int8x16_t q = vreinterpretq_s8_u8(veorq_u8(qs, xor88_));
    out.w_lo = vshrq_n_s8(vshlq_n_s8(q, 4), 4);
    out.w_hi = vshrq_n_s8(q, 4);
    const uint8x16_t pc16 = vcombine_u8(pc, vdup_n_u8(0));
    out.col_lo = Columns(pc16, place_lo_, shift_lo_);
    out.col_hi = Columns(pc16, place_hi_, shift_hi_);
    return out;
  }

 private:
  // 16-bit lane j (bytes 2j, 2j+1) is group j % 4 (or 4 + j % 4) of the pair's row
  // j / 4: the two code bytes holding its 3 bits are shifted down and masked to the
  // code c, (c, c + 8) indexes the first and second column of the pair, and the
  // group's first column is added.
  uint8x16_t Columns(uint8x16_t pc16, uint8x16_t place, int16x8_t shift) const {
    const uint16x8_t words = vreinterpretq_u16_u8(vqtbl1q_u8(pc16, place));
    const uint16x8_t code = vandq_u16(vshlq_u16(words, shift), mask7_);
    const uint8x16_t control = vreinterpretq_u8_u16(vmlaq_n_u16(second_, code, 0x0101));
    return vaddq_u8(vqtbl1q_u8(columns_, control), base_);
  }

  // Group g's code is bits 3g..3g+2 of its row's 3 bytes: byte 3g / 8, bit 3g % 8.
  static constexpr uint8_t kPlaceLo[16] = {0, 1, 0, 1, 0, 1, 1, 2, 3, 4, 3, 4, 3, 4, 4, 5};
  static constexpr uint8_t kPlaceHi[16] = {1, 2, 1, 2, 2, 3, 2, 3, 4, 5, 4, 5, 5, 6, 5, 6};
  static constexpr int16_t kShiftLo[8] = {0, -3, -6, -1, 0, -3, -6, -1};
  static constexpr int16_t kShiftHi[8] = {-4, -7, -2, -5, -4, -7, -2, -5};
  // moert_w4s24_pairs: entry c the first column of code c, entry 8 + c its second.
  static constexpr uint8_t kColumns[16] = {0, 0, 0, 1, 1, 2, 0, 2, 1, 2, 3, 2, 3, 3, 1, 3};
  static constexpr uint8_t kBase[16] = {0, 0, 4, 4, 8, 8, 12, 12, 0, 0, 4, 4, 8, 8, 12, 12};

  uint8x16_t xor88_;
  uint16x8_t mask7_, second_;
  uint8x16_t place_lo_, place_hi_;
  int16x8_t shift_lo_, shift_hi_;
  uint8x16_t columns_;
  uint8x16_t base_;
};

}  // inline namespace isa_neondot / isa_neoni8mm
}  // namespace moert::kernels::neon

#endif  // MOERT_KERNELS_NEON_QGEMM_H_
