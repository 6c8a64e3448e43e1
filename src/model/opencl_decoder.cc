// DecoderModel's forward pass on an OpenCL device (see opencl_decoder.h). Built only
// with the OpenCL backend (src/backend/sources.cmake lists it with the backend).
#include "model/opencl_decoder.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <optional>
#include <cmath>
#include <random>
#include <string_view>
#include <utility>

#include "backend/opencl/buffer.h"
#include "backend/opencl/device.h"
#include "backend/opencl/ops.h"
#include "core/fp16.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/expert_cache.h"
#include "kernels/ukernel.h"

namespace moert::model {
namespace {

namespace cl = backend::opencl;
using backend::WeightFormat;
using cl::Buffer;
using cl::BufferRef;

constexpr size_t kA8Bytes = sizeof(moert_a8_block);

// Blocking copies to / from a place in a buffer (the scratch buffers are BufferRefs).
absl::Status WriteRef(cl::Device& device, BufferRef ref, const void* data, size_t bytes) {
  return cl::ClStatus(clEnqueueWriteBuffer(device.queue(), ref.mem, CL_TRUE, ref.offset, bytes,
                                           data, 0, nullptr, nullptr),
                      "clEnqueueWriteBuffer");
}
absl::Status ReadRef(cl::Device& device, BufferRef ref, void* data, size_t bytes) {
  return cl::ClStatus(clEnqueueReadBuffer(device.queue(), ref.mem, CL_TRUE, ref.offset, bytes,
                                          data, 0, nullptr, nullptr),
                      "clEnqueueReadBuffer");
}

BufferRef At(BufferRef ref, size_t byte_offset) {
  ref.offset += byte_offset;
  return ref;
}

// A weight on the device: float rows (fp32, or half when every value is a half: an
// F16 tensor keeps its size), or packed tiles (W4/W8) for the integer kernels.
// `groups` matrices of `rows` x `cols` each (stacked experts: one per expert).
struct DevMatrix {
  Buffer buffer;
  bool packed = false;
  bool half = false;  // float rows stored as IEEE half
  cl::MatrixRef ref;  // packed
  int64_t groups = 1;
  int64_t rows = 0;  // per group
  int64_t cols = 0;

  // Group g's float rows.
  BufferRef FloatGroup(int64_t g) const {
    return BufferRef(buffer, static_cast<size_t>(g * rows * cols) * (half ? 2 : 4));
  }
};

// `data` as halves when every value is one exactly (nullopt otherwise): the fp32 copy
// of an F16 tensor.
std::optional<std::vector<uint16_t>> ExactHalves(const std::vector<float>& data) {
  std::vector<uint16_t> out(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    out[i] = core::FloatToFp16(data[i]);
    if (std::bit_cast<uint32_t>(core::Fp16ToFloat(out[i])) != std::bit_cast<uint32_t>(data[i])) {
      return std::nullopt;
    }
  }
  return out;
}

absl::StatusOr<DevMatrix> Upload(cl::Device& device, const Matrix& m, int64_t groups,
                                 std::string_view name) {
  DevMatrix out;
  out.groups = groups;
  out.cols = m.cols;
  if (!m.packed.empty()) {
    if (m.packed.format() != WeightFormat::kW4 && m.packed.format() != WeightFormat::kW8) {
      return absl::UnimplementedError(
          StrCat("OpenCL backend: ", name, " is packed as ",
                 backend::WeightFormatName(m.packed.format()),
                 ", which has no OpenCL kernels yet (W4 and W8 only)"));
    }
    MOERT_ASSIGN_OR_RETURN(cl::DeviceMatrix dm, cl::DeviceMatrix::Upload(device, m.packed));
    out.buffer = std::move(dm.buffer);
    out.ref = dm.ref;
    out.ref.data = BufferRef(out.buffer);
    out.packed = true;
    out.groups = m.packed.groups();
    out.rows = m.packed.rows();
    return out;
  }
  if (m.data.empty() || groups <= 0 || m.rows % groups != 0) {
    return absl::InvalidArgumentError(StrCat("OpenCL backend: ", name, " has no weights"));
  }
  out.rows = m.rows / groups;
  if (const std::optional<std::vector<uint16_t>> halves = ExactHalves(m.data)) {
    out.half = true;
    MOERT_ASSIGN_OR_RETURN(out.buffer,
                           Buffer::FromHost(device, halves->data(), halves->size() * 2));
    return out;
  }
  MOERT_ASSIGN_OR_RETURN(out.buffer,
                         Buffer::FromHost(device, m.data.data(), m.data.size() * sizeof(float)));
  return out;
}

// An optional vector: an empty Buffer when `v` is empty.
absl::StatusOr<Buffer> UploadVector(cl::Device& device, const std::vector<float>& v) {
  if (v.empty()) return Buffer();
  return Buffer::FromHost(device, v.data(), v.size() * sizeof(float));
}

struct DevLayer {
  Buffer attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  DevMatrix wq, wk, wv, wo;
  DevMatrix router;          // MoE
  DevMatrix gate, up, down;  // the experts (stacked) or the dense FFN
};

// Scratch buffers of the forward pass, each grown on demand.
enum Slot {
  kX, kCur, kOut, kQ, kAttn, kXq, kRouterLogits, kExperts, kWeights, kXs, kGate, kUp, kDown,
  kPairOut, kIdxToken, kIdxPair, kLogits, kNewK, kNewV, kSlotCount
};

class OpenClDecoderImpl final : public OpenClDecoder {
 public:
  OpenClDecoderImpl(const DecoderView& view, std::unique_ptr<cl::Device> device, bool kv_half)
      : view_(view), spec_(*view.spec), device_(std::move(device)), kv_half_(kv_half) {}

  const std::string& device_name() const override { return device_->info().name; }
  const std::string& driver_version() const override { return device_->info().driver_version; }
  std::string device_type() const override { return std::string(device_->info().TypeName()); }

