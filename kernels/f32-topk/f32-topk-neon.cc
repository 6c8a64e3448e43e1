// AArch64 NEON f32 top-k, index for index the scalar reference's output (ukernel.h).
// The same scheme as f32-topk-avx2.cc: each value becomes an int32 key whose signed
// order is the contract's order (sign ? -|bits| : |bits|, so +0.0 and -0.0 both give
// 0; NaN becomes kNanKey, one below -inf's key), then rounds of: the max key
// (vmaxvq); every lane equal to it set to kTakenKey (below every other key); their
// indices, lowest first, are the next outputs, up to k, so equal values come out in
// index order. Lanes past n hold kTakenKey too; k <= n keeps them from being picked.
// Up to 64 values the keys stay in 16 of the 32 vector registers; above, k <= 8 goes
// through a candidate filter first, and the rest is a search in a stack buffer.
#include <arm_neon.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/ukernel.h"
#include "kernels/ukernels-neon.h"

namespace {

constexpr int32_t kNanKey = -0x7F800001;  // -inf's key is -0x7F800000
constexpr int32_t kTakenKey = INT32_MIN;

// The keys of x[0..rem) (rem >= 1; 4 when rem > 4); lanes past rem hold kTakenKey.
// Reads no float past x + rem.
inline int32x4_t LoadKeys(const float* x, size_t rem) {
  int32x4_t bits;
  uint32x4_t valid = vdupq_n_u32(UINT32_MAX);
  if (rem >= 4) {
    bits = vreinterpretq_s32_f32(vld1q_f32(x));
  } else {
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    std::memcpy(tail, x, rem * sizeof(float));
    bits = vreinterpretq_s32_f32(vld1q_f32(tail));
    const uint32x4_t iota = {0, 1, 2, 3};
    valid = vcltq_u32(iota, vdupq_n_u32(static_cast<uint32_t>(rem)));
  }
  const int32x4_t mag = vandq_s32(bits, vdupq_n_s32(0x7FFFFFFF));
  int32x4_t key = vbslq_s32(vcltzq_s32(bits), vnegq_s32(mag), mag);
  key = vbslq_s32(vcgtq_s32(mag, vdupq_n_s32(0x7F800000)), vdupq_n_s32(kNanKey), key);
  return vbslq_s32(valid, key, vdupq_n_s32(kTakenKey));
}

// Lane-wise max of v[0..N) as a balanced tree (short dependency chain).
template <size_t N>
inline int32x4_t TreeMax(const int32x4_t* v) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return vmaxq_s32(TreeMax<N / 2>(v), TreeMax<N - N / 2>(v + N / 2));
  }
}

// Calls f(0), ..., f(N - 1), unrolled, so that arrays indexed by the argument live in
// registers.
template <typename F, size_t... J>
inline void Unrolled(std::index_sequence<J...>, F&& f) {
  (f(J), ...);
}

// Bit i % 32 of hit mask word i / 32 stands for key i (a NEON compare has no movemask:
// the equal lanes' bits are ORed, then added across the vector).
alignas(16) constexpr uint32_t kBit[64] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31,
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

// One round over key[0..NV): takes every lane holding the max (sets it to kTakenKey)
// and returns their positions as a bit mask (bit 4 * j + lane). The next round's max
// depends only on the masking, not on the index extraction from the bits.
template <size_t NV>
inline uint64_t TakeMax(int32x4_t* key) {
  const int32x4_t taken = vdupq_n_s32(kTakenKey);
  const int32x4_t max = vdupq_n_s32(vmaxvq_s32(TreeMax<NV>(key)));
  uint32x4_t bits[2] = {vdupq_n_u32(0), vdupq_n_u32(0)};
  Unrolled(std::make_index_sequence<NV>(), [&](size_t j) {
    const uint32x4_t eq = vceqq_s32(key[j], max);
    key[j] = vbslq_s32(eq, taken, key[j]);
    bits[j / 8] = vorrq_u32(bits[j / 8], vandq_u32(eq, vld1q_u32(kBit + 4 * j)));
  });
  uint64_t hits = vaddvq_u32(bits[0]);
  if constexpr (NV > 8) hits |= uint64_t{vaddvq_u32(bits[1])} << 32;
  return hits;
}

