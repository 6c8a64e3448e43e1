// Reads model tensors out of a GGUF file into fp32 matrices (format::Dequantize),
// checking each one's size, and reports loading progress by bytes read. For a memory
// budget it can also only measure what loading would allocate, leave the routed experts
// to an expert pool, and drop the file pages it has read from the resident set.
#ifndef MOERT_MODEL_WEIGHTS_H_
#define MOERT_MODEL_WEIGHTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/gguf.h"
#include "model/embedding.h"
#include "model/layers.h"

namespace moert::model {

class WeightLoader {
 public:
  // `progress` (may be empty) receives the fraction of tensor bytes loaded so far.
  // `pack`: LoadMatMul repacks quantized tensors for the integer kernels.
  WeightLoader(const format::GgufFile& file, std::function<void(float)> progress,
               bool pack = false);

  bool Has(const std::string& name) const { return file_.FindTensor(name) != nullptr; }
  // Set: every tensor read after it is true fails with Cancelled (ModelLoadOptions::cancel).
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  // Measure mode: every call checks its tensor as usual but reads nothing and leaves
  // its output empty; measured_bytes() sums what the calls would have allocated.
  void set_measure_only(bool on) { measure_only_ = on; }
  uint64_t measured_bytes() const { return measured_bytes_; }
  // The routed experts (blk.N.ffn_{gate,up,down}_exps) live in an expert pool: the
  // MoE loader skips them, and progress counts the other tensors only.
  void set_skip_routed_experts(bool on);
  bool skip_routed_experts() const { return skip_routed_experts_; }
  // After a tensor is read, its pages of the file mapping leave the resident set
  // (madvise MADV_PAGEOUT, a hint that never changes the bytes), so the mapping does
  // not count against a memory budget.
  void set_release_pages(bool on) { release_pages_ = on; }
  // Checks that tensor `name` holds `n` values inside the file, without reading it.
  absl::Status Check(const std::string& name, int64_t n) { return Find(name, n).status(); }
  // InvalidArgument naming tensor `name` when it is absent or its dimensions (ggml
  // order: columns first) are not `dims`; a check for tensors whose value count alone
  // would not catch a transposed or reshaped matrix.
  absl::Status CheckDims(const std::string& name, std::span<const uint64_t> dims) const;

  // Tensor `name` as `rows` x `cols` fp32 values. InvalidArgument naming the tensor
  // when it is absent, holds another number of values or lies outside the file;
  // Unimplemented naming it and its type when that type cannot be dequantized.
  absl::Status Load(const std::string& name, int64_t rows, int64_t cols, Matrix* out);
  // A weight that only ever multiplies activations (attention and FFN projections,
  // experts, the lm head): as Load, except that with packing on, a quantized tensor
  // (any type but F32/F16/BF16) with `cols` a multiple of 32 is repacked into its
  // natural runtime layout (backend::NaturalFormat) instead, as `groups` matrices of
  // rows / groups rows (one per expert of a stacked expert tensor).
  absl::Status LoadMatMul(const std::string& name, int64_t rows, int64_t cols, int64_t groups,
                          Matrix* out);
  // The token embedding table, `rows` x `cols`: with `keep_quantized`, a tensor of a
  // quantized type Dequantize reads stays in its blocks (EmbeddingTable::SetQuantized);
  // otherwise, and for F32 or a moert-pack layout, as Load reads it.
  absl::Status LoadEmbedding(const std::string& name, int64_t rows, int64_t cols,
                             bool keep_quantized, EmbeddingTable* out);
  // A 1-D tensor of `n` values.
  absl::Status LoadVector(const std::string& name, int64_t n, std::vector<float>* out);
  // As LoadVector when the tensor exists; leaves `out` empty when it does not.
  absl::Status LoadOptionalVector(const std::string& name, int64_t n, std::vector<float>* out);

 private:
  // The tensor `name` checked to hold `n` values whose bytes lie inside the file.
  absl::StatusOr<const format::GgufTensorInfo*> Find(const std::string& name, int64_t n);
  absl::Status Read(const std::string& name, int64_t n, std::vector<float>* out);
  // After tensor `name` is read: `status` naming the tensor when it failed, else its
  // file pages released and its bytes counted as progress.
  absl::Status Finish(const std::string& name, const format::GgufTensorInfo& t,
                      absl::Status status);
  void Progress(uint64_t bytes);
  void ReleasePages(const format::GgufTensorInfo& t) const;

  const format::GgufFile& file_;
  std::function<void(float)> progress_;
  const std::atomic<bool>* cancel_ = nullptr;
  bool pack_ = false;
  uint64_t total_bytes_ = 0;
  uint64_t done_bytes_ = 0;
  bool measure_only_ = false;
  uint64_t measured_bytes_ = 0;
  bool skip_routed_experts_ = false;
  bool release_pages_ = false;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_WEIGHTS_H_
