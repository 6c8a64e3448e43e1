// Small elementwise kernels the model forward chains between the big ops: the
// residual add, biases, SwiGLU's silu(gate) * up, row gathers (tokens grouped by
// expert) and the weighted sum of each token's expert outputs in slot order. Each is
// the CPU's arithmetic (src/model/layers.cc, decoder.cc) in the same order; silu's
// exp() is the device's.

// x[i] += y[i] for i < count.
__kernel void add_inplace(__global uchar* x_base, ulong x_off, __global const uchar* y_base,
                          ulong y_off, int count) {
  const int i = (int)get_global_id(0);
  if (i >= count) return;
  __global float* x = (__global float*)(x_base + x_off);
  x[i] = x[i] + ((__global const float*)(y_base + y_off))[i];
}

// y[t][i] += b[i] over rows of `width`; count = rows * width.
__kernel void add_bias(__global uchar* y_base, ulong y_off, __global const uchar* b_base,
                       ulong b_off, int width, int count) {
  const int i = (int)get_global_id(0);
  if (i >= count) return;
  __global float* y = (__global float*)(y_base + y_off);
  y[i] = y[i] + ((__global const float*)(b_base + b_off))[i % width];
}

// g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)).
__kernel void silu_mul(__global uchar* g_base, ulong g_off, __global const uchar* u_base,
                       ulong u_off, int count) {
  const int i = (int)get_global_id(0);
  if (i >= count) return;
  __global float* g = (__global float*)(g_base + g_off);
  const float x = g[i];
  g[i] = (x / (1.0f + exp(-x))) * ((__global const float*)(u_base + u_off))[i];
}

// dst row r = src row idx[r], rows of `width` floats, for r < n.
__kernel void gather_rows(__global const uchar* src_base, ulong src_off,
                          __global const uchar* idx_base, ulong idx_off, __global uchar* dst_base,
                          ulong dst_off, int width, int n, int src_rows) {
  const int i = (int)get_global_id(0);
  const int r = (int)get_global_id(1);
  if (i >= width || r >= n) return;
  const int from = ((__global const int*)(idx_base + idx_off))[r];
  // A row index outside the source gives a NaN row: the kernel never reads outside it.
  ((__global float*)(dst_base + dst_off))[(size_t)r * width + i] =
      from >= 0 && from < src_rows
          ? ((__global const float*)(src_base + src_off))[(size_t)from * width + i]
          : NAN;
}

// out[t] = sum over slots s < k with experts[t*k+s] >= 0, in slot order, of
// weights[t*k+s] * y[t*k+s] (the first term assigned, the next added).
__kernel void moe_combine(__global const uchar* y_base, ulong y_off,
                          __global const uchar* e_base, ulong e_off, __global const uchar* w_base,
                          ulong w_off, __global uchar* out_base, ulong out_off, int width, int k,
                          int n) {
  const int i = (int)get_global_id(0);
  const int t = (int)get_global_id(1);
  if (i >= width || t >= n) return;
  __global const float* y = (__global const float*)(y_base + y_off);
  __global const int* experts = (__global const int*)(e_base + e_off);
  __global const float* weights = (__global const float*)(w_base + w_off);
  float o = 0.0f;
  bool first = true;
  for (int s = 0; s < k; ++s) {
    const int p = t * k + s;
    if (experts[p] < 0) continue;
    const float term = weights[p] * y[(size_t)p * width + i];
    o = first ? term : o + term;
    first = false;
  }
  ((__global float*)(out_base + out_off))[(size_t)t * width + i] = o;
}

// y[i] = x[i] rounded to half (to nearest, ties to even; core vstore_half_rte: no
// cl_khr_fp16 needed): the new rows of a half KV cache.
__kernel void to_half(__global const uchar* x_base, ulong x_off, __global uchar* y_base,
                      ulong y_off, int count) {
  const int i = (int)get_global_id(0);
  if (i >= count) return;
  vstore_half_rte(((__global const float*)(x_base + x_off))[i], (size_t)i,
                  (__global half*)(y_base + y_off));
}

// x rounded to the nearest IEEE half value (ties to even), kept as a float: the
// spacing of halves at x's binade (2^-24 below the normal range), then rint. Exact
// for |x| below 65504 (no half type needed: cl_khr_fp16 is optional).
static inline float round_to_half(float x) {
  const int e = max(ilogb(x), -14);
  const float spacing = ldexp(1.0f, e - 10);
  return rint(x / spacing) * spacing;
}

// y[i] = gelu(x[i]) as ggml's fp16 table gives it (cpu::Gelu): 0 at or below -10, x at
// or above 10, else half(gelu(half(x))) with the tanh approximation; y may be x. The
// device's exp stands in for the CPU's tanh, so a value can land one half-ulp from the
// CPU's.
__kernel void gelu(__global const uchar* x_base, ulong x_off, __global uchar* y_base, ulong y_off,
                   int count) {
  const int i = (int)get_global_id(0);
  if (i >= count) return;
  const float x = ((__global const float*)(x_base + x_off))[i];
  float y;
  if (x <= -10.0f) {
    y = 0.0f;
  } else if (x >= 10.0f) {
    y = x;
  } else {
    const float h = round_to_half(x);
    const float u = 0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h);
    // tanh through exp: it reaches exactly +-1 where the correctly rounded tanh does
    // (builtin tanh may stop one ulp short, and 1 + tanh(u) near -1 magnifies that).
    const float t = copysign(1.0f - 2.0f / (exp(2.0f * fabs(u)) + 1.0f), u);
    y = round_to_half(0.5f * h * (1.0f + t));
  }
  ((__global float*)(y_base + y_off))[i] = y;
}
