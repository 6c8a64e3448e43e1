// The fp32 reference path's dot products, in the order kernels/ukernel.h fixes for the
// f32 GEMM: R weight rows times C input vectors, each dot product with two 4-lane
// partial sums over blocks of 8 (lane j of the first sums the elements 8b + j, of the
// second 8b + 4 + j), added lane-wise, reduced as (s0 + s1) + (s2 + s3), then the tail
// in order, without fused multiply-add. A value is the same bits whichever block shape
// computed it. Templates over the accumulator: Lanes4x2 (two 4-lane vectors: SSE,
// NEON, the portable code) or Lanes8 (one 8-lane vector holding both: AVX; only for a
// file built with AVX), which add the same products lane for lane. Shared by the f32
// GEMM kernels (kernels/f32-gemm/) and the CPU backend's attention scores.
#ifndef MOERT_KERNELS_F32_GEMM_F32_DOT_H_
#define MOERT_KERNELS_F32_GEMM_F32_DOT_H_

#include <cstddef>
#include <cstring>

namespace moert::kernels::f32 {

typedef float V4 __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

struct Lanes4x2 {
  struct V {
    V4 lo, hi;
  };
  static V Zero() { return {V4{0, 0, 0, 0}, V4{0, 0, 0, 0}}; }
  static V Load(const float* p) { return {Load4(p), Load4(p + 4)}; }
  static V MulAdd(V acc, V w, V x) { return {acc.lo + w.lo * x.lo, acc.hi + w.hi * x.hi}; }
  static V4 Fold(V acc) { return acc.lo + acc.hi; }
};

#if defined(__AVX__)
struct Lanes8 {
  typedef float V __attribute__((vector_size(32)));
  static V Zero() { return V{0, 0, 0, 0, 0, 0, 0, 0}; }
  static V Load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static V MulAdd(V acc, V w, V x) { return acc + w * x; }
  static V4 Fold(V acc) {
    return __builtin_shufflevector(acc, acc, 0, 1, 2, 3) +
           __builtin_shufflevector(acc, acc, 4, 5, 6, 7);
  }
};
#endif

// out[r * C + c] = dot(w[r], x[c]) over k values.
template <int R, int C, typename L>
inline void DotBlock(const float* const* w, const float* const* x, size_t k, float* out) {
  typename L::V acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = L::Zero();
  }
  size_t i = 0;
  for (; i + 8 <= k; i += 8) {
    typename L::V xv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) xv[c] = L::Load(x[c] + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const typename L::V wv = L::Load(w[r] + i);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = L::MulAdd(acc[r][c], wv, xv[c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const V4 s = L::Fold(acc[r][c]);
      float v = (s[0] + s[1]) + (s[2] + s[3]);
      for (size_t j = i; j < k; ++j) v += w[r][j] * x[c][j];
      out[r * C + c] = v;
    }
  }
}

// The f32 GEMM ukernel's contract (ukernel.h) in blocks of R rows by C tokens where they
// fit, R1 rows by one token for the last tokens (a decode step's single token), single
// dot products at the edges.
template <int R, int C, int R1, typename L>
void GemmTile(size_t k, const float* w, size_t ldw, size_t r0, size_t r1, const float* x, size_t n,
              float* y, size_t ldy) {
  float out[R * C > R1 ? R * C : R1];
  size_t t = 0;
  for (; t + C <= n; t += C) {
    const float* xs[C];
    for (int c = 0; c < C; ++c) xs[c] = x + (t + c) * k;
    size_t r = r0;
    for (; r + R <= r1; r += R) {
      const float* ws[R];
      for (int i = 0; i < R; ++i) ws[i] = w + (r + i) * ldw;
      DotBlock<R, C, L>(ws, xs, k, out);
      for (int i = 0; i < R; ++i) {
        for (int c = 0; c < C; ++c) y[(t + c) * ldy + r + i] = out[i * C + c];
      }
    }
    for (; r < r1; ++r) {
      const float* ws[1] = {w + r * ldw};
      DotBlock<1, C, L>(ws, xs, k, out);
      for (int c = 0; c < C; ++c) y[(t + c) * ldy + r] = out[c];
    }
  }
  for (; t < n; ++t) {
    const float* xs[1] = {x + t * k};
    size_t r = r0;
    for (; r + R1 <= r1; r += R1) {
      const float* ws[R1];
      for (int i = 0; i < R1; ++i) ws[i] = w + (r + i) * ldw;
      DotBlock<R1, 1, L>(ws, xs, k, out);
      for (int i = 0; i < R1; ++i) y[t * ldy + r + i] = out[i];
    }
    for (; r < r1; ++r) {
      const float* ws[1] = {w + r * ldw};
      DotBlock<1, 1, L>(ws, xs, k, out);
      y[t * ldy + r] = out[0];
    }
  }
}

}  // namespace moert::kernels::f32

#endif  // MOERT_KERNELS_F32_GEMM_F32_DOT_H_
