// Builds the expert directory from the stacked expert tensors of a GGUF file.
#include "experts/expert_directory.h"

#include <cstring>
#include <utility>

#include "core/strings.h"
#include "format/arch.h"

namespace moert::experts {
namespace {

uint64_t AlignUp64(uint64_t v) { return (v + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<ExpertDirectory> ExpertDirectory::Build(const format::GgufFile& file, int n_layer,
                                                       int n_expert, int64_t n_embd,
                                                       int64_t n_ff) {
  using format::TensorKind;
  if (n_layer < 1 || n_expert < 1 || n_embd < 1 || n_ff < 1) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": no routed experts to pool (",
                                             n_layer, " layers, ", n_expert, " experts)"));
  }
  ExpertDirectory dir;
  dir.path_ = file.name();
  dir.file_size_ = file.bytes().size();
  dir.file_offset_ = file.file_offset();
  dir.n_layer_ = n_layer;
  dir.n_expert_ = n_expert;
  dir.has_layer_.assign(static_cast<size_t>(n_layer), false);
  dir.infos_.resize(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert));

  struct PartSpec {
    TensorKind kind;
    int64_t rows;  // per expert
    int64_t cols;
  };
  const PartSpec specs[kExpertParts] = {{TensorKind::kFfnGateExps, n_ff, n_embd},
                                        {TensorKind::kFfnUpExps, n_ff, n_embd},
                                        {TensorKind::kFfnDownExps, n_embd, n_ff}};
  for (int layer = 0; layer < n_layer; ++layer) {
    const format::GgufTensorInfo* tensors[kExpertParts];
    int present = 0;
    for (int p = 0; p < kExpertParts; ++p) {
      tensors[p] = file.FindTensor(format::TensorWeightName(specs[p].kind, layer));
      present += tensors[p] != nullptr ? 1 : 0;
    }
    if (present == 0) continue;
    for (int p = 0; p < kExpertParts; ++p) {
      if (tensors[p] == nullptr) {
        return absl::InvalidArgumentError(
            StrCat(file.name(), ": layer ", layer, " has routed experts but no tensor '",
                   format::TensorWeightName(specs[p].kind, layer), "'"));
      }
    }
    uint64_t block = 0;
    std::array<ExpertPart, kExpertParts> parts;
    for (int p = 0; p < kExpertParts; ++p) {
      const format::GgufTensorInfo& t = *tensors[p];
      const std::string name(t.name);
      const int64_t rows = specs[p].rows;
      const int64_t cols = specs[p].cols;
      if (t.n_elements != uint64_t(n_expert) * uint64_t(rows) * uint64_t(cols)) {
        return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' has ",
                                                 t.n_elements, " values, expected ", n_expert,
                                                 " experts of ", rows, " x ", cols));
      }
      if (cols % 32 != 0) {
        return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' has rows of ",
                                                 cols, " values, not a multiple of 32"));
      }
      ExpertPart& part = parts[static_cast<size_t>(p)];
      part.tensor = name;
      part.file_type = t.type;
      part.rows = rows;
      part.cols = cols;
      if (std::optional<backend::WeightFormat> packed = backend::PackedFormatOf(t.type)) {
        if (rows % 8 != 0) {
          return absl::UnimplementedError(
              StrCat(file.name(), ": tensor '", name, "' is packed (",
                     format::GgmlTypeName(t.type), ") with ", rows,
                     " rows per expert, not a multiple of 8: its experts share tiles"));
        }
        part.format = *packed;
        part.packed_in_file = true;
      } else {
        const bool is_float = t.type == format::GgmlType::kF32 ||
                              t.type == format::GgmlType::kF16 ||
                              t.type == format::GgmlType::kBF16;
        if (is_float || !backend::CanPack(t.type)) {
          return absl::UnimplementedError(
              StrCat(file.name(), ": tensor '", name, "' has type ", format::GgmlTypeName(t.type),
                     "; the expert pool holds quantized experts only (this type stays fp32 and "
                     "fully resident)"));
        }
        part.format = backend::NaturalFormat(t.type);
      }
      const std::optional<uint64_t> row_bytes = format::GgmlRowBytes(t.type, uint64_t(cols));
      if (!row_bytes) {
        return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name,
                                                 "': rows of ", cols, " values are not whole blocks"));
      }
      part.file_bytes = *row_bytes * uint64_t(rows);
      if (t.n_bytes != part.file_bytes * uint64_t(n_expert) ||
          file.TensorData(t).size() != t.n_bytes) {
        return absl::InvalidArgumentError(
            StrCat(file.name(), ": the data of tensor '", name, "' is not inside the file"));
      }
      part.runtime_bytes = backend::PackedBytes(part.format, rows, cols);
      if (part.packed_in_file && part.runtime_bytes != part.file_bytes) {
        return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' holds ",
                                                 part.file_bytes, " bytes per expert, expected ",
                                                 part.runtime_bytes));
      }
      part.block_offset = block;
      block = AlignUp64(block + part.runtime_bytes);
    }
    dir.has_layer_[static_cast<size_t>(layer)] = true;
    ++dir.pooled_layers_;
    for (int e = 0; e < n_expert; ++e) {
      ExpertInfo& info = dir.infos_[static_cast<size_t>(layer) * size_t(n_expert) + size_t(e)];
      info.layer = layer;
      info.expert = e;
      info.parts = parts;
      info.runtime_bytes = 0;
      info.file_bytes = 0;
      for (int p = 0; p < kExpertParts; ++p) {
        ExpertPart& part = info.parts[static_cast<size_t>(p)];
        part.file_offset = tensors[p]->file_offset + uint64_t(e) * part.file_bytes;
        info.runtime_bytes = part.block_offset + part.runtime_bytes;
        info.file_bytes += part.file_bytes;
        dir.max_part_file_bytes_ = std::max(dir.max_part_file_bytes_, part.file_bytes);
      }
      dir.max_runtime_bytes_ = std::max(dir.max_runtime_bytes_, info.runtime_bytes);
      dir.max_file_bytes_ = std::max(dir.max_file_bytes_, info.file_bytes);
      dir.total_runtime_bytes_ += info.runtime_bytes;
      dir.total_file_bytes_ += info.file_bytes;
    }
  }
  if (dir.pooled_layers_ == 0) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": no layer has routed expert tensors (blk.N.ffn_gate_exps.weight)"));
  }

  if (const format::GgufKeyValue* kv = file.FindKey(kChecksumKey)) {
    const uint64_t expected = uint64_t(n_layer) * uint64_t(n_expert);
    if (kv->value.type != format::GgufValueType::kArray ||
        kv->value.array_type != format::GgufValueType::kUint64 ||
        kv->value.array_size != expected || kv->value.array_bytes.size() != expected * 8) {
      return absl::InvalidArgumentError(StrCat(file.name(), ": metadata key '", kChecksumKey,
                                               "' must be an array of ", expected,
                                               " uint64 values (one per layer and expert)"));
    }
    dir.stored_checksums_.resize(expected);
    for (uint64_t i = 0; i < expected; ++i) {
      uint64_t v = 0;
      for (int b = 7; b >= 0; --b) v = (v << 8) | kv->value.array_bytes[i * 8 + uint64_t(b)];
      dir.stored_checksums_[i] = v;
    }
  }
  return dir;
}

