// The VNNI quantized GEMV/GEMM block math: the AVX2 kernels' formats (kernels/avx2-qgemm.h,
// whose tile loop and loaders they reuse) with the int8 dot products done by vpdpbusd
// (unsigned bytes times signed bytes, four products summed into each int32 lane) instead
// of maddubs + hadd + madd. Included by the *-avxvnni.cc files (-mavxvnni: the VEX form,
// 256-bit) and the *-avx512vnni.cc files (-mavx512f -mavx512bw -mavx512vl -mavx512vnni:
// the EVEX form, and 512-bit registers for W4, W4M and W4S24).
//
// Numerics: vpdpbusd adds exact products into int32 lanes without saturation (a lane
// sums at most 8 products of 15 * 127 for W4, 4 of 128 * 127 for W8, 16 of 15 * 127 or
// 8 * 127 for W4S24's two sums), so every block's isum is the exact integer the scalar
// reference forms, and the float steps are avx2::AddScaled's: every output has the
// reference's bits.
#ifndef MOERT_KERNELS_VNNI_QGEMM_H_
#define MOERT_KERNELS_VNNI_QGEMM_H_

#include <immintrin.h>

#include "kernels/avx2-qgemm.h"

#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__)) && !defined(__AVXVNNI__)
#error "kernels/vnni-qgemm.h needs -mavxvnni or -mavx512vnni -mavx512vl"
#endif

namespace moert::kernels::vnni {
// The same format names are compiled for AVX-VNNI (VEX), AVX512-VNNI and AVX512-VBMI
// (EVEX), and the tile loop templates over them are instantiated in each: were the names
// the same, the linker would keep one of the instantiations (weak symbols of one name),
// and the AVX512-VNNI kernels once ran AVX-VNNI's VEX vpdpbusd, which a CPU with
// AVX512-VNNI alone (Zen 4, Ice Lake) faults on. avx2-qgemm.h's inline namespace per ISA
// gives each build its own names (tests/kernels/check-isa-symbols.sh checks it).
inline namespace MOERT_X86_ISA_NAMESPACE {

// acc + the dot products of 4 unsigned bytes of u with 4 signed bytes of s, per int32 lane.
MOERT_AVX2_INLINE __m256i DpBusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}

// sum over the block of nibble * a per row (no offset), rows in lane order
// 0,2,4,6,1,3,5,7 (as avx2::DotNibbles4): each register's lane holds one row's four
// partial sums, and the hadd tree adds them.
MOERT_AVX2_INLINE __m256i DotNibbles4(const avx2::Nibbles4& n, const moert_a8_block& a) {
  const __m256i a_lo = avx2::BroadcastLo(a);
  const __m256i a_hi = avx2::BroadcastHi(a);
  const __m256i zero = _mm256_setzero_si256();
  __m256i s[4];
  MOERT_AVX2_UNROLL
  for (int p = 0; p < 4; ++p) s[p] = DpBusd(DpBusd(zero, n.lo[p], a_lo), n.hi[p], a_hi);
  const __m256i s01 = _mm256_hadd_epi32(s[0], s[1]);
  const __m256i s23 = _mm256_hadd_epi32(s[2], s[3]);
  return _mm256_hadd_epi32(s01, s23);
}

// --- 256-bit formats (AVX-VNNI; W8 also under AVX512-VNNI) ----------------------------

struct W4 : avx2::W4 {
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i isum = _mm256_sub_epi32(vnni::DotNibbles4(w.n, a), _mm256_set1_epi32(a.s * 8));
    return avx2::AddScaled(acc, isum, w.d, a.d);
  }
};

struct W4M : avx2::W4M {
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    return avx2::AddOffset(avx2::AddScaled(acc, vnni::DotNibbles4(w.n, a), w.d, a.d), w.m, a);
  }
};

// |w| times a with w's sign, as avx2::W8; one vpdpbusd per row replaces maddubs + madd.
struct W8 : avx2::W8 {
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
    const __m256i zero = _mm256_setzero_si256();
    __m256i s[8];
    MOERT_AVX2_UNROLL
    for (int r = 0; r < 8; ++r) {
      const __m256i wr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.b->qs[r]));
      s[r] = DpBusd(zero, w.abs_w[r], _mm256_sign_epi8(av, wr));
    }
    return avx2::AddScaled(acc, SumRows(s), w.d, a.d);
  }
};

