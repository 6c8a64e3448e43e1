// Softmax over rows: y = exp(x - max) * (1 / sum). One work-group (power-of-two size)
// per row. y may be x.
__kernel void softmax(__global const uchar* x_base, ulong x_off, __global uchar* y_base,
                      ulong y_off, int width, __local float* red) {
  const int row = (int)get_group_id(0);
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  __global const float* x = (__global const float*)(x_base + x_off) + (size_t)row * width;
  __global float* y = (__global float*)(y_base + y_off) + (size_t)row * width;
  float m = -INFINITY;
  for (int i = lid; i < width; i += n) m = fmax(m, x[i]);
  m = wg_reduce_max(m, red);
  float sum = 0.0f;
  for (int i = lid; i < width; i += n) {
    const float e = exp(x[i] - m);
    y[i] = e;
    sum += e;
  }
  sum = wg_reduce_sum(sum, red);
  const float inv = 1.0f / sum;
  // Each work-item rescales the elements it wrote itself: no barrier on y needed.
  for (int i = lid; i < width; i += n) y[i] = y[i] * inv;
}
