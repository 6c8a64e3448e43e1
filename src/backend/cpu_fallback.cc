// A device backend whose missing ops run on the CPU (see cpu_fallback.h).
#include "backend/cpu_fallback.h"

#include <algorithm>
#include <utility>

#include "core/status.h"
#include "core/strings.h"

namespace moert::backend {
namespace {

// A weight on the device where it has kernels for it, and always the CPU's view.
class PlacedWeight final : public Weight {
 public:
  PlacedWeight(std::unique_ptr<Weight> on_device, std::unique_ptr<Weight> on_cpu)
      : Weight(on_device != nullptr ? on_device->type() : on_cpu->type(), on_cpu->groups(),
               on_cpu->rows(), on_cpu->cols()),
        device(std::move(on_device)),
        cpu(std::move(on_cpu)) {}
  uint64_t device_bytes() const override { return device != nullptr ? device->device_bytes() : 0; }

  std::unique_ptr<Weight> device;  // null: the device has no kernels for it
  std::unique_ptr<Weight> cpu;
};

const PlacedWeight* Placed(const Weight* w) { return dynamic_cast<const PlacedWeight*>(w); }

}  // namespace

// Host copies of one op's device arguments: inputs read from the device, outputs
// written back by Flush. The same device place staged twice (an op whose output is
// its input) is one host copy.
class CpuFallbackBackend::Staging {
 public:
  Staging(Backend& device, cpu::CpuBackend& cpu) : device_(device), cpu_(cpu) {}

  absl::StatusOr<TensorRef> In(TensorRef ref, size_t bytes) { return Stage(ref, bytes, true, false); }
  // An output; `read`: the op reads it too (in place).
  absl::StatusOr<TensorRef> Out(TensorRef ref, size_t bytes, bool read = false) {
    return Stage(ref, bytes, read, true);
  }
  // An attention op's inputs, replaced by their host copies: q (n queries) and the
  // first kv rows of the caches of the shape's types (v empty: none).
  absl::Status InAttention(const AttentionArgs& shape, int64_t n, int64_t kv, TensorRef& q,
                           TensorRef& k, TensorRef& v) {
    MOERT_ASSIGN_OR_RETURN(q, In(q, static_cast<size_t>(n * shape.n_head * shape.head_dim_k) * 4));
    MOERT_ASSIGN_OR_RETURN(k, InCache(k, shape.key_type(), kv, shape.n_head_kv, shape.head_dim_k));
    if (v.empty()) return absl::OkStatus();
    MOERT_ASSIGN_OR_RETURN(v,
                           InCache(v, shape.value_type(), kv, shape.n_head_kv, shape.head_dim_v));
    return absl::OkStatus();
  }
  absl::Status Flush() {
    for (Entry& e : entries_) {
      if (e.out) MOERT_RETURN_IF_ERROR(device_.Write(e.device, e.host->host(), e.bytes));
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    TensorRef device;
    size_t bytes = 0;
    std::unique_ptr<Buffer> host;
    bool out = false;
  };
  // `rows` KV cache rows of n_head_kv * head_dim values of `type`.
  absl::StatusOr<TensorRef> InCache(TensorRef ref, KvType type, int64_t rows, int n_head_kv,
                                    int head_dim) {
    MOERT_ASSIGN_OR_RETURN(const size_t row, KvRowBytes(type, int64_t{n_head_kv} * head_dim));
    return In(ref, static_cast<size_t>(std::max<int64_t>(rows, 0)) * row);
  }
  absl::StatusOr<TensorRef> Stage(TensorRef ref, size_t bytes, bool read, bool out) {
    if (ref.empty()) return TensorRef();
    for (Entry& e : entries_) {
      if (e.device.buffer == ref.buffer && e.device.offset == ref.offset && e.bytes == bytes) {
        e.out = e.out || out;
        return TensorRef(e.host);
      }
    }
    Entry e;
    e.device = ref;
    e.bytes = bytes;
    e.out = out;
    MOERT_ASSIGN_OR_RETURN(e.host, cpu_.Allocate(std::max<size_t>(bytes, 1)));
    if (read && bytes > 0) MOERT_RETURN_IF_ERROR(device_.Read(ref, e.host->host(), bytes));
    entries_.push_back(std::move(e));
    return TensorRef(entries_.back().host);
  }

  Backend& device_;
  cpu::CpuBackend& cpu_;
  std::vector<Entry> entries_;
};

CpuFallbackBackend::CpuFallbackBackend(std::unique_ptr<Backend> device, cpu::CpuBackend& cpu)
    : device_(std::move(device)), cpu_(cpu) {}

CpuFallbackBackend::~CpuFallbackBackend() = default;

bool CpuFallbackBackend::Supports(Op op, WeightType type) const {
  return device_->Supports(op, type);
}

absl::StatusOr<std::unique_ptr<Weight>> CpuFallbackBackend::UploadWeight(const Matrix& m,
                                                                         int64_t groups,
                                                                         std::string_view name) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Weight> on_cpu, cpu_.UploadWeight(m, groups, name));
  absl::StatusOr<std::unique_ptr<Weight>> on_device = device_->UploadWeight(m, groups, name);
  if (!on_device.ok()) {
    if (!absl::IsUnimplemented(on_device.status())) return on_device.status();
    on_device = std::unique_ptr<Weight>();  // the CPU multiplies it
  }
  return std::unique_ptr<Weight>(std::make_unique<PlacedWeight>(std::move(*on_device), std::move(on_cpu)));
}