// W4S24 (2:4 sparse), both VNNI forms: avx2::W4S24's expanded pair codes and gathered
// activations, with the nibble products and the minus-8 term each summed by vpdpbusd
// straight into int32 lanes (one row per lane, rows in order): no int16 stage.
struct W4S24 : avx2::W4S24 {
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i eight = _mm256_set1_epi8(8);
    __m256i sum = _mm256_setzero_si256();
    __m256i offset = _mm256_setzero_si256();
    MOERT_AVX2_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i g = Gather(w, a, i);
      sum = DpBusd(sum, w.nibble[i], g);
      offset = DpBusd(offset, eight, g);
    }
    return avx2::AddScaled(acc, _mm256_sub_epi32(sum, offset), w.d, a.d);
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// --- 512-bit W4 and W4M (AVX512-VNNI) -------------------------------------------------
//
// A block's 8 rows of 16 bytes are two 64-byte registers: rows 0..3 and rows 4..7, one
// row per 128-bit lane. The activation halves are broadcast to all four lanes; after
// the vpdpbusd pairs each lane holds its row's four partial sums. One unpack-add round
// and one swap-add leave row L's total in dword 4L and row L + 4's in dword 4L + 1 of
// a register, and one vpermd gathers them in row order: the scales load in row order.
struct RowOrder {
  static MOERT_AVX2_INLINE __m128i HalfOrder() {
    return _mm_set_epi64x(static_cast<int64_t>(avx2::HalfOrderLo(4, 5, 6, 7)),
                          static_cast<int64_t>(avx2::HalfOrderLo(0, 1, 2, 3)));
  }
  static MOERT_AVX2_INLINE __m256 ToRowOrder(__m256 acc) { return acc; }
};

struct Nibbles8 {
  __m512i lo[2];
  __m512i hi[2];
};

MOERT_AVX2_INLINE Nibbles8 LoadNibbles8(const uint8_t (*qs)[16]) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  Nibbles8 n;
  MOERT_AVX2_UNROLL
  for (int h = 0; h < 2; ++h) {
    const __m512i v = _mm512_loadu_si512(qs[4 * h]);
    n.lo[h] = _mm512_and_si512(v, mask);
    n.hi[h] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  }
  return n;
}

// sum over the block of nibble * a per row (no offset), in row order.
MOERT_AVX2_INLINE __m256i DotNibbles8(const Nibbles8& n, const moert_a8_block& a) {
  const __m512i a_lo =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs)));
  const __m512i a_hi =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs + 16)));
  const __m512i zero = _mm512_setzero_si512();
  __m512i s[2];
  MOERT_AVX2_UNROLL
  for (int h = 0; h < 2; ++h) {
    s[h] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, n.lo[h], a_lo), n.hi[h], a_hi);
  }
  // Lane L: [s0 p0+p2, s1 p0+p2, s0 p1+p3, s1 p1+p3], then the halves swapped and added.
  const __m512i t =
      _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
  const __m512i u = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
  const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, u));
}

struct W4x512 {
  using Block = moert_w4_block;
  using Lanes = RowOrder;
  struct Prepared {
    Nibbles8 n;
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    return {LoadNibbles8(b.qs), avx2::LoadHalfs(b.d, Lanes::HalfOrder())};
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i isum = _mm256_sub_epi32(DotNibbles8(w.n, a), _mm256_set1_epi32(a.s * 8));
    return avx2::AddScaled(acc, isum, w.d, a.d);
  }
};

struct W4Mx512 {
  using Block = moert_w4m_block;
  using Lanes = RowOrder;
  struct Prepared {
    Nibbles8 n;
    __m256 d;
    __m256 m;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    return {LoadNibbles8(b.qs), avx2::LoadHalfs(b.d, Lanes::HalfOrder()),
            avx2::LoadHalfs(b.m, Lanes::HalfOrder())};
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    return avx2::AddOffset(avx2::AddScaled(acc, DotNibbles8(w.n, a), w.d, a.d), w.m, a);
  }
};

