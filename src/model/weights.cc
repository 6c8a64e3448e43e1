// Dequantizes model tensors to fp32 with errors that name the tensor.
#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "backend/packing.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/dequant.h"
#include "format/ggml_types.h"

namespace moert::model {

WeightLoader::WeightLoader(const format::GgufFile& file, std::function<void(float)> progress,
                           bool pack)
    : file_(file), progress_(std::move(progress)), pack_(pack) {
  for (const format::GgufTensorInfo& t : file.tensors()) total_bytes_ += t.n_bytes;
}

absl::StatusOr<const format::GgufTensorInfo*> WeightLoader::Find(const std::string& name,
                                                                   int64_t n) {
  if (cancel_ != nullptr && cancel_->load()) {
    return absl::CancelledError(StrCat(file_.name(), ": loading cancelled"));
  }
  const format::GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(StrCat(file_.name(), ": missing tensor '", name, "'"));
  }
  if (t->n_elements != static_cast<uint64_t>(n)) {
    return absl::InvalidArgumentError(
        StrCat(file_.name(), ": tensor '", name, "' has ", t->n_elements, " values, expected ", n));
  }
  if (file_.TensorData(*t).size() != t->n_bytes) {
    return absl::InvalidArgumentError(
        StrCat(file_.name(), ": the data of tensor '", name, "' is not inside the file"));
  }
  return t;
}

absl::Status WeightLoader::CheckDims(const std::string& name,
                                     std::span<const uint64_t> dims) const {
  const format::GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(StrCat(file_.name(), ": missing tensor '", name, "'"));
  }
  if (!std::equal(t->dims.begin(), t->dims.end(), dims.begin(), dims.end())) {
    return absl::InvalidArgumentError(StrCat(file_.name(), ": tensor '", name, "' has shape [",
                                             StrJoin(t->dims, ", "), "], expected [",
                                             StrJoin(dims, ", "), "]"));
  }
  return absl::OkStatus();
}

namespace {

bool IsRoutedExpertTensor(std::string_view name) {
  return name.find("_exps.weight") != std::string_view::npos;
}

}  // namespace

void WeightLoader::set_skip_routed_experts(bool on) {
  skip_routed_experts_ = on;
  total_bytes_ = 0;
  for (const format::GgufTensorInfo& t : file_.tensors()) {
    if (!on || !IsRoutedExpertTensor(t.name)) total_bytes_ += t.n_bytes;
  }
}

void WeightLoader::ReleasePages(const format::GgufTensorInfo& t) const {
#ifdef MADV_PAGEOUT
  if (!release_pages_) return;
  const std::span<const uint8_t> data = file_.TensorData(t);
  if (data.empty()) return;
  const long page_long = sysconf(_SC_PAGESIZE);
  const uintptr_t page = page_long > 0 ? static_cast<uintptr_t>(page_long) : 4096;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data.data() + data.size());
  // Only a hint: on failure (an old kernel) the pages just stay.
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)t;
#endif
}

void WeightLoader::Progress(uint64_t bytes) {
  done_bytes_ += bytes;
  if (progress_ && total_bytes_ > 0) {
    progress_(
        static_cast<float>(static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_)));
  }
}

absl::Status WeightLoader::Read(const std::string& name, int64_t n, std::vector<float>* out) {
  MOERT_ASSIGN_OR_RETURN(const format::GgufTensorInfo* t, Find(name, n));
  if (!format::CanDequantize(t->type)) {
    return absl::UnimplementedError(StrCat(file_.name(), ": tensor '", name, "' has type ",
                                           format::GgmlTypeName(t->type),
                                           ", which the reference model cannot dequantize"));
  }
  if (measure_only_) {
    out->clear();
    measured_bytes_ += static_cast<uint64_t>(n) * sizeof(float);
    return absl::OkStatus();
  }
  out->resize(static_cast<size_t>(n));
  return Finish(name, *t, format::Dequantize(t->type, file_.TensorData(*t), *out));
}

absl::Status WeightLoader::Finish(const std::string& name, const format::GgufTensorInfo& t,
                                  absl::Status status) {
  if (!status.ok()) {
    return absl::Status(status.code(), StrCat(file_.name(), ": tensor '", name,
                                              "': ", std::string(status.message())));
  }
  ReleasePages(t);
  Progress(t.n_bytes);
  return absl::OkStatus();
}