  absl::Status SelfTest();
  absl::Status UploadWeights();
  // With an expert pool: the device's view of its expert region and the per-layer
  // matrices over it (SetUpPooledExperts), or the reason the experts run on the host.
  void SetUpPooledExperts();
  absl::Status ForwardBatch(std::span<const int32_t> tokens, int64_t pos0, const HostKv& kv,
                            int64_t first_logit_row, float* logits) override;
  void Invalidate(uint64_t kv_id, int64_t from) override {
    if (kv_id == kv_id_) kv_valid_ = std::min(kv_valid_, from);
  }
  void InjectFailureForTesting(const DeviceFailureForTesting& failure) override {
    failure_ = failure;
  }
  DevicePoolStats pooled_stats() const override { return pooled_stats_; }
  uint64_t weight_bytes() const override { return weight_bytes_; }
  uint64_t kv_bytes() const override { return k_cache_.size() + v_cache_.size(); }
  void SpoilZeroCopyCheckForTesting() override { spoil_zero_copy_check_ = true; }

 private:
  absl::StatusOr<BufferRef> Get(Slot slot, size_t bytes) {
    Buffer& b = scratch_[slot];
    if (b.size() < bytes) {
      b = Buffer();
      MOERT_ASSIGN_OR_RETURN(b, Buffer::Create(*device_, std::max<size_t>(bytes, 256)));
    }
    return BufferRef(b);
  }
  // y = w (group g) x for n rows of x.
  absl::Status Project(const DevMatrix& w, int64_t g, BufferRef x, int64_t n, BufferRef y);
  absl::Status SyncKv(const HostKv& kv, int64_t pos0);
  // `values` cache values at value index `at` from / to host floats (rounded to half,
  // or widened from it, for a half cache).
  absl::Status UploadKvRows(Buffer& cache, const float* host, size_t values, size_t at);
  absl::Status DownloadKvRows(const Buffer& cache, size_t at, size_t values, float* host);
  size_t KvElemBytes() const { return kv_half_ ? 2 : 4; }
  absl::Status RunLayer(int il, int64_t n, int64_t pos0, BufferRef x);
  absl::Status RunAttention(int il, int64_t n, int64_t pos0, BufferRef cur, BufferRef out);
  absl::Status RunMoe(int il, int64_t n, BufferRef cur, BufferRef out);
  // A MoE block with an expert pool: routing on the host, experts on the device (or
  // the host: see DecoderView::expert_cache).
  absl::Status RunPooledMoe(int il, int64_t n, BufferRef cur, BufferRef out);
  // Makes the pinned expert's current bytes visible to the device; its block offset.
  absl::StatusOr<uint64_t> PublishExpert(int il, int expert);
  // Zero-copy: checks once that the device reads the bytes the host published at
  // `offset`; if not, switches the region to a device copy (republishing everything).
  absl::Status CheckZeroCopy(uint64_t offset, uint64_t bytes);
  absl::Status RunDenseFfn(const DevLayer& l, int64_t n, BufferRef cur, BufferRef out);
  // The f32 expert path: gate/up/silu*mul/down per chosen expert.
  absl::Status RunF32Experts(const DevLayer& l, int64_t n, int k, BufferRef cur,
                             BufferRef experts, BufferRef weights, BufferRef out);

  // Whether this ForwardBatch call is one an injected failure fails (counts the call).
  bool TakeInjectedFailure();

  int64_t KeyWidth() const { return int64_t{spec_.n_head_kv} * spec_.head_dim_k; }
  int64_t ValueWidth() const { return int64_t{spec_.n_head_kv} * spec_.head_dim_v; }