// --- 512-bit W4S24 (AVX512-VNNI) ---------------------------------------------------------
//
// avx2::W4S24 with two of its index registers in one 512-bit register: index[0] holds
// avx2's index[0] | index[1] (kept values 0..7), index[1] its index[2] | index[3]
// (8..15). The codes register is repeated in both halves, so each expansion step
// (pshufb, multiply, shift, multiply-add, table pshufb, add) serves 32 (row, group)
// codes instead of 16; the 64 nibble bytes are one load and one vpermd (the a dwords
// of rows 0..7, then the b dwords). The activation tables of a half are avx2's: the
// block's bytes at 8i. The two halves' int32 sums are added at the end: rows in order.
struct W4S24Tables512 {
  uint8_t place[2][64];
  uint16_t shift[2][32];
  uint8_t columns[64];
};

constexpr W4S24Tables512 MakeW4S24Tables512() {
  const avx2::W4S24Tables& t = avx2::kW4S24Tables;
  W4S24Tables512 u{};
  for (int j = 0; j < 2; ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 32; ++k) u.place[j][32 * h + k] = t.place[2 * j + h][k];
      for (int k = 0; k < 16; ++k) u.shift[j][16 * h + k] = t.shift[2 * j + h][k];
    }
  }
  for (int k = 0; k < 64; ++k) u.columns[k] = t.columns[k % 32];
  return u;
}

alignas(64) inline constexpr W4S24Tables512 kW4S24Tables512 = MakeW4S24Tables512();

struct W4S24x512 {
  using Block = moert_w4s24_block;
  using Lanes = avx2::W4S24::Lanes;  // rows in order
  struct Prepared {
    __m512i index[2];   // kept values 0..7, 8..15 of every row (a dword per row and half)
    __m512i nibble[2];  // the matching nibbles
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    Prepared w;
    const W4S24Tables512& t = kW4S24Tables512;
    const __m512i codes = _mm512_broadcast_i64x4(avx2::W4S24::LoadCodes(b));
    const __m512i columns = _mm512_load_si512(t.columns);
    const __m512i dup = _mm512_set1_epi16(0x0101);
    const __m512i second = _mm512_set1_epi16(0x0800);
    const __m512i odd = _mm512_set1_epi32(0x04040000);
    MOERT_AVX2_UNROLL
    for (int j = 0; j < 2; ++j) {
      const __m512i words = _mm512_shuffle_epi8(codes, _mm512_load_si512(t.place[j]));
      const __m512i code =
          _mm512_srli_epi16(_mm512_mullo_epi16(words, _mm512_load_si512(t.shift[j])), 13);
      const __m512i control = _mm512_add_epi16(_mm512_mullo_epi16(code, dup), second);
      w.index[j] = _mm512_add_epi8(_mm512_shuffle_epi8(columns, control), odd);
    }
    // Row r's qs bytes 0..3 are dword 2r, bytes 4..7 dword 2r + 1.
    const __m512i q = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
        _mm512_loadu_si512(b.qs));
    const __m512i mask = _mm512_set1_epi8(0x0F);
    w.nibble[0] = _mm512_and_si512(q, mask);                        // kept 0..3 | 4..7
    w.nibble[1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);  // kept 8..11 | 12..15
    w.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    return w;
  }
  // The activation tables of index[j]: the block's bytes at 16j and 16j + 8.
  static MOERT_AVX2_INLINE __m512i Tables(const moert_a8_block& a, int j) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(&a) + 16 * j;
    const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    const __m256i hi =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 8)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m512i eight = _mm512_set1_epi8(8);
    __m512i sum = _mm512_setzero_si512();
    __m512i offset = _mm512_setzero_si512();
    MOERT_AVX2_UNROLL
    for (int j = 0; j < 2; ++j) {
      const __m512i g = _mm512_shuffle_epi8(Tables(a, j), w.index[j]);
      sum = _mm512_dpbusd_epi32(sum, w.nibble[j], g);
      offset = _mm512_dpbusd_epi32(offset, eight, g);
    }
    const __m512i isum = _mm512_sub_epi32(sum, offset);
    return avx2::AddScaled(
        acc, _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1)),
        w.d, a.d);
  }
};

