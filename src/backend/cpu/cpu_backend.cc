// The CPU backend (see cpu_backend.h): argument checks, then the ops of f32_ops.h and
// qmatmul.h on host pointers.
#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/xnnpack_f32.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/kv_rows.h"
#include "backend/cpu/qmatmul.h"
#include "core/fp16.h"
#include "core/status.h"
#include "core/strings.h"
#include "telemetry/trace.h"

namespace moert::backend::cpu {
namespace {

static_assert(sizeof(int) == sizeof(int32_t), "expert ids are int32 in buffers");

class HostBuffer final : public Buffer {
 public:
  // Owns `bytes` of 64-byte aligned memory (`wrapped` null) or borrows `wrapped`.
  HostBuffer(const Backend* owner, size_t bytes, uint8_t* wrapped)
      : Buffer(owner, bytes), data_(wrapped) {}
  ~HostBuffer() override {
    if (owned_) std::free(data_);
  }
  static absl::StatusOr<std::unique_ptr<Buffer>> Own(const Backend* owner, size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(StrCat("CPU backend: cannot allocate ", bytes, " bytes"));
    }
    auto buffer = std::make_unique<HostBuffer>(owner, bytes, static_cast<uint8_t*>(p));
    buffer->owned_ = true;
    return std::unique_ptr<Buffer>(std::move(buffer));
  }
  uint8_t* host() const override { return data_; }

 private:
  uint8_t* data_;
  bool owned_ = false;
};

// A weight the CPU reads in place: the loader's matrix, borrowed.
class CpuWeight final : public Weight {
 public:
  CpuWeight(const Matrix& m, WeightType type, int64_t groups, int64_t rows)
      : Weight(type, groups, rows, m.cols), m_(&m) {}
  MatrixView View(int64_t g) const {
    if (!m_->packed.empty()) return m_->packed.group(g);
    return MatrixView(m_->data.data() + g * rows() * cols(), rows(), cols());
  }
  bool packed() const { return !m_->packed.empty(); }

  // XNNPACK's operator over this one-group fp32 weight, made on first use; null when
  // XNNPACK cannot take it (the caller then runs cpu::MatMul).
  XnnpackF32Gemm* Xnnpack() const {
    if (!xnnpack_tried_) {
      xnnpack_tried_ = true;
      if (!packed() && groups() == 1) {
        auto gemm = XnnpackF32Gemm::Create(m_->data.data(), rows(), cols());
        if (gemm.ok()) xnnpack_ = std::move(*gemm);
      }
    }
    return xnnpack_.get();
  }

 private:
  const Matrix* m_;
  mutable bool xnnpack_tried_ = false;
  mutable std::unique_ptr<XnnpackF32Gemm> xnnpack_;
};

// `count` values of T at `ref`, checked to lie inside a host-visible buffer.
template <typename T>
absl::StatusOr<T*> At(TensorRef ref, int64_t count, std::string_view op, std::string_view arg) {
  if (ref.buffer == nullptr || ref.buffer->host() == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("CPU backend ", op, ": ", arg, " is not in host memory"));
  }
  if (count < 0 || ref.offset % alignof(T) != 0 ||
      ref.offset > ref.buffer->size() ||
      static_cast<uint64_t>(count) * sizeof(T) > ref.buffer->size() - ref.offset) {
    return absl::OutOfRangeError(StrCat("CPU backend ", op, ": ", arg, " (", count, " x ",
                                        sizeof(T), " bytes at offset ", ref.offset,
                                        ") is outside its buffer of ", ref.buffer->size(),
                                        " bytes"));
  }
  return reinterpret_cast<T*>(ref.buffer->host() + ref.offset);
}

// As At, but an empty ref is null.
template <typename T>
absl::StatusOr<T*> Optional(TensorRef ref, int64_t count, std::string_view op,
                            std::string_view arg) {
  if (ref.empty()) return static_cast<T*>(nullptr);
  return At<T>(ref, count, op, arg);
}

absl::Status Positive(int64_t v, std::string_view op, std::string_view what) {
  if (v <= 0) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", op, ": ", what, " must be > 0, got ", v));
  }
  return absl::OkStatus();
}

