// The OpenCL backend (see opencl_backend.h): Backend's buffers as cl_mem, its ops as
// the operators of ops.h (which check every argument against its buffer).
#include "backend/opencl/opencl_backend.h"

#include <bit>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/f32_ops.h"
#include "backend/opencl/buffer.h"
#include "backend/opencl/ops.h"
#include "core/fp16.h"
#include "core/status.h"
#include "core/strings.h"
#include "kernels/ukernel.h"

namespace moert::backend::opencl {
namespace {

constexpr size_t kA8Bytes = sizeof(moert_a8_block);

class ClBuffer final : public backend::Buffer {
 public:
  ClBuffer(const Backend* owner, opencl::Buffer buffer, uint8_t* host)
      : backend::Buffer(owner, buffer.size()), buffer_(std::move(buffer)), host_(host) {}
  uint8_t* host() const override { return host_; }
  opencl::Buffer& cl() { return buffer_; }

 private:
  opencl::Buffer buffer_;
  uint8_t* host_;  // WrapHost's memory; null otherwise
};

// A weight on the device: float rows (fp32, or half when every value is one), or
// packed tiles for the integer kernels.
class ClWeight final : public Weight {
 public:
  ClWeight(WeightType type, int64_t groups, int64_t rows, int64_t cols)
      : Weight(type, groups, rows, cols) {}
  opencl::Buffer buffer;
  MatrixRef ref;  // packed

  bool packed() const { return type() != WeightType::kF32 && type() != WeightType::kF16; }
  uint64_t device_bytes() const override { return buffer.size(); }
  BufferRef FloatGroup(int64_t g) const {
    const size_t elem = type() == WeightType::kF16 ? 2 : 4;
    return BufferRef(buffer, static_cast<size_t>(g * rows() * cols()) * elem);
  }
};

// `data` as halves when every value is one exactly (nullopt otherwise): the fp32 copy
// of an F16 tensor. Checks before it converts, so an fp32 matrix allocates nothing.
std::optional<std::vector<uint16_t>> ExactHalves(const std::vector<float>& data) {
  for (float v : data) {
    if (std::bit_cast<uint32_t>(core::Fp16ToFloat(core::FloatToFp16(v))) !=
        std::bit_cast<uint32_t>(v)) {
      return std::nullopt;
    }
  }
  std::vector<uint16_t> out(data.size());
  for (size_t i = 0; i < data.size(); ++i) out[i] = core::FloatToFp16(data[i]);
  return out;
}

class OpenClBackend final : public Backend {
 public:
  explicit OpenClBackend(std::unique_ptr<Device> device) : device_(std::move(device)) {}

  Device& cl_device() { return *device_; }
  absl::Status SelfTest();

  std::string_view name() const override { return "OpenCL"; }
  DeviceDescription device() const override {
    return {device_->info().name, std::string(device_->info().TypeName()),
            device_->info().driver_version, device_->info().unified_memory};
  }
  bool Supports(Op op, WeightType type) const override {
    switch (op) {
      case Op::kMatMul:
        return type == WeightType::kF32 || type == WeightType::kF16 || type == WeightType::kW4 ||
               type == WeightType::kW8;
      case Op::kFusedMoe:
        return type == WeightType::kW4 || type == WeightType::kW8;
      case Op::kAttentionEntropy:
      case Op::kGatedAdd:
      case Op::kStoreKv:
        return false;  // no kernels yet: the CPU runs them
      default:
        return true;
    }
  }

  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(size_t bytes) override {
    MOERT_ASSIGN_OR_RETURN(opencl::Buffer b, opencl::Buffer::Create(*device_, bytes));
    return std::unique_ptr<backend::Buffer>(std::make_unique<ClBuffer>(this, std::move(b), nullptr));
  }
  absl::StatusOr<std::unique_ptr<backend::Buffer>> WrapHost(void* host, size_t bytes) override {
    MOERT_ASSIGN_OR_RETURN(opencl::Buffer b, opencl::Buffer::WrapHost(*device_, host, bytes));
    return std::unique_ptr<backend::Buffer>(
        std::make_unique<ClBuffer>(this, std::move(b), static_cast<uint8_t*>(host)));
  }
  absl::Status Publish(backend::Buffer& buffer, size_t offset, size_t bytes) override {
    MOERT_ASSIGN_OR_RETURN(ClBuffer * b, Own(&buffer, "publish"));
    return b->cl().Publish(*device_, offset, bytes);
  }
  absl::Status Write(TensorRef dst, const void* src, size_t bytes) override {
    MOERT_ASSIGN_OR_RETURN(ClBuffer * b, Own(dst.buffer, "write"));
    return b->cl().Write(*device_, src, bytes, dst.offset);
  }
  absl::Status Read(TensorRef src, void* dst, size_t bytes) override {
    MOERT_ASSIGN_OR_RETURN(ClBuffer * b, Own(src.buffer, "read"));
    return b->cl().Read(*device_, dst, bytes, src.offset);
  }
  absl::Status Finish() override { return device_->Finish(); }

  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(const Matrix& m, int64_t groups,
                                                       std::string_view name) override;