// --- W4 GEMM over tile pairs (AVX512-VNNI) ----------------------------------------------
//
// For two or more activation rows the GEMM takes two 8-row tiles at a time and puts row
// j of the pair (tile A's rows 0..7, tile B's 8..15) in dword lane j of a register:
// register t holds each row's 4 weight bytes of step t (t < 4: the low nibbles of qs
// bytes 4t..4t+3, columns 4t..4t+3; t >= 4: the high nibbles of bytes 4(t-4).., columns
// 16 + 4(t-4)..), so one vpdpbusd against activation dword t broadcast to every lane
// adds 4 products to all 16 rows' sums, and a block's row sums come out in row order
// with no horizontal reduction. The rearrangement (4 vpermt2d, 4 vshufi64x2 and the
// nibble masks) is made once per block pair and serves every activation row. Each
// row's block sum is exact in int32 and then scaled and added as W4x512 and the scalar
// kernel do, so the outputs are bit for bit the same.
struct W4PairSteps {
  __m512i step[8];
  __m512 d;  // the 16 rows' scales
};

MOERT_AVX2_INLINE W4PairSteps PrepareW4Pair(const moert_w4_block& ta, const moert_w4_block& tb) {
  // Dword lanes 0..7: dword 4j + s of (rows 0..3 | rows 4..7) = row j's bytes 4s..4s+3,
  // for s = 0 (lanes 0..7) and s = 1 (lanes 8..15); the second index s = 2, 3.
  const __m512i idx01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i idx23 = _mm512_add_epi32(idx01, _mm512_set1_epi32(2));
  const __m512i a0 = _mm512_loadu_si512(ta.qs[0]);
  const __m512i a1 = _mm512_loadu_si512(ta.qs[4]);
  const __m512i b0 = _mm512_loadu_si512(tb.qs[0]);
  const __m512i b1 = _mm512_loadu_si512(tb.qs[4]);
  const __m512i a01 = _mm512_permutex2var_epi32(a0, idx01, a1);
  const __m512i a23 = _mm512_permutex2var_epi32(a0, idx23, a1);
  const __m512i b01 = _mm512_permutex2var_epi32(b0, idx01, b1);
  const __m512i b23 = _mm512_permutex2var_epi32(b0, idx23, b1);
  // [A s, B s]: 128-bit lanes 0, 1 (s even) or 2, 3 (s odd) of each.
  const __m512i raw[4] = {
      _mm512_shuffle_i64x2(a01, b01, 0x44), _mm512_shuffle_i64x2(a01, b01, 0xEE),
      _mm512_shuffle_i64x2(a23, b23, 0x44), _mm512_shuffle_i64x2(a23, b23, 0xEE)};
  const __m512i mask = _mm512_set1_epi8(0x0F);
  W4PairSteps w;
  MOERT_AVX2_UNROLL
  for (int s = 0; s < 4; ++s) {
    w.step[s] = _mm512_and_si512(raw[s], mask);
    w.step[s + 4] = _mm512_and_si512(_mm512_srli_epi16(raw[s], 4), mask);
  }
  const __m256i halfs = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.d))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.d)), 1);
  w.d = _mm512_cvtph_ps(halfs);
  return w;
}

