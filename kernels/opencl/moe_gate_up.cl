// Fused MoE expert op, first half (MOERT_WFMT = 4 or 8): for each (token, slot) pair p
// and each row r of the expert's width, h[p][r] = silu(gate_e row r . x[t]) *
// (up_e row r . x[t]), where e = experts[p] (read on the device: the router's output
// needs no trip through the host) and t = p / k. Both dot products keep the CPU
// kernels' block order (backend::FusedFfn's gate/up GEMV/GEMM).
// Expert -1 is an empty slot (a router that gave the token fewer experts): its h is 0
// and moe_down skips it. Expert e's place: expert_start (common.cl).
__kernel void moe_gate_up(__global const uchar* gate_base, ulong gate_off,
                          __global const uchar* up_base, ulong up_off, ulong expert_bytes,
                          __global const uchar* offsets_base, ulong offsets_off, int has_offsets,
                          __global const uchar* x_base, ulong x_off,
                          __global const uchar* experts_base, ulong experts_off, int has_experts,
                          __global uchar* h_base, ulong h_off, int n_ff, int kb, int k,
                          int n_pairs, int n_expert) {
  const int row = (int)get_global_id(0);
  const int p = (int)get_global_id(1);
  if (row >= n_ff || p >= n_pairs) return;
  int e = has_experts ? ((__global const int*)(experts_base + experts_off))[p] : 0;
  __global float* h = (__global float*)(h_base + h_off) + (size_t)p * n_ff;
  if (e == -1) {
    h[row] = 0.0f;
    return;
  }
  if (e < 0 || e >= n_expert) {
    // A bad expert id: never read outside the weights; the NaN shows up downstream.
    h[row] = NAN;
    return;
  }
  __global const a8_block* x = (__global const a8_block*)(x_base + x_off) + (size_t)(p / k) * kb;
  const size_t start = expert_start(e, expert_bytes, offsets_base, offsets_off, has_offsets);
  const float g = w_row_dot(gate_base + gate_off + start, row, kb, x);
  const float u = w_row_dot(up_base + up_off + start, row, kb, x);
  h[row] = moert_silu(g) * u;
}
