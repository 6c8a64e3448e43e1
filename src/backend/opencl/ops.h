// The OpenCL operators (kernels/opencl/*.cl): A8 quantization, W4A8/W8A8 GEMV and
// GEMM over the packed tiles of kernels/ukernel.h (the PackedMatrix bytes uploaded
// as they are), the fused MoE expert op, RMSNorm, RoPE, softmax, causal GQA attention
// over a KV cache, and top-k routing.
//
// Every op only enqueues: inputs and outputs are device buffers (BufferRef: a buffer
// and a byte offset), so a model forward chains ops without host round trips and
// reads results with Buffer::Read (which waits) or Device::Finish. Arguments are
// checked against the buffers' sizes before anything is enqueued; a bad one is
// InvalidArgument/OutOfRange, a device failure the Status of the failing cl call.
//
// Numerics against the CPU (tests/backend/opencl_test.cc checks each):
//  - q8_quant: the same A8 bits as the CPU quantizer when the device divides
//    correctly rounded (most do; the option is passed when it reports it).
//  - GEMV (k_split 1) and GEMM: the same bits as the CPU kernels (exact int32 block
//    dots, blocks in order, no FMA). GEMV with k_split > 1: a tree sum, ulps off.
//  - fused MoE: gate/up bits exact; exp() inside SiLU is the device's (<= 3 ulp), so
//    an A8 rounding of h can flip and the output differs at the ~1e-7 relative level.
//  - RMSNorm, softmax, attention, routing weights: float reductions in another
//    order than the CPU's (which sums some of them in double): NMSE ~1e-12.
#ifndef MOERT_BACKEND_OPENCL_OPS_H_
#define MOERT_BACKEND_OPENCL_OPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/opencl/buffer.h"
#include "backend/opencl/device.h"
#include "backend/packing.h"
#include "backend/cpu/qmatmul.h"

namespace moert::backend::opencl {

// A packed matrix (or `groups` stacked experts, group after group) in device memory:
// the bytes of a backend::PackedMatrix. W4 and W8 run on the device; W4M and W4S24
// are not implemented yet (Unimplemented).
struct MatrixRef {
  BufferRef data;
  WeightFormat format = WeightFormat::kW4;
  int64_t groups = 1;
  int64_t rows = 0;  // per group
  int64_t cols = 0;
  size_t group_bytes = 0;
};

// An uploaded PackedMatrix that owns its buffer.
struct DeviceMatrix {
  Buffer buffer;
  MatrixRef ref;

  static absl::StatusOr<DeviceMatrix> Upload(Device& device, const PackedMatrix& m);
};

// Device scratch that grows on demand (the fused MoE's h and its A8 copy, attention
// scores). Reused across calls; only one op at a time may use a Scratch.
class Scratch {
 public:
  // A buffer of at least `bytes` for use `slot` (0..3).
  absl::StatusOr<BufferRef> Get(Device& device, int slot, size_t bytes);

