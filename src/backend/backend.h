// The Backend interface: the memory and the ops the layer graph (src/model), the MoE
// scheduler (src/pipeline) and the vision tower compute with, whatever runs them (the
// CPU kernels, an OpenCL device, ...). In the spirit of ggml's backend vtable: a small
// abstract class, one implementation per folder under src/backend/, a registry
// (backend/registry.h) that the conformance suite walks.
//
// Ops only enqueue where the backend is asynchronous: their inputs and outputs are
// places in the backend's own buffers (TensorRef), so a forward pass chains them
// without host round trips; Read waits. Arguments are checked before anything runs
// (InvalidArgument / OutOfRange naming the op and the argument); a device failure is
// the Status of the failing call. A backend that lacks an op (or a weight type) says
// so through Supports(); calling it anyway is Unimplemented naming both. Numerics of
// each op against the CPU backend: docs/backends.md.
#ifndef MOERT_BACKEND_BACKEND_H_
#define MOERT_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/kv_type.h"
#include "backend/matrix.h"

namespace moert::backend {

class Backend;

// Memory one backend allocated or wrapped (movable only through its unique_ptr).
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Backend* owner() const { return owner_; }
  size_t size() const { return size_; }
  // Byte 0 where the host reads and writes the buffer in place (every CPU buffer, a
  // wrapped host range); null where it lives elsewhere.
  virtual uint8_t* host() const { return nullptr; }

 protected:
  Buffer(const Backend* owner, size_t size) : owner_(owner), size_(size) {}

 private:
  const Backend* owner_;
  size_t size_;
};

// A place in a buffer: an op's argument.
struct TensorRef {
  Buffer* buffer = nullptr;
  size_t offset = 0;  // bytes

  TensorRef() = default;
  TensorRef(Buffer* b, size_t byte_offset = 0) : buffer(b), offset(byte_offset) {}  // NOLINT
  TensorRef(const std::unique_ptr<Buffer>& b, size_t byte_offset = 0)  // NOLINT
      : buffer(b.get()), offset(byte_offset) {}
  bool empty() const { return buffer == nullptr; }
  TensorRef At(size_t bytes) const { return {buffer, offset + bytes}; }
};

// What a weight holds, for Supports() and errors.
enum class WeightType { kF32, kF16, kW4, kW4M, kW8, kW4S24 };
// "f32", "f16", "w4", "w4m", "w8", "w4s24".
std::string_view WeightTypeName(WeightType type);
WeightType WeightTypeOf(WeightFormat format);

// A weight on a backend: `groups` matrices of rows x cols (a stacked expert tensor:
// group e is expert e; otherwise 1).
class Weight {
 public:
  virtual ~Weight() = default;
  WeightType type() const { return type_; }
  int64_t groups() const { return groups_; }
  int64_t rows() const { return rows_; }  // per group
  int64_t cols() const { return cols_; }
  // Device memory the weight takes (0 where the backend reads the loader's copy).
  virtual uint64_t device_bytes() const { return 0; }

 protected:
  Weight(WeightType type, int64_t groups, int64_t rows, int64_t cols)
      : type_(type), groups_(groups), rows_(rows), cols_(cols) {}

 private:
  WeightType type_;
  int64_t groups_, rows_, cols_;
};

// The ops of the interface (Supports, the conformance suite, docs/backends.md).
enum class Op {
  kMatMul,      // MatMuls: quantized (W4/W4M/W8/W4S24 x A8) and fp32/fp16 weights
  kRmsNorm,
  kLayerNorm,
  kRope,
  kAttention,   // causal GQA over a KV cache
  kFullAttention,  // attention without a mask (a vision tower, a cross-attention)
  kAttentionEntropy,  // the entropy of FullAttention's distributions (token pruning)
  kSoftmax,
  kSiluMul,     // silu(g) * u, the SwiGLU gate
  kGelu,
  kAdd,         // x += y (the residual)
  kAddBias,
  kTopK,        // the router's softmax top-k
  kFusedMoe,    // an MoE layer's experts, or a dense FFN: the fused expert op
  kGatherRows,
  kMoeCombine,  // the weighted merge of expert outputs in slot order
  kStoreHalf,   // floats rounded to IEEE half (a half KV cache)
  kGatedAdd,    // out += y * sigmoid(gate): qwen2moe's shared expert
  kStoreKv,     // float rows into a KV cache of a KvType (f32, f16, q8_0)
};
inline constexpr Op kAllOps[] = {
    Op::kMatMul,   Op::kRmsNorm, Op::kLayerNorm,  Op::kRope,       Op::kAttention,
    Op::kFullAttention, Op::kAttentionEntropy,
    Op::kSoftmax,  Op::kSiluMul, Op::kGelu,       Op::kAdd,        Op::kAddBias,
    Op::kTopK,     Op::kFusedMoe, Op::kGatherRows, Op::kMoeCombine, Op::kStoreHalf,
    Op::kGatedAdd, Op::kStoreKv};
std::string_view OpName(Op op);

