// The AMX-INT8 quantized GEMM (prefill): up to 16 A8 activation rows times W4, W4M or
// W8 weight tiles, the int8 dot products of a block done by one tdpbssd.
//
// A 32-column block gives each output an exact int32 (ukernel.h), so a tile multiply
// never spans two blocks: per block and per 16 weight rows (two of the format's 8-row
// tiles),
//  - tile A (tmm1) = the block's 32 activation bytes of each row (m rows, 32 bytes),
//    loaded straight from the A8 blocks with the rows' stride;
//  - tile B (tmm2) = the 16 weight rows' 32 values as signed bytes in the VNNI order
//    tdpbssd reads (8 rows of 64 bytes: row k holds, for each weight row n, its values
//    4k..4k+3), which the format's block is expanded into with AVX-512 (Pack);
//  - tile C (tmm0) = zero, then tdpbssd: C[i][n] = the block's exact int32 dot product
//    of activation row i with weight row n;
//  - C is stored and each activation row's 16 outputs are accumulated in a zmm in the
//    order ukernel.h fixes: acc = acc + (float)isum * (w.d * a.d), and for W4M
//    acc = acc + (float)a.s * (w.m * a.d). So every output has the scalar reference's bits.
//
// The tile instructions come from a policy class: AmxTiles (below) issues them; the
// tests instantiate the same loop over kernels/amx-tile-emulator.h's scalar model of
// them, so the loop is checked on any AVX-512 machine and the instructions themselves
// where the CPU has AMX.
//
// Included by the *-amx.cc files (-mavx512f -mavx512bw -mavx512vl -mamx-tile
// -mamx-int8) and, with the emulator, by tests/kernels/amx_emulated_gemm.cc (AVX-512
// only).
#ifndef MOERT_KERNELS_AMX_QGEMM_H_
#define MOERT_KERNELS_AMX_QGEMM_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/ukernel.h"
#include "kernels/ukernels-amx.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__)
#error "kernels/amx-qgemm.h needs -mavx512f -mavx512bw"
#endif

#define MOERT_AMX_INLINE inline __attribute__((always_inline))
#define MOERT_AMX_UNROLL _Pragma("GCC unroll 16")

namespace moert::kernels::amx {
// Its own names for what the AMX objects and the emulated test build define (see
// avx2-qgemm.h on why each ISA build needs them).
inline namespace isa_amx {

// The 64-byte operand of ldtilecfg (palette 1).
struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t
  uint8_t rows[16] = {};    // rows of tile t
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Tiles of the GEMM: C (int32 results), A (activations), B (weights).
constexpr int kTileC = 0;
constexpr int kTileA = 1;
constexpr int kTileB = 2;

// The shapes for m activation rows (1..16).
inline TileConfig GemmTileConfig(size_t m) {
  TileConfig cfg;
  cfg.rows[kTileC] = static_cast<uint8_t>(m);
  cfg.colsb[kTileC] = 16 * sizeof(int32_t);  // 16 weight rows
  cfg.rows[kTileA] = static_cast<uint8_t>(m);
  cfg.colsb[kTileA] = MOERT_QK;  // one block's bytes
  cfg.rows[kTileB] = MOERT_QK / 4;
  cfg.colsb[kTileB] = 64;  // 16 weight rows x 4 bytes
  return cfg;
}

// GCC spells the feature macros __AMX_TILE__ and __AMX_INT8__, clang __AMXTILE__ and
// __AMXINT8__.
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && \
    (defined(__AMX_INT8__) || defined(__AMXINT8__))
// The hardware's tile instructions. GCC's intrinsics paste the tile number into the
// register name (%tmm0), so the numbers are written out: 0 = kTileC, 1 = kTileA,
// 2 = kTileB. GCC 12's ldtilecfg and tileloadd are asm statements that do not tell the
// compiler they read memory (ldtilecfg declares 8 of its 64 bytes, tileloadd none), so
// it could sink or drop the stores that fill the config or the B buffer: a compiler
// barrier that takes the address (Visible) goes before each.
static_assert(kTileC == 0 && kTileA == 1 && kTileB == 2, "AmxTiles spells the tiles out");
MOERT_AMX_INLINE void Visible(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }
struct AmxTiles {
  static MOERT_AMX_INLINE void Configure(const TileConfig& cfg) {
    Visible(&cfg);
    _tile_loadconfig(&cfg);
  }
  static MOERT_AMX_INLINE void LoadA(const void* base, size_t stride) {
    Visible(base);
    _tile_loadd(1, base, static_cast<long>(stride));
  }
  static MOERT_AMX_INLINE void LoadB(const void* base) {
    Visible(base);
    _tile_loadd(2, base, 64);
  }
  // C = A times B (signed bytes), from zero.
  static MOERT_AMX_INLINE void Multiply() {
    _tile_zero(0);
    _tile_dpbssd(0, 1, 2);
  }
  // (GCC's tilestored declares a memory clobber.)
  static MOERT_AMX_INLINE void StoreC(int32_t* base) { _tile_stored(0, base, 64); }
  static MOERT_AMX_INLINE void Release() { _tile_release(); }
};
#endif

// Rows 0..7 (`first`) and 8..15 (`second`; null: zeros) of one W4 or W4M block into
// the B tile: b[k][4n + j] = row n's value at column 4k + j, minus `bias`. Nibble byte
// j of a row holds columns j (low) and j + 16 (high): dword q of its 16 bytes holds
// columns 4q..4q+3 in its low nibbles (B row q) and 16 + 4q.. in its high ones (B row
// q + 4).
template <typename Block, int kBias>
MOERT_AMX_INLINE void PackNibbles(const Block* first, const Block* second, int8_t* b) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i r03 = _mm512_loadu_si512(first->qs[0]);
  const __m512i r47 = _mm512_loadu_si512(first->qs[4]);
  const __m512i r811 = second != nullptr ? _mm512_loadu_si512(second->qs[0]) : zero;
  const __m512i r1215 = second != nullptr ? _mm512_loadu_si512(second->qs[4]) : zero;
  // Of 8 rows' 32 dwords (4 a row, rows 0-3 in the first register): lane l < 8 takes
  // row l's dword q, lane l >= 8 row l - 8's dword q + 1 (q = 0 or 2).
  const __m512i q01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i q23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i lo01 = _mm512_permutex2var_epi32(r03, q01, r47);
  const __m512i lo23 = _mm512_permutex2var_epi32(r03, q23, r47);
  const __m512i hi01 = _mm512_permutex2var_epi32(r811, q01, r1215);
  const __m512i hi23 = _mm512_permutex2var_epi32(r811, q23, r1215);
  // Dword q of all 16 rows: rows 0-7 from the first, 8-15 from the second.
  __m512i d[4];
  d[0] = _mm512_shuffle_i64x2(lo01, hi01, 0x44);
  d[1] = _mm512_shuffle_i64x2(lo01, hi01, 0xEE);
  d[2] = _mm512_shuffle_i64x2(lo23, hi23, 0x44);
  d[3] = _mm512_shuffle_i64x2(lo23, hi23, 0xEE);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(kBias));
  MOERT_AMX_UNROLL
  for (int q = 0; q < 4; ++q) {
    const __m512i lo = _mm512_and_si512(d[q], mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d[q], 4), mask);
    _mm512_store_si512(b + 64 * q, _mm512_sub_epi8(lo, bias));
    _mm512_store_si512(b + 64 * (q + 4), _mm512_sub_epi8(hi, bias));
  }
}

