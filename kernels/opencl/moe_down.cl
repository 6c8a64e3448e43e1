// Fused MoE expert op, second half (MOERT_WFMT = 4 or 8): out[t][r] = sum over slots s
// in slot order of weights[p] * (down_e row r . hq[p]), p = t * k + s, e = experts[p]
// (has_weights == 0: k is 1 and out = the expert's output). The sum is formed exactly
// as backend::FusedFfn forms it: o = w0 * y0, then o = o + w_s * y_s; an empty slot
// (expert -1) is skipped. Expert e's place: as in moe_gate_up (offsets or stacked).
__kernel void moe_down(__global const uchar* down_base, ulong down_off, ulong expert_bytes,
                       __global const uchar* offsets_base, ulong offsets_off, int has_offsets,
                       __global const uchar* hq_base, ulong hq_off,
                       __global const uchar* experts_base, ulong experts_off, int has_experts,
                       __global const uchar* weights_base, ulong weights_off, int has_weights,
                       __global uchar* out_base, ulong out_off, int n_embd, int kb, int k,
                       int n_tokens, int n_expert) {
  const int row = (int)get_global_id(0);
  const int t = (int)get_global_id(1);
  if (row >= n_embd || t >= n_tokens) return;
  __global const int* experts = (__global const int*)(experts_base + experts_off);
  __global const float* weights = (__global const float*)(weights_base + weights_off);
  __global const a8_block* hq = (__global const a8_block*)(hq_base + hq_off);
  float o = 0.0f;
  int first = 1;
  for (int s = 0; s < k; ++s) {
    const int p = t * k + s;
    const int e = has_experts ? experts[p] : 0;
    if (e == -1) continue;
    if (e < 0 || e >= n_expert) {
      o = NAN;
      break;
    }
    const size_t start = expert_start(e, expert_bytes, offsets_base, offsets_off, has_offsets);
    const float y = w_row_dot(down_base + down_off + start, row, kb, hq + (size_t)p * kb);
    if (!has_weights) {
      o = y;
    } else if (first) {
      o = weights[p] * y;
    } else {
      o = o + weights[p] * y;
    }
    first = 0;
  }
  ((__global float*)(out_base + out_off))[(size_t)t * n_embd + row] = o;
}