  absl::Status MatMuls(std::span<const MatMulArgs> jobs) override;
  absl::Status RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight, float eps,
                       TensorRef y) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "rms_norm"));
    MOERT_ASSIGN_OR_RETURN(BufferRef wr, Ref(weight, "rms_norm"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "rms_norm"));
    return opencl::RmsNorm(*device_, xr, n_rows, width, wr, eps, yr);
  }
  absl::Status LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                         TensorRef bias, float eps, TensorRef y) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "layer_norm"));
    MOERT_ASSIGN_OR_RETURN(BufferRef wr, Ref(weight, "layer_norm"));
    MOERT_ASSIGN_OR_RETURN(BufferRef br, Ref(bias, "layer_norm"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "layer_norm"));
    if (wr.empty()) return absl::InvalidArgumentError("OpenCL layer_norm: no weight");
    return opencl::LayerNorm(*device_, xr, n_rows, width, wr, br, eps, yr);
  }
  absl::Status Rope(const backend::RopeArgs& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
                    TensorRef x) override {
    opencl::RopeArgs args;
    args.neox = rope.neox;
    args.n_rot = rope.n_rot;
    args.theta_base = rope.theta_base;
    args.freq_scale = rope.freq_scale;
    MOERT_ASSIGN_OR_RETURN(args.freq_factors, Ref(rope.freq_factors, "rope"));
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "rope"));
    return opencl::Rope(*device_, args, pos0, n, n_heads, head_dim, xr);
  }
  absl::Status Attention(const backend::AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                         TensorRef k_cache, TensorRef v_cache, TensorRef out) override {
    MOERT_RETURN_IF_ERROR(F32Caches(shape, Op::kAttention));
    const opencl::AttentionArgs args = ClArgs(shape);
    MOERT_ASSIGN_OR_RETURN(BufferRef qr, Ref(q, "attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef kr, Ref(k_cache, "attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef vr, Ref(v_cache, "attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef outr, Ref(out, "attention"));
    return opencl::Attention(*device_, args, qr, n, pos0, kr, vr, outr, scratch_);
  }
  absl::Status FullAttention(const backend::AttentionArgs& shape, TensorRef q, int64_t n,
                             TensorRef k, TensorRef v, int64_t n_kv, TensorRef out) override {
    if (shape.kv_half) return Unsupported(Op::kFullAttention);
    MOERT_RETURN_IF_ERROR(F32Caches(shape, Op::kFullAttention));
    const opencl::AttentionArgs args = ClArgs(shape);
    MOERT_ASSIGN_OR_RETURN(BufferRef qr, Ref(q, "full_attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef kr, Ref(k, "full_attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef vr, Ref(v, "full_attention"));
    MOERT_ASSIGN_OR_RETURN(BufferRef outr, Ref(out, "full_attention"));
    return opencl::FullAttention(*device_, args, qr, n, kr, vr, n_kv, outr, scratch_);
  }
  absl::Status AttentionEntropy(const backend::AttentionArgs&, TensorRef, int64_t, TensorRef,
                                int64_t, TensorRef) override {
    return Unsupported(Op::kAttentionEntropy);
  }
  absl::Status Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "softmax"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "softmax"));
    return opencl::Softmax(*device_, xr, n_rows, width, yr);
  }
  absl::Status SiluMul(TensorRef g, TensorRef u, int64_t count) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef gr, Ref(g, "silu_mul"));
    MOERT_ASSIGN_OR_RETURN(BufferRef ur, Ref(u, "silu_mul"));
    return opencl::SiluMul(*device_, gr, ur, count);
  }
  absl::Status Gelu(TensorRef x, int64_t count, TensorRef y) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "gelu"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "gelu"));
    return opencl::Gelu(*device_, xr, count, yr);
  }
  absl::Status GatedAdd(TensorRef, TensorRef, TensorRef, int64_t, int64_t) override {
    return Unsupported(Op::kGatedAdd);
  }
  absl::Status Add(TensorRef x, TensorRef y, int64_t count) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "add"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "add"));
    return opencl::AddInPlace(*device_, xr, yr, count);
  }
  absl::Status AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "add_bias"));
    MOERT_ASSIGN_OR_RETURN(BufferRef br, Ref(b, "add_bias"));
    return opencl::AddBias(*device_, yr, br, n, width);
  }
  absl::Status TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                    TensorRef experts, TensorRef weights) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef lr, Ref(logits, "top_k"));
    MOERT_ASSIGN_OR_RETURN(BufferRef er, Ref(experts, "top_k"));
    MOERT_ASSIGN_OR_RETURN(BufferRef wr, Ref(weights, "top_k"));
    return opencl::TopKRoute(*device_, lr, n, n_expert, k, renormalize, er, wr);
  }
  absl::Status FusedMoe(const Experts& w, TensorRef x, int64_t n, int k, TensorRef experts,
                        TensorRef weights, TensorRef out) override;
  absl::Status GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n, int64_t width,
                          TensorRef dst) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef sr, Ref(src, "gather_rows"));
    MOERT_ASSIGN_OR_RETURN(BufferRef ir, Ref(idx, "gather_rows"));
    MOERT_ASSIGN_OR_RETURN(BufferRef dr, Ref(dst, "gather_rows"));
    return opencl::GatherRows(*device_, sr, src_rows, ir, n, width, dr);
  }
  absl::Status MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n, int k,
                          int64_t width, TensorRef out) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "moe_combine"));
    MOERT_ASSIGN_OR_RETURN(BufferRef er, Ref(experts, "moe_combine"));
    MOERT_ASSIGN_OR_RETURN(BufferRef wr, Ref(weights, "moe_combine"));
    MOERT_ASSIGN_OR_RETURN(BufferRef outr, Ref(out, "moe_combine"));
    return opencl::MoeCombine(*device_, yr, er, wr, n, k, width, outr);
  }
  absl::Status StoreHalf(TensorRef x, int64_t count, TensorRef y) override {
    MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "store_half"));
    MOERT_ASSIGN_OR_RETURN(BufferRef yr, Ref(y, "store_half"));
    return opencl::ToHalf(*device_, xr, count, yr);
  }
  absl::Status StoreKv(KvType, TensorRef, int64_t, int64_t, TensorRef) override {
    return Unsupported(Op::kStoreKv);
  }

 private:
  absl::StatusOr<ClBuffer*> Own(backend::Buffer* b, std::string_view op) {
    if (b == nullptr || b->owner() != this) {
      return absl::InvalidArgumentError(
          StrCat("OpenCL backend ", op, ": a buffer of another backend (or none)"));
    }
    return static_cast<ClBuffer*>(b);
  }
  // The kernels read fp32 caches, or halves through kv_half (StoreHalf's rows); other
  // KV cache types (SupportsKv says no) are Unimplemented naming them.
  absl::Status F32Caches(const backend::AttentionArgs& shape, Op op) const {
    if (shape.k_type == KvType::kF32 && shape.v_type == KvType::kF32) return absl::OkStatus();
    return absl::UnimplementedError(StrCat("the OpenCL backend has no ", OpName(op), " over ",
                                           KvTypeName(shape.k_type), " keys and ",
                                           KvTypeName(shape.v_type), " values"));
  }
  static opencl::AttentionArgs ClArgs(const backend::AttentionArgs& shape) {
    opencl::AttentionArgs args;
    args.n_head = shape.n_head;
    args.n_head_kv = shape.n_head_kv;
    args.head_dim_k = shape.head_dim_k;
    args.head_dim_v = shape.head_dim_v;
    args.scale = shape.scale;
    args.kv_half = shape.kv_half;
    return args;
  }
  // The device place of `t` (empty for an empty ref).
  absl::StatusOr<BufferRef> Ref(TensorRef t, std::string_view op) {
    if (t.empty()) return BufferRef();
    MOERT_ASSIGN_OR_RETURN(ClBuffer * b, Own(t.buffer, op));
    return BufferRef(b->cl(), t.offset);
  }
  // x quantized to A8 in the backend's own scratch (n rows of cols floats).
  absl::StatusOr<BufferRef> Quantized(BufferRef x, int64_t n, int64_t cols) {
    const size_t bytes = static_cast<size_t>(n * (cols / MOERT_QK)) * kA8Bytes;
    if (a8_.size() < bytes) {
      a8_ = opencl::Buffer();
      MOERT_ASSIGN_OR_RETURN(a8_, opencl::Buffer::Create(*device_, std::max<size_t>(bytes, 256)));
    }
    MOERT_RETURN_IF_ERROR(opencl::Q8Quant(*device_, x, n, cols, a8_));
    return BufferRef(a8_);
  }

  std::unique_ptr<Device> device_;
  Scratch scratch_;
  opencl::Buffer a8_;  // activations quantized for the op that reads them next
};

