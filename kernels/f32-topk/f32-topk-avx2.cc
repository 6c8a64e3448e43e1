// AVX2 f32 top-k, index for index the scalar reference's output (ukernel.h).
// Each value becomes an int32 key whose signed order is the contract's order:
// sign-magnitude to two's complement (key = sign ? -|bits| : |bits|, so +0.0 and
// -0.0 both give 0), and NaN becomes kNanKey, one below -inf's key. Then rounds of:
// the vector max of the keys; every lane equal to it set to kTakenKey (below every
// other key); their indices, lowest first (movemask, then count trailing zeros), are
// the next outputs, up to k. So equal values come out in index order, as the
// contract says. Lanes past n hold kTakenKey too; k <= n keeps them from being picked.
// Up to 64 values the keys stay in registers; above, in a stack buffer.
#include <immintrin.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/ukernel.h"
#include "kernels/ukernels-avx2.h"

namespace {

constexpr int32_t kNanKey = -0x7F800001;  // -inf's key is -0x7F800000
constexpr int32_t kTakenKey = INT32_MIN;

// Lanes 0..7 all ones, then zeros: loadu at kTailMask + 8 - rem gives rem ones.
alignas(64) constexpr int32_t kTailMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                               0,  0,  0,  0,  0,  0,  0,  0};

// The keys of x[0..rem), rem in [1, 8]; lanes past rem hold kTakenKey. Reads no
// float past x + rem (the masked load does not touch masked-out lanes).
inline __m256i LoadKeys(const float* x, size_t rem) {
  __m256i bits;
  __m256i valid = _mm256_set1_epi32(-1);
  if (rem >= 8) {
    bits = _mm256_castps_si256(_mm256_loadu_ps(x));
  } else {
    valid = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTailMask + 8 - rem));
    bits = _mm256_castps_si256(_mm256_maskload_ps(x, valid));
  }
  const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  // sign_epi32 negates where bits < 0 (the sign bit set); where bits == 0, mag is 0.
  __m256i key = _mm256_sign_epi32(mag, bits);
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
  key = _mm256_blendv_epi8(key, _mm256_set1_epi32(kNanKey), nan);
  return _mm256_blendv_epi8(_mm256_set1_epi32(kTakenKey), key, valid);
}

// Every lane set to the max of v's lanes.
inline __m256i BroadcastMax(__m256i v) {
  v = _mm256_max_epi32(v, _mm256_permute2x128_si256(v, v, 0x01));
  v = _mm256_max_epi32(v, _mm256_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm256_max_epi32(v, _mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
}

// Lane-wise max of v[0..N) as a balanced tree (short dependency chain).
template <size_t N>
inline __m256i TreeMax(const __m256i* v) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return _mm256_max_epi32(TreeMax<N / 2>(v), TreeMax<N - N / 2>(v + N / 2));
  }
}

// Calls f(0), ..., f(N - 1), unrolled, so that arrays indexed by the argument live in
// registers.
template <typename F, size_t... J>
inline void Unrolled(std::index_sequence<J...>, F&& f) {
  (f(J), ...);
}

// One round over keys[0..NV): takes every lane holding the max (sets it to
// kTakenKey) and returns their positions as a bit mask (bit 8 * j + lane). The next
// round's max depends only on the masking, not on the index extraction from the bits,
// which runs beside it.
template <size_t NV>
inline uint64_t TakeMax(__m256i* key) {
  const __m256i taken = _mm256_set1_epi32(kTakenKey);
  const __m256i max = BroadcastMax(TreeMax<NV>(key));
  uint64_t hits = 0;
  Unrolled(std::make_index_sequence<NV>(), [&](size_t j) {
    const __m256i eq = _mm256_cmpeq_epi32(key[j], max);
    key[j] = _mm256_blendv_epi8(key[j], taken, eq);
    hits |= uint64_t{static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(eq)))} << (8 * j);
  });
  return hits;
}

// The top k of NV vectors of keys (k <= the keys that are not kTakenKey), all in
// registers: rounds of TakeMax, each giving the next outputs in index order. The keys
// come from x[0..n) when `keys` is null, else from keys[0..8 * NV); writes positions,
// mapped through `map` when it is not null.
template <size_t NV>
void SelectInRegisters(size_t n, const float* x, const int32_t* keys, size_t k, const uint32_t* map,
                       uint32_t* indices) {
  __m256i key[NV];
  Unrolled(std::make_index_sequence<NV>(), [&](size_t j) {
    key[j] = keys != nullptr ? _mm256_load_si256(reinterpret_cast<const __m256i*>(keys) + j)
                             : LoadKeys(x + 8 * j, n - 8 * j);
  });
  for (size_t r = 0; r < k;) {
    uint64_t hits = TakeMax<NV>(key);
    do {
      const uint32_t i = static_cast<uint32_t>(__builtin_ctzll(hits));
      indices[r++] = map != nullptr ? map[i] : i;
      hits &= hits - 1;
    } while (hits != 0 && r < k);
  }
}

