// The f32 weighted row sum (ukernel.h, moert_f32_wsum_ukernel_fn) over a vector type of
// L lanes: each output element adds the rows' products to its value in the order of the
// rows, one multiply and one add at a time, so every lane width gives the same bits.
// Chunks of 4 vectors stay in registers across all rows; the tail of fewer than L
// elements is summed one element at a time.
#ifndef MOERT_KERNELS_F32_WSUM_F32_WSUM_H_
#define MOERT_KERNELS_F32_WSUM_F32_WSUM_H_

#include <cstddef>
#include <cstring>

namespace moert::kernels::f32 {

template <int L>
inline void WeightedRowSum(size_t n, const float* w, const float* v, size_t v_stride, size_t dv,
                           float* out) {
  typedef float V __attribute__((vector_size(4 * L)));
  const auto load = [](const float* p) {
    V x;
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  size_t d = 0;
  for (; d + 4 * L <= dv; d += 4 * L) {
    V acc[4];
    for (int c = 0; c < 4; ++c) acc[c] = load(out + d + c * L);
    for (size_t i = 0; i < n; ++i) {
      const V wv = V{} + w[i];
      const float* row = v + i * v_stride + d;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[c] += wv * load(row + c * L);
    }
    std::memcpy(out + d, acc, sizeof(acc));
  }
  for (; d + L <= dv; d += L) {
    V acc = load(out + d);
    for (size_t i = 0; i < n; ++i) acc += (V{} + w[i]) * load(v + i * v_stride + d);
    std::memcpy(out + d, &acc, sizeof(acc));
  }
  for (; d < dv; ++d) {
    float acc = out[d];
    for (size_t i = 0; i < n; ++i) acc += w[i] * v[i * v_stride + d];
    out[d] = acc;
  }
}

}  // namespace moert::kernels::f32

#endif  // MOERT_KERNELS_F32_WSUM_F32_WSUM_H_