bool ExpertDirectory::has_layer(int layer) const {
  return layer >= 0 && layer < n_layer_ && has_layer_[static_cast<size_t>(layer)];
}

const ExpertInfo& ExpertDirectory::info(int layer, int expert) const {
  return infos_[static_cast<size_t>(layer) * static_cast<size_t>(n_expert_) +
                static_cast<size_t>(expert)];
}

std::optional<uint64_t> ExpertDirectory::stored_checksum(int layer, int expert) const {
  if (stored_checksums_.empty()) return std::nullopt;
  return stored_checksums_[static_cast<size_t>(layer) * static_cast<size_t>(n_expert_) +
                           static_cast<size_t>(expert)];
}

std::string ExpertDirectory::LayoutDifference(const ExpertDirectory& other) const {
  if (path_ != other.path_ || file_offset_ != other.file_offset_) {
    return StrCat("the file is another one (", other.path_, ")");
  }
  if (file_size_ != other.file_size_) {
    return StrCat("the file's size changed from ", file_size_, " to ", other.file_size_, " bytes");
  }
  if (n_layer_ != other.n_layer_ || n_expert_ != other.n_expert_ ||
      has_layer_ != other.has_layer_) {
    return "the layers with routed experts changed";
  }
  for (size_t i = 0; i < infos_.size(); ++i) {
    for (int p = 0; p < kExpertParts; ++p) {
      const ExpertPart& a = infos_[i].parts[static_cast<size_t>(p)];
      const ExpertPart& b = other.infos_[i].parts[static_cast<size_t>(p)];
      if (a.tensor != b.tensor || a.file_offset != b.file_offset || a.file_bytes != b.file_bytes ||
          a.file_type != b.file_type || a.format != b.format ||
          a.packed_in_file != b.packed_in_file || a.rows != b.rows || a.cols != b.cols ||
          a.block_offset != b.block_offset || a.runtime_bytes != b.runtime_bytes) {
        return StrCat("expert ", infos_[i].expert, " of layer ", infos_[i].layer, " ('", a.tensor,
                      "') lies elsewhere or has another type");
      }
    }
  }
  return "";
}

}  // namespace moert::experts
