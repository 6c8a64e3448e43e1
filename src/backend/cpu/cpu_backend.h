// The CPU backend: Backend over host memory, the integer microkernels (qmatmul.h) and
// the fp32 ops (f32_ops.h). The reference every other backend is compared with; its
// results are the bits the model has always computed, on any thread count.
#ifndef MOERT_BACKEND_CPU_CPU_BACKEND_H_
#define MOERT_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>

#include "backend/backend.h"
#include "backend/cpu/f32_ops.h"

namespace moert::backend::cpu {

class CpuBackend final : public Backend {
 public:
  // Runs on `pool` (its threads and microkernels; borrowed, it must outlive this).
  explicit CpuBackend(ThreadPool& pool) : pool_(&pool) {}
  // Runs on a pool of its own.
  explicit CpuBackend(int threads);

  ThreadPool& pool() { return *pool_; }
  // Large-batch fp32 matmuls (F32 weights, at least XnnpackF32Gemm::kMinRows rows)
  // through XNNPACK (backend/cpu/xnnpack_f32.h): faster, but not the reference's bits,
  // so off by default; the vision encoder's backend turns it on.
  void set_xnnpack_f32(bool on) { xnnpack_f32_ = on; }

  std::string_view name() const override { return "CPU"; }
  DeviceDescription device() const override;
  bool Supports(Op op, WeightType type = WeightType::kF32) const override;
  bool SupportsKv(KvType) const override { return true; }
  bool host_memory() const override { return true; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> WrapHost(void* host, size_t bytes) override;
  absl::Status Publish(Buffer& buffer, size_t offset, size_t bytes) override;
  absl::Status Write(TensorRef dst, const void* src, size_t bytes) override;
  absl::Status Read(TensorRef src, void* dst, size_t bytes) override;
  absl::Status Finish() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(const Matrix& m, int64_t groups,
                                                       std::string_view name) override;

  absl::Status MatMuls(std::span<const MatMulArgs> jobs) override;
  absl::Status RmsNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight, float eps,
                       TensorRef y) override;
  absl::Status LayerNorm(TensorRef x, int64_t n_rows, int64_t width, TensorRef weight,
                         TensorRef bias, float eps, TensorRef y) override;
  absl::Status Rope(const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
                    TensorRef x) override;
  absl::Status Attention(const AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                         TensorRef k_cache, TensorRef v_cache, TensorRef out) override;
  absl::Status FullAttention(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                             TensorRef v, int64_t n_kv, TensorRef out) override;
  absl::Status AttentionEntropy(const AttentionArgs& shape, TensorRef q, int64_t n, TensorRef k,
                                int64_t n_kv, TensorRef entropy) override;
  absl::Status Softmax(TensorRef x, int64_t n_rows, int64_t width, TensorRef y) override;
  absl::Status SiluMul(TensorRef g, TensorRef u, int64_t count) override;
  absl::Status Gelu(TensorRef x, int64_t count, TensorRef y) override;
  absl::Status Add(TensorRef x, TensorRef y, int64_t count) override;
  absl::Status AddBias(TensorRef y, TensorRef b, int64_t n, int64_t width) override;
  absl::Status TopK(TensorRef logits, int64_t n, int n_expert, int k, bool renormalize,
                    TensorRef experts, TensorRef weights) override;
  absl::Status FusedMoe(const Experts& w, TensorRef x, int64_t n, int k, TensorRef experts,
                        TensorRef weights, TensorRef out) override;
  absl::Status GatherRows(TensorRef src, int64_t src_rows, TensorRef idx, int64_t n,
                          int64_t width, TensorRef dst) override;
  absl::Status MoeCombine(TensorRef y, TensorRef experts, TensorRef weights, int64_t n, int k,
                          int64_t width, TensorRef out) override;
  absl::Status StoreHalf(TensorRef x, int64_t count, TensorRef y) override;
  absl::Status GatedAdd(TensorRef out, TensorRef y, TensorRef gate, int64_t n,
                        int64_t width) override;
  absl::Status StoreKv(KvType type, TensorRef src, int64_t n_rows, int64_t width,
                       TensorRef dst) override;

 private:
  // Attention and FullAttention: kv keys, causal or not.
  absl::Status RunAttention(const AttentionArgs& shape, TensorRef q, int64_t n, int64_t pos0,
                            TensorRef k_cache, TensorRef v_cache, int64_t kv, bool causal,
                            TensorRef out);

  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_;
  bool xnnpack_f32_ = false;
};

// The matrix view of group `group` of a CPU weight (tests, the MoE scheduler's host
// fallback); FailedPrecondition when `w` is not a CPU weight.
absl::StatusOr<MatrixView> CpuWeightView(const Weight& w, int64_t group);

}  // namespace moert::backend::cpu

#endif  // MOERT_BACKEND_CPU_CPU_BACKEND_H_