  DecoderView view_;
  const format::ModelSpec& spec_;
  std::unique_ptr<cl::Device> device_;
  cl::Scratch op_scratch_;
  std::array<Buffer, kSlotCount> scratch_;
  std::vector<DevLayer> layers_;
  Buffer output_norm_, rope_freqs_;
  DevMatrix lm_head_;
  // The device KV cache: layer l's keys at [l][kv_capacity_][KeyWidth()], mirroring
  // host cache kv_id_ at positions [0, kv_valid_).
  Buffer k_cache_, v_cache_;
  bool kv_half_ = false;  // OpenClDecoderOptions::kv_half
  uint64_t weight_bytes_ = 0;
  uint64_t kv_id_ = 0;
  int kv_capacity_ = 0;
  int64_t kv_valid_ = 0;
  // The expert pool's region as the device sees it: over the host's memory
  // (WrapHost, zero-copy) or a device copy; per layer, the experts' parts as matrices
  // of that buffer (data.offset: the part's place in a block; empty: the layer runs
  // on the host), and per (layer, expert) the block generation the device has.
  Buffer region_;
  bool region_copy_ = false;
  bool zero_copy_checked_ = false;
  bool spoil_zero_copy_check_ = false;  // tests: the check sees stale bytes
  std::vector<cl::FfnRef> pooled_parts_;
  std::vector<uint64_t> published_;
  DevicePoolStats pooled_stats_;
  // Tests: the injected failure (times == 0: none) and whether the running call fails.
  DeviceFailureForTesting failure_{.after_calls = 0, .layer = 0, .cl_error = 0, .times = 0};
  bool fail_this_call_ = false;
};

bool OpenClDecoderImpl::TakeInjectedFailure() {
  if (failure_.times == 0) return false;
  if (failure_.after_calls > 0) {
    --failure_.after_calls;
    return false;
  }
  if (failure_.times > 0) --failure_.times;
  return true;
}

absl::Status OpenClDecoderImpl::SelfTest() {
  // An fp32 GEMV with a K tail against model::Dot: the kernel compiles, runs and sums
  // in the CPU's order on this device.
  constexpr int64_t kRows = 24, kCols = 44;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(kRows * kCols)), x(static_cast<size_t>(kCols));
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  MOERT_ASSIGN_OR_RETURN(Buffer dw, Buffer::FromHost(*device_, w.data(), w.size() * 4));
  MOERT_ASSIGN_OR_RETURN(Buffer dx, Buffer::FromHost(*device_, x.data(), x.size() * 4));
  MOERT_ASSIGN_OR_RETURN(Buffer dy, Buffer::Create(*device_, kRows * 4));
  MOERT_RETURN_IF_ERROR(cl::F32MatMul(*device_, dw, kRows, kCols, dx, 1, dy));
  std::vector<float> y(kRows);
  MOERT_RETURN_IF_ERROR(dy.Read(*device_, y.data(), y.size() * 4));
  for (int64_t r = 0; r < kRows; ++r) {
    const float want = Dot(w.data() + r * kCols, x.data(), kCols);
    if (!(std::fabs(y[static_cast<size_t>(r)] - want) <= 1e-5f * (1.0f + std::fabs(want)))) {
      return absl::FailedPreconditionError(
          StrCat("OpenCL self-test failed on ", device_->info().name, ": GEMV row ", r, " is ",
                 y[static_cast<size_t>(r)], ", the CPU's ", want));
    }
  }
  return absl::OkStatus();
}

absl::Status OpenClDecoderImpl::UploadWeights() {
  if (view_.shared_expert) {
    return absl::UnimplementedError(
        "OpenCL backend: models with a shared expert (qwen2moe) run on the CPU only for now");
  }
  cl::Device& d = *device_;
  MOERT_ASSIGN_OR_RETURN(output_norm_, UploadVector(d, *view_.output_norm));
  MOERT_ASSIGN_OR_RETURN(rope_freqs_, UploadVector(d, *view_.rope_freqs));
  const bool tied = view_.output->empty();
  MOERT_ASSIGN_OR_RETURN(lm_head_, Upload(d, tied ? *view_.token_embd : *view_.output, 1,
                                          tied ? "token_embd.weight" : "output.weight"));
  const int64_t n_expert = spec_.n_expert;
  layers_.resize(view_.layers->size());
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerWeights& w = (*view_.layers)[il];
    DevLayer& l = layers_[il];
    const std::string blk = StrCat("blk.", il, ".");
    MOERT_ASSIGN_OR_RETURN(l.attn_norm, UploadVector(d, w.attn_norm));
    MOERT_ASSIGN_OR_RETURN(l.ffn_norm, UploadVector(d, w.ffn_norm));
    MOERT_ASSIGN_OR_RETURN(l.bq, UploadVector(d, w.attn.bq));
    MOERT_ASSIGN_OR_RETURN(l.bk, UploadVector(d, w.attn.bk));
    MOERT_ASSIGN_OR_RETURN(l.bv, UploadVector(d, w.attn.bv));
    MOERT_ASSIGN_OR_RETURN(l.q_norm, UploadVector(d, w.attn.q_norm));
    MOERT_ASSIGN_OR_RETURN(l.k_norm, UploadVector(d, w.attn.k_norm));
    MOERT_ASSIGN_OR_RETURN(l.wq, Upload(d, w.attn.wq, 1, blk + "attn_q.weight"));
    MOERT_ASSIGN_OR_RETURN(l.wk, Upload(d, w.attn.wk, 1, blk + "attn_k.weight"));
    MOERT_ASSIGN_OR_RETURN(l.wv, Upload(d, w.attn.wv, 1, blk + "attn_v.weight"));
    MOERT_ASSIGN_OR_RETURN(l.wo, Upload(d, w.attn.wo, 1, blk + "attn_output.weight"));
    if (spec_.is_moe() && view_.expert_cache != nullptr) {
      continue;  // the routed experts are in the expert pool (SetUpPooledExperts)
    }
    if (spec_.is_moe()) {
      MOERT_ASSIGN_OR_RETURN(l.router, Upload(d, w.moe.router, 1, blk + "ffn_gate_inp.weight"));
      MOERT_ASSIGN_OR_RETURN(l.gate, Upload(d, w.moe.gate_exps, n_expert, blk + "ffn_gate_exps"));
      MOERT_ASSIGN_OR_RETURN(l.up, Upload(d, w.moe.up_exps, n_expert, blk + "ffn_up_exps"));
      MOERT_ASSIGN_OR_RETURN(l.down, Upload(d, w.moe.down_exps, n_expert, blk + "ffn_down_exps"));
    } else {
      MOERT_ASSIGN_OR_RETURN(l.gate, Upload(d, w.ffn.gate, 1, blk + "ffn_gate.weight"));
      MOERT_ASSIGN_OR_RETURN(l.up, Upload(d, w.ffn.up, 1, blk + "ffn_up.weight"));
      MOERT_ASSIGN_OR_RETURN(l.down, Upload(d, w.ffn.down, 1, blk + "ffn_down.weight"));
    }
    if (l.gate.packed != l.up.packed || l.gate.packed != l.down.packed) {
      return absl::UnimplementedError(StrCat("OpenCL backend: layer ", il,
                                             "'s FFN mixes packed and fp32 weights"));
    }
  }
  if (view_.expert_cache != nullptr) SetUpPooledExperts();
  // What the weights take on the device (the expert pool's region not counted).
  const auto add = [&](const Buffer& b) { weight_bytes_ += b.size(); };
  for (const Buffer* b : {&output_norm_, &rope_freqs_, &lm_head_.buffer}) add(*b);
  for (const DevLayer& l : layers_) {
    for (const Buffer* b : {&l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                            &l.wq.buffer, &l.wk.buffer, &l.wv.buffer, &l.wo.buffer,
                            &l.router.buffer, &l.gate.buffer, &l.up.buffer, &l.down.buffer}) {
      add(*b);
    }
  }
  return device_->Finish();
}