absl::Status WeightLoader::LoadMatMul(const std::string& name, int64_t rows, int64_t cols,
                                      int64_t groups, Matrix* out) {
  using format::GgmlType;
  MOERT_ASSIGN_OR_RETURN(const format::GgufTensorInfo* t, Find(name, rows * cols));
  if (const std::optional<backend::WeightFormat> packed = backend::PackedFormatOf(t->type);
      packed && pack_ && groups >= 1 && rows % groups == 0) {
    // A moert-pack file: already in runtime layout, one extent per expert; no repack.
    const int64_t group_rows = rows / groups;
    const size_t group_bytes = backend::PackedBytes(*packed, group_rows, cols);
    if (file_.TensorData(*t).size() != group_bytes * static_cast<size_t>(groups)) {
      return absl::InvalidArgumentError(
          StrCat(file_.name(), ": packed tensor '", name, "' holds ", file_.TensorData(*t).size(),
                 " bytes, expected ", group_bytes * static_cast<size_t>(groups)));
    }
    out->data.clear();
    out->rows = rows;
    out->cols = cols;
    if (measure_only_) {
      measured_bytes_ += (group_bytes * static_cast<uint64_t>(groups) + 63) / 64 * 64;
      return absl::OkStatus();
    }
    out->packed = backend::PackedMatrix(*packed, groups, group_rows, cols);
    std::memcpy(out->packed.mutable_group(0), file_.TensorData(*t).data(),
                group_bytes * static_cast<size_t>(groups));
    Progress(t->n_bytes);
    return absl::OkStatus();
  }
  const bool is_float =
      t->type == GgmlType::kF32 || t->type == GgmlType::kF16 || t->type == GgmlType::kBF16;
  if (!pack_ || is_float || cols % 32 != 0 || groups < 1 || rows % groups != 0 ||
      !backend::CanPack(t->type)) {
    return Load(name, rows, cols, out);
  }
  const int64_t group_rows = rows / groups;
  const std::optional<uint64_t> row_bytes = format::GgmlRowBytes(t->type, uint64_t(cols));
  if (!row_bytes) return Load(name, rows, cols, out);
  const backend::WeightFormat target = backend::NaturalFormat(t->type);
  out->data.clear();
  out->rows = rows;
  out->cols = cols;
  if (measure_only_) {
    // PackedMatrix's allocation: the groups back to back, rounded up to 64 bytes.
    measured_bytes_ +=
        (backend::PackedBytes(target, group_rows, cols) * static_cast<uint64_t>(groups) + 63) /
        64 * 64;
    return absl::OkStatus();
  }
  out->packed = backend::PackedMatrix(target, groups, group_rows, cols);
  const std::span<const uint8_t> bytes = file_.TensorData(*t);
  const size_t src_group_bytes = static_cast<size_t>(group_rows) * *row_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    absl::Status status = backend::PackRows(
        t->type, bytes.subspan(static_cast<size_t>(g) * src_group_bytes, src_group_bytes),
        group_rows, cols, target, {out->packed.mutable_group(g), out->packed.group_bytes()});
    if (!status.ok()) {
      return absl::Status(status.code(), StrCat(file_.name(), ": tensor '", name,
                                                "': ", std::string(status.message())));
    }
  }
  ReleasePages(*t);
  Progress(t->n_bytes);
  return absl::OkStatus();
}

absl::Status WeightLoader::Load(const std::string& name, int64_t rows, int64_t cols, Matrix* out) {
  out->rows = rows;
  out->cols = cols;
  const format::GgufTensorInfo* t = file_.FindTensor(name);
  if (t != nullptr && backend::PackedFormatOf(t->type)) {
    // A moert-pack file on the reference path: its runtime layout read back as fp32.
    MOERT_ASSIGN_OR_RETURN(t, Find(name, rows * cols));
    if (measure_only_) {
      out->data.clear();
      measured_bytes_ += static_cast<uint64_t>(rows * cols) * sizeof(float);
      return absl::OkStatus();
    }
    out->data.resize(static_cast<size_t>(rows * cols));
    absl::Status status =
        backend::DequantizePackedTensor(t->type, file_.TensorData(*t), rows, cols, out->data);
    if (!status.ok()) {
      return absl::Status(status.code(), StrCat(file_.name(), ": tensor '", name,
                                                "': ", std::string(status.message())));
    }
    Progress(t->n_bytes);
    return absl::OkStatus();
  }
  return Read(name, rows * cols, &out->data);
}

absl::Status WeightLoader::LoadEmbedding(const std::string& name, int64_t rows, int64_t cols,
                                         bool keep_quantized, EmbeddingTable* out) {
  const format::GgufTensorInfo* t = file_.FindTensor(name);
  if (!keep_quantized || t == nullptr || t->type == format::GgmlType::kF32 ||
      backend::PackedFormatOf(t->type) || !format::CanDequantize(t->type)) {
    Matrix dense;
    MOERT_RETURN_IF_ERROR(Load(name, rows, cols, &dense));
    out->SetDense(std::move(dense));
    return absl::OkStatus();
  }
  MOERT_ASSIGN_OR_RETURN(t, Find(name, rows * cols));
  if (measure_only_) {
    *out = EmbeddingTable();
    measured_bytes_ += t->n_bytes;
    return absl::OkStatus();
  }
  return Finish(name, *t, out->SetQuantized(t->type, rows, cols, file_.TensorData(*t)));
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