// SelectInRegisters for NV = nv in [1, 8].
void SelectInRegisters(size_t nv, size_t n, const float* x, const int32_t* keys, size_t k,
                       const uint32_t* map, uint32_t* indices) {
  switch (nv) {
    case 1:
      return SelectInRegisters<1>(n, x, keys, k, map, indices);
    case 2:
      return SelectInRegisters<2>(n, x, keys, k, map, indices);
    case 3:
      return SelectInRegisters<3>(n, x, keys, k, map, indices);
    case 4:
      return SelectInRegisters<4>(n, x, keys, k, map, indices);
    case 5:
      return SelectInRegisters<5>(n, x, keys, k, map, indices);
    case 6:
      return SelectInRegisters<6>(n, x, keys, k, map, indices);
    case 7:
      return SelectInRegisters<7>(n, x, keys, k, map, indices);
    default:
      return SelectInRegisters<8>(n, x, keys, k, map, indices);
  }
}

// The top k of keys[0..8 * nv), any nv, the keys in memory (rewritten): the same
// rounds, with a search for the vectors holding the max instead of a pass over all.
void SelectInMemory(int32_t* keys, size_t nv, size_t k, uint32_t* indices) {
  auto* vkeys = reinterpret_cast<__m256i*>(keys);
  const __m256i taken = _mm256_set1_epi32(kTakenKey);
  for (size_t r = 0; r < k;) {
    // Four accumulators: four independent max chains.
    __m256i acc[4] = {vkeys[0], vkeys[0], vkeys[0], vkeys[0]};
    size_t j = 1;
    for (; j + 4 <= nv; j += 4) {
      for (size_t a = 0; a < 4; ++a) acc[a] = _mm256_max_epi32(acc[a], vkeys[j + a]);
    }
    for (; j < nv; ++j) acc[0] = _mm256_max_epi32(acc[0], vkeys[j]);
    const __m256i max = BroadcastMax(TreeMax<4>(acc));
    for (j = 0; j < nv && r < k; ++j) {
      const __m256i eq = _mm256_cmpeq_epi32(vkeys[j], max);
      uint32_t hits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(eq)));
      if (hits == 0) continue;
      // A whole-vector store: the next round's load of it is forwarded from the store
      // buffer, which a 4-byte store into it would not be.
      vkeys[j] = _mm256_blendv_epi8(vkeys[j], taken, eq);
      for (; hits != 0 && r < k; hits &= hits - 1) {
        indices[r++] = static_cast<uint32_t>(8 * j) + static_cast<uint32_t>(__builtin_ctz(hits));
      }
    }
  }
}

}  // namespace

void moert_f32_topk_ukernel__avx2(size_t n, const float* x, size_t k, uint32_t* indices) {
  assert(k >= 1 && k <= n && n <= MOERT_TOPK_MAX_N);
  const size_t nv = (n + 7) / 8;
  if (nv <= 8) return SelectInRegisters(nv, n, x, nullptr, k, nullptr, indices);
  alignas(32) int32_t keys[MOERT_TOPK_MAX_N];
  auto* vkeys = reinterpret_cast<__m256i*>(keys);
  for (size_t j = 0; j < nv; ++j) vkeys[j] = LoadKeys(x + 8 * j, n - 8 * j);
  if (k <= 8) {
    // Above 64 values, a filter first. The lane-wise max over the vectors is 8 keys of
    // 8 different values (no lane is all padding when nv > 1), so at least 8 values
    // have a key >= their min, t: the top k (k <= 8) all have keys >= t. Those
    // candidates, usually a few dozen, keep their index order, so the selection over
    // them breaks ties as the full one would.
    __m256i lane_max = vkeys[0];
    for (size_t j = 1; j < nv; ++j) lane_max = _mm256_max_epi32(lane_max, vkeys[j]);
    __m256i t = _mm256_min_epi32(lane_max, _mm256_permute2x128_si256(lane_max, lane_max, 0x01));
    t = _mm256_min_epi32(t, _mm256_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm256_min_epi32(t, _mm256_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    alignas(32) int32_t candidates[MOERT_TOPK_MAX_N + 8];
    uint32_t where[MOERT_TOPK_MAX_N];
    size_t c = 0;
    for (size_t j = 0; j < nv; ++j) {
      // key >= t: not t > key.
      uint32_t ge = ~static_cast<uint32_t>(
                        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(t, vkeys[j])))) &
                    0xFFu;
      for (; ge != 0; ge &= ge - 1) {
        const size_t i = 8 * j + static_cast<size_t>(__builtin_ctz(ge));
        candidates[c] = keys[i];
        where[c++] = static_cast<uint32_t>(i);
      }
    }
    if (c <= 64) {
      for (size_t i = c; i % 8 != 0; ++i) candidates[i] = kTakenKey;
      return SelectInRegisters((c + 7) / 8, 0, nullptr, candidates, k, where, indices);
    }
  }
  SelectInMemory(keys, nv, k, indices);
}