void OpenClDecoderImpl::SetUpPooledExperts() {
  const experts::ExpertCache& cache = *view_.expert_cache;
  const experts::ExpertDirectory& dir = cache.directory();
  const auto host = [&](std::string why) {
    pooled_stats_.placement = StrCat("host: ", why);
    pooled_parts_.clear();
  };
  if (view_.pooled_experts == PooledExperts::kHost) return host("PooledExperts::kHost");
  // Per layer: every expert's parts in formats the kernels run (W4, W8) and at the
  // same places in their blocks, so one matrix per part and an offset per expert
  // address them all.
  pooled_parts_.assign(view_.layers->size(), cl::FfnRef{});
  int device_layers = 0;
  std::string why_not;
  for (int il = 0; il < static_cast<int>(pooled_parts_.size()); ++il) {
    if (!dir.has_layer(il)) continue;  // a dense layer
    const experts::ExpertInfo& first = dir.info(il, 0);
    bool ok = true;
    for (const experts::ExpertPart& p : first.parts) {
      if (ok && p.format != WeightFormat::kW4 && p.format != WeightFormat::kW8) {
        ok = false;
        why_not = StrCat("layer ", il, "'s experts are packed as ",
                         backend::WeightFormatName(p.format), " (no OpenCL kernels)");
      }
    }
    for (int e = 1; ok && e < dir.n_expert(); ++e) {
      for (size_t part = 0; part < first.parts.size(); ++part) {
        const experts::ExpertPart& a = first.parts[part];
        const experts::ExpertPart& b = dir.info(il, e).parts[part];
        if (a.format != b.format || a.rows != b.rows || a.cols != b.cols ||
            a.block_offset != b.block_offset) {
          ok = false;
          why_not = StrCat("layer ", il, "'s experts differ in layout");
        }
      }
    }
    if (!ok) continue;
    const auto matrix = [&](experts::ExpertPartKind kind) {
      // data: the part's place in a block, in region_ once it exists.
      const experts::ExpertPart& p = first.parts[static_cast<size_t>(kind)];
      BufferRef at;
      at.offset = static_cast<size_t>(p.block_offset);
      return cl::MatrixRef{at, p.format, dir.n_expert(), p.rows, p.cols,
                           backend::PackedBytes(p.format, p.rows, p.cols)};
    };
    pooled_parts_[static_cast<size_t>(il)] = {matrix(experts::ExpertPartKind::kGate),
                                              matrix(experts::ExpertPartKind::kUp),
                                              matrix(experts::ExpertPartKind::kDown), {}};
    ++device_layers;
  }
  if (device_layers == 0) return host(why_not.empty() ? "no pooled layer" : why_not);
  // The region: zero-copy where the device reads host memory, else a device copy.
  region_copy_ =
      view_.pooled_experts == PooledExperts::kDeviceCopy || !device_->info().unified_memory;
  absl::StatusOr<Buffer> region =
      region_copy_
          ? Buffer::Create(*device_, cache.expert_region_bytes())
          : Buffer::WrapHost(*device_, cache.expert_region(), cache.expert_region_bytes());
  if (!region.ok()) return host(std::string(region.status().message()));
  region_ = std::move(*region);
  for (cl::FfnRef& f : pooled_parts_) {
    for (cl::MatrixRef* m : {&f.gate, &f.up, &f.down}) {
      if (m->rows > 0) m->data.mem = region_.get();
    }
  }
  published_.assign(pooled_parts_.size() * static_cast<size_t>(dir.n_expert()), 0);
  pooled_stats_.placement = region_copy_ ? "device (copied per load)" : "device (zero-copy)";
  if (!why_not.empty()) StrAppend(&pooled_stats_.placement, "; host for ", why_not);
}

absl::Status OpenClDecoderImpl::Project(const DevMatrix& w, int64_t g, BufferRef x, int64_t n,
                                        BufferRef y) {
  if (!w.packed) return cl::F32MatMul(*device_, w.FloatGroup(g), w.rows, w.cols, x, n, y, w.half);
  MOERT_ASSIGN_OR_RETURN(
      BufferRef xq, Get(kXq, static_cast<size_t>(n * (w.cols / MOERT_QK)) * kA8Bytes));
  MOERT_RETURN_IF_ERROR(cl::Q8Quant(*device_, x, n, w.cols, xq));
  return cl::QMatMul(*device_, w.ref, g, xq, n, y);
}

absl::Status OpenClDecoderImpl::SyncKv(const HostKv& kv, int64_t pos0) {
  const size_t elem = KvElemBytes();
  const size_t kw = static_cast<size_t>(KeyWidth()), vw = static_cast<size_t>(ValueWidth());
  if (kv.id != kv_id_ || kv.capacity != kv_capacity_ || k_cache_.empty()) {
    kv_id_ = 0;
    kv_valid_ = 0;
    if (kv.capacity != kv_capacity_ || k_cache_.empty()) {
      k_cache_ = Buffer();
      v_cache_ = Buffer();
      const size_t rows = static_cast<size_t>(kv.capacity) * spec_.n_layer;
      MOERT_ASSIGN_OR_RETURN(k_cache_, Buffer::Create(*device_, rows * kw * elem));
      MOERT_ASSIGN_OR_RETURN(v_cache_, Buffer::Create(*device_, rows * vw * elem));
      kv_capacity_ = kv.capacity;
    }
    kv_id_ = kv.id;
  }
  if (kv_valid_ < pos0) {
    const size_t from = static_cast<size_t>(kv_valid_), count = static_cast<size_t>(pos0) - from;
    for (size_t il = 0; il < spec_.n_layer; ++il) {
      const size_t row0 = il * static_cast<size_t>(kv_capacity_) + from;
      MOERT_RETURN_IF_ERROR(UploadKvRows(k_cache_, kv.keys[il] + from * kw, count * kw, row0 * kw));
      MOERT_RETURN_IF_ERROR(UploadKvRows(v_cache_, kv.values[il] + from * vw, count * vw, row0 * vw));
    }
    kv_valid_ = pos0;
  }
  return absl::OkStatus();
}

absl::Status OpenClDecoderImpl::UploadKvRows(Buffer& cache, const float* host, size_t values,
                                             size_t at) {
  if (!kv_half_) return cache.Write(*device_, host, values * 4, at * 4);
  std::vector<uint16_t> halves(values);
  for (size_t i = 0; i < values; ++i) halves[i] = core::FloatToFp16(host[i]);
  return cache.Write(*device_, halves.data(), values * 2, at * 2);
}

