// MoE routing on the device (model::RouteToken): softmax over a token's n_expert
// logits (n_expert <= 256), the k most probable experts in descending order of
// probability (ties: the lower index first), and their weights (divided by their sum
// when renormalize). One work-item per token: at most 256 * k compares, small beside
// the expert matmuls it feeds.
__kernel void topk_route(__global const uchar* logits_base, ulong logits_off,
                         __global uchar* experts_base, ulong experts_off,
                         __global uchar* weights_base, ulong weights_off, int n_expert, int k,
                         int renormalize, int n_tokens) {
  const int t = (int)get_global_id(0);
  if (t >= n_tokens) return;
  __global const float* l = (__global const float*)(logits_base + logits_off) + (size_t)t * n_expert;
  __global int* experts = (__global int*)(experts_base + experts_off) + (size_t)t * k;
  __global float* weights = (__global float*)(weights_base + weights_off) + (size_t)t * k;
  float p[256];
  float m = l[0];
  for (int e = 1; e < n_expert; ++e) m = fmax(m, l[e]);
  float sum = 0.0f;
  for (int e = 0; e < n_expert; ++e) {
    p[e] = exp(l[e] - m);
    sum += p[e];
  }
  const float inv = 1.0f / sum;
  for (int e = 0; e < n_expert; ++e) p[e] = p[e] * inv;
  float total = 0.0f;
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < n_expert; ++e) {
      // Chosen experts are marked -1 (probabilities are >= 0); strict > keeps the lower
      // index on a tie.
      if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
    }
    if (best < 0) best = 0;  // all NaN: still a valid index
    experts[i] = best;
    weights[i] = p[best];
    total += p[best];
    p[best] = -1.0f;
  }
  if (renormalize) {
    for (int i = 0; i < k; ++i) weights[i] = weights[i] / total;
  }
}
