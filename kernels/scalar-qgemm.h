// The scalar reference of every quantized matrix-multiply family: one template over
// the weight format, instantiated by the *-scalar.cc file of each family. It is the
// definition of the numerics in ukernel.h, written for clarity, not speed.
#ifndef MOERT_KERNELS_SCALAR_QGEMM_H_
#define MOERT_KERNELS_SCALAR_QGEMM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"
#include "kernels/ukernel.h"

namespace moert::kernels::scalar {

// Integer dot product of row r of a weight block with an activation block.
inline int32_t BlockDot(const moert_w4_block& w, int r, const moert_a8_block& a) {
  int32_t sum = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = (w.qs[r][j] & 0x0F) - 8;
    const int hi = (w.qs[r][j] >> 4) - 8;
    sum += lo * a.qs[j] + hi * a.qs[j + 16];
  }
  return sum;
}

inline int32_t BlockDot(const moert_w4m_block& w, int r, const moert_a8_block& a) {
  int32_t sum = 0;
  for (int j = 0; j < 16; ++j) {
    sum += (w.qs[r][j] & 0x0F) * a.qs[j] + (w.qs[r][j] >> 4) * a.qs[j + 16];
  }
  return sum;
}

inline int32_t BlockDot(const moert_w8_block& w, int r, const moert_a8_block& a) {
  int32_t sum = 0;
  for (int j = 0; j < MOERT_QK; ++j) sum += w.qs[r][j] * a.qs[j];
  return sum;
}

inline int32_t BlockDot(const moert_w4s24_block& w, int r, const moert_a8_block& a) {
  int32_t sum = 0;
  for (int k = 0; k < 16; ++k) {
    const int nibble = k < 8 ? (w.qs[r][k] & 0x0F) : (w.qs[r][k - 8] >> 4);
    const int pos = moert_w4s24_pairs[moert_w4s24_code(w.pc[r], k / 2)][k % 2];
    sum += (nibble - 8) * a.qs[4 * (k / 2) + pos];
  }
  return sum;
}

// acc after one block, exactly as ukernel.h defines it.
template <typename Block>
inline float Accumulate(float acc, const Block& w, int r, const moert_a8_block& a) {
  const float scale = core::Fp16ToFloat(w.d[r]) * a.d;
  acc = acc + static_cast<float>(BlockDot(w, r, a)) * scale;
  return acc;
}

template <>
inline float Accumulate(float acc, const moert_w4m_block& w, int r, const moert_a8_block& a) {
  const float scale = core::Fp16ToFloat(w.d[r]) * a.d;
  acc = acc + static_cast<float>(BlockDot(w, r, a)) * scale;
  const float offset = core::Fp16ToFloat(w.m[r]) * a.d;
  acc = acc + static_cast<float>(a.s) * offset;
  return acc;
}

template <typename Block>
void QGemm(size_t m, size_t nc, size_t kb, const moert_a8_block* a, size_t a_stride,
           const void* w, float* c, size_t c_stride) {
  const auto* tile = static_cast<const Block*>(w);
  for (size_t n0 = 0; n0 < nc; n0 += MOERT_NR, tile += kb) {
    const size_t rows = nc - n0 < MOERT_NR ? nc - n0 : MOERT_NR;
    for (size_t i = 0; i < m; ++i) {
      const auto* a_row = reinterpret_cast<const moert_a8_block*>(
          reinterpret_cast<const char*>(a) + i * a_stride);
      for (size_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (size_t b = 0; b < kb; ++b) {
          acc = Accumulate(acc, tile[b], static_cast<int>(r), a_row[b]);
        }
        c[i * c_stride + n0 + r] = acc;
      }
    }
  }
}

}  // namespace moert::kernels::scalar

#endif  // MOERT_KERNELS_SCALAR_QGEMM_H_
