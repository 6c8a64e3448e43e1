// fp32 matmul for weights that stay fp32 (F32/F16/BF16 tensors, routers, the tied lm
// head): y[t][r] = dot(w row r, x row t). One work-item per output value, summing in
// exactly the order of model::Dot (src/model/layers.cc DotBlock): two 4-lane partial
// sums over blocks of 8, lanes reduced as (s0 + s1) + (s2 + s3), then the tail in
// order; no fused multiply-add (common.cl). The result is the CPU's, bit for bit.
__kernel void f32_matmul(__global const uchar* w_base, ulong w_off, __global const uchar* x_base,
                         ulong x_off, __global uchar* y_base, ulong y_off, int rows, int k,
                         int n) {
  const int r = (int)get_global_id(0);
  const int t = (int)get_global_id(1);
  if (r >= rows || t >= n) return;
  __global const float* w = (__global const float*)(w_base + w_off) + (size_t)r * k;
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)t * k;
  float4 acc0 = (float4)(0.0f);
  float4 acc1 = (float4)(0.0f);
  int i = 0;
  for (; i + 8 <= k; i += 8) {
    const float4 wa = vload4(0, w + i);
    const float4 wb = vload4(0, w + i + 4);
    const float4 xa = vload4(0, x + i);
    const float4 xb = vload4(0, x + i + 4);
    acc0 = acc0 + wa * xa;
    acc1 = acc1 + wb * xb;
  }
  const float4 s = acc0 + acc1;
  float v = (s.x + s.y) + (s.z + s.w);
  for (; i < k; ++i) v = v + w[i] * x[i];
  ((__global float*)(y_base + y_off))[(size_t)t * rows + r] = v;
}
