// What the AVX2 (+F16C) quantized GEMV/GEMM microkernels share: per weight format, how
// one block of a tile is loaded into registers ("Prepare", once per block) and how it
// is multiplied with one A8 activation block and added to the 8-lane accumulator
// ("Accumulate", once per block and activation row, so a GEMM reuses the prepared
// weights for all its rows), and the tile loop around them. Included only by the
// *-avx2.cc files, which are compiled with -mavx2 -mfma -mf16c.
//
// Numerics (kernels/ukernel.h): the block dot products are exact int32 sums, and each
// output lane takes acc = acc + (float)isum * (d * a.d) (and the W4M offset term) with
// a separate multiply and add, in block order, so every output has the scalar
// reference's bits. The 8 rows of a tile live in the 8 lanes of one register, in the
// order the format's reduction tree leaves them (Format::Lanes); the scales are loaded
// in that order and the accumulator is put back in row order when it is stored.
#ifndef MOERT_KERNELS_AVX2_QGEMM_H_
#define MOERT_KERNELS_AVX2_QGEMM_H_

#include <immintrin.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/ukernel.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "kernels/avx2-qgemm.h needs -mavx2 -mf16c"
#endif

#define MOERT_AVX2_INLINE inline __attribute__((always_inline))
// The short loops over registers must be unrolled, or the register arrays go to memory
// (g++ -O2 does not unroll them by itself).
#define MOERT_AVX2_UNROLL _Pragma("GCC unroll 8")

namespace moert::kernels::avx2 {

// 8 fp16 values at `p`, reordered so lane l holds element order[l], widened exactly.
MOERT_AVX2_INLINE __m256 LoadHalfs(const uint16_t* p, __m128i order) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_shuffle_epi8(h, order));
}

// pshufb control that gathers the 16-bit elements r0..r7 of a 128-bit register.
constexpr uint64_t HalfOrderLo(int r0, int r1, int r2, int r3) {
  return static_cast<uint64_t>(2 * r0) | static_cast<uint64_t>(2 * r0 + 1) << 8 |
         static_cast<uint64_t>(2 * r1) << 16 | static_cast<uint64_t>(2 * r1 + 1) << 24 |
         static_cast<uint64_t>(2 * r2) << 32 | static_cast<uint64_t>(2 * r2 + 1) << 40 |
         static_cast<uint64_t>(2 * r3) << 48 | static_cast<uint64_t>(2 * r3 + 1) << 56;
}

// acc + (float)isum * (d * a_d): the one accumulation step of ukernel.h.
MOERT_AVX2_INLINE __m256 AddScaled(__m256 acc, __m256i isum, __m256 d, float a_d) {
  const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a_d));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), scale));
}

// acc + (float)a.s * (m * a.d): the W4M offset step of ukernel.h, after AddScaled.
MOERT_AVX2_INLINE __m256 AddOffset(__m256 acc, __m256 m, const moert_a8_block& a) {
  const __m256 offset = _mm256_mul_ps(m, _mm256_set1_ps(a.d));
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(a.s)), offset));
}

// Both 16-byte halves of a 32-value activation block, each broadcast to both lanes.
MOERT_AVX2_INLINE __m256i BroadcastLo(const moert_a8_block& a) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs)));
}
MOERT_AVX2_INLINE __m256i BroadcastHi(const moert_a8_block& a) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs + 16)));
}

// --- W4 and W4M: two rows per register ------------------------------------------------
//
// Rows 2p and 2p+1 of a block are 32 contiguous bytes; one load holds row 2p in the low
// lane and row 2p+1 in the high lane. Their low nibbles (columns 0..15) and high nibbles
// (columns 16..31) multiply the activation halves broadcast to both lanes. maddubs
// (unsigned nibble x signed activation) cannot saturate, and every int16 partial sum
// stays below 2^15: a 16-bit lane after the hadd tree sums 16 products of at most
// 15 * 128 = 1920, i.e. at most 30720. The tree leaves rows in lane order 0,2,4,6,1,3,5,7.
struct Nibbles4 {
  __m256i lo[4];
  __m256i hi[4];
};

MOERT_AVX2_INLINE Nibbles4 LoadNibbles4(const uint8_t (*qs)[16]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  Nibbles4 n;
  MOERT_AVX2_UNROLL
  for (int p = 0; p < 4; ++p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[2 * p]));
    n.lo[p] = _mm256_and_si256(v, mask);
    n.hi[p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  }
  return n;
}

