// Reads model tensors out of a GGUF file into fp32 matrices (format::Dequantize),
// checking each one's size, and reports loading progress by bytes read.
#ifndef MOERT_MODEL_WEIGHTS_H_
#define MOERT_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "format/gguf.h"
#include "model/layers.h"

namespace moert::model {

class WeightLoader {
 public:
  // `progress` (may be empty) receives the fraction of tensor bytes loaded so far.
  WeightLoader(const format::GgufFile& file, std::function<void(float)> progress);

  bool Has(const std::string& name) const { return file_.FindTensor(name) != nullptr; }

  // Tensor `name` as `rows` x `cols` fp32 values. InvalidArgument naming the tensor
  // when it is absent, holds another number of values or lies outside the file;
  // Unimplemented naming it and its type when that type cannot be dequantized.
  absl::Status Load(const std::string& name, int64_t rows, int64_t cols, Matrix* out);
  // A 1-D tensor of `n` values.
  absl::Status LoadVector(const std::string& name, int64_t n, std::vector<float>* out);
  // As LoadVector when the tensor exists; leaves `out` empty when it does not.
  absl::Status LoadOptionalVector(const std::string& name, int64_t n, std::vector<float>* out);

 private:
  absl::Status Read(const std::string& name, int64_t n, std::vector<float>* out);

  const format::GgufFile& file_;
  std::function<void(float)> progress_;
  uint64_t total_bytes_ = 0;
  uint64_t done_bytes_ = 0;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_WEIGHTS_H_
