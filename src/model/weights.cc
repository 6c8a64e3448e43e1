// Dequantizes model tensors to fp32 with errors that name the tensor.
#include "model/weights.h"

#include <utility>

#include "core/strings.h"
#include "format/dequant.h"
#include "format/ggml_types.h"

namespace moert::model {

WeightLoader::WeightLoader(const format::GgufFile& file, std::function<void(float)> progress)
    : file_(file), progress_(std::move(progress)) {
  for (const format::GgufTensorInfo& t : file.tensors()) total_bytes_ += t.n_bytes;
}

absl::Status WeightLoader::Read(const std::string& name, int64_t n, std::vector<float>* out) {
  const format::GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(StrCat(file_.name(), ": missing tensor '", name, "'"));
  }
  if (t->n_elements != static_cast<uint64_t>(n)) {
    return absl::InvalidArgumentError(
        StrCat(file_.name(), ": tensor '", name, "' has ", t->n_elements, " values, expected ", n));
  }
  if (!format::CanDequantize(t->type)) {
    return absl::UnimplementedError(StrCat(file_.name(), ": tensor '", name, "' has type ",
                                           format::GgmlTypeName(t->type),
                                           ", which the reference model cannot dequantize"));
  }
  std::span<const uint8_t> bytes = file_.TensorData(*t);
  if (bytes.size() != t->n_bytes) {
    return absl::InvalidArgumentError(
        StrCat(file_.name(), ": the data of tensor '", name, "' is not inside the file"));
  }
  out->resize(static_cast<size_t>(n));
  absl::Status status = format::Dequantize(t->type, bytes, *out);
  if (!status.ok()) {
    return absl::Status(status.code(), StrCat(file_.name(), ": tensor '", name,
                                              "': ", std::string(status.message())));
  }
  done_bytes_ += t->n_bytes;
  if (progress_ && total_bytes_ > 0) {
    progress_(
        static_cast<float>(static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_)));
  }
  return absl::OkStatus();
}

absl::Status WeightLoader::Load(const std::string& name, int64_t rows, int64_t cols, Matrix* out) {
  out->rows = rows;
  out->cols = cols;
  return Read(name, rows * cols, &out->data);
}

absl::Status WeightLoader::LoadVector(const std::string& name, int64_t n, std::vector<float>* out) {
  return Read(name, n, out);
}

absl::Status WeightLoader::LoadOptionalVector(const std::string& name, int64_t n,
                                              std::vector<float>* out) {
  if (!Has(name)) {
    out->clear();
    return absl::OkStatus();
  }
  return Read(name, n, out);
}

}  // namespace moert::model