// sum over the block of nibble * a per row (no offset), rows in lane order 0,2,4,6,1,3,5,7.
MOERT_AVX2_INLINE __m256i DotNibbles4(const Nibbles4& n, const moert_a8_block& a) {
  const __m256i a_lo = BroadcastLo(a);
  const __m256i a_hi = BroadcastHi(a);
  __m256i s[4];
  MOERT_AVX2_UNROLL
  for (int p = 0; p < 4; ++p) {
    s[p] =
        _mm256_add_epi16(_mm256_maddubs_epi16(n.lo[p], a_lo), _mm256_maddubs_epi16(n.hi[p], a_hi));
  }
  const __m256i s01 = _mm256_hadd_epi16(s[0], s[1]);
  const __m256i s23 = _mm256_hadd_epi16(s[2], s[3]);
  return _mm256_madd_epi16(_mm256_hadd_epi16(s01, s23), _mm256_set1_epi16(1));
}

// Lanes hold rows 0,2,4,6,1,3,5,7: HalfOrder loads the fp16 scales in that order and
// ToRowOrder puts the accumulator back in row order.
struct LaneOrder02461357 {
  static MOERT_AVX2_INLINE __m128i HalfOrder() {
    return _mm_set_epi64x(static_cast<int64_t>(HalfOrderLo(1, 3, 5, 7)),
                          static_cast<int64_t>(HalfOrderLo(0, 2, 4, 6)));
  }
  // Row r is in lane {0,4,1,5,2,6,3,7}[r].
  static MOERT_AVX2_INLINE __m256 ToRowOrder(__m256 acc) {
    return _mm256_permutevar8x32_ps(acc, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
};

struct W4 {
  using Block = moert_w4_block;
  using Lanes = LaneOrder02461357;
  struct Prepared {
    Nibbles4 n;
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    return {LoadNibbles4(b.qs), LoadHalfs(b.d, Lanes::HalfOrder())};
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    // sum (q - 8) * a = sum q * a - 8 * a.s, exactly (a.s is the sum of a.qs, see A8).
    const __m256i isum = _mm256_sub_epi32(DotNibbles4(w.n, a), _mm256_set1_epi32(a.s * 8));
    return AddScaled(acc, isum, w.d, a.d);
  }
};

struct W4M {
  using Block = moert_w4m_block;
  using Lanes = LaneOrder02461357;
  struct Prepared {
    Nibbles4 n;
    __m256 d;
    __m256 m;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    return {LoadNibbles4(b.qs), LoadHalfs(b.d, Lanes::HalfOrder()),
            LoadHalfs(b.m, Lanes::HalfOrder())};
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    return AddOffset(AddScaled(acc, DotNibbles4(w.n, a), w.d, a.d), w.m, a);
  }
};

// --- W8: one row per register -----------------------------------------------------------
//
// maddubs needs one unsigned operand: |w| (|-128| = 128 as an unsigned byte, exact) times
// a with w's sign (a in [-127, 127], so the negation is exact). A pair of products is at
// most 2 * 128 * 127 = 32512 and cannot saturate.
struct W8 {
  using Block = moert_w8_block;
  struct Lanes {  // rows in order
    static MOERT_AVX2_INLINE __m128i HalfOrder() {
      return _mm_set_epi64x(static_cast<int64_t>(HalfOrderLo(4, 5, 6, 7)),
                            static_cast<int64_t>(HalfOrderLo(0, 1, 2, 3)));
    }
    static MOERT_AVX2_INLINE __m256 ToRowOrder(__m256 acc) { return acc; }
  };
  struct Prepared {
    const Block* b;  // the signs are read from memory (L1) in Accumulate
    __m256i abs_w[8];
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    Prepared w;
    w.b = &b;
    MOERT_AVX2_UNROLL
    for (int r = 0; r < 8; ++r) {
      w.abs_w[r] = _mm256_abs_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[r])));
    }
    w.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    return w;
  }
  // Row r's int32 sum of the eight lanes of s[r], rows in order.
  static MOERT_AVX2_INLINE __m256i SumRows(const __m256i (&s)[8]) {
    // Lane halves: h0123 = rows 0..3 (low-lane sums | high-lane sums), h4567 likewise.
    const __m256i h0123 =
        _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i h4567 =
        _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_blend_epi32(h0123, h4567, 0xF0),
                            _mm256_permute2x128_si256(h0123, h4567, 0x21));
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[8];
    MOERT_AVX2_UNROLL
    for (int r = 0; r < 8; ++r) {
      const __m256i wr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.b->qs[r]));
      s[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_w[r], _mm256_sign_epi8(av, wr)), ones);
    }
    return AddScaled(acc, SumRows(s), w.d, a.d);
  }
};