// Rows 0..7 and 8..15 of one W8 block into the B tile: B row q is dword q (columns
// 4q..4q+3) of each of the 16 rows, a 16 x 8 transpose of dwords.
MOERT_AMX_INLINE void PackW8(const moert_w8_block* first, const moert_w8_block* second, int8_t* b) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i rows[8];  // rows 2p and 2p + 1 (8 dwords each) in register p
  MOERT_AMX_UNROLL
  for (int p = 0; p < 4; ++p) {
    rows[p] = _mm512_loadu_si512(first->qs[2 * p]);
    rows[p + 4] = second != nullptr ? _mm512_loadu_si512(second->qs[2 * p]) : zero;
  }
  // Of 4 rows (registers 2p, 2p + 1): lane 4q + r = row r's dword q (q < 4), and of
  // dword q + 4 with the second index.
  const __m512i q03 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i q47 = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
  __m512i lo[4], hi[4];  // 4 rows each: 4p..4p+3
  MOERT_AMX_UNROLL
  for (int p = 0; p < 4; ++p) {
    lo[p] = _mm512_permutex2var_epi32(rows[2 * p], q03, rows[2 * p + 1]);
    hi[p] = _mm512_permutex2var_epi32(rows[2 * p], q47, rows[2 * p + 1]);
  }
  // 128-bit lane q of lo[0..3] is dword q of rows 0-3, 4-7, 8-11, 12-15: B row q.
  MOERT_AMX_UNROLL
  for (int half = 0; half < 2; ++half) {
    const __m512i* x = half == 0 ? lo : hi;
    const __m512i ab01 = _mm512_shuffle_i64x2(x[0], x[1], 0x44);  // x0.l0 x0.l1 x1.l0 x1.l1
    const __m512i ab23 = _mm512_shuffle_i64x2(x[0], x[1], 0xEE);  // x0.l2 x0.l3 x1.l2 x1.l3
    const __m512i cd01 = _mm512_shuffle_i64x2(x[2], x[3], 0x44);
    const __m512i cd23 = _mm512_shuffle_i64x2(x[2], x[3], 0xEE);
    int8_t* out = b + 64 * 4 * half;
    _mm512_store_si512(out, _mm512_shuffle_i64x2(ab01, cd01, 0x88));        // lanes 0
    _mm512_store_si512(out + 64, _mm512_shuffle_i64x2(ab01, cd01, 0xDD));   // lanes 1
    _mm512_store_si512(out + 128, _mm512_shuffle_i64x2(ab23, cd23, 0x88));  // lanes 2
    _mm512_store_si512(out + 192, _mm512_shuffle_i64x2(ab23, cd23, 0xDD));  // lanes 3
  }
}