absl::Status OpenClBackend::SelfTest() {
  // An fp32 GEMV with a K tail against the CPU's dot product: the kernel compiles,
  // runs and sums in the CPU's order on this device.
  constexpr int64_t kRows = 24, kCols = 44;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(kRows * kCols)), x(static_cast<size_t>(kCols));
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  MOERT_ASSIGN_OR_RETURN(opencl::Buffer dw, opencl::Buffer::FromHost(*device_, w.data(), w.size() * 4));
  MOERT_ASSIGN_OR_RETURN(opencl::Buffer dx, opencl::Buffer::FromHost(*device_, x.data(), x.size() * 4));
  MOERT_ASSIGN_OR_RETURN(opencl::Buffer dy, opencl::Buffer::Create(*device_, kRows * 4));
  MOERT_RETURN_IF_ERROR(F32MatMul(*device_, dw, kRows, kCols, dx, 1, dy));
  std::vector<float> y(kRows);
  MOERT_RETURN_IF_ERROR(dy.Read(*device_, y.data(), y.size() * 4));
  for (int64_t r = 0; r < kRows; ++r) {
    const float want = cpu::Dot(w.data() + r * kCols, x.data(), kCols);
    if (!(std::fabs(y[static_cast<size_t>(r)] - want) <= 1e-5f * (1.0f + std::fabs(want)))) {
      return absl::FailedPreconditionError(
          StrCat("OpenCL self-test failed on ", device_->info().name, ": GEMV row ", r, " is ",
                 y[static_cast<size_t>(r)], ", the CPU's ", want));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Weight>> OpenClBackend::UploadWeight(const Matrix& m, int64_t groups,
                                                                    std::string_view name) {
  if (!m.packed.empty()) {
    const WeightFormat f = m.packed.format();
    if (f != WeightFormat::kW4 && f != WeightFormat::kW8) {
      return absl::UnimplementedError(StrCat("OpenCL backend: ", name, " is packed as ",
                                             WeightFormatName(f),
                                             ", which has no OpenCL kernels yet (W4 and W8 only)"));
    }
    MOERT_ASSIGN_OR_RETURN(DeviceMatrix dm, DeviceMatrix::Upload(*device_, m.packed));
    auto w = std::make_unique<ClWeight>(WeightTypeOf(f), m.packed.groups(), m.packed.rows(),
                                        m.packed.cols());
    w->buffer = std::move(dm.buffer);
    w->ref = dm.ref;
    w->ref.data = BufferRef(w->buffer);
    return std::unique_ptr<Weight>(std::move(w));
  }
  if (m.data.empty() || groups <= 0 || m.rows % groups != 0) {
    return absl::InvalidArgumentError(StrCat("OpenCL backend: ", name, " has no weights"));
  }
  const std::optional<std::vector<uint16_t>> halves = ExactHalves(m.data);
  auto w = std::make_unique<ClWeight>(halves ? WeightType::kF16 : WeightType::kF32, groups,
                                      m.rows / groups, m.cols);
  if (halves) {
    MOERT_ASSIGN_OR_RETURN(w->buffer,
                           opencl::Buffer::FromHost(*device_, halves->data(), halves->size() * 2));
  } else {
    MOERT_ASSIGN_OR_RETURN(w->buffer, opencl::Buffer::FromHost(*device_, m.data.data(),
                                                               m.data.size() * sizeof(float)));
  }
  return std::unique_ptr<Weight>(std::move(w));
}

absl::Status OpenClBackend::MatMuls(std::span<const MatMulArgs> jobs) {
  // Each distinct input quantized once for the packed jobs after it that read it (the
  // queue is in order, so the next quantization waits for them).
  BufferRef quantized_from;
  int64_t quantized_n = -1, quantized_cols = -1;
  BufferRef xq;
  for (const MatMulArgs& job : jobs) {
    const auto* w = dynamic_cast<const ClWeight*>(job.w);
    if (w == nullptr) {
      return absl::InvalidArgumentError("OpenCL backend matmul: the weight is not an OpenCL weight");
    }
    if (job.n == 0) continue;
    MOERT_ASSIGN_OR_RETURN(BufferRef x, Ref(job.x, "matmul"));
    MOERT_ASSIGN_OR_RETURN(BufferRef y, Ref(job.y, "matmul"));
    if (!w->packed()) {
      MOERT_RETURN_IF_ERROR(F32MatMul(*device_, w->FloatGroup(job.group), w->rows(), w->cols(), x,
                                      job.n, y, w->type() == WeightType::kF16));
      continue;
    }
    if (x.mem != quantized_from.mem || x.offset != quantized_from.offset ||
        job.n != quantized_n || w->cols() != quantized_cols) {
      MOERT_ASSIGN_OR_RETURN(xq, Quantized(x, job.n, w->cols()));
      quantized_from = x;
      quantized_n = job.n;
      quantized_cols = w->cols();
    }
    MOERT_RETURN_IF_ERROR(QMatMul(*device_, w->ref, job.group, xq, job.n, y));
  }
  return absl::OkStatus();
}

absl::Status OpenClBackend::FusedMoe(const Experts& w, TensorRef x, int64_t n, int k,
                                     TensorRef experts, TensorRef weights, TensorRef out) {
  FfnRef f;
  int64_t n_embd = 0;
  if (w.placed()) {
    MOERT_ASSIGN_OR_RETURN(ClBuffer * region, Own(w.region, "fused_moe"));
    MatrixRef* parts[3] = {&f.gate, &f.up, &f.down};
    for (int p = 0; p < 3; ++p) {
      const ExpertPart& part = w.parts[p];
      if (part.format != WeightFormat::kW4 && part.format != WeightFormat::kW8) {
        return Unsupported(Op::kFusedMoe, WeightTypeOf(part.format));
      }
      *parts[p] = MatrixRef{BufferRef(region->cl(), static_cast<size_t>(part.block_offset)),
                            part.format, w.n_expert, part.rows, part.cols,
                            PackedBytes(part.format, part.rows, part.cols)};
    }
    f.expert_offsets = w.offsets;
    n_embd = w.parts[0].cols;
  } else {
    const ClWeight* parts[3] = {dynamic_cast<const ClWeight*>(w.gate),
                                dynamic_cast<const ClWeight*>(w.up),
                                dynamic_cast<const ClWeight*>(w.down)};
    for (const ClWeight* p : parts) {
      if (p == nullptr) {
        return absl::InvalidArgumentError("OpenCL backend fused_moe: not an OpenCL weight");
      }
      if (!p->packed()) return Unsupported(Op::kFusedMoe, p->type());
    }
    f.gate = parts[0]->ref;
    f.up = parts[1]->ref;
    f.down = parts[2]->ref;
    n_embd = parts[0]->cols();
  }
  MOERT_ASSIGN_OR_RETURN(BufferRef xr, Ref(x, "fused_moe"));
  MOERT_ASSIGN_OR_RETURN(BufferRef er, Ref(experts, "fused_moe"));
  MOERT_ASSIGN_OR_RETURN(BufferRef wr, Ref(weights, "fused_moe"));
  MOERT_ASSIGN_OR_RETURN(BufferRef outr, Ref(out, "fused_moe"));
  MOERT_ASSIGN_OR_RETURN(BufferRef xq, Quantized(xr, n, n_embd));
  return opencl::FusedMoe(*device_, f, xq, n, k, er, wr, outr, scratch_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> OpenOpenClBackend(const OpenClBackendOptions& options) {
  DeviceOptions device_options = options.device;
  device_options.allow_cpu = !options.require_gpu && options.allow_cpu_device;
  auto device = Device::Open(device_options);
  if (!device.ok()) {
    return absl::FailedPreconditionError(
        StrCat("OpenCL backend unavailable: ", std::string(device.status().message())));
  }
  if (options.require_gpu && ((*device)->info().type & CL_DEVICE_TYPE_GPU) == 0) {
    return absl::FailedPreconditionError(
        StrCat("OpenCL device ", (*device)->info().name, " is not a GPU"));
  }
  auto backend = std::make_unique<OpenClBackend>(std::move(*device));
  MOERT_RETURN_IF_ERROR(backend->SelfTest());
  return std::unique_ptr<Backend>(std::move(backend));
}

Device* DeviceOf(Backend& backend) {
  auto* cl = dynamic_cast<OpenClBackend*>(&backend);
  return cl != nullptr ? &cl->cl_device() : nullptr;
}

}  // namespace moert::backend::opencl