// The bytes of a row of `width` values of `type`; InvalidArgument naming the op otherwise.
absl::StatusOr<size_t> RowBytes(KvType type, int64_t width, std::string_view op) {
  absl::StatusOr<size_t> bytes = KvRowBytes(type, width);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", op, ": ", bytes.status().message()));
  }
  return bytes;
}

// `rows` cache rows of `width` values of `type` at `ref`, checked to lie inside a
// host-visible buffer (fp32 rows aligned as floats).
absl::StatusOr<KvRows> CacheAt(TensorRef ref, KvType type, int64_t rows, int64_t width,
                               std::string_view op, std::string_view arg) {
  MOERT_ASSIGN_OR_RETURN(const size_t row_bytes, RowBytes(type, width, op));
  if (type == KvType::kF32) {
    MOERT_ASSIGN_OR_RETURN(const float* p, At<const float>(ref, rows * width, op, arg));
    return F32Rows(p, width);
  }
  MOERT_ASSIGN_OR_RETURN(const uint8_t* p,
                         At<const uint8_t>(ref, rows * static_cast<int64_t>(row_bytes), op, arg));
  return KvRows{p, type, row_bytes};
}

// kv_half names the caches' type itself: it cannot be combined with another.
absl::Status CheckKvTypes(const AttentionArgs& shape, std::string_view op) {
  if (shape.kv_half && (shape.k_type != KvType::kF32 || shape.v_type != KvType::kF32)) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", op, ": kv_half with k_type ",
                                             KvTypeName(shape.k_type), " and v_type ",
                                             KvTypeName(shape.v_type)));
  }
  return absl::OkStatus();
}

absl::StatusOr<const CpuWeight*> CpuWeightOf(const Weight* w, std::string_view op) {
  const auto* cw = dynamic_cast<const CpuWeight*>(w);
  if (cw == nullptr) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", op, ": the weight is not a CPU weight"));
  }
  return cw;
}

}  // namespace

CpuBackend::CpuBackend(int threads)
    : own_pool_(std::make_unique<ThreadPool>(threads)), pool_(own_pool_.get()) {}

DeviceDescription CpuBackend::device() const {
  return {StrCat("CPU (", pool_->threads(), " threads, ", kernels::IsaName(pool_->kernels().isa),
                 " kernels)"),
          "CPU", "", /*unified_memory=*/true};
}

bool CpuBackend::Supports(Op op, WeightType type) const {
  // The fused expert op runs packed weights only: fp32 experts run as matmuls.
  if (op == Op::kFusedMoe) return type != WeightType::kF32 && type != WeightType::kF16;
  return true;
}

absl::StatusOr<std::unique_ptr<Buffer>> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("CPU backend: a buffer of 0 bytes");
  return HostBuffer::Own(this, bytes);
}

absl::StatusOr<std::unique_ptr<Buffer>> CpuBackend::WrapHost(void* host, size_t bytes) {
  if (host == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("CPU backend: WrapHost needs memory and a size");
  }
  return std::unique_ptr<Buffer>(
      std::make_unique<HostBuffer>(this, bytes, static_cast<uint8_t*>(host)));
}

absl::Status CpuBackend::Publish(Buffer& buffer, size_t offset, size_t bytes) {
  if (offset > buffer.size() || bytes > buffer.size() - offset) {
    return absl::OutOfRangeError(StrCat("CPU backend: publishing ", bytes, " bytes at ", offset,
                                        " of a buffer of ", buffer.size()));
  }
  return absl::OkStatus();  // the host's writes are what the ops read
}