// --- W4S24: 2:4 sparse int4 -------------------------------------------------------------
//
// The 16 kept values of a row-block are gathered from the activations with pshufb. Kept
// value k = 4i + t (idx byte i, 2-bit field t) is column 8i + 4(t/2) + pos. A register
// lane of indices covers one idx byte i for 4 rows, so it gathers from the 8 columns
// 8i..8i+7 only: from a 16-byte table broadcast from the activation block's bytes at
// 8i, whose bytes 8..15 are qs[8i..8i+7] (the table for i = 0 starts at the block's d and
// s, which the indices never pick), hence index = 8 + 4(t/2) + pos.
//
// Lanes hold rows {0,1,4,5} (low) and {2,3,6,7} (high): the idx bytes are permuted that
// way (vpermq + pshufb), each 2-bit field becomes an index byte through a 16-entry table
// on its nibble, and two rounds of unpacks put the 4 fields of an idx byte in k order,
// matching the nibbles (the low or high nibbles of qs bytes 0..3 or 4..7 of each row,
// picked with shufps). isum = sum (q - 8) * a: maddubs of the nibbles minus maddubs of 8,
// each int16 at most 2 * 15 * 127; a 16-bit lane of the sum holds 8 products of at most
// 8 * 127 in magnitude. The final madd leaves rows in lane order 0,1,4,5,2,3,6,7.
struct W4S24 {
  using Block = moert_w4s24_block;
  struct Lanes {
    static MOERT_AVX2_INLINE __m128i HalfOrder() {
      return _mm_set_epi64x(static_cast<int64_t>(HalfOrderLo(2, 3, 6, 7)),
                            static_cast<int64_t>(HalfOrderLo(0, 1, 4, 5)));
    }
    // Row r is in lane {0,1,4,5,2,3,6,7}[r].
    static MOERT_AVX2_INLINE __m256 ToRowOrder(__m256 acc) {
      return _mm256_permutevar8x32_ps(acc, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    }
  };
  struct Prepared {
    __m256i index[4];   // index[i]: pshufb indices of the kept values of idx byte i
    __m256i nibble[4];  // the matching nibbles (kept values 4i .. 4i+3 of each row)
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    Prepared w;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    // idx bytes: byte 4r + i. After vpermq the low lane has rows 0,1,4,5 and the high lane
    // rows 2,3,6,7 (4 bytes each); pshufb transposes each lane to byte 4i + (row slot).
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.idx));
    v = _mm256_permute4x64_epi64(v, 0xD8);
    const __m256i transpose =
        _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    v = _mm256_shuffle_epi8(v, transpose);
    const __m256i v_lo = _mm256_and_si256(v, mask);                        // fields 0, 1
    const __m256i v_hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);  // fields 2, 3
    // Nibble n = field(t) | field(t+1) << 2 -> index 8 + 4(t/2) + field.
    const __m256i f0_table =
        _mm256_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9,
                         10, 11, 8, 9, 10, 11, 8, 9, 10, 11);
    const __m256i f1_table =
        _mm256_setr_epi8(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11, 8, 8, 8, 8, 9, 9,
                         9, 9, 10, 10, 10, 10, 11, 11, 11, 11);
    const __m256i four = _mm256_set1_epi8(4);
    const __m256i f0 = _mm256_shuffle_epi8(f0_table, v_lo);
    const __m256i f1 = _mm256_shuffle_epi8(f1_table, v_lo);
    const __m256i f2 = _mm256_shuffle_epi8(_mm256_add_epi8(f0_table, four), v_hi);
    const __m256i f3 = _mm256_shuffle_epi8(_mm256_add_epi8(f1_table, four), v_hi);
    const __m256i f01_lo = _mm256_unpacklo_epi8(f0, f1);  // bytes 0..7 (idx bytes 0, 1)
    const __m256i f01_hi = _mm256_unpackhi_epi8(f0, f1);  // bytes 8..15 (idx bytes 2, 3)
    const __m256i f23_lo = _mm256_unpacklo_epi8(f2, f3);
    const __m256i f23_hi = _mm256_unpackhi_epi8(f2, f3);
    w.index[0] = _mm256_unpacklo_epi16(f01_lo, f23_lo);
    w.index[1] = _mm256_unpackhi_epi16(f01_lo, f23_lo);
    w.index[2] = _mm256_unpacklo_epi16(f01_hi, f23_hi);
    w.index[3] = _mm256_unpackhi_epi16(f01_hi, f23_hi);
    // qs rows 0..3 (q0) and 4..7 (q1), 8 bytes a row: dwords r.a (bytes 0..3), r.b (4..7).
    const __m256 q0 =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[0])));
    const __m256 q1 =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[4])));
    // Low lane: rows 0, 1, 4, 5; high lane: rows 2, 3, 6, 7.
    const __m256i qa = _mm256_castps_si256(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256i qb = _mm256_castps_si256(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
    w.nibble[0] = _mm256_and_si256(qa, mask);                        // kept 0..3
    w.nibble[1] = _mm256_and_si256(qb, mask);                        // kept 4..7
    w.nibble[2] = _mm256_and_si256(_mm256_srli_epi16(qa, 4), mask);  // kept 8..11
    w.nibble[3] = _mm256_and_si256(_mm256_srli_epi16(qb, 4), mask);  // kept 12..15
    w.d = LoadHalfs(b.d, Lanes::HalfOrder());
    return w;
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(&a);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256i sum = _mm256_setzero_si256();
    MOERT_AVX2_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i table = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 8 * i)));
      const __m256i g = _mm256_shuffle_epi8(table, w.index[i]);
      sum = _mm256_add_epi16(sum, _mm256_sub_epi16(_mm256_maddubs_epi16(w.nibble[i], g),
                                                   _mm256_maddubs_epi16(eight, g)));
    }
    const __m256i isum = _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
    return AddScaled(acc, isum, w.d, a.d);
  }
};
static_assert(offsetof(moert_a8_block, qs) == 8, "W4S24 tables assume qs at byte 8");

