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

// This header is compiled once per x86 kernel ISA (-mavx2, -mavxvnni, -mavx512vnni,
// -mavx512vbmi; vnni-qgemm.h builds on it). An inline namespace per ISA gives each build
// its own names for what it defines, inline functions and template instantiations alike:
// with one name the linker would keep one ISA's copy of such a weak symbol for every
// caller, and a CPU without that ISA would fault (kernels.isa_symbols checks it).
#if defined(__AVX512VBMI__)
#define MOERT_X86_ISA_NAMESPACE isa_avx512vbmi
#elif defined(__AVX512VNNI__)
#define MOERT_X86_ISA_NAMESPACE isa_avx512vnni
#elif defined(__AVXVNNI__)
#define MOERT_X86_ISA_NAMESPACE isa_avxvnni
#else
#define MOERT_X86_ISA_NAMESPACE isa_avx2
#endif

namespace moert::kernels::avx2 {
inline namespace MOERT_X86_ISA_NAMESPACE {

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

// Activation dword t of a block (its values 4t..4t+3), read in place: a set1 of it
// becomes a vpbroadcastd from memory (integer domain: a vbroadcastss feeding vpdpbusd
// was 1.25x slower on Zen 4).
MOERT_AVX2_INLINE int32_t ActivationDword(const moert_a8_block& a, int t) {
  typedef int32_t Dword __attribute__((aligned(1), may_alias));
  return *reinterpret_cast<const Dword*>(a.qs + 4 * t);
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

// W4 for a GEMM (two or more activation rows): the 8 rows of a tile in the 8 dword lanes
// (order 0,2,4,6,1,3,5,7), one register per step of 4 columns: step t < 4 holds each
// row's low nibbles of qs bytes 4t..4t+3 (columns 4t..4t+3), step t >= 4 the high
// nibbles of bytes 4(t-4).. (columns 16 + 4(t-4)..), which activation dword t (a.qs +
// 4t) multiplies. One maddubs per step against that dword broadcast adds each row's 4
// products in the lane's two int16 halves, so the block needs no horizontal sums: the 8
// steps' int16 sums stay below 2^15 (each half sums 16 products of at most 15 * 127, at
// most 30480 in magnitude) and one madd makes each row's int32 sum, exact, as W4's. The
// rearrangement (8 unpacks) is made once per block and serves every activation row.
struct W4Steps {
  using Block = moert_w4_block;
  using Lanes = LaneOrder02461357;
  struct Prepared {
    __m256i step[8];
    __m256 d;
  };
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    // v[p]: rows 2p (low lane) and 2p+1 (high lane), dwords 0..3 of each.
    __m256i v[4];
    MOERT_AVX2_UNROLL
    for (int p = 0; p < 4; ++p) {
      v[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[2 * p]));
    }
    // Lanes (r0 r2 | r1 r3) of dwords 0, 1 and 2, 3; then (r4 r6 | r5 r7).
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    const __m256i t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    const __m256i t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    // Dword s of rows 0,2,4,6 | 1,3,5,7.
    const __m256i raw[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                            _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i mask = _mm256_set1_epi8(0x0F);
    Prepared w;
    MOERT_AVX2_UNROLL
    for (int s = 0; s < 4; ++s) {
      w.step[s] = _mm256_and_si256(raw[s], mask);
      w.step[s + 4] = _mm256_and_si256(_mm256_srli_epi16(raw[s], 4), mask);
    }
    w.d = LoadHalfs(b.d, Lanes::HalfOrder());
    return w;
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const auto dword = [&a](int t) { return _mm256_set1_epi32(ActivationDword(a, t)); };
    __m256i even = _mm256_maddubs_epi16(w.step[0], dword(0));
    __m256i odd = _mm256_maddubs_epi16(w.step[1], dword(1));
    MOERT_AVX2_UNROLL
    for (int t = 2; t < 8; t += 2) {
      even = _mm256_add_epi16(even, _mm256_maddubs_epi16(w.step[t], dword(t)));
      odd = _mm256_add_epi16(odd, _mm256_maddubs_epi16(w.step[t + 1], dword(t + 1)));
    }
    const __m256i sums = _mm256_madd_epi16(_mm256_add_epi16(even, odd), _mm256_set1_epi16(1));
    // sum (q - 8) * a = sum q * a - 8 * a.s, exactly.
    return AddScaled(acc, _mm256_sub_epi32(sums, _mm256_set1_epi32(a.s * 8)), w.d, a.d);
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
// The 16 kept values of a row-block are gathered from the activations with pshufb.
// index[i] (i = 0..3) holds, a dword per row and the rows in order, the table indices of
// kept values 4i..4i+3: groups 2i and 2i+1, columns 8i..8i+7. Its table is 16 bytes
// broadcast from the activation block's bytes at 8i, whose bytes 8..15 are
// qs[8i..8i+7] (the table for i = 0 starts at d and s, which the indices never pick),
// hence index = 8 + 4 (odd group) + column-in-group.
//
// The pair codes are expanded for all 8 rows at once, without a table walk per weight:
// the codes of rows 0..3 fill the low lane and those of rows 4..7 the high lane (two
// 16-byte loads). Per index register one pshufb puts in each 16-bit word (row, group)
// the two code bytes that hold the group's 3 bits, at bit s; a multiply by 2^(13 - s)
// and a shift by 13 leave the code c (AVX2 has no per-word shift); c * 0x0101 + 0x0800
// is the pshufb control (c, c + 8) into one 16-byte table of every code's first column
// (entries 0..7) and second column (entries 8..15), plus 8; the odd group adds 4.
//
// The nibbles: q0 = rows 0..3 (8 bytes a row: dwords r.a, r.b), q1 = rows 4..7; shufps
// and vpermq give the a (kept values 0..3, 8..11) or b (4..7, 12..15) dwords of all
// rows in order. isum = sum (q - 8) * a: maddubs of the nibbles minus maddubs of 8,
// each int16 at most 2 * 15 * 127; a 16-bit lane of the sum holds 8 products of at
// most 8 * 127 in magnitude. The final madd leaves the rows in order.
struct W4S24Tables {
  uint8_t place[4][32];   // index[i]'s pshufb of the code bytes into words
  uint16_t shift[4][16];  // 2^(13 - s) for each of those words
  uint8_t columns[32];    // 8 + the first (entries 0..7) and second (8..15) columns
};

constexpr W4S24Tables MakeW4S24Tables() {
  W4S24Tables t{};
  for (int i = 0; i < 4; ++i) {
    for (int lane = 0; lane < 2; ++lane) {
      for (int w = 0; w < 8; ++w) {  // word w: row w / 2 of the lane, group 2i + w % 2
        const int row = w / 2;
        const int g = 2 * i + w % 2;
        const int byte = 3 * g / 8;
        t.place[i][16 * lane + 2 * w] = static_cast<uint8_t>(3 * row + byte);
        t.place[i][16 * lane + 2 * w + 1] = static_cast<uint8_t>(3 * row + byte + 1);
        t.shift[i][8 * lane + w] = static_cast<uint16_t>(1 << (13 - (3 * g - 8 * byte)));
      }
    }
  }
  for (int lane = 0; lane < 2; ++lane) {
    for (int c = 0; c < 8; ++c) {
      t.columns[16 * lane + c] = static_cast<uint8_t>(8 + moert_w4s24_pairs[c][0]);
      t.columns[16 * lane + 8 + c] = static_cast<uint8_t>(8 + moert_w4s24_pairs[c][1]);
    }
  }
  return t;
}

alignas(32) inline constexpr W4S24Tables kW4S24Tables = MakeW4S24Tables();

struct W4S24 {
  using Block = moert_w4s24_block;
  using Lanes = W8::Lanes;  // rows in order
  struct Prepared {
    __m256i index[4];   // index[i]: pshufb indices of kept values 4i .. 4i+3 of each row
    __m256i nibble[4];  // the matching nibbles
    __m256 d;
  };
  static MOERT_AVX2_INLINE __m256i Load(const void* p) {
    return _mm256_load_si256(static_cast<const __m256i*>(p));
  }
  // The pair codes of rows 0..3 in the low lane, of rows 4..7 in the high lane (each
  // 16-byte load starts at a row's codes and stays inside the block).
  static MOERT_AVX2_INLINE __m256i LoadCodes(const Block& b) {
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.pc[0]))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.pc[4])), 1);
  }
  static MOERT_AVX2_INLINE Prepared Prepare(const Block& b) {
    Prepared w;
    const W4S24Tables& t = kW4S24Tables;
    const __m256i codes = LoadCodes(b);
    const __m256i columns = Load(t.columns);
    const __m256i dup = _mm256_set1_epi16(0x0101);
    const __m256i second = _mm256_set1_epi16(0x0800);
    const __m256i odd = _mm256_set1_epi32(0x04040000);
    MOERT_AVX2_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i words = _mm256_shuffle_epi8(codes, Load(t.place[i]));
      const __m256i code = _mm256_srli_epi16(_mm256_mullo_epi16(words, Load(t.shift[i])), 13);
      const __m256i control = _mm256_add_epi16(_mm256_mullo_epi16(code, dup), second);
      w.index[i] = _mm256_add_epi8(_mm256_shuffle_epi8(columns, control), odd);
    }
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256 q0 =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[0])));
    const __m256 q1 =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs[4])));
    const __m256i qa = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8);
    const __m256i qb = _mm256_permute4x64_epi64(
        _mm256_castps_si256(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8);
    w.nibble[0] = _mm256_and_si256(qa, mask);                        // kept 0..3
    w.nibble[1] = _mm256_and_si256(qb, mask);                        // kept 4..7
    w.nibble[2] = _mm256_and_si256(_mm256_srli_epi16(qa, 4), mask);  // kept 8..11
    w.nibble[3] = _mm256_and_si256(_mm256_srli_epi16(qb, 4), mask);  // kept 12..15
    w.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    return w;
  }
  // The pshufb of kept values 4i .. 4i+3 of every row from activation block a.
  static MOERT_AVX2_INLINE __m256i Gather(const Prepared& w, const moert_a8_block& a, int i) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(&a);
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 8 * i)));
    return _mm256_shuffle_epi8(table, w.index[i]);
  }
  static MOERT_AVX2_INLINE __m256 Accumulate(__m256 acc, const Prepared& w,
                                             const moert_a8_block& a) {
    const __m256i eight = _mm256_set1_epi8(8);
    __m256i sum = _mm256_setzero_si256();
    MOERT_AVX2_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i g = Gather(w, a, i);
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

}  // inline namespace MOERT_X86_ISA_NAMESPACE
}  // namespace moert::kernels::avx2

#endif  // MOERT_KERNELS_AVX2_QGEMM_H_