absl::Status OpenClDecoderImpl::DownloadKvRows(const Buffer& cache, size_t at, size_t values,
                                               float* host) {
  if (!kv_half_) return cache.Read(*device_, host, values * 4, at * 4);
  std::vector<uint16_t> halves(values);
  MOERT_RETURN_IF_ERROR(cache.Read(*device_, halves.data(), values * 2, at * 2));
  for (size_t i = 0; i < values; ++i) host[i] = core::Fp16ToFloat(halves[i]);
  return absl::OkStatus();
}

absl::Status OpenClDecoderImpl::RunAttention(int il, int64_t n, int64_t pos0, BufferRef cur,
                                             BufferRef out) {
  const DevLayer& l = layers_[static_cast<size_t>(il)];
  const int n_head = static_cast<int>(spec_.n_head);
  const int n_head_kv = static_cast<int>(spec_.n_head_kv);
  const int dk = static_cast<int>(spec_.head_dim_k);
  const int64_t q_width = int64_t{n_head} * dk;
  const int64_t kw = KeyWidth(), vw = ValueWidth();
  MOERT_ASSIGN_OR_RETURN(BufferRef q, Get(kQ, static_cast<size_t>(n * q_width) * 4));
  // This layer's cache, and the new rows' place in it: k and v are projected there (a
  // half cache: into scratch, then rounded into it once RoPE'd).
  const size_t elem = KvElemBytes();
  const BufferRef k_layer(k_cache_, static_cast<size_t>(il) * kv_capacity_ * kw * elem);
  const BufferRef v_layer(v_cache_, static_cast<size_t>(il) * kv_capacity_ * vw * elem);
  const BufferRef k_rows = At(k_layer, static_cast<size_t>(pos0 * kw) * elem);
  const BufferRef v_rows = At(v_layer, static_cast<size_t>(pos0 * vw) * elem);
  BufferRef k = k_rows, v = v_rows;
  if (kv_half_) {
    MOERT_ASSIGN_OR_RETURN(k, Get(kNewK, static_cast<size_t>(n * kw) * 4));
    MOERT_ASSIGN_OR_RETURN(v, Get(kNewV, static_cast<size_t>(n * vw) * 4));
  }
  MOERT_RETURN_IF_ERROR(Project(l.wq, 0, cur, n, q));
  MOERT_RETURN_IF_ERROR(Project(l.wk, 0, cur, n, k));
  MOERT_RETURN_IF_ERROR(Project(l.wv, 0, cur, n, v));
  if (!l.bq.empty()) MOERT_RETURN_IF_ERROR(cl::AddBias(*device_, q, l.bq, n, q_width));
  if (!l.bk.empty()) MOERT_RETURN_IF_ERROR(cl::AddBias(*device_, k, l.bk, n, kw));
  if (!l.bv.empty()) MOERT_RETURN_IF_ERROR(cl::AddBias(*device_, v, l.bv, n, vw));
  const float eps = spec_.rms_eps;
  if (view_.attention.qk_norm == format::QkNorm::kPerHead) {
    MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, q, n * n_head, dk, l.q_norm, eps, q));
    MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, k, n * n_head_kv, dk, l.k_norm, eps, k));
  } else if (view_.attention.qk_norm == format::QkNorm::kFullWidth) {
    MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, q, n, q_width, l.q_norm, eps, q));
    MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, k, n, kw, l.k_norm, eps, k));
  }
  cl::RopeArgs rope;
  rope.neox = view_.attention.rope == format::RopeLayout::kNeox;
  rope.n_rot = static_cast<int>(spec_.n_rot);
  rope.theta_base = spec_.rope_theta;
  rope.freq_scale =
      spec_.rope_scaling == format::RopeScaling::kLinear ? 1.0f / spec_.rope_scaling_factor : 1.0f;
  if (!rope_freqs_.empty()) rope.freq_factors = rope_freqs_;
  MOERT_RETURN_IF_ERROR(cl::Rope(*device_, rope, pos0, n, n_head, dk, q));
  MOERT_RETURN_IF_ERROR(cl::Rope(*device_, rope, pos0, n, n_head_kv, dk, k));
  if (kv_half_) {
    MOERT_RETURN_IF_ERROR(cl::ToHalf(*device_, k, n * kw, k_rows));
    MOERT_RETURN_IF_ERROR(cl::ToHalf(*device_, v, n * vw, v_rows));
  }

  cl::AttentionArgs shape;
  shape.n_head = n_head;
  shape.n_head_kv = n_head_kv;
  shape.head_dim_k = dk;
  shape.head_dim_v = static_cast<int>(spec_.head_dim_v);
  shape.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  shape.kv_half = kv_half_;
  MOERT_ASSIGN_OR_RETURN(
      BufferRef attn, Get(kAttn, static_cast<size_t>(n * n_head * shape.head_dim_v) * 4));
  MOERT_RETURN_IF_ERROR(
      cl::Attention(*device_, shape, q, n, pos0, k_layer, v_layer, attn, op_scratch_));
  return Project(l.wo, 0, attn, n, out);
}