absl::Status CpuFallbackBackend::MatMuls(std::span<const MatMulArgs> jobs) {
  std::vector<MatMulArgs> on_device, on_cpu;
  Staging s(*device_, cpu_);
  for (const MatMulArgs& job : jobs) {
    const PlacedWeight* w = Placed(job.w);
    if (w == nullptr) return absl::InvalidArgumentError("matmul: not a weight of this backend");
    if (w->device != nullptr && OnDevice(Op::kMatMul, w->device->type())) {
      on_device.push_back({w->device.get(), job.group, job.x, job.n, job.y});
      continue;
    }
    MatMulArgs c{w->cpu.get(), job.group, {}, job.n, {}};
    MOERT_ASSIGN_OR_RETURN(c.x, s.In(job.x, static_cast<size_t>(job.n * w->cols()) * 4));
    MOERT_ASSIGN_OR_RETURN(c.y, s.Out(job.y, static_cast<size_t>(job.n * w->rows()) * 4));
    on_cpu.push_back(c);
  }
  if (!on_device.empty()) MOERT_RETURN_IF_ERROR(device_->MatMuls(on_device));
  if (on_cpu.empty()) return absl::OkStatus();
  ++cpu_ops_;
  MOERT_RETURN_IF_ERROR(cpu_.MatMuls(on_cpu));
  return s.Flush();
}

absl::Status CpuFallbackBackend::RmsNorm(TensorRef x, int64_t n_rows, int64_t width,
                                         TensorRef weight, float eps, TensorRef y) {
  if (OnDevice(Op::kRmsNorm)) return device_->RmsNorm(x, n_rows, width, weight, eps, y);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, s.In(weight, static_cast<size_t>(width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, bytes));
  MOERT_RETURN_IF_ERROR(cpu_.RmsNorm(hx, n_rows, width, hw, eps, hy));
  return s.Flush();
}