// --- The tile loop ------------------------------------------------------------------------

// Writes the first `rows` lanes of `v` (row order) to c.
MOERT_AVX2_INLINE void StoreRows(float* c, __m256 v, size_t rows) {
  if (rows == MOERT_NR) {
    _mm256_storeu_ps(c, v);
  } else {
    alignas(32) float tmp[MOERT_NR];
    _mm256_store_ps(tmp, v);
    std::memcpy(c, tmp, rows * sizeof(float));
  }
}

// M activation rows (1 <= M <= 4) against all tiles; see the qgemm signature in ukernel.h.
template <class Format, size_t M>
MOERT_AVX2_INLINE void QGemmRows(size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
                                 const void* w, float* c, size_t c_stride) {
  using Block = typename Format::Block;
  const moert_a8_block* a_row[M];
  MOERT_AVX2_UNROLL
  for (size_t i = 0; i < M; ++i) {
    a_row[i] =
        reinterpret_cast<const moert_a8_block*>(reinterpret_cast<const char*>(a) + i * a_stride);
  }
  const auto* tile = static_cast<const Block*>(w);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    __m256 acc[M];
    MOERT_AVX2_UNROLL
    for (size_t i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < kb; ++b) {
      const typename Format::Prepared prepared = Format::Prepare(tile[b]);
      MOERT_AVX2_UNROLL
      for (size_t i = 0; i < M; ++i) acc[i] = Format::Accumulate(acc[i], prepared, a_row[i][b]);
    }
    const size_t rows = nc - n0 < MOERT_NR ? nc - n0 : MOERT_NR;
    MOERT_AVX2_UNROLL
    for (size_t i = 0; i < M; ++i) {
      StoreRows(c + i * c_stride + n0, Format::Lanes::ToRowOrder(acc[i]), rows);
    }
  }
}

// A GEMV kernel: the contract allows m == 1 only, but any m is computed row by row.
template <class Format>
void QGemv(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride, const void* w,
           float* c, size_t c_stride) {
  for (size_t i = 0; i < m; ++i) {
    QGemmRows<Format, 1>(
        nc, kb,
        reinterpret_cast<const moert_a8_block*>(reinterpret_cast<const char*>(a) + i * a_stride),
        a_stride, w, c + i * c_stride, c_stride);
  }
}

// A GEMM kernel of MR = 4 rows (1 <= m <= 4, as the config's mr promises callers).
template <class Format>
void QGemm4(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride, const void* w,
            float* c, size_t c_stride) {
  assert(m >= 1 && m <= 4);
  switch (m) {
    case 1:
      QGemmRows<Format, 1>(nc, kb, a, a_stride, w, c, c_stride);
      break;
    case 2:
      QGemmRows<Format, 2>(nc, kb, a, a_stride, w, c, c_stride);
      break;
    case 3:
      QGemmRows<Format, 3>(nc, kb, a, a_stride, w, c, c_stride);
      break;
    default:
      QGemmRows<Format, 4>(nc, kb, a, a_stride, w, c, c_stride);
      break;
  }
}

}  // namespace moert::kernels::avx2

#endif  // MOERT_KERNELS_AVX2_QGEMM_H_