absl::Status CpuBackend::Write(TensorRef dst, const void* src, size_t bytes) {
  MOERT_ASSIGN_OR_RETURN(uint8_t * d, At<uint8_t>(dst, static_cast<int64_t>(bytes), "write", "dst"));
  if (bytes > 0) std::memcpy(d, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::Read(TensorRef src, void* dst, size_t bytes) {
  MOERT_ASSIGN_OR_RETURN(uint8_t * s, At<uint8_t>(src, static_cast<int64_t>(bytes), "read", "src"));
  if (bytes > 0) std::memcpy(dst, s, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Weight>> CpuBackend::UploadWeight(const Matrix& m, int64_t groups,
                                                                 std::string_view name) {
  if (!m.packed.empty()) {
    return std::unique_ptr<Weight>(std::make_unique<CpuWeight>(
        m, WeightTypeOf(m.packed.format()), m.packed.groups(), m.packed.rows()));
  }
  if (m.data.empty() || groups <= 0 || m.rows % groups != 0 ||
      static_cast<int64_t>(m.data.size()) != m.rows * m.cols) {
    return absl::InvalidArgumentError(
        StrCat("CPU backend: ", name, " is not a ", groups, "-group weight"));
  }
  return std::unique_ptr<Weight>(
      std::make_unique<CpuWeight>(m, WeightType::kF32, groups, m.rows / groups));
}

absl::Status CpuBackend::MatMuls(std::span<const MatMulArgs> jobs) {
  std::vector<MatMulJob> cpu_jobs;
  cpu_jobs.reserve(jobs.size());
  for (const MatMulArgs& job : jobs) {
    MOERT_ASSIGN_OR_RETURN(const CpuWeight* w, CpuWeightOf(job.w, "matmul"));
    if (job.group < 0 || job.group >= w->groups() || job.n < 0) {
      return absl::InvalidArgumentError(StrCat("CPU backend matmul: group ", job.group, " of ",
                                               w->groups(), ", ", job.n, " rows"));
    }
    MOERT_ASSIGN_OR_RETURN(const float* x, At<const float>(job.x, job.n * w->cols(), "matmul", "x"));
    MOERT_ASSIGN_OR_RETURN(float* y, At<float>(job.y, job.n * w->rows(), "matmul", "y"));
    if (xnnpack_f32_ && !w->packed() && job.n >= XnnpackF32Gemm::kMinRows) {
      if (XnnpackF32Gemm* gemm = w->Xnnpack(); gemm != nullptr) {
        MOERT_RETURN_IF_ERROR(gemm->Run(x, job.n, y, pool_->handle()));
        continue;
      }
    }
    cpu_jobs.push_back({w->View(job.group), x, job.n, y});
  }
  cpu::MatMuls(*pool_, cpu_jobs);
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                                 float eps, TensorRef y) {
  MOERT_RETURN_IF_ERROR(Positive(width, "rms_norm", "width"));
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, n_rows * width, "rms_norm", "x"));
  MOERT_ASSIGN_OR_RETURN(const float* wp, At<const float>(weight, width, "rms_norm", "weight"));
  MOERT_ASSIGN_OR_RETURN(float* yp, At<float>(y, n_rows * width, "rms_norm", "y"));
  cpu::RmsNorm(xp, n_rows, width, wp, eps, yp);
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                                   TensorRef bias, float eps, TensorRef y) {
  MOERT_RETURN_IF_ERROR(Positive(width, "layer_norm", "width"));
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, n_rows * width, "layer_norm", "x"));
  MOERT_ASSIGN_OR_RETURN(const float* wp, At<const float>(weight, width, "layer_norm", "weight"));
  MOERT_ASSIGN_OR_RETURN(const float* bp, Optional<const float>(bias, width, "layer_norm", "bias"));
  MOERT_ASSIGN_OR_RETURN(float* yp, At<float>(y, n_rows * width, "layer_norm", "y"));
  cpu::LayerNorm(xp, n_rows, width, wp, bp, eps, yp);
  return absl::OkStatus();
}

absl::Status CpuBackend::Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads,
                              int head_dim, TensorRef x) {
  if (rope.n_rot < 0 || rope.n_rot % 2 != 0 || rope.n_rot > head_dim || pos0 < 0 || n_heads < 1) {
    return absl::InvalidArgumentError(StrCat("CPU backend rope: n_rot ", rope.n_rot, " of ",
                                             head_dim, ", ", n_heads, " heads at ", pos0));
  }
  MOERT_ASSIGN_OR_RETURN(float* xp,
                         At<float>(x, n * n_heads * int64_t{head_dim}, "rope", "x"));
  MOERT_ASSIGN_OR_RETURN(const float* ff,
                         Optional<const float>(rope.freq_factors, rope.n_rot / 2, "rope",
                                               "freq_factors"));
  RopeParams params;
  params.layout = rope.neox ? format::RopeLayout::kNeox : format::RopeLayout::kNormal;
  params.n_rot = rope.n_rot;
  params.theta_base = rope.theta_base;
  params.freq_scale = rope.freq_scale;
  params.freq_factors = ff;
  ApplyRope(params, pos0, n, n_heads, head_dim, xp);
  return absl::OkStatus();
}