absl::Status OpenClDecoderImpl::RunF32Experts(const DevLayer& l, int64_t n, int k, BufferRef cur,
                                              BufferRef experts, BufferRef weights,
                                              BufferRef out) {
  // Tokens grouped by expert on the host (the routing read back), as model::MoeFfn.
  const int64_t pairs = n * k;
  const int n_expert = static_cast<int>(spec_.n_expert);
  std::vector<int32_t> chosen(static_cast<size_t>(pairs));
  MOERT_RETURN_IF_ERROR(ReadRef(*device_, experts, chosen.data(), chosen.size() * 4));
  std::vector<int64_t> first_row(static_cast<size_t>(n_expert) + 1, 0);
  for (int32_t e : chosen) {
    if (e < 0 || e >= n_expert) {
      if (e >= n_expert) return absl::InternalError(StrCat("OpenCL routing chose expert ", e));
      continue;
    }
    ++first_row[static_cast<size_t>(e) + 1];
  }
  for (int e = 0; e < n_expert; ++e) first_row[e + 1] += first_row[e];
  const int64_t n_rows = first_row[static_cast<size_t>(n_expert)];
  std::vector<int32_t> token_of_row(static_cast<size_t>(std::max<int64_t>(n_rows, 1)), 0);
  std::vector<int32_t> row_of_pair(static_cast<size_t>(pairs), 0);
  std::vector<int64_t> next(first_row.begin(), first_row.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int e = chosen[static_cast<size_t>(p)];
    if (e < 0) continue;
    const int64_t r = next[static_cast<size_t>(e)]++;
    token_of_row[static_cast<size_t>(r)] = static_cast<int32_t>(p / k);
    row_of_pair[static_cast<size_t>(p)] = static_cast<int32_t>(r);
  }
  if (n_rows == 0) return absl::InternalError("OpenCL routing chose no expert");
  const int64_t e_dim = spec_.n_embd, ff = l.gate.rows;
  MOERT_ASSIGN_OR_RETURN(BufferRef idx_tok, Get(kIdxToken, token_of_row.size() * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef idx_pair, Get(kIdxPair, row_of_pair.size() * 4));
  MOERT_RETURN_IF_ERROR(WriteRef(*device_, idx_tok, token_of_row.data(),
                                      token_of_row.size() * 4));
  MOERT_RETURN_IF_ERROR(WriteRef(*device_, idx_pair, row_of_pair.data(),
                                      row_of_pair.size() * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef xs, Get(kXs, static_cast<size_t>(n_rows * e_dim) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef g, Get(kGate, static_cast<size_t>(n_rows * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef u, Get(kUp, static_cast<size_t>(n_rows * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef dn, Get(kDown, static_cast<size_t>(n_rows * e_dim) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef po, Get(kPairOut, static_cast<size_t>(pairs * e_dim) * 4));
  MOERT_RETURN_IF_ERROR(cl::GatherRows(*device_, cur, n, idx_tok, n_rows, e_dim, xs));
  for (int e = 0; e < n_expert; ++e) {
    const int64_t r = first_row[static_cast<size_t>(e)];
    const int64_t m = first_row[static_cast<size_t>(e) + 1] - r;
    if (m == 0) continue;
    const BufferRef xe = At(xs, static_cast<size_t>(r * e_dim) * 4);
    MOERT_RETURN_IF_ERROR(Project(l.gate, e, xe, m, At(g, static_cast<size_t>(r * ff) * 4)));
    MOERT_RETURN_IF_ERROR(Project(l.up, e, xe, m, At(u, static_cast<size_t>(r * ff) * 4)));
  }
  MOERT_RETURN_IF_ERROR(cl::SiluMul(*device_, g, u, n_rows * ff));
  for (int e = 0; e < n_expert; ++e) {
    const int64_t r = first_row[static_cast<size_t>(e)];
    const int64_t m = first_row[static_cast<size_t>(e) + 1] - r;
    if (m == 0) continue;
    MOERT_RETURN_IF_ERROR(Project(l.down, e, At(g, static_cast<size_t>(r * ff) * 4), m,
                                  At(dn, static_cast<size_t>(r * e_dim) * 4)));
  }
  MOERT_RETURN_IF_ERROR(cl::GatherRows(*device_, dn, n_rows, idx_pair, pairs, e_dim, po));
  return cl::MoeCombine(*device_, po, experts, weights, n, k, e_dim, out);
}

absl::StatusOr<uint64_t> OpenClDecoderImpl::PublishExpert(int il, int expert) {
  const experts::ExpertCache& cache = *view_.expert_cache;
  const std::optional<experts::ExpertCache::Placement> at = cache.PlacementOf(il, expert);
  if (!at) {
    return absl::InternalError(StrCat("OpenCL: pinned expert ", expert, " of layer ", il,
                                      " is not resident"));
  }
  uint64_t& seen = published_[static_cast<size_t>(il) * static_cast<size_t>(spec_.n_expert) +
                              static_cast<size_t>(expert)];
  if (seen != at->generation) {
    const uint64_t bytes = cache.directory().info(il, expert).runtime_bytes;
    if (!region_copy_) {
      MOERT_RETURN_IF_ERROR(region_.Publish(*device_, at->offset, bytes));
      if (!zero_copy_checked_) MOERT_RETURN_IF_ERROR(CheckZeroCopy(at->offset, bytes));
    }
    if (region_copy_) {
      MOERT_RETURN_IF_ERROR(
          region_.Write(*device_, cache.expert_region() + at->offset, bytes, at->offset));
    }
    seen = at->generation;
    pooled_stats_.published_bytes += bytes;
  }
  return at->offset;
}

absl::Status OpenClDecoderImpl::CheckZeroCopy(uint64_t offset, uint64_t bytes) {
  // The first expert published: does the device read what the host wrote? A driver
  // that copied or pinned the region's pages when it was wrapped (most of them were
  // not yet committed) would show stale bytes; then a device copy takes over.
  zero_copy_checked_ = true;
  const experts::ExpertCache& cache = *view_.expert_cache;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, 256));
  std::vector<uint8_t> seen(n);
  MOERT_RETURN_IF_ERROR(region_.Read(*device_, seen.data(), n, static_cast<size_t>(offset)));
  if (spoil_zero_copy_check_ && n > 0) seen[0] = static_cast<uint8_t>(~seen[0]);
  if (std::memcmp(seen.data(), cache.expert_region() + offset, n) == 0) return absl::OkStatus();
  MOERT_ASSIGN_OR_RETURN(Buffer copy, Buffer::Create(*device_, cache.expert_region_bytes()));
  region_ = std::move(copy);
  region_copy_ = true;
  for (cl::FfnRef& f : pooled_parts_) {
    for (cl::MatrixRef* m : {&f.gate, &f.up, &f.down}) {
      if (m->rows > 0) m->data.mem = region_.get();
    }
  }
  std::fill(published_.begin(), published_.end(), 0);  // everything again, into the copy
  pooled_stats_.placement = StrCat(
      "device (copied per load: the zero-copy view read stale bytes)",
      pooled_stats_.placement.substr(std::string_view("device (zero-copy)").size()));
  return absl::OkStatus();
}

absl::Status OpenClDecoderImpl::RunPooledMoe(int il, int64_t n, BufferRef cur, BufferRef out) {
  const MoeWeights& w = (*view_.layers)[static_cast<size_t>(il)].moe;
  ThreadPool& pool = *view_.host_pool;
  const size_t values = static_cast<size_t>(n * spec_.n_embd);
  std::vector<float> x(values);
  MOERT_RETURN_IF_ERROR(ReadRef(*device_, cur, x.data(), values * 4));
  const MoeRoute route = RouteMoe(pool, w, x.data(), n);
  const bool on_device =
      il < static_cast<int>(pooled_parts_.size()) && pooled_parts_[static_cast<size_t>(il)].gate.rows > 0;
  absl::StatusOr<std::vector<int>> pinned =
      on_device ? AcquireRouted(w, route) : absl::ResourceExhaustedError("host");
  if (!pinned.ok()) {
    if (!absl::IsResourceExhausted(pinned.status())) return pinned.status();
    // On the host: this layer cannot run on the device, or the batch's experts do not
    // fit the pool together (RunMoeExperts runs them in subsets that do).
    std::vector<float> y(values);
    MOERT_RETURN_IF_ERROR(RunMoeExperts(pool, w, x.data(), n, route, y.data()));
    ++pooled_stats_.host_batches;
    return WriteRef(*device_, out, y.data(), values * 4);
  }
  experts::ExpertCache& cache = *view_.expert_cache;
  absl::Status status = [&]() -> absl::Status {
    std::vector<uint64_t> offsets(static_cast<size_t>(spec_.n_expert), 0);
    // Twice when the zero-copy check turned the region into a copy part-way: the
    // experts published before it go into the copy too.
    for (int pass = 0; pass < 2; ++pass) {
      const bool was_copy = region_copy_;
      for (int e : *pinned) {
        MOERT_ASSIGN_OR_RETURN(offsets[static_cast<size_t>(e)], PublishExpert(il, e));
      }
      if (region_copy_ == was_copy) break;
    }
    cl::FfnRef f = pooled_parts_[static_cast<size_t>(il)];
    f.expert_offsets = offsets;
    const size_t pairs = route.chosen.size();
    MOERT_ASSIGN_OR_RETURN(BufferRef experts, Get(kExperts, pairs * 4));
    MOERT_ASSIGN_OR_RETURN(BufferRef weights, Get(kWeights, pairs * 4));
    static_assert(sizeof(int) == sizeof(int32_t));
    MOERT_RETURN_IF_ERROR(WriteRef(*device_, experts, route.chosen.data(), pairs * 4));
    MOERT_RETURN_IF_ERROR(WriteRef(*device_, weights, route.weights.data(), pairs * 4));
    MOERT_ASSIGN_OR_RETURN(
        BufferRef xq, Get(kXq, static_cast<size_t>(n * (spec_.n_embd / MOERT_QK)) * kA8Bytes));
    MOERT_RETURN_IF_ERROR(cl::Q8Quant(*device_, cur, n, spec_.n_embd, xq));
    MOERT_RETURN_IF_ERROR(
        cl::FusedMoe(*device_, f, xq, n, route.k, experts, weights, out, op_scratch_));
    // The kernels read the pinned blocks: they may go only once the device is done.
    return device_->Finish();
  }();
  for (int e : *pinned) cache.Release(il, e);
  if (status.ok()) ++pooled_stats_.device_batches;
  return status;
}

absl::Status OpenClDecoderImpl::RunMoe(int il, int64_t n, BufferRef cur, BufferRef out) {
  if (view_.expert_cache != nullptr) return RunPooledMoe(il, n, cur, out);
  const DevLayer& l = layers_[static_cast<size_t>(il)];
  const int n_expert = static_cast<int>(spec_.n_expert);
  const int k = static_cast<int>(spec_.n_expert_used);
  MOERT_ASSIGN_OR_RETURN(BufferRef logits,
                         Get(kRouterLogits, static_cast<size_t>(n * n_expert) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef experts, Get(kExperts, static_cast<size_t>(n * k) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef weights, Get(kWeights, static_cast<size_t>(n * k) * 4));
  MOERT_RETURN_IF_ERROR(Project(l.router, 0, cur, n, logits));
  MOERT_RETURN_IF_ERROR(
      cl::TopKRoute(*device_, logits, n, n_expert, k, spec_.renormalize_topk, experts, weights));
  if (!l.gate.packed) return RunF32Experts(l, n, k, cur, experts, weights, out);
  MOERT_ASSIGN_OR_RETURN(
      BufferRef xq, Get(kXq, static_cast<size_t>(n * (spec_.n_embd / MOERT_QK)) * kA8Bytes));
  MOERT_RETURN_IF_ERROR(cl::Q8Quant(*device_, cur, n, spec_.n_embd, xq));
  return cl::FusedMoe(*device_, {l.gate.ref, l.up.ref, l.down.ref, {}}, xq, n, k, experts,
                      weights, out, op_scratch_);
}

absl::Status OpenClDecoderImpl::RunDenseFfn(const DevLayer& l, int64_t n, BufferRef cur,
                                            BufferRef out) {
  if (l.gate.packed) {
    MOERT_ASSIGN_OR_RETURN(
        BufferRef xq, Get(kXq, static_cast<size_t>(n * (spec_.n_embd / MOERT_QK)) * kA8Bytes));
    MOERT_RETURN_IF_ERROR(cl::Q8Quant(*device_, cur, n, spec_.n_embd, xq));
    return cl::FusedMoe(*device_, {l.gate.ref, l.up.ref, l.down.ref, {}}, xq, n, 1, {}, {}, out,
                        op_scratch_);
  }
  const int64_t ff = l.gate.rows;
  MOERT_ASSIGN_OR_RETURN(BufferRef g, Get(kGate, static_cast<size_t>(n * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef u, Get(kUp, static_cast<size_t>(n * ff) * 4));
  MOERT_RETURN_IF_ERROR(Project(l.gate, 0, cur, n, g));
  MOERT_RETURN_IF_ERROR(Project(l.up, 0, cur, n, u));
  MOERT_RETURN_IF_ERROR(cl::SiluMul(*device_, g, u, n * ff));
  return Project(l.down, 0, g, n, out);
}

absl::Status OpenClDecoderImpl::RunLayer(int il, int64_t n, int64_t pos0, BufferRef x) {
  const DevLayer& l = layers_[static_cast<size_t>(il)];
  const int64_t e = spec_.n_embd;
  MOERT_ASSIGN_OR_RETURN(BufferRef cur, Get(kCur, static_cast<size_t>(n * e) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef out, Get(kOut, static_cast<size_t>(n * e) * 4));
  MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, x, n, e, l.attn_norm, spec_.rms_eps, cur));
  MOERT_RETURN_IF_ERROR(RunAttention(il, n, pos0, cur, out));
  // An injected failure (tests) strikes here: earlier layers and this layer's attention
  // are enqueued (its new K/V rows written on the device, not yet on the host), as
  // when a real enqueue of the residual add fails.
  if (fail_this_call_ && il == std::clamp(failure_.layer, 0, static_cast<int>(spec_.n_layer) - 1)) {
    return cl::ClStatus(failure_.cl_error, "clEnqueueNDRangeKernel(add_inplace)");
  }
  MOERT_RETURN_IF_ERROR(cl::AddInPlace(*device_, x, out, n * e));
  MOERT_RETURN_IF_ERROR(cl::RmsNorm(*device_, x, n, e, l.ffn_norm, spec_.rms_eps, cur));
  MOERT_RETURN_IF_ERROR(spec_.is_moe() ? RunMoe(il, n, cur, out) : RunDenseFfn(l, n, cur, out));
  return cl::AddInPlace(*device_, x, out, n * e);
}

absl::Status OpenClDecoderImpl::ForwardBatch(std::span<const int32_t> tokens, int64_t pos0,
                                             const HostKv& kv, int64_t first_logit_row,
                                             float* logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t e = spec_.n_embd;
  fail_this_call_ = TakeInjectedFailure();
  // Positions >= pos0 on the device are about to be overwritten: from here on, a
  // failure at any point leaves the device copy valid below pos0 at most, so the next
  // call uploads whatever the host cache holds from pos0 (a CPU fallback's rows).
  if (kv.id == kv_id_) kv_valid_ = std::min(kv_valid_, pos0);
  absl::Status status = [&]() -> absl::Status {
    MOERT_RETURN_IF_ERROR(SyncKv(kv, pos0));
    std::vector<float> x_host(static_cast<size_t>(n * e));
    for (int64_t t = 0; t < n; ++t) {
      const float* row = view_.token_embd->row(tokens[static_cast<size_t>(t)]);
      std::copy(row, row + e, x_host.begin() + t * e);
    }
    MOERT_ASSIGN_OR_RETURN(BufferRef x, Get(kX, x_host.size() * 4));
    MOERT_RETURN_IF_ERROR(WriteRef(*device_, x, x_host.data(), x_host.size() * 4));
    for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
      MOERT_RETURN_IF_ERROR(RunLayer(il, n, pos0, x));
    }
    if (first_logit_row < n) {
      const int64_t rows = n - first_logit_row;
      MOERT_ASSIGN_OR_RETURN(BufferRef cur, Get(kCur, static_cast<size_t>(n * e) * 4));
      const BufferRef x_rows = At(x, static_cast<size_t>(first_logit_row * e) * 4);
      MOERT_RETURN_IF_ERROR(
          cl::RmsNorm(*device_, x_rows, rows, e, output_norm_, spec_.rms_eps, cur));
      const int64_t n_vocab = spec_.n_vocab;
      MOERT_ASSIGN_OR_RETURN(BufferRef out, Get(kLogits, static_cast<size_t>(rows * n_vocab) * 4));
      MOERT_RETURN_IF_ERROR(Project(lm_head_, 0, cur, rows, out));
      MOERT_RETURN_IF_ERROR(
          ReadRef(*device_, out, logits, static_cast<size_t>(rows * n_vocab) * 4));
    }
    // The new keys and values back to the host cache (a half cache's values as floats:
    // the host then holds what the device attends over).
    const size_t kw = static_cast<size_t>(KeyWidth()), vw = static_cast<size_t>(ValueWidth());
    for (size_t il = 0; il < spec_.n_layer; ++il) {
      const size_t row0 = il * static_cast<size_t>(kv_capacity_) + static_cast<size_t>(pos0);
      MOERT_RETURN_IF_ERROR(DownloadKvRows(k_cache_, row0 * kw, static_cast<size_t>(n) * kw,
                                           kv.keys[il] + pos0 * KeyWidth()));
      MOERT_RETURN_IF_ERROR(DownloadKvRows(v_cache_, row0 * vw, static_cast<size_t>(n) * vw,
                                           kv.values[il] + pos0 * ValueWidth()));
    }
    return device_->Finish();
  }();
  if (status.ok()) kv_valid_ = pos0 + n;
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpenClDecoder>> NewOpenClDecoder(
    const DecoderView& view, const OpenClDecoderOptions& options) {
  cl::DeviceOptions device_options;
  device_options.allow_cpu = !options.require_gpu && options.allow_cpu_device;
  auto device = cl::Device::Open(device_options);
  if (!device.ok()) {
    return absl::FailedPreconditionError(
        StrCat("OpenCL backend unavailable: ", std::string(device.status().message())));
  }
  if (options.require_gpu && ((*device)->info().type & CL_DEVICE_TYPE_GPU) == 0) {
    return absl::FailedPreconditionError(
        StrCat("OpenCL device ", (*device)->info().name, " is not a GPU"));
  }
  auto impl = std::make_unique<OpenClDecoderImpl>(view, std::move(*device), options.kv_half);
  MOERT_RETURN_IF_ERROR(impl->SelfTest());
  MOERT_RETURN_IF_ERROR(impl->UploadWeights());
  return std::unique_ptr<OpenClDecoder>(std::move(impl));
}

}  // namespace moert::model