// acc + (float)(sum (q - 8) * a) * (d * a.d), per row of the pair (W4x512's steps).
MOERT_AVX2_INLINE __m512 AccumulateW4Pair(__m512 acc, const W4PairSteps& w,
                                          const moert_a8_block& a) {
  // Activation dword t in every lane (avx2::ActivationDword: a vpbroadcastd from memory).
  const auto dword = [&a](int t) { return _mm512_set1_epi32(avx2::ActivationDword(a, t)); };
  // The offset -8 * a.s rides in the first sum's start value (exact int32 either way).
  __m512i even = _mm512_set1_epi32(-8 * a.s);
  __m512i odd = _mm512_setzero_si512();
  MOERT_AVX2_UNROLL
  for (int t = 0; t < 8; t += 2) {
    even = _mm512_dpbusd_epi32(even, w.step[t], dword(t));
    odd = _mm512_dpbusd_epi32(odd, w.step[t + 1], dword(t + 1));
  }
  const __m512i isum = _mm512_add_epi32(even, odd);
  const __m512 scale = _mm512_mul_ps(w.d, _mm512_set1_ps(a.d));
  return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), scale));
}

// M activation rows (2 <= M <= 4) against the tile pairs of the first 16 * pairs rows.
template <size_t M>
MOERT_AVX2_INLINE void QGemmW4Pairs(size_t pairs, size_t kb, const moert_a8_block* a,
                                    size_t a_stride, const moert_w4_block* tile, float* c,
                                    size_t c_stride) {
  const moert_a8_block* a_row[M];
  MOERT_AVX2_UNROLL
  for (size_t i = 0; i < M; ++i) {
    a_row[i] =
        reinterpret_cast<const moert_a8_block*>(reinterpret_cast<const char*>(a) + i * a_stride);
  }
  for (size_t p = 0; p < pairs; ++p, tile += 2 * kb) {
    __m512 acc[M];
    MOERT_AVX2_UNROLL
    for (size_t i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
    for (size_t b = 0; b < kb; ++b) {
      const W4PairSteps w = PrepareW4Pair(tile[b], tile[kb + b]);
      MOERT_AVX2_UNROLL
      for (size_t i = 0; i < M; ++i) acc[i] = AccumulateW4Pair(acc[i], w, a_row[i][b]);
    }
    MOERT_AVX2_UNROLL
    for (size_t i = 0; i < M; ++i) _mm512_storeu_ps(c + i * c_stride + 16 * p, acc[i]);
  }
}

// The q4 GEMM (1 <= m <= 4): tile pairs as above for m >= 2, then the rows left (an odd
// tile, a short last tile) and m == 1 by W4x512.
inline void QGemmW4(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
                    const void* w, float* c, size_t c_stride) {
  const size_t pairs = m >= 2 ? nc / (2 * MOERT_NR) : 0;
  const auto* tile = static_cast<const moert_w4_block*>(w);
  switch (m) {
    case 1:
      break;
    case 2:
      QGemmW4Pairs<2>(pairs, kb, a, a_stride, tile, c, c_stride);
      break;
    case 3:
      QGemmW4Pairs<3>(pairs, kb, a, a_stride, tile, c, c_stride);
      break;
    default:
      QGemmW4Pairs<4>(pairs, kb, a, a_stride, tile, c, c_stride);
      break;
  }
  const size_t done = 2 * MOERT_NR * pairs;
  if (done < nc) {
    avx2::QGemm4<W4x512>(m, nc - done, kb, a, a_stride, tile + 2 * pairs * kb, c + done, c_stride);
  }
}

#if defined(__AVX512VBMI__)

// --- W4S24 with AVX512-VBMI byte permutes ------------------------------------------------
//
// vpermb indexes all 64 bytes of a register, so the expansion needs no per-lane tables:
//  1. one vpermb puts row r's 3 code bytes in qword r;
//  2. per half j (kept values 8j..8j+7 of every row, byte 8r + k), one vpmultishiftqb
//     picks for byte k the 8 bits at 3 * (4j + k / 2) of its qword: the group's code in
//     bits 0..2;
//  3. one vpternlogd keeps those 3 bits and adds the byte's (second?, group) as bits
//     3 and 4..6: a 7-bit index into a 128-entry table of each (code, second, group)'s
//     column in the block, which one vpermi2b reads.
// A half's kept values are then one vpermb of the 32 activation bytes, and its nibbles
// one and (low nibbles: kept values 0..7) or shift and and (high: 8..15) of the block's
// 64 qs bytes, already in that byte order. Each row's 4 dword sums are added by a qword
// shift and add and vpmovqd: rows in order.
struct W4S24VbmiTables {
  uint8_t spread[64];       // vpermb: row r's code bytes 3r..3r+2 into qword r
  uint8_t shift[2][64];     // vpmultishiftqb controls of half j
  uint8_t select[2][64];    // (k % 2) << 3 | group << 4 of byte 8r + k of half j
  uint8_t columns[128];     // [code | second << 3 | group << 4] = 4 group + the column
};

constexpr W4S24VbmiTables MakeW4S24VbmiTables() {
  W4S24VbmiTables t{};
  for (int r = 0; r < 8; ++r) {
    for (int k = 0; k < 8; ++k) t.spread[8 * r + k] = static_cast<uint8_t>(3 * r + (k < 3 ? k : 2));
  }
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 64; ++i) {
      const int k = i % 8;
      const int group = 4 * j + k / 2;
      t.shift[j][i] = static_cast<uint8_t>(3 * group);
      t.select[j][i] = static_cast<uint8_t>((k % 2) << 3 | group << 4);
    }
  }
  for (int i = 0; i < 128; ++i) {
    const int code = i & 7, second = (i >> 3) & 1, group = i >> 4;
    t.columns[i] = static_cast<uint8_t>(4 * group + moert_w4s24_pairs[code][second]);
  }
  return t;
}