namespace {

// The f32 ops' view of an attention shape; n_kv 0: causal over the cache.
AttentionShape ShapeOf(const AttentionArgs& shape, int64_t n_kv) {
  AttentionShape s;
  s.n_head = shape.n_head;
  s.n_head_kv = shape.n_head_kv;
  s.head_dim_k = shape.head_dim_k;
  s.head_dim_v = shape.head_dim_v;
  s.scale = shape.scale;
  s.n_kv = n_kv;
  return s;
}

}  // namespace

absl::Status CpuBackend::Attention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                   int64_t pos0, TensorRef k_cache, TensorRef v_cache,
                                   TensorRef out) {
  if (pos0 < 0) return absl::InvalidArgumentError(StrCat("CPU backend attention: position ", pos0));
  return RunAttention(shape, q, n, pos0, k_cache, v_cache, pos0 + n, /*causal=*/true, out);
}

absl::Status CpuBackend::FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                       TensorRef k, TensorRef v, int64_t n_kv, TensorRef out) {
  if (n_kv < 1) {
    return absl::InvalidArgumentError(StrCat("CPU backend full_attention: ", n_kv, " keys"));
  }
  return RunAttention(shape, q, n, 0, k, v, n_kv, /*causal=*/false, out);
}

absl::Status CpuBackend::RunAttention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                      int64_t pos0, TensorRef k_cache, TensorRef v_cache,
                                      int64_t kv, bool causal, TensorRef out) {
  const Op op = causal ? Op::kAttention : Op::kFullAttention;
  const std::string_view name = OpName(op);
  MOERT_RETURN_IF_ERROR(CheckKvTypes(shape, name));
  if (shape.n_head < 1 || shape.n_head_kv < 1 || shape.n_head % shape.n_head_kv != 0 ||
      shape.head_dim_k < 1 || shape.head_dim_v < 1 || n < 0) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", name, ": ", shape.n_head,
                                             " heads over ", shape.n_head_kv, " KV heads of ",
                                             shape.head_dim_k, "/", shape.head_dim_v));
  }
  MOERT_ASSIGN_OR_RETURN(const float* qp,
                         At<const float>(q, n * shape.n_head * shape.head_dim_k, name, "q"));
  MOERT_ASSIGN_OR_RETURN(const KvRows kp, CacheAt(k_cache, shape.key_type(), kv,
                                                  int64_t{shape.n_head_kv} * shape.head_dim_k,
                                                  name, "k"));
  MOERT_ASSIGN_OR_RETURN(const KvRows vp, CacheAt(v_cache, shape.value_type(), kv,
                                                  int64_t{shape.n_head_kv} * shape.head_dim_v,
                                                  name, "v"));
  MOERT_ASSIGN_OR_RETURN(float* op_out,
                         At<float>(out, n * shape.n_head * shape.head_dim_v, name, "out"));
  cpu::Attention(*pool_, ShapeOf(shape, causal ? 0 : kv), qp, n, pos0, kp, vp, op_out);
  return absl::OkStatus();
}

absl::Status CpuBackend::AttentionEntropy(const AttentionArgs& shape, TensorRef q, int64_t n,
                                          TensorRef k, int64_t n_kv, TensorRef entropy) {
  const std::string_view name = OpName(Op::kAttentionEntropy);
  MOERT_RETURN_IF_ERROR(CheckKvTypes(shape, name));
  if (shape.n_head < 1 || shape.n_head_kv < 1 || shape.n_head % shape.n_head_kv != 0 ||
      shape.head_dim_k < 1 || n < 0 || n_kv < 1) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", name, ": ", shape.n_head,
                                             " heads over ", shape.n_head_kv, " KV heads of ",
                                             shape.head_dim_k, ", ", n_kv, " keys"));
  }
  MOERT_ASSIGN_OR_RETURN(const float* qp,
                         At<const float>(q, n * shape.n_head * shape.head_dim_k, name, "q"));
  MOERT_ASSIGN_OR_RETURN(
      const KvRows kp,
      CacheAt(k, shape.key_type(), n_kv, int64_t{shape.n_head_kv} * shape.head_dim_k, name, "k"));
  MOERT_ASSIGN_OR_RETURN(float* ep, At<float>(entropy, n * shape.n_head, name, "entropy"));
  cpu::AttentionEntropy(*pool_, ShapeOf(shape, n_kv), qp, n, kp, ep);
  return absl::OkStatus();
}

