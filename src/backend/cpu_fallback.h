// A device backend whose missing ops run on the CPU: every op the device Supports()
// goes to it; any other runs on the CPU backend, its inputs read back from the device
// and its outputs written to it. Weights are uploaded to the device where it has
// kernels for them and are always viewable by the CPU (which borrows the loader's
// copy), so a matmul or fused expert op the device lacks runs there. The layer graph
// and the MoE scheduler talk to this one backend and never ask what runs where.
//
// Attention over KV cache types the device does not read (SupportsKv) runs on the CPU
// too, the caches read back whole.
//
// Placed experts (an expert pool's region) run on the CPU only from a region the host
// reads in place (a wrapped host range).
#ifndef MOERT_BACKEND_CPU_FALLBACK_H_
#define MOERT_BACKEND_CPU_FALLBACK_H_

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace moert::backend {

class CpuFallbackBackend final : public Backend {
 public:
  // `cpu` is borrowed (it must outlive this backend).
  CpuFallbackBackend(std::unique_ptr<Backend> device, cpu::CpuBackend& cpu);
  ~CpuFallbackBackend() override;

  Backend& device_backend() { return *device_; }
  // Ops run on the CPU so far (tests, reporting).
  uint64_t cpu_ops() const { return cpu_ops_; }

  std::string_view name() const override { return device_->name(); }
  DeviceDescription device() const override { return device_->device(); }
  // What the device runs itself (a caller chooses its algorithm by it); every op runs,
  // the others on the CPU.
  bool Supports(Op op, WeightType type) const override;
  bool SupportsKv(KvType type) const override { return device_->SupportsKv(type); }
  bool host_memory() const override { return device_->host_memory(); }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return device_->Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> WrapHost(void* host, size_t bytes) override {
    return device_->WrapHost(host, bytes);
  }
  absl::Status Publish(Buffer& buffer, size_t offset, size_t bytes) override {
    return device_->Publish(buffer, offset, bytes);
  }
  absl::Status Write(TensorRef dst, const void* src, size_t bytes) override {
    return device_->Write(dst, src, bytes);
  }
  absl::Status Read(TensorRef src, void* dst, size_t bytes) override {
    return device_->Read(src, dst, bytes);
  }
  absl::Status Finish() override { return device_->Finish(); }
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
  class Staging;

  bool OnDevice(Op op, WeightType type = WeightType::kF32) const {
    return device_->Supports(op, type);
  }
  // An attention op over caches of these types (the device must read both).
  bool OnDevice(Op op, const AttentionArgs& shape) const {
    return OnDevice(op) && device_->SupportsKv(shape.k_type) && device_->SupportsKv(shape.v_type);
  }

  std::unique_ptr<Backend> device_;
  cpu::CpuBackend& cpu_;
  uint64_t cpu_ops_ = 0;
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_CPU_FALLBACK_H_
