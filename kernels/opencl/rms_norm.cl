// RMSNorm over rows (model::RmsNorm): y = (x * (1 / sqrt(mean(x^2) + eps))) * weight.
// One work-group (power-of-two size) per row; the sum of squares is a float tree sum
// (the CPU sums in double), so results agree to a few ulps, not bit for bit.
__kernel void rms_norm(__global const uchar* x_base, ulong x_off, __global const uchar* w_base,
                       ulong w_off, __global uchar* y_base, ulong y_off, int width, float eps,
                       __local float* red) {
  const int row = (int)get_group_id(0);
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)row * width;
  __global const float* w = (__global const float*)(w_base + w_off);
  __global float* y = (__global float*)(y_base + y_off) + (size_t)row * width;
  float sum = 0.0f;
  for (int i = lid; i < width; i += n) sum += x[i] * x[i];
  sum = wg_reduce_sum(sum, red);
  const float mean = sum / (float)width;
  const float scale = 1.0f / sqrt(mean + eps);
  for (int i = lid; i < width; i += n) y[i] = (x[i] * scale) * w[i];
}
