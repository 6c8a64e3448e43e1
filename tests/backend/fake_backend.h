// Tests only: a backend with memory of its own (the host cannot read it in place, as
// on a discrete device) that runs only some ops, each with the CPU backend's code on
// that memory, so its results are the CPU's bits. Model tests load it as the device
// (ModelLoadOptions::device_backend): the model must run, what it lacks must run on
// the CPU, and the logits must be the CPU's.
#ifndef MOERT_TESTS_BACKEND_FAKE_BACKEND_H_
#define MOERT_TESTS_BACKEND_FAKE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <set>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/strings.h"

namespace moert::backend::testing {

// What a FakeBackend ran (the test keeps it).
struct FakeCounts {
  uint64_t ops = 0;  // ops it ran itself
};

class FakeBackend final : public Backend {
 public:
  // Runs `ops` (the rest: Unimplemented, and Supports says no).
  FakeBackend(std::set<Op> ops, std::shared_ptr<FakeCounts> counts)
      : ops_(std::move(ops)), counts_(std::move(counts)), cpu_(1) {}

  std::string_view name() const override { return "Fake"; }
  DeviceDescription device() const override { return {"fake device", "GPU", "fake 1.0", false}; }
  bool Supports(Op op, WeightType) const override { return ops_.count(op) > 0; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    auto inner = cpu_.Allocate(bytes);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<Buffer>(std::make_unique<FakeBuffer>(this, std::move(*inner)));
  }
  absl::StatusOr<std::unique_ptr<Buffer>> WrapHost(void*, size_t) override {
    return absl::UnimplementedError("the fake device cannot wrap host memory");
  }
  absl::Status Publish(Buffer&, size_t, size_t) override { return absl::OkStatus(); }
  absl::Status Write(TensorRef dst, const void* src, size_t bytes) override {
    return cpu_.Write(Inner(dst), src, bytes);
  }
  absl::Status Read(TensorRef src, void* dst, size_t bytes) override {
    return cpu_.Read(Inner(src), dst, bytes);
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(const Matrix& m, int64_t groups,
                                                       std::string_view name) override {
    return cpu_.UploadWeight(m, groups, name);
  }

  absl::Status MatMuls(std::span<const MatMulArgs> jobs) override {
    if (!Count(Op::kMatMul)) return Unsupported(Op::kMatMul);
    std::vector<MatMulArgs> inner(jobs.begin(), jobs.end());
    for (MatMulArgs& j : inner) {
      j.x = Inner(j.x);
      j.y = Inner(j.y);
    }
    return cpu_.MatMuls(inner);
  }
  absl::Status RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight, float eps,
                       TensorRef y) override {
    if (!Count(Op::kRmsNorm)) return Unsupported(Op::kRmsNorm);
    return cpu_.RmsNorm(Inner(x), n_rows, width, Inner(weight), eps, Inner(y));
  }
  absl::Status LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                         TensorRef bias, float eps, TensorRef y) override {
    if (!Count(Op::kLayerNorm)) return Unsupported(Op::kLayerNorm);
    return cpu_.LayerNorm(Inner(x), n_rows, width, Inner(weight), Inner(bias), eps, Inner(y));
  }
  absl::Status Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
                    TensorRef x) override {
    if (!Count(Op::kRope)) return Unsupported(Op::kRope);
    RopeArgs r = rope;
    r.freq_factors = Inner(rope.freq_factors);
    return cpu_.Rope(r, pos0, n, n_heads, head_dim, Inner(x));
  }
  absl::Status Attention(const AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                         TensorRef k_cache, TensorRef v_cache, TensorRef out) override {
    if (!Count(Op::kAttention)) return Unsupported(Op::kAttention);
    return cpu_.Attention(shape, Inner(q), n, pos0, Inner(k_cache), Inner(v_cache), Inner(out));
  }
  absl::Status FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                             TensorRef v, int64_t n_kv, TensorRef out) override {
    if (!Count(Op::kFullAttention)) return Unsupported(Op::kFullAttention);
    return cpu_.FullAttention(shape, Inner(q), n, Inner(k), Inner(v), n_kv, Inner(out));
  }
  absl::Status AttentionEntropy(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                                int64_t n_kv, TensorRef entropy) override {
    if (!Count(Op::kAttentionEntropy)) return Unsupported(Op::kAttentionEntropy);
    return cpu_.AttentionEntropy(shape, Inner(q), n, Inner(k), n_kv, Inner(entropy));
  }
  absl::Status Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) override {
    if (!Count(Op::kSoftmax)) return Unsupported(Op::kSoftmax);
    return cpu_.Softmax(Inner(x), n_rows, width, Inner(y));
  }
  absl::Status SiluMul(TensorRef g, TensorRef u, int64_t count) override {
    if (!Count(Op::kSiluMul)) return Unsupported(Op::kSiluMul);
    return cpu_.SiluMul(Inner(g), Inner(u), count);
  }
  absl::Status Gelu(TensorRef x, int64_t count, TensorRef y) override {
    if (!Count(Op::kGelu)) return Unsupported(Op::kGelu);
    return cpu_.Gelu(Inner(x), count, Inner(y));
  }
  absl::Status Add(TensorRef x, TensorRef y, int64_t count) override {
    if (!Count(Op::kAdd)) return Unsupported(Op::kAdd);
    return cpu_.Add(Inner(x), Inner(y), count);
  }
  absl::Status AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) override {
    if (!Count(Op::kAddBias)) return Unsupported(Op::kAddBias);
    return cpu_.AddBias(Inner(y), Inner(b), n, width);
  }
  absl::Status TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                    TensorRef experts, TensorRef weights) override {
    if (!Count(Op::kTopK)) return Unsupported(Op::kTopK);
    return cpu_.TopK(Inner(logits), n, n_expert, k, renormalize, Inner(experts), Inner(weights));
  }
  absl::Status FusedMoe(const Experts& w, TensorRef x, int64_t n, int k, TensorRef experts,
                        TensorRef weights, TensorRef out) override {
    if (!Count(Op::kFusedMoe)) return Unsupported(Op::kFusedMoe);
    Experts inner = w;
    if (w.placed()) inner.region = Inner(TensorRef(w.region)).buffer;  // a device copy of the pool
    return cpu_.FusedMoe(inner, Inner(x), n, k, Inner(experts), Inner(weights), Inner(out));
  }
  absl::Status GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n, int64_t width,
                          TensorRef dst) override {
    if (!Count(Op::kGatherRows)) return Unsupported(Op::kGatherRows);
    return cpu_.GatherRows(Inner(src), src_rows, Inner(idx), n, width, Inner(dst));
  }
  absl::Status MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n, int k,
                          int64_t width, TensorRef out) override {
    if (!Count(Op::kMoeCombine)) return Unsupported(Op::kMoeCombine);
    return cpu_.MoeCombine(Inner(y), Inner(experts), Inner(weights), n, k, width, Inner(out));
  }
  absl::Status StoreHalf(TensorRef x, int64_t count, TensorRef y) override {
    if (!Count(Op::kStoreHalf)) return Unsupported(Op::kStoreHalf);
    return cpu_.StoreHalf(Inner(x), count, Inner(y));
  }
  absl::Status StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                       TensorRef dst) override {
    if (!Count(Op::kStoreKv)) return Unsupported(Op::kStoreKv);
    return cpu_.StoreKv(type, Inner(src), n_rows, width, Inner(dst));
  }
  absl::Status GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                        int64_t width) override {
    if (!Count(Op::kGatedAdd)) return Unsupported(Op::kGatedAdd);
    return cpu_.GatedAdd(Inner(out), Inner(y), Inner(gate), n, width);
  }

 private:
  // Memory the host cannot address: host() is null; only the fake reads it.
  class FakeBuffer final : public Buffer {
   public:
    FakeBuffer(const Backend* owner, std::unique_ptr<Buffer> inner)
        : Buffer(owner, inner->size()), inner_(std::move(inner)) {}
    Buffer* inner() const { return inner_.get(); }

   private:
    std::unique_ptr<Buffer> inner_;
  };

  // The CPU buffer behind a fake one (an empty ref stays empty; another backend's
  // buffer stays as it is, and the CPU's checks reject it if the host cannot read it).
  TensorRef Inner(TensorRef t) const {
    if (t.empty() || t.buffer->owner() != this) return t;
    return TensorRef(static_cast<FakeBuffer*>(t.buffer)->inner(), t.offset);
  }
  bool Count(Op op) {
    if (ops_.count(op) == 0) return false;
    ++counts_->ops;
    return true;
  }

  std::set<Op> ops_;
  std::shared_ptr<FakeCounts> counts_;
  cpu::CpuBackend cpu_;
};

}  // namespace moert::backend::testing

#endif  // MOERT_TESTS_BACKEND_FAKE_BACKEND_H_