 private:
  Buffer buffers_[4];
};

// x: n rows of k floats (k a multiple of 32) -> a: n * k / 32 A8 blocks.
absl::Status Q8Quant(Device& device, BufferRef x, int64_t n, int64_t k, BufferRef a);

// y[i][r] = w (group `group`) row r . a row i, for n A8 rows (y: n rows of w.rows
// floats). n == 1 runs the GEMV kernel, n > 1 the GEMM.
absl::Status QMatMul(Device& device, const MatrixRef& w, int64_t group, BufferRef a, int64_t n,
                     BufferRef y);

// One MoE layer's experts (stacked: group e is expert e) or a dense FFN (groups 1).
struct FfnRef {
  MatrixRef gate;  // [n_ff][n_embd] per expert
  MatrixRef up;    // [n_ff][n_embd]
  MatrixRef down;  // [n_embd][n_ff]
  // Experts at scattered places (an expert pool's blocks in one buffer): expert e's
  // part starts expert_offsets[e] bytes past that part's data.offset (which is then the
  // part's place within a block), instead of e * group_bytes. groups entries; only the
  // experts routed to need a real place (each is checked against the buffer).
  std::span<const uint64_t> expert_offsets;
};

// backend::FusedFfn on the device: out[t] = sum over slots s < k, in slot order, of
// weights[t*k+s] * ffn(experts[t*k+s], x[t]) for the n A8 rows of x. `experts`
// (int32, n*k) and `weights` (float, n*k) live on the device (TopKRoute's output);
// `experts` empty: every slot is expert 0; `weights` empty: k must be 1 and out[t] =
// ffn(x[t]). Expert -1 is an empty slot (skipped; slot 0 must hold an expert, as in
// backend::FusedFfn); another id outside [0, groups) makes that token's output NaN
// (the kernels never read outside the weights).
absl::Status FusedMoe(Device& device, const FfnRef& w, BufferRef x, int64_t n, int k,
                      BufferRef experts, BufferRef weights, BufferRef out, Scratch& scratch);

// model::RmsNorm: y = x / sqrt(mean(x^2) + eps) * weight over n_rows rows of width.
absl::Status RmsNorm(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef weight,
                     float eps, BufferRef y);

// model::ApplyRope in place on x ([n][n_heads * head_dim]) for positions pos0 ...
struct RopeArgs {
  bool neox = false;  // format::RopeLayout::kNeox
  int n_rot = 0;
  float theta_base = 10000;
  float freq_scale = 1;
  BufferRef freq_factors;  // n_rot / 2 floats, or empty
};
absl::Status Rope(Device& device, const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads,
                  int head_dim, BufferRef x);

// Softmax of each of n_rows rows of width floats; y may be x.
absl::Status Softmax(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef y);

// model::Attention: causal GQA of the n queries at positions pos0 .. pos0 + n - 1 over
// the cached keys/values of positions 0 .. pos0 + n - 1.
struct AttentionArgs {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;
  int head_dim_v = 0;
  float scale = 1;
  bool kv_half = false;  // the caches hold IEEE halves (ToHalf's rows)
};
absl::Status Attention(Device& device, const AttentionArgs& shape, BufferRef q, int64_t n,
                       int64_t pos0, BufferRef k_cache, BufferRef v_cache, BufferRef out,
                       Scratch& scratch);

// model::RouteToken for n tokens: logits [n][n_expert] (n_expert <= 256) -> experts
// (int32) and weights (float), [n][k] each.
absl::Status TopKRoute(Device& device, BufferRef logits, int64_t n, int n_expert, int k,
                       bool renormalize, BufferRef experts, BufferRef weights);

// --- fp32 and elementwise ops for the model forward (kernels/opencl/f32_gemm.cl,
// elementwise.cl); each is the CPU's arithmetic in the CPU's order.

// y[t][r] = model::Dot(w row r, x row t) for n rows of x ([n][cols]); w is rows x cols
// fp32, row-major, or IEEE half when half_weights (core vload_half: any device).
// Bit for bit model::MatMul on the same weight values.
absl::Status F32MatMul(Device& device, BufferRef w, int64_t rows, int64_t cols, BufferRef x,
                       int64_t n, BufferRef y, bool half_weights = false);

// y[i] = x[i] rounded to half (nearest, ties to even) for i < count; y holds halves.
absl::Status ToHalf(Device& device, BufferRef x, int64_t count, BufferRef y);

// x[i] += y[i] for i < count.
absl::Status AddInPlace(Device& device, BufferRef x, BufferRef y, int64_t count);

// y[t][i] += b[i] for n rows of width.
absl::Status AddBias(Device& device, BufferRef y, BufferRef b, int64_t n, int64_t width);

// g[i] = silu(g[i]) * u[i] for i < count.
absl::Status SiluMul(Device& device, BufferRef g, BufferRef u, int64_t count);
// cpu::Gelu (ggml's fp16-table values) of count floats; y may be x.
absl::Status Gelu(Device& device, BufferRef x, int64_t count, BufferRef y);
// cpu::LayerNorm over n_rows rows of width; bias may be empty; y may be x.
absl::Status LayerNorm(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef weight,
                       BufferRef bias, float eps, BufferRef y);
// Attention without a mask: each of the n queries over all n_kv keys (fp32 k and v).
absl::Status FullAttention(Device& device, const AttentionArgs& shape, BufferRef q, int64_t n,
                           BufferRef k, BufferRef v, int64_t n_kv, BufferRef out,
                           Scratch& scratch);

// dst row r = src row idx[r] (int32 idx on the device, each < src_rows) for r < n; an
// index outside [0, src_rows) gives a NaN row (the kernel never reads outside src).
absl::Status GatherRows(Device& device, BufferRef src, int64_t src_rows, BufferRef idx,
                        int64_t n, int64_t width, BufferRef dst);

// out[t] = sum over slots s < k in order (experts[t*k+s] >= 0) of
// weights[t*k+s] * y[t*k+s], y: [n*k][width]; out: [n][width].
absl::Status MoeCombine(Device& device, BufferRef y, BufferRef experts, BufferRef weights,
                        int64_t n, int k, int64_t width, BufferRef out);

}  // namespace moert::backend::opencl

#endif  // MOERT_BACKEND_OPENCL_OPS_H_
