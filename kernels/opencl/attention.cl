// Causal grouped-query attention over the KV cache (model::Attention), or with
// full_kv > 0 attention without a mask, every query over keys 0 .. full_kv - 1
// (Backend::FullAttention: a vision tower, a resampler): one work-group
// (power-of-two size) per (query head h, query t at position pos0 + t). Query head h
// reads KV head h / (n_head / n_head_kv). The scores of positions 0 .. pos0 + t go to
// `scores` (a row of scores_stride floats per (t, h)); softmax as the CPU computes it
// (max, exp(s - max), times 1 / sum), then out[d] = sum_j (p_j / sum) * v[j][d].
//
// MOERT_KV_HALF=1: the cache holds halves (vload_half, core OpenCL 1.2), read as floats.
#if MOERT_KV_HALF
#define KV_BYTES 2
#define KV_AT(p, i) vload_half((i), (p))
typedef half kv_elem;
#else
#define KV_BYTES 4
#define KV_AT(p, i) (p)[i]
typedef float kv_elem;
#endif

__kernel void attention(__global const uchar* q_base, ulong q_off, __global const uchar* k_base,
                        ulong k_off, __global const uchar* v_base, ulong v_off,
                        __global uchar* out_base, ulong out_off, __global uchar* s_base,
                        ulong s_off, int n_head, int n_head_kv, int dk, int dv, int pos0,
                        int scores_stride, float scale, int full_kv, __local float* red) {
  const int h = (int)get_group_id(0);
  const int t = (int)get_group_id(1);
  const int lid = (int)get_local_id(0);
  const int n = (int)get_local_size(0);
  const int group = n_head / n_head_kv;
  const int g = h / group;
  const int n_kv = full_kv > 0 ? full_kv : pos0 + t + 1;
  const size_t k_row = (size_t)n_head_kv * dk;
  const size_t v_row = (size_t)n_head_kv * dv;
  __global const float* qh = (__global const float*)(q_base + q_off) + ((size_t)t * n_head + h) * dk;
  // (No arithmetic on half pointers: offsets are taken in bytes, elements by index.)
  __global const kv_elem* keys = (__global const kv_elem*)(k_base + k_off + (size_t)g * dk * KV_BYTES);
  __global const kv_elem* vals = (__global const kv_elem*)(v_base + v_off + (size_t)g * dv * KV_BYTES);
  __global float* p = (__global float*)(s_base + s_off) + ((size_t)t * n_head + h) * scores_stride;
  float m = -INFINITY;
  for (int j = lid; j < n_kv; j += n) {
    const size_t kj = (size_t)j * k_row;
    float s = 0.0f;
    for (int d = 0; d < dk; ++d) s += KV_AT(keys, kj + d) * qh[d];
    s = s * scale;
    p[j] = s;
    m = fmax(m, s);
  }
  m = wg_reduce_max(m, red);
  float sum = 0.0f;
  for (int j = lid; j < n_kv; j += n) {
    const float e = exp(p[j] - m);
    p[j] = e;
    sum += e;
  }
  sum = wg_reduce_sum(sum, red);
  const float inv = 1.0f / sum;
  // Every work-item now reads every p[j]: make the others' writes visible.
  barrier(CLK_GLOBAL_MEM_FENCE);
  __global float* o = (__global float*)(out_base + out_off) + ((size_t)t * n_head + h) * dv;
  for (int d = lid; d < dv; d += n) {
    float acc = 0.0f;
    for (int j = 0; j < n_kv; ++j) acc += (p[j] * inv) * KV_AT(vals, (size_t)j * v_row + d);
    o[d] = acc;
  }
}