alignas(64) inline constexpr W4S24VbmiTables kW4S24VbmiTables = MakeW4S24VbmiTables();

struct W4S24Vbmi {
  using Block = moert_w4s24_block;
  using Lanes = avx2::W4S24::Lanes;  // rows in order
  struct Prepared {
    __m512i index[2];   // half j: byte 8r + k = the column of row r's kept value 8j + k
    __m512i nibble[2];  // the matching nibbles
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    const W4S24VbmiTables& t = kW4S24VbmiTables;
    Prepared w;
    // 32 bytes from the codes stay inside the block (the nibbles follow them).
    const __m512i codes = _mm512_permutexvar_epi8(
        _mm512_load_si512(t.spread),
        _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.pc))));
    const __m512i columns_lo = _mm512_load_si512(t.columns);
    const __m512i columns_hi = _mm512_load_si512(t.columns + 64);
    MOERT_AVX2_UNROLL
    for (int j = 0; j < 2; ++j) {
      const __m512i fields = _mm512_multishift_epi64_epi8(_mm512_load_si512(t.shift[j]), codes);
      // (fields & 7) | select: vpternlogd's truth table for (A & B) | C.
      const __m512i entry = _mm512_ternarylogic_epi32(fields, _mm512_set1_epi8(7),
                                                      _mm512_load_si512(t.select[j]), 0xEA);
      w.index[j] = _mm512_permutex2var_epi8(columns_lo, entry, columns_hi);
    }
    const __m512i q = _mm512_loadu_si512(b.qs);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    w.nibble[0] = _mm512_and_si512(q, mask);
    w.nibble[1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
    w.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    return w;
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m512i table =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)));
    const __m512i eight = _mm512_set1_epi8(8);
    __m512i sum = _mm512_setzero_si512();
    __m512i offset = _mm512_setzero_si512();
    MOERT_AVX2_UNROLL
    for (int j = 0; j < 2; ++j) {
      const __m512i g = _mm512_permutexvar_epi8(w.index[j], table);
      sum = _mm512_dpbusd_epi32(sum, w.nibble[j], g);
      offset = _mm512_dpbusd_epi32(offset, eight, g);
    }
    // Row r's two dwords are qword r: add them in its low dword and narrow.
    const __m512i isum = _mm512_sub_epi32(sum, offset);
    const __m256i rows = _mm512_cvtepi64_epi32(_mm512_add_epi32(isum, _mm512_srli_epi64(isum, 32)));
    return avx2::AddScaled(acc, rows, w.d, a.d);
  }
};

#endif  // __AVX512VBMI__

#endif  // AVX512F && AVX512BW && AVX512VNNI

}  // inline namespace MOERT_X86_ISA_NAMESPACE
}  // namespace moert::kernels::vnni

#endif  // MOERT_KERNELS_VNNI_QGEMM_H_
