// Tests only: a Backend that forwards to another one and injects the failures a real
// device shows, through a state the test keeps (it outlives the backend, which a model
// may drop when it gives its device up):
//  - a failed batch: after `after_batches` batches that run normally, the next `times`
//    batches (< 0: every one from then on) fail in layer `layer`, once that layer's
//    attention is enqueued, at its residual add, with the Status a real enqueue
//    returning the OpenCL error `cl_error` gives (a batch ends at its Finish: a model
//    without an expert pool, whose device MoE blocks also Finish per layer);
//  - a stale zero-copy view: reads of a wrapped host range see its first byte flipped.
#ifndef MOERT_TESTS_BACKEND_FAULT_BACKEND_H_
#define MOERT_TESTS_BACKEND_FAULT_BACKEND_H_

#include <memory>
#include <set>
#include <utility>

#include "backend/backend.h"
#ifdef MOERT_HAVE_OPENCL
#include "backend/opencl/cl_status.h"
#endif

namespace moert::backend::testing {

struct FaultState {
  bool alive = false;  // a FaultBackend uses this state now
  int after_batches = 0;
  int layer = 0;
  int cl_error = -5;  // CL_OUT_OF_RESOURCES
  int times = 0;      // failing batches left (< 0: all)
  bool spoil_wrapped_reads = false;
  uint64_t batches = 0;  // batches ended (at their Finish, or failed) since armed

  // Arms a failure (see the file comment); replaces an earlier one.
  void FailBatches(int after, int at_layer, int error, int count = 1) {
    after_batches = after;
    layer = at_layer;
    cl_error = error;
    times = count;
    batches = 0;
  }
};

class FaultBackend final : public Backend {
 public:
  FaultBackend(std::unique_ptr<Backend> inner, std::shared_ptr<FaultState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {
    state_->alive = true;
  }
  ~FaultBackend() override { state_->alive = false; }

  std::string_view name() const override { return inner_->name(); }
  DeviceDescription device() const override { return inner_->device(); }
  bool Supports(Op op, WeightType type) const override { return inner_->Supports(op, type); }
  bool SupportsKv(KvType type) const override { return inner_->SupportsKv(type); }
  bool host_memory() const override { return inner_->host_memory(); }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> WrapHost(void* host, size_t bytes) override {
    auto b = inner_->WrapHost(host, bytes);
    if (b.ok()) wrapped_.insert(b->get());
    return b;
  }
  absl::Status Publish(Buffer& buffer, size_t offset, size_t bytes) override {
    return inner_->Publish(buffer, offset, bytes);
  }
  absl::Status Write(TensorRef dst, const void* src, size_t bytes) override {
    return inner_->Write(dst, src, bytes);
  }
  absl::Status Read(TensorRef src, void* dst, size_t bytes) override {
    absl::Status s = inner_->Read(src, dst, bytes);
    if (s.ok() && bytes > 0 && state_->spoil_wrapped_reads && wrapped_.count(src.buffer) > 0) {
      auto* first = static_cast<uint8_t*>(dst);
      *first = static_cast<uint8_t>(~*first);
    }
    return s;
  }
  absl::Status Finish() override {
    absl::Status s = inner_->Finish();
    EndBatch();
    return s;
  }
  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(const Matrix& m, int64_t groups,
                                                       std::string_view name) override {
    return inner_->UploadWeight(m, groups, name);
  }

  absl::Status MatMuls(std::span<const MatMulArgs> jobs) override { return inner_->MatMuls(jobs); }
  absl::Status RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight, float eps,
                       TensorRef y) override {
    return inner_->RmsNorm(x, n_rows, width, weight, eps, y);
  }
  absl::Status LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                         TensorRef bias, float eps, TensorRef y) override {
    return inner_->LayerNorm(x, n_rows, width, weight, bias, eps, y);
  }
  absl::Status Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
                    TensorRef x) override {
    return inner_->Rope(rope, pos0, n, n_heads, head_dim, x);
  }
  absl::Status Attention(const AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                         TensorRef k_cache, TensorRef v_cache, TensorRef out) override {
    return inner_->Attention(shape, q, n, pos0, k_cache, v_cache, out);
  }
  absl::Status FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                             TensorRef v, int64_t n_kv, TensorRef out) override {
    return inner_->FullAttention(shape, q, n, k, v, n_kv, out);
  }
  absl::Status AttentionEntropy(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                                int64_t n_kv, TensorRef entropy) override {
    return inner_->AttentionEntropy(shape, q, n, k, n_kv, entropy);
  }
  absl::Status Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) override {
    return inner_->Softmax(x, n_rows, width, y);
  }
  absl::Status SiluMul(TensorRef g, TensorRef u, int64_t count) override {
    return inner_->SiluMul(g, u, count);
  }
  absl::Status Gelu(TensorRef x, int64_t count, TensorRef y) override {
    return inner_->Gelu(x, count, y);
  }
  absl::Status Add(TensorRef x, TensorRef y, int64_t count) override {
    // Layer L's first add (after its attention) is the batch's add number 2L.
    if (adds_++ == 2 * static_cast<int64_t>(state_->layer) && FailThisBatch()) {
      if (state_->times > 0) --state_->times;
      EndBatch();
#ifdef MOERT_HAVE_OPENCL
      return opencl::ClStatus(state_->cl_error, "clEnqueueNDRangeKernel(add_inplace)");
#else
      return absl::UnavailableError("injected device failure");
#endif
    }
    return inner_->Add(x, y, count);
  }
  absl::Status AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) override {
    return inner_->AddBias(y, b, n, width);
  }
  absl::Status TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                    TensorRef experts, TensorRef weights) override {
    return inner_->TopK(logits, n, n_expert, k, renormalize, experts, weights);
  }
  absl::Status FusedMoe(const Experts& w, TensorRef x, int64_t n, int k, TensorRef experts,
                        TensorRef weights, TensorRef out) override {
    return inner_->FusedMoe(w, x, n, k, experts, weights, out);
  }
  absl::Status GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n, int64_t width,
                          TensorRef dst) override {
    return inner_->GatherRows(src, src_rows, idx, n, width, dst);
  }
  absl::Status MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n, int k,
                          int64_t width, TensorRef out) override {
    return inner_->MoeCombine(y, experts, weights, n, k, width, out);
  }
  absl::Status StoreHalf(TensorRef x, int64_t count, TensorRef y) override {
    return inner_->StoreHalf(x, count, y);
  }
  absl::Status StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                       TensorRef dst) override {
    return inner_->StoreKv(type, src, n_rows, width, dst);
  }
  absl::Status GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                        int64_t width) override {
    return inner_->GatedAdd(out, y, gate, n, width);
  }

 private:
  // Whether the batch now running is one an injected failure fails.
  bool FailThisBatch() const {
    return state_->times != 0 && state_->batches >= static_cast<uint64_t>(state_->after_batches);
  }
  void EndBatch() {
    ++state_->batches;
    adds_ = 0;
  }

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<FaultState> state_;
  std::set<const Buffer*> wrapped_;
  int64_t adds_ = 0;  // in the batch now running
};

}  // namespace moert::backend::testing

#endif  // MOERT_TESTS_BACKEND_FAULT_BACKEND_H_