absl::Status CpuBackend::Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) {
  MOERT_RETURN_IF_ERROR(Positive(width, "softmax", "width"));
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, n_rows * width, "softmax", "x"));
  MOERT_ASSIGN_OR_RETURN(float* yp, At<float>(y, n_rows * width, "softmax", "y"));
  cpu::Softmax(xp, n_rows, width, yp);
  return absl::OkStatus();
}

absl::Status CpuBackend::SiluMul(TensorRef g, TensorRef u, int64_t count) {
  MOERT_ASSIGN_OR_RETURN(float* gp, At<float>(g, count, "silu_mul", "g"));
  MOERT_ASSIGN_OR_RETURN(const float* up, At<const float>(u, count, "silu_mul", "u"));
  for (int64_t i = 0; i < count; ++i) gp[i] = Silu(gp[i]) * up[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::Gelu(TensorRef x, int64_t count, TensorRef y) {
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, count, "gelu", "x"));
  MOERT_ASSIGN_OR_RETURN(float* yp, At<float>(y, count, "gelu", "y"));
  for (int64_t i = 0; i < count; ++i) yp[i] = cpu::Gelu(xp[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::Add(TensorRef x, TensorRef y, int64_t count) {
  MOERT_ASSIGN_OR_RETURN(float* xp, At<float>(x, count, "add", "x"));
  MOERT_ASSIGN_OR_RETURN(const float* yp, At<const float>(y, count, "add", "y"));
  for (int64_t i = 0; i < count; ++i) xp[i] += yp[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) {
  MOERT_ASSIGN_OR_RETURN(float* yp, At<float>(y, n * width, "add_bias", "y"));
  MOERT_ASSIGN_OR_RETURN(const float* bp, At<const float>(b, width, "add_bias", "b"));
  cpu::AddBias(bp, width, n, yp);
  return absl::OkStatus();
}

absl::Status CpuBackend::TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                              TensorRef experts, TensorRef weights) {
  if (n_expert < 1 || k < 1 || k > n_expert) {
    return absl::InvalidArgumentError(
        StrCat("CPU backend top_k: ", k, " of ", n_expert, " experts"));
  }
  MOERT_ASSIGN_OR_RETURN(const float* lp, At<const float>(logits, n * n_expert, "top_k", "logits"));
  MOERT_ASSIGN_OR_RETURN(int* ep, At<int>(experts, n * k, "top_k", "experts"));
  MOERT_ASSIGN_OR_RETURN(float* wp, At<float>(weights, n * k, "top_k", "weights"));
  for (int64_t t = 0; t < n; ++t) {
    RouteToken(lp + t * n_expert, n_expert, k, renormalize, ep + t * k, wp + t * k);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::FusedMoe(const Experts& w, TensorRef x, int64_t n, int k,
                                  TensorRef experts, TensorRef weights, TensorRef out) {
  MOERT_TRACE_SCOPE_ARG("expert batch", "tokens", n);
  // Each expert's views: from the stacked weights, or at its place in the region.
  std::vector<const CpuWeight*> stacked(3, nullptr);
  int n_expert = w.n_expert;
  WeightFormat format[3];
  int64_t rows[3], cols[3];
  if (w.placed()) {
    if (w.region->host() == nullptr) {
      return absl::InvalidArgumentError("CPU backend fused_moe: the expert region is not in host memory");
    }
    for (int p = 0; p < 3; ++p) {
      format[p] = w.parts[p].format;
      rows[p] = w.parts[p].rows;
      cols[p] = w.parts[p].cols;
    }
    if (static_cast<int>(w.offsets.size()) < n_expert) {
      return absl::InvalidArgumentError(StrCat("CPU backend fused_moe: ", w.offsets.size(),
                                               " expert offsets for ", n_expert, " experts"));
    }
  } else {
    const Weight* parts[3] = {w.gate, w.up, w.down};
    for (int p = 0; p < 3; ++p) {
      MOERT_ASSIGN_OR_RETURN(stacked[p], CpuWeightOf(parts[p], "fused_moe"));
      if (!stacked[p]->packed()) return Unsupported(Op::kFusedMoe, stacked[p]->type());
      rows[p] = stacked[p]->rows();
      cols[p] = stacked[p]->cols();
    }
    n_expert = static_cast<int>(stacked[0]->groups());
  }
  const int64_t n_embd = cols[0], n_ff = rows[0];
  if (n_expert < 1 || k < 1 || rows[1] != n_ff || cols[1] != n_embd || cols[2] != n_ff ||
      rows[2] != n_embd || n_embd % MOERT_QK != 0 || n_ff % MOERT_QK != 0 ||
      (weights.empty() && k != 1)) {
    return absl::InvalidArgumentError(StrCat("CPU backend fused_moe: experts of ", n_embd, " x ",
                                             n_ff, " (", n_expert, " experts, k ", k, ")"));
  }
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, n * n_embd, "fused_moe", "x"));
  MOERT_ASSIGN_OR_RETURN(const int* ep, Optional<const int>(experts, n * k, "fused_moe", "experts"));
  MOERT_ASSIGN_OR_RETURN(const float* wp,
                         Optional<const float>(weights, n * k, "fused_moe", "weights"));
  MOERT_ASSIGN_OR_RETURN(float* op, At<float>(out, n * n_embd, "fused_moe", "out"));
  if (ep != nullptr) {
    for (int64_t p = 0; p < n * k; ++p) {
      if (ep[p] < -1 || ep[p] >= n_expert || (p % k == 0 && ep[p] < 0)) {
        return absl::InvalidArgumentError(StrCat("CPU backend fused_moe: expert ", ep[p],
                                                 " at pair ", p, " (", n_expert, " experts)"));
      }
      if (w.placed() && ep[p] >= 0) {
        const uint64_t at = w.offsets[static_cast<size_t>(ep[p])];
        for (int part = 0; part < 3; ++part) {
          const uint64_t end = at + w.parts[part].block_offset +
                               PackedBytes(format[part], rows[part], cols[part]);
          if (end > w.region->size()) {
            return absl::OutOfRangeError(StrCat("CPU backend fused_moe: expert ", ep[p],
                                                " at offset ", at, " passes the region of ",
                                                w.region->size(), " bytes"));
          }
        }
      }
    }
  }
  const auto view = [&](int e) -> FfnView {
    if (!w.placed()) {
      return {stacked[0]->View(e).packed, stacked[1]->View(e).packed, stacked[2]->View(e).packed};
    }
    const uint8_t* block = w.region->host() + w.offsets[static_cast<size_t>(e)];
    FfnView v;
    PackedView* parts[3] = {&v.gate, &v.up, &v.down};
    for (int p = 0; p < 3; ++p) {
      *parts[p] = {format[p], rows[p], cols[p], block + w.parts[p].block_offset};
    }
    return v;
  };
  A8Matrix xq;
  xq.Quantize(pool_->kernels(), *pool_, xp, n, n_embd);
  FusedFfn(*pool_, pool_->kernels(), xq, k, ep, wp, view, n_embd, op);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n,
                                    int64_t width, TensorRef dst) {
  MOERT_ASSIGN_OR_RETURN(const float* sp,
                         At<const float>(src, src_rows * width, "gather_rows", "src"));
  MOERT_ASSIGN_OR_RETURN(const int* ip, At<const int>(idx, n, "gather_rows", "idx"));
  MOERT_ASSIGN_OR_RETURN(float* dp, At<float>(dst, n * width, "gather_rows", "dst"));
  for (int64_t r = 0; r < n; ++r) {
    if (ip[r] < 0 || ip[r] >= src_rows) {
      return absl::InvalidArgumentError(StrCat("CPU backend gather_rows: row ", ip[r], " of ",
                                               src_rows, " at ", r));
    }
  }
  for (int64_t r = 0; r < n; ++r) std::copy(sp + ip[r] * width, sp + (ip[r] + 1) * width, dp + r * width);
  return absl::OkStatus();
}

absl::Status CpuBackend::MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n,
                                    int k, int64_t width, TensorRef out) {
  MOERT_RETURN_IF_ERROR(Positive(k, "moe_combine", "k"));
  MOERT_ASSIGN_OR_RETURN(const float* yp, At<const float>(y, n * k * width, "moe_combine", "y"));
  MOERT_ASSIGN_OR_RETURN(const int* ep, At<const int>(experts, n * k, "moe_combine", "experts"));
  MOERT_ASSIGN_OR_RETURN(const float* wp, At<const float>(weights, n * k, "moe_combine", "weights"));
  MOERT_ASSIGN_OR_RETURN(float* op, At<float>(out, n * width, "moe_combine", "out"));
  CombineSlots(*pool_, yp, ep, wp, n, k, width, op);
  return absl::OkStatus();
}

absl::Status CpuBackend::StoreHalf(TensorRef x, int64_t count, TensorRef y) {
  MOERT_ASSIGN_OR_RETURN(const float* xp, At<const float>(x, count, "store_half", "x"));
  MOERT_ASSIGN_OR_RETURN(uint16_t* yp, At<uint16_t>(y, count, "store_half", "y"));
  for (int64_t i = 0; i < count; ++i) yp[i] = core::FloatToFp16(xp[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                                  int64_t width) {
  MOERT_ASSIGN_OR_RETURN(float* op, At<float>(out, n * width, "gated_add", "out"));
  MOERT_ASSIGN_OR_RETURN(const float* yp, At<const float>(y, n * width, "gated_add", "y"));
  MOERT_ASSIGN_OR_RETURN(const float* gp, At<const float>(gate, n, "gated_add", "gate"));
  for (int64_t t = 0; t < n; ++t) {
    const float g = Sigmoid(gp[t]);
    for (int64_t i = 0; i < width; ++i) op[t * width + i] += yp[t * width + i] * g;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                                 TensorRef dst) {
  const std::string_view name = OpName(Op::kStoreKv);
  MOERT_ASSIGN_OR_RETURN(const size_t row_bytes, RowBytes(type, width, name));
  if (n_rows < 0) {
    return absl::InvalidArgumentError(StrCat("CPU backend ", name, ": ", n_rows, " rows"));
  }
  MOERT_ASSIGN_OR_RETURN(const float* sp, At<const float>(src, n_rows * width, name, "src"));
  MOERT_ASSIGN_OR_RETURN(uint8_t* dp,
                         At<uint8_t>(dst, n_rows * static_cast<int64_t>(row_bytes), name, "dst"));
  // A decode step's row or two on this thread; a prefill's rows spread over the pool.
  constexpr int64_t kValuesPerTask = 16384;
  const int64_t rows_per_task = std::max<int64_t>(1, kValuesPerTask / width);
  const int64_t tasks = (n_rows + rows_per_task - 1) / rows_per_task;
  const auto encode = [&](size_t task) {
    const int64_t r0 = static_cast<int64_t>(task) * rows_per_task;
    const int64_t r1 = std::min(n_rows, r0 + rows_per_task);
    for (int64_t r = r0; r < r1; ++r) {
      EncodeKvRow(type, sp + r * width, width, dp + static_cast<size_t>(r) * row_bytes);
    }
  };
  if (tasks == 1) {
    encode(0);
  } else if (tasks > 1) {
    pool_->ParallelFor(static_cast<size_t>(tasks), encode);
  }
  return absl::OkStatus();
}

absl::StatusOr<MatrixView> CpuWeightView(const Weight& w, int64_t group) {
  const auto* cw = dynamic_cast<const CpuWeight*>(&w);
  if (cw == nullptr) return absl::FailedPreconditionError("not a CPU weight");
  return cw->View(group);
}

}  // namespace moert::backend::cpu