// The top k of NV vectors of keys (k <= the keys that are not kTakenKey), all in
// registers: rounds of TakeMax, each giving the next outputs in index order. The keys
// come from x[0..n) when `keys` is null, else from keys[0..4 * NV); writes positions,
// mapped through `map` when it is not null.
template <size_t NV>
void SelectInRegisters(size_t n, const float* x, const int32_t* keys, size_t k, const uint32_t* map,
                       uint32_t* indices) {
  int32x4_t key[NV];
  Unrolled(std::make_index_sequence<NV>(), [&](size_t j) {
    key[j] = keys != nullptr ? vld1q_s32(keys + 4 * j) : LoadKeys(x + 4 * j, n - 4 * j);
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

// SelectInRegisters for NV = nv in [1, 16].
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
    case 8:
      return SelectInRegisters<8>(n, x, keys, k, map, indices);
    case 9:
      return SelectInRegisters<9>(n, x, keys, k, map, indices);
    case 10:
      return SelectInRegisters<10>(n, x, keys, k, map, indices);
    case 11:
      return SelectInRegisters<11>(n, x, keys, k, map, indices);
    case 12:
      return SelectInRegisters<12>(n, x, keys, k, map, indices);
    case 13:
      return SelectInRegisters<13>(n, x, keys, k, map, indices);
    case 14:
      return SelectInRegisters<14>(n, x, keys, k, map, indices);
    case 15:
      return SelectInRegisters<15>(n, x, keys, k, map, indices);
    default:
      return SelectInRegisters<16>(n, x, keys, k, map, indices);
  }
}

// The top k of keys[0..4 * nv), any nv, the keys in memory (rewritten): each round the
// max, then a scalar scan to the first key equal to it, which is taken.
void SelectInMemory(int32_t* keys, size_t nv, size_t k, uint32_t* indices) {
  for (size_t r = 0; r < k; ++r) {
    // Four accumulators: four independent max chains.
    int32x4_t acc[4];
    for (size_t a = 0; a < 4; ++a) acc[a] = vld1q_s32(keys);
    size_t j = 1;
    for (; j + 4 <= nv; j += 4) {
      for (size_t a = 0; a < 4; ++a) acc[a] = vmaxq_s32(acc[a], vld1q_s32(keys + 4 * (j + a)));
    }
    for (; j < nv; ++j) acc[0] = vmaxq_s32(acc[0], vld1q_s32(keys + 4 * j));
    const int32_t max = vmaxvq_s32(TreeMax<4>(acc));
    size_t i = 0;
    while (keys[i] != max) ++i;
    indices[r] = static_cast<uint32_t>(i);
    keys[i] = kTakenKey;
  }
}

}  // namespace

void moert_f32_topk_ukernel__neon(size_t n, const float* x, size_t k, uint32_t* indices) {
  assert(k >= 1 && k <= n && n <= MOERT_TOPK_MAX_N);
  const size_t nv = (n + 3) / 4;
  if (nv <= 16) return SelectInRegisters(nv, n, x, nullptr, k, nullptr, indices);
  int32_t keys[MOERT_TOPK_MAX_N];
  for (size_t j = 0; j < nv; ++j) vst1q_s32(keys + 4 * j, LoadKeys(x + 4 * j, n - 4 * j));
  if (k <= 8) {
    // Above 64 values, a filter first. The lane-wise maxima over the even and over the
    // odd vectors are 8 keys of 8 different values (with nv > 16, no lane of either is
    // all padding), so at least 8 values have a key >= their min, t: the top k
    // (k <= 8) all have keys >= t. Those candidates, usually a few dozen, keep their
    // index order, so the selection over them breaks ties as the full one would.
    int32x4_t even = vld1q_s32(keys);
    int32x4_t odd = vld1q_s32(keys + 4);
    for (size_t j = 2; j + 1 < nv; j += 2) {
      even = vmaxq_s32(even, vld1q_s32(keys + 4 * j));
      odd = vmaxq_s32(odd, vld1q_s32(keys + 4 * j + 4));
    }
    if (nv % 2 != 0) even = vmaxq_s32(even, vld1q_s32(keys + 4 * (nv - 1)));
    const int32x4_t t = vdupq_n_s32(vminvq_s32(vminq_s32(even, odd)));
    const uint32x4_t lane_bit = {1, 2, 4, 8};
    alignas(16) int32_t candidates[MOERT_TOPK_MAX_N + 4];
    uint32_t where[MOERT_TOPK_MAX_N];
    size_t c = 0;
    for (size_t j = 0; j < nv; ++j) {
      uint32_t ge = vaddvq_u32(vandq_u32(vcgeq_s32(vld1q_s32(keys + 4 * j), t), lane_bit));
      for (; ge != 0; ge &= ge - 1) {
        const size_t i = 4 * j + static_cast<size_t>(__builtin_ctz(ge));
        candidates[c] = keys[i];
        where[c++] = static_cast<uint32_t>(i);
      }
    }
    if (c <= 64) {
      for (size_t i = c; i % 4 != 0; ++i) candidates[i] = kTakenKey;
      return SelectInRegisters((c + 3) / 4, 0, nullptr, candidates, k, where, indices);
    }
  }
  SelectInMemory(keys, nv, k, indices);
}