// The device a backend runs on, in words.
struct DeviceDescription {
  std::string name;    // "x86_64 CPU (AVX2)", "Adreno (TM) 740"
  std::string type;    // "CPU", "GPU", ...
  std::string driver;  // the driver's version; empty for the CPU
  // The device reads host memory in place (WrapHost is zero-copy): the CPU, and
  // devices that share memory with it (CL_DEVICE_HOST_UNIFIED_MEMORY).
  bool unified_memory = false;
};

// y[t] = w (group `group`) . x[t] for n rows: x is [n][w.cols()] floats, y [n][w.rows()].
struct MatMulArgs {
  const Weight* w = nullptr;
  int64_t group = 0;
  TensorRef x;
  int64_t n = 0;
  TensorRef y;
};

struct RopeArgs {
  bool neox = false;  // format::RopeLayout::kNeox: pairs (i, i + n_rot / 2), else (2i, 2i + 1)
  int n_rot = 0;      // leading dimensions of each head that rotate
  float theta_base = 10000;
  float freq_scale = 1;  // 1 / linear scaling factor
  TensorRef freq_factors;  // n_rot / 2 floats, or empty
};

struct AttentionArgs {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;
  int head_dim_v = 0;
  float scale = 1;       // applied to q.k before the softmax
  // A device's half cache (graph.h's kv_half): the caches hold IEEE halves, StoreHalf's
  // rows; the same bytes as k_type = v_type = kF16, which it must not be combined with.
  bool kv_half = false;
  // What the key and value caches hold: rows of n_head_kv * head dim values as
  // StoreKv wrote them (KvRowBytes apart). A backend that reads only some types says so
  // in SupportsKv.
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;

  // The types the caches hold, kv_half included.
  KvType key_type() const { return kv_half ? KvType::kF16 : k_type; }
  KvType value_type() const { return kv_half ? KvType::kF16 : v_type; }
};

// One MoE layer's experts (or a dense FFN: groups 1) for FusedMoe: SwiGLU weights
// down(silu(gate x) * up x). Stacked: `gate`/`up`/`down` hold every expert. Placed
// (an expert pool): `region` holds the experts at scattered places: expert e's part
// starts at offsets[e] + that part's place in a block; `parts` gives each part's
// type, shape and place, and only the experts routed to need an offset.
struct ExpertPart {
  WeightFormat format = WeightFormat::kW4;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t block_offset = 0;  // within an expert's block
};
struct Experts {
  const Weight* gate = nullptr;  // stacked
  const Weight* up = nullptr;
  const Weight* down = nullptr;
  Buffer* region = nullptr;  // placed
  ExpertPart parts[3];       // gate, up, down
  int n_expert = 0;
  std::span<const uint64_t> offsets;

  bool placed() const { return region != nullptr; }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "CPU", "OpenCL".
  virtual std::string_view name() const = 0;
  virtual DeviceDescription device() const = 0;
  // Whether `op` runs here for weights of `type` (matmul, fused MoE; ignored by the
  // other ops). A caller places an op the backend lacks on the CPU.
  virtual bool Supports(Op op, WeightType type = WeightType::kF32) const = 0;
  // Optional: whether Attention, FullAttention and AttentionEntropy here read caches of
  // `type` (AttentionArgs::k_type / v_type; kv_half is the device path's own switch).
  // A caller places attention over a type the backend lacks on the CPU. Default: f32.
  virtual bool SupportsKv(KvType type) const { return type == KvType::kF32; }
  // Whether the host reads and writes this backend's buffers in place (no copies to
  // reach its results: routing on the host costs nothing).
  virtual bool host_memory() const { return false; }