absl::Status CpuFallbackBackend::LayerNorm(TensorRef x, int64_t n_rows, int64_t width,
                                           TensorRef weight, TensorRef bias, float eps,
                                           TensorRef y) {
  if (OnDevice(Op::kLayerNorm)) return device_->LayerNorm(x, n_rows, width, weight, bias, eps, y);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, s.In(weight, static_cast<size_t>(width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hb, s.In(bias, static_cast<size_t>(width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, bytes));
  MOERT_RETURN_IF_ERROR(cpu_.LayerNorm(hx, n_rows, width, hw, hb, eps, hy));
  return s.Flush();
}

absl::Status CpuFallbackBackend::Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads,
                                      int head_dim, TensorRef x) {
  if (OnDevice(Op::kRope)) return device_->Rope(rope, pos0, n, n_heads, head_dim, x);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  RopeArgs host = rope;
  MOERT_ASSIGN_OR_RETURN(host.freq_factors,
                         s.In(rope.freq_factors, static_cast<size_t>(rope.n_rot / 2) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hx,
                         s.Out(x, static_cast<size_t>(n * n_heads * int64_t{head_dim}) * 4, true));
  MOERT_RETURN_IF_ERROR(cpu_.Rope(host, pos0, n, n_heads, head_dim, hx));
  return s.Flush();
}

absl::Status CpuFallbackBackend::Attention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                           int64_t pos0, TensorRef k_cache, TensorRef v_cache,
                                           TensorRef out) {
  if (OnDevice(Op::kAttention, shape)) {
    return device_->Attention(shape, q, n, pos0, k_cache, v_cache, out);
  }
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  TensorRef hq = q, hk = k_cache, hv = v_cache;
  MOERT_RETURN_IF_ERROR(s.InAttention(shape, n, pos0 + n, hq, hk, hv));
  MOERT_ASSIGN_OR_RETURN(TensorRef ho,
                         s.Out(out, static_cast<size_t>(n * shape.n_head * shape.head_dim_v) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.Attention(shape, hq, n, pos0, hk, hv, ho));
  return s.Flush();
}

absl::Status CpuFallbackBackend::FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n,
                                               TensorRef k, TensorRef v, int64_t n_kv,
                                               TensorRef out) {
  if (OnDevice(Op::kFullAttention, shape)) {
    return device_->FullAttention(shape, q, n, k, v, n_kv, out);
  }
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  TensorRef hq = q, hk = k, hv = v;
  MOERT_RETURN_IF_ERROR(s.InAttention(shape, n, n_kv, hq, hk, hv));
  MOERT_ASSIGN_OR_RETURN(TensorRef ho,
                         s.Out(out, static_cast<size_t>(n * shape.n_head * shape.head_dim_v) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.FullAttention(shape, hq, n, hk, hv, n_kv, ho));
  return s.Flush();
}

absl::Status CpuFallbackBackend::AttentionEntropy(const AttentionArgs& shape, TensorRef q,
                                                  int64_t n, TensorRef k, int64_t n_kv,
                                                  TensorRef entropy) {
  if (OnDevice(Op::kAttentionEntropy, shape)) {
    return device_->AttentionEntropy(shape, q, n, k, n_kv, entropy);
  }
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  TensorRef hq = q, hk = k, none;
  MOERT_RETURN_IF_ERROR(s.InAttention(shape, n, n_kv, hq, hk, none));
  MOERT_ASSIGN_OR_RETURN(TensorRef he, s.Out(entropy, static_cast<size_t>(n * shape.n_head) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.AttentionEntropy(shape, hq, n, hk, n_kv, he));
  return s.Flush();
}

absl::Status CpuFallbackBackend::Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) {
  if (OnDevice(Op::kSoftmax)) return device_->Softmax(x, n_rows, width, y);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, bytes));
  MOERT_RETURN_IF_ERROR(cpu_.Softmax(hx, n_rows, width, hy));
  return s.Flush();
}

absl::Status CpuFallbackBackend::SiluMul(TensorRef g, TensorRef u, int64_t count) {
  if (OnDevice(Op::kSiluMul)) return device_->SiluMul(g, u, count);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hg, s.Out(g, static_cast<size_t>(count) * 4, true));
  MOERT_ASSIGN_OR_RETURN(TensorRef hu, s.In(u, static_cast<size_t>(count) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.SiluMul(hg, hu, count));
  return s.Flush();
}

absl::Status CpuFallbackBackend::Gelu(TensorRef x, int64_t count, TensorRef y) {
  if (OnDevice(Op::kGelu)) return device_->Gelu(x, count, y);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, static_cast<size_t>(count) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, static_cast<size_t>(count) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.Gelu(hx, count, hy));
  return s.Flush();
}

absl::Status CpuFallbackBackend::Add(TensorRef x, TensorRef y, int64_t count) {
  if (OnDevice(Op::kAdd)) return device_->Add(x, y, count);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.Out(x, static_cast<size_t>(count) * 4, true));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.In(y, static_cast<size_t>(count) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.Add(hx, hy, count));
  return s.Flush();
}

absl::Status CpuFallbackBackend::AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) {
  if (OnDevice(Op::kAddBias)) return device_->AddBias(y, b, n, width);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, static_cast<size_t>(n * width) * 4, true));
  MOERT_ASSIGN_OR_RETURN(TensorRef hb, s.In(b, static_cast<size_t>(width) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.AddBias(hy, hb, n, width));
  return s.Flush();
}