// The weight formats: W4 (values nibble - 8), W4M (nibble, plus the offset term), W8.
struct W4 {
  using Block = moert_w4_block;
  static constexpr bool kOffset = false;
  static MOERT_AMX_INLINE void Pack(const Block* first, const Block* second, int8_t* b) {
    PackNibbles<Block, 8>(first, second, b);
  }
};
struct W4M {
  using Block = moert_w4m_block;
  static constexpr bool kOffset = true;
  static MOERT_AMX_INLINE void Pack(const Block* first, const Block* second, int8_t* b) {
    PackNibbles<Block, 0>(first, second, b);
  }
};
struct W8 {
  using Block = moert_w8_block;
  static constexpr bool kOffset = false;
  static MOERT_AMX_INLINE void Pack(const Block* first, const Block* second, int8_t* b) {
    PackW8(first, second, b);
  }
};

// The 16 fp16 values of rows 0..7 of `first` and `second` (zeros without it), widened.
MOERT_AMX_INLINE __m512 LoadHalfs16(const uint16_t* first, const uint16_t* second) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first));
  const __m128i hi = second != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(second))
                                       : _mm_setzero_si128();
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// c[i][n] for i < m (<= 16), n < nc: ukernel.h's moert_qgemm_ukernel_fn.
template <typename Tiles, typename Format>
void Gemm(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride, const void* w,
          float* c, size_t c_stride) {
  using Block = typename Format::Block;
  const auto* tiles = static_cast<const Block*>(w);
  const size_t ntiles = (nc + MOERT_NR - 1) / MOERT_NR;
  alignas(64) int8_t b[MOERT_QK / 4 * 64];
  alignas(64) int32_t isum[MOERT_AMX_GEMM_ROWS][16];
  // Rows m..15 of isum are never written by the tile store: their (unused) outputs
  // must still be computed from defined values.
  std::memset(isum, 0, sizeof(isum));
  const TileConfig cfg = GemmTileConfig(m);
  Tiles::Configure(cfg);
  const auto* a_bytes = reinterpret_cast<const char*>(a);
  for (size_t t = 0; t < ntiles; t += 2) {
    const Block* first = tiles + t * kb;
    const Block* second = t + 1 < ntiles ? first + kb : nullptr;
    __m512 acc[MOERT_AMX_GEMM_ROWS];
    MOERT_AMX_UNROLL
    for (int i = 0; i < MOERT_AMX_GEMM_ROWS; ++i) acc[i] = _mm512_setzero_ps();
    for (size_t blk = 0; blk < kb; ++blk) {
      const Block* w1 = first + blk;
      const Block* w2 = second != nullptr ? second + blk : nullptr;
      Format::Pack(w1, w2, b);
      Tiles::LoadA(a_bytes + blk * sizeof(moert_a8_block) + offsetof(moert_a8_block, qs), a_stride);
      Tiles::LoadB(b);
      Tiles::Multiply();
      Tiles::StoreC(&isum[0][0]);
      const __m512 wd = LoadHalfs16(w1->d, w2 != nullptr ? w2->d : nullptr);
      __m512 wm = _mm512_setzero_ps();
      if constexpr (Format::kOffset) wm = LoadHalfs16(w1->m, w2 != nullptr ? w2->m : nullptr);
      MOERT_AMX_UNROLL
      for (int i = 0; i < MOERT_AMX_GEMM_ROWS; ++i) {
        // Rows past m read row m - 1's block (in bounds) and are not stored.
        const size_t row = static_cast<size_t>(i) < m ? static_cast<size_t>(i) : m - 1;
        const auto& ab = reinterpret_cast<const moert_a8_block*>(a_bytes + row * a_stride)[blk];
        const __m512 ad = _mm512_set1_ps(ab.d);
        const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(isum[i]));
        acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(s, _mm512_mul_ps(wd, ad)));
        if constexpr (Format::kOffset) {
          const __m512 as = _mm512_set1_ps(static_cast<float>(ab.s));
          acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(as, _mm512_mul_ps(wm, ad)));
        }
      }
    }
    const size_t n0 = t * MOERT_NR;
    const size_t cols = nc - n0 < 16 ? nc - n0 : 16;
    const __mmask16 store = static_cast<__mmask16>((1u << cols) - 1u);
    MOERT_AMX_UNROLL
    for (int i = 0; i < MOERT_AMX_GEMM_ROWS; ++i) {
      if (static_cast<size_t>(i) < m) {
        _mm512_mask_storeu_ps(c + static_cast<size_t>(i) * c_stride + n0, store, acc[i]);
      }
    }
  }
  Tiles::Release();
}

}  // namespace isa_amx
}  // namespace moert::kernels::amx

#endif  // MOERT_KERNELS_AMX_QGEMM_H_