  // --- Buffers.
  // `bytes` > 0. ResourceExhausted when the device cannot hold it.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) = 0;
  // A buffer over `bytes` of host memory the caller keeps valid and writes: zero-copy
  // where the device reads host memory in place, else the driver's copy. After the host
  // writes a range, Publish it before an op reads it. Unimplemented where the device
  // cannot wrap host memory.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> WrapHost(void* host, size_t bytes) = 0;
  virtual absl::Status Publish(Buffer& buffer, size_t offset, size_t bytes) = 0;
  // Blocking copies from / to the host.
  virtual absl::Status Write(TensorRef dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Read(TensorRef src, void* dst, size_t bytes) = 0;
  // Waits for everything enqueued; a device lost meanwhile shows up here.
  virtual absl::Status Finish() = 0;

  // A weight for MatMuls / FusedMoe: `m` as `groups` matrices of m.rows / groups rows
  // (a packed matrix keeps its own groups). The CPU borrows `m` (it must outlive the
  // weight); a device copies it (F16 values stay half there). Unimplemented naming
  // `name` and the type when the backend has no kernels for it.
  virtual absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(const Matrix& m, int64_t groups,
                                                               std::string_view name) = 0;
  // A buffer holding a copy of `values` (norm weights, biases); null for empty values.
  absl::StatusOr<std::unique_ptr<Buffer>> UploadFloats(std::span<const float> values);

  // --- Ops (float tensors are row-major fp32 unless said otherwise).
  // Independent matmuls in one dispatch (q/k/v, all of an MoE layer's experts).
  virtual absl::Status MatMuls(std::span<const MatMulArgs> jobs) = 0;
  absl::Status MatMul(const Weight& w, int64_t group, TensorRef x, int64_t n, TensorRef y) {
    const MatMulArgs job{&w, group, x, n, y};
    return MatMuls({&job, 1});
  }
  // y = x / sqrt(mean(x^2) + eps) * weight over n_rows rows of width; y may be x.
  virtual absl::Status RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                               float eps, TensorRef y) = 0;
  // y = (x - mean) / sqrt(var + eps) * weight + bias (bias may be empty); y may be x.
  virtual absl::Status LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                                 TensorRef bias, float eps, TensorRef y) = 0;
  // Rotates the heads of x ([n][n_heads * head_dim]) for positions pos0 .. pos0 + n - 1.
  virtual absl::Status Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads,
                            int head_dim, TensorRef x) = 0;
  // Causal attention of the n queries at positions pos0 .. (q: [n][n_head * head_dim_k])
  // over cached keys/values at positions 0 .. pos0 + n - 1 (rows of n_head_kv * head
  // dim, of shape.k_type / v_type); out: [n][n_head * head_dim_v].
  virtual absl::Status Attention(const AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                                 TensorRef k_cache, TensorRef v_cache, TensorRef out) = 0;
  // Attention without a mask: each of the n queries (q: [n][n_head * head_dim_k]) over
  // all n_kv keys and values (k: [n_kv][n_head_kv * head_dim_k], v likewise); out:
  // [n][n_head * head_dim_v]. k and v are rows of shape.k_type / v_type; kv_half is the
  // device path's (the CPU reads it as kF16, OpenCL refuses it).
  virtual absl::Status FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                     TensorRef k, TensorRef v, int64_t n_kv, TensorRef out) = 0;
  // The entropy in nats of each query's FullAttention distribution per head (the
  // softmax of scale * q . k over the n_kv keys, rows of shape.k_type): entropy
  // [n][n_head].
  virtual absl::Status AttentionEntropy(const AttentionArgs& shape, TensorRef q, int64_t n,
                                        TensorRef k, int64_t n_kv, TensorRef entropy) = 0;
  // Softmax of each of n_rows rows of width; y may be x.
  virtual absl::Status Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) = 0;
  // g[i] = silu(g[i]) * u[i].
  virtual absl::Status SiluMul(TensorRef g, TensorRef u, int64_t count) = 0;
  // y[i] = gelu(x[i]) (the tanh approximation, as ggml's gelu); y may be x.
  virtual absl::Status Gelu(TensorRef x, int64_t count, TensorRef y) = 0;
  // x[i] += y[i].
  virtual absl::Status Add(TensorRef x, TensorRef y, int64_t count) = 0;
  // y[t][i] += b[i] for n rows of width.
  virtual absl::Status AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) = 0;
  // The router: softmax over each of n rows of n_expert logits, the k most probable
  // (ties: the lower index) in descending order, weights renormalised to sum to 1 or
  // not: experts (int32) and weights, [n][k] each.
  virtual absl::Status TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                            TensorRef experts, TensorRef weights) = 0;
  // out[t] = sum over slots s < k, in slot order, of weights[t*k+s] * ffn(experts[t*k+s],
  // x[t]) for n rows of x (floats, n_embd wide). `experts` (int32) and `weights` live in
  // this backend; `experts` empty: every slot is expert 0; `weights` empty: k must be 1
  // and out[t] = ffn(x[t]). Expert -1 is an empty slot; slot 0 must hold an expert.
  virtual absl::Status FusedMoe(const Experts& w, TensorRef x, int64_t n, int k,
                                TensorRef experts, TensorRef weights, TensorRef out) = 0;
  // dst row r = src row idx[r] (int32 idx, each < src_rows) for r < n.
  virtual absl::Status GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n,
                                  int64_t width, TensorRef dst) = 0;
  // out[t] = sum over slots s < k in order (experts[t*k+s] >= 0) of weights[t*k+s] *
  // y[t*k+s] (the first term written, the others added); y: [n*k][width].
  virtual absl::Status MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n,
                                  int k, int64_t width, TensorRef out) = 0;
  // y[i] = x[i] rounded to IEEE half (nearest, ties to even); y holds halves.
  virtual absl::Status StoreHalf(TensorRef x, int64_t count, TensorRef y) = 0;
  // out[t][i] += y[t][i] * sigmoid(gate[t]) for n rows of width (gate: n floats).
  virtual absl::Status GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                                int64_t width) = 0;
  // n_rows rows of width floats at src into a KV cache of `type`: row r at byte
  // r * KvRowBytes(type, width) from dst (f32: a copy; f16: core::FloatToFp16; q8_0:
  // ggml's quantize_row_q8_0_ref). InvalidArgument for a width KvRowBytes refuses.
  virtual absl::Status StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                               TensorRef dst) = 0;

 protected:
  // Unimplemented naming the backend, the op and the weight type (for ops a backend
  // lacks).
  absl::Status Unsupported(Op op, WeightType type = WeightType::kF32) const;
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_BACKEND_H_
