// fp32 matmul for weights that stay fp32 (F32/F16/BF16 tensors, routers, the tied lm
// head): y[t][r] = dot(w row r, x row t). One work-item per output value, summing in
// exactly the order of model::Dot (src/model/layers.cc DotBlock): two 4-lane partial
// sums over blocks of 8, lanes reduced as (s0 + s1) + (s2 + s3), then the tail in
// order; no fused multiply-add (common.cl). The result is the CPU's, bit for bit.
//
// MOERT_W_HALF=1: the weights are stored as half (vload_half, core OpenCL 1.2: no
// cl_khr_fp16 needed), for matrices whose every value is a half (an F16 tensor): half
// the device memory and bandwidth, the same floats, so the same bits.
// (No arithmetic on half pointers: without the extension half only names storage.)
#if MOERT_W_HALF
#define W_BYTES 2
#define W_LOAD4(w, i) vload_half4((i) / 4, (w))
#define W_AT(w, i) vload_half((i), (w))
typedef half w_elem;
#else
#define W_BYTES 4
#define W_LOAD4(w, i) vload4((i) / 4, (w))
#define W_AT(w, i) (w)[i]
typedef float w_elem;
#endif

__kernel void f32_matmul(__global const uchar* w_base, ulong w_off, __global const uchar* x_base,
                         ulong x_off, __global uchar* y_base, ulong y_off, int rows, int k,
                         int n) {
  const int r = (int)get_global_id(0);
  const int t = (int)get_global_id(1);
  if (r >= rows || t >= n) return;
  __global const w_elem* w = (__global const w_elem*)(w_base + w_off + (size_t)r * k * W_BYTES);
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)t * k;
  float4 acc0 = (float4)(0.0f);
  float4 acc1 = (float4)(0.0f);
  int i = 0;
  for (; i + 8 <= k; i += 8) {
    const float4 wa = W_LOAD4(w, i);
    const float4 wb = W_LOAD4(w, i + 4);
    const float4 xa = vload4(0, x + i);
    const float4 xb = vload4(0, x + i + 4);
    acc0 = acc0 + wa * xa;
    acc1 = acc1 + wb * xb;
  }
  const float4 s = acc0 + acc1;
  float v = (s.x + s.y) + (s.z + s.w);
  for (; i < k; ++i) v = v + W_AT(w, i) * x[i];
  ((__global float*)(y_base + y_off))[(size_t)t * rows + r] = v;
}
