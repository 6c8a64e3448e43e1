// Rotary position embedding in place (model::ApplyRope): one work-item per (pair i,
// head, token). neox == 0 rotates (x[2i], x[2i+1]), neox == 1 (x[i], x[i + n_rot/2]).
// The angle is built as the CPU builds it (theta = pos, times theta_scale once per
// pair index, a running product in float), so only cos/sin differ (a few ulps).
__kernel void rope(__global uchar* x_base, ulong x_off, __global const uchar* ff_base,
                   ulong ff_off, int has_freq_factors, int pos0, int n_heads, int head_dim,
                   int n_rot, float theta_scale, float freq_scale, int neox, int n_tokens) {
  const int i = (int)get_global_id(0);
  const int h = (int)get_global_id(1);
  const int t = (int)get_global_id(2);
  const int half_rot = n_rot / 2;
  if (i >= half_rot || h >= n_heads || t >= n_tokens) return;
  float theta = (float)(pos0 + t);
  for (int j = 0; j < i; ++j) theta *= theta_scale;
  const float ff =
      has_freq_factors ? ((__global const float*)(ff_base + ff_off))[i] : 1.0f;
  const float angle = freq_scale * (theta / ff);
  const float c = cos(angle);
  const float s = sin(angle);
  __global float* v =
      (__global float*)(x_base + x_off) + ((size_t)t * n_heads + h) * head_dim;
  const int i0 = neox ? i : 2 * i;
  const int i1 = neox ? i + half_rot : 2 * i + 1;
  const float x0 = v[i0];
  const float x1 = v[i1];
  v[i0] = x0 * c - x1 * s;
  v[i1] = x0 * s + x1 * c;
}
