// LayerNorm over rows (cpu::LayerNorm): the mean, then the variance of x - mean, and
// y = ((x - mean) * (1 / sqrt(variance + eps))) * weight (+ bias when has_bias). One
// work-group (power-of-two size) per row; the sums are float tree sums (the CPU sums in
// double), so results agree to a few ulps, not bit for bit. y may be x: every
// work-item writes only the elements it read last, after both reductions.
__kernel void layer_norm(__global const uchar* x_base, ulong x_off, __global const uchar* w_base,
                         ulong w_off, __global const uchar* b_base, ulong b_off, int has_bias,
                         __global uchar* y_base, ulong y_off, int width, float eps,
                         __local float* red) {
  const int row = (int)get_group_id(0);
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)row * width;
  __global const float* w = (__global const float*)(w_base + w_off);
  __global const float* b = (__global const float*)(b_base + b_off);
  __global float* y = (__global float*)(y_base + y_off) + (size_t)row * width;
  float sum = 0.0f;
  for (int i = lid; i < width; i += n) sum += x[i];
  const float mean = wg_reduce_sum(sum, red) / (float)width;
  float sum2 = 0.0f;
  for (int i = lid; i < width; i += n) {
    const float v = x[i] - mean;
    sum2 += v * v;
  }
  const float variance = wg_reduce_sum(sum2, red) / (float)width;
  const float scale = 1.0f / sqrt(variance + eps);
  for (int i = lid; i < width; i += n) {
    const float v = ((x[i] - mean) * scale) * w[i];
    y[i] = has_bias ? v + b[i] : v;
  }
}