absl::Status CpuFallbackBackend::TopK(TensorRef logits, int64_t n, int n_expert, int k,
                                      bool renormalize, TensorRef experts, TensorRef weights) {
  if (OnDevice(Op::kTopK)) return device_->TopK(logits, n, n_expert, k, renormalize, experts, weights);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hl, s.In(logits, static_cast<size_t>(n * n_expert) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef he, s.Out(experts, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, s.Out(weights, static_cast<size_t>(n * k) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.TopK(hl, n, n_expert, k, renormalize, he, hw));
  return s.Flush();
}

absl::Status CpuFallbackBackend::FusedMoe(const Experts& w, TensorRef x, int64_t n, int k,
                                          TensorRef experts, TensorRef weights, TensorRef out) {
  Experts on_device = w, on_cpu = w;
  bool device_ok = true;
  int64_t n_embd = 0;
  std::unique_ptr<Buffer> region;
  if (w.placed()) {
    for (const ExpertPart& p : w.parts) {
      device_ok = device_ok && OnDevice(Op::kFusedMoe, WeightTypeOf(p.format));
    }
    n_embd = w.parts[0].cols;
    if (!device_ok) {
      if (w.region->host() == nullptr) {
        return absl::UnimplementedError(StrCat("the ", name(), " backend has no fused_moe for these "
                                               "experts, and the CPU cannot read their region"));
      }
      MOERT_ASSIGN_OR_RETURN(region, cpu_.WrapHost(w.region->host(), w.region->size()));
      on_cpu.region = region.get();
    }
  } else {
    const PlacedWeight* parts[3] = {Placed(w.gate), Placed(w.up), Placed(w.down)};
    for (const PlacedWeight* p : parts) {
      if (p == nullptr) return absl::InvalidArgumentError("fused_moe: not a weight of this backend");
      device_ok = device_ok && p->device != nullptr && OnDevice(Op::kFusedMoe, p->device->type());
    }
    if (device_ok) {
      on_device.gate = parts[0]->device.get();
      on_device.up = parts[1]->device.get();
      on_device.down = parts[2]->device.get();
    }
    on_cpu.gate = parts[0]->cpu.get();
    on_cpu.up = parts[1]->cpu.get();
    on_cpu.down = parts[2]->cpu.get();
    n_embd = parts[0]->cols();
  }
  if (device_ok) return device_->FusedMoe(on_device, x, n, k, experts, weights, out);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  const size_t bytes = static_cast<size_t>(n * n_embd) * 4;
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef he, s.In(experts, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, s.In(weights, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef ho, s.Out(out, bytes));
  MOERT_RETURN_IF_ERROR(cpu_.FusedMoe(on_cpu, hx, n, k, he, hw, ho));
  return s.Flush();
}

absl::Status CpuFallbackBackend::GatherRows(TensorRef src, int64_t src_rows, TensorRef idx,
                                            int64_t n, int64_t width, TensorRef dst) {
  if (OnDevice(Op::kGatherRows)) return device_->GatherRows(src, src_rows, idx, n, width, dst);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hs, s.In(src, static_cast<size_t>(src_rows * width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hi, s.In(idx, static_cast<size_t>(n) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hd, s.Out(dst, static_cast<size_t>(n * width) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.GatherRows(hs, src_rows, hi, n, width, hd));
  return s.Flush();
}

absl::Status CpuFallbackBackend::MoeCombine(TensorRef y, TensorRef experts, TensorRef weights,
                                            int64_t n, int k, int64_t width, TensorRef out) {
  if (OnDevice(Op::kMoeCombine)) return device_->MoeCombine(y, experts, weights, n, k, width, out);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.In(y, static_cast<size_t>(n * k * width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef he, s.In(experts, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, s.In(weights, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef ho, s.Out(out, static_cast<size_t>(n * width) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.MoeCombine(hy, he, hw, n, k, width, ho));
  return s.Flush();
}

absl::Status CpuFallbackBackend::StoreHalf(TensorRef x, int64_t count, TensorRef y) {
  if (OnDevice(Op::kStoreHalf)) return device_->StoreHalf(x, count, y);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, s.In(x, static_cast<size_t>(count) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.Out(y, static_cast<size_t>(count) * 2));
  MOERT_RETURN_IF_ERROR(cpu_.StoreHalf(hx, count, hy));
  return s.Flush();
}

absl::Status CpuFallbackBackend::GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                                          int64_t width) {
  if (OnDevice(Op::kGatedAdd)) return device_->GatedAdd(out, y, gate, n, width);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(TensorRef ho, s.Out(out, static_cast<size_t>(n * width) * 4, true));
  MOERT_ASSIGN_OR_RETURN(TensorRef hy, s.In(y, static_cast<size_t>(n * width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hg, s.In(gate, static_cast<size_t>(n) * 4));
  MOERT_RETURN_IF_ERROR(cpu_.GatedAdd(ho, hy, hg, n, width));
  return s.Flush();
}

absl::Status CpuFallbackBackend::StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                                         TensorRef dst) {
  if (OnDevice(Op::kStoreKv)) return device_->StoreKv(type, src, n_rows, width, dst);
  ++cpu_ops_;
  Staging s(*device_, cpu_);
  MOERT_ASSIGN_OR_RETURN(const size_t row_bytes, KvRowBytes(type, width));
  const size_t rows = static_cast<size_t>(std::max<int64_t>(n_rows, 0));
  MOERT_ASSIGN_OR_RETURN(TensorRef hs, s.In(src, rows * static_cast<size_t>(width) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hd, s.Out(dst, rows * row_bytes));
  MOERT_RETURN_IF_ERROR(cpu_.StoreKv(type, hs, n_rows, width, hd));
  return s.Flush();
}

}  // namespace moert::backend
