// DecoderModel's side of an expert hot update applied in place (runtime/update.cc):
// resident experts get their new weights converted ahead and copied over the old ones
// between two steps; an expert pool switches its loader to the new file and evicts the
// changed experts, which its next misses read anew.
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/dequant.h"
#include "format/ggml_types.h"
#include "model/decoder.h"

namespace moert::model {
namespace {

class DecoderExpertUpdate final : public ExpertUpdate {
 public:
  // One part of one resident expert: its group of a stacked weight, as the weight
  // holds it (packed bytes, or fp32 values).
  struct Write {
    Matrix* target = nullptr;
    int64_t group = 0;
    std::vector<uint8_t> packed;
    std::vector<float> floats;
  };

  uint64_t bytes() const override {
    uint64_t n = 0;
    for (const Write& w : writes) n += w.packed.size() + w.floats.size() * sizeof(float);
    return n;
  }

  std::vector<Write> writes;                          // resident experts
  std::optional<experts::ExpertDirectory> directory;  // with a pool: the new file's
  std::vector<std::pair<int, int>> experts;
};

// Expert `expert` of the stacked weight `target` (tensor `name` of `file`: n_expert
// groups of `rows` x `cols`) in the form `target` holds it.
absl::Status ConvertExpert(const format::GgufFile& file, const std::string& name, int n_expert,
                           int expert, int64_t rows, int64_t cols, Matrix* target,
                           DecoderExpertUpdate::Write* out) {
  const format::GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' is missing"));
  }
  const std::span<const uint8_t> all = file.TensorData(*t);
  if (all.size() % static_cast<size_t>(n_expert) != 0) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' holds ",
                                             all.size(), " bytes, not ", n_expert, " experts"));
  }
  const size_t expert_bytes = all.size() / static_cast<size_t>(n_expert);
  const std::span<const uint8_t> src = all.subspan(static_cast<size_t>(expert) * expert_bytes,
                                                   expert_bytes);
  const auto mismatch = [&](std::string_view what) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' ", what,
                                             " the loaded model's"));
  };
  out->target = target;
  out->group = expert;
  if (!target->packed.empty()) {
    const backend::WeightFormat format = target->packed.format();
    if (target->packed.groups() != n_expert || target->packed.rows() != rows ||
        target->packed.cols() != cols) {
      return mismatch("has another shape than");
    }
    out->packed.resize(target->packed.group_bytes());
    if (const std::optional<backend::WeightFormat> in_file = backend::PackedFormatOf(t->type)) {
      // A moert-pack file: the runtime layout already.
      if (*in_file != format || expert_bytes != out->packed.size()) {
        return mismatch("is in another layout than");
      }
      std::memcpy(out->packed.data(), src.data(), expert_bytes);
      return absl::OkStatus();
    }
    if (backend::NaturalFormat(t->type) != format) return mismatch("packs into another layout than");
    const absl::Status packed = backend::PackRows(t->type, src, rows, cols, format, out->packed);
    if (!packed.ok()) {
      return absl::Status(packed.code(), StrCat(file.name(), ": tensor '", name, "': ",
                                                std::string(packed.message())));
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(target->data.size()) != rows * cols * n_expert) {
    return mismatch("has another shape than");
  }
  out->floats.resize(static_cast<size_t>(rows * cols));
  const absl::Status values = format::Dequantize(t->type, src, out->floats);
  if (!values.ok()) {
    return absl::Status(values.code(), StrCat(file.name(), ": tensor '", name, "': ",
                                              std::string(values.message())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertUpdate>> DecoderModel::PrepareExpertUpdate(
    const format::GgufFile& file, std::span<const std::pair<int, int>> experts) {
  auto update = std::make_unique<DecoderExpertUpdate>();
  update->experts.assign(experts.begin(), experts.end());
  for (const auto& [layer, expert] : experts) {
    if (layer < 0 || layer >= static_cast<int>(layers_.size()) ||
        layers_[static_cast<size_t>(layer)].moe.n_expert == 0 || expert < 0 ||
        expert >= layers_[static_cast<size_t>(layer)].moe.n_expert) {
      return absl::InvalidArgumentError(
          StrCat("expert ", expert, " of layer ", layer, " is not a routed expert of the model"));
    }
  }
  if (expert_cache_ != nullptr) {
    MOERT_ASSIGN_OR_RETURN(
        experts::ExpertDirectory dir,
        experts::ExpertDirectory::Build(file, static_cast<int>(spec_.n_layer),
                                        static_cast<int>(spec_.n_expert), spec_.n_embd,
                                        spec_.n_ff_expert));
    if (const std::string why = expert_cache_->directory().LayoutDifference(dir); !why.empty()) {
      return absl::InvalidArgumentError(
          StrCat(file.name(), ": the expert pool cannot read it in place: ", why));
    }
    update->directory.emplace(std::move(dir));
    return std::unique_ptr<ExpertUpdate>(std::move(update));
  }
  const int64_t n_embd = spec_.n_embd;
  const int64_t n_ff = spec_.n_ff_expert;
  for (const auto& [layer, expert] : experts) {
    MoeWeights& moe = layers_[static_cast<size_t>(layer)].moe;
    const struct {
      format::TensorKind kind;
      Matrix* target;
      int64_t rows, cols;
    } parts[] = {{format::TensorKind::kFfnGateExps, &moe.gate_exps, n_ff, n_embd},
                 {format::TensorKind::kFfnUpExps, &moe.up_exps, n_ff, n_embd},
                 {format::TensorKind::kFfnDownExps, &moe.down_exps, n_embd, n_ff}};
    for (const auto& part : parts) {
      DecoderExpertUpdate::Write write;
      MOERT_RETURN_IF_ERROR(ConvertExpert(file, format::TensorWeightName(part.kind, layer),
                                          moe.n_expert, expert, part.rows, part.cols, part.target,
                                          &write));
      update->writes.push_back(std::move(write));
    }
  }
  return std::unique_ptr<ExpertUpdate>(std::move(update));
}

absl::Status DecoderModel::CommitExpertUpdate(ExpertUpdate& base) {
  auto* update = dynamic_cast<DecoderExpertUpdate*>(&base);
  if (update == nullptr) {
    return absl::InvalidArgumentError("the expert update was prepared by another model type");
  }
  // Checked here, between steps: a device given up (UseCpuBackend) changes it.
  if (device_graph_ != nullptr) {
    return absl::UnimplementedError(StrCat("the model runs on ", backend_.backend,
                                           ", which holds its own copies of the experts"));
  }
  if (update->directory.has_value()) {
    if (expert_cache_ == nullptr) {
      return absl::FailedPreconditionError("the update was prepared for an expert pool");
    }
    return expert_cache_->SwitchToUpdatedFile(*update->directory, update->experts);
  }
  for (DecoderExpertUpdate::Write& w : update->writes) {
    if (!w.packed.empty()) {
      std::memcpy(w.target->packed.mutable_group(w.group), w.packed.data(), w.packed.size());
    } else {
      std::memcpy(w.target->data.data() + w.group * static_cast<int64_t>(w.floats.size()),
                  w.floats.data(), w.floats.size() * sizeof(float));
    }
  }
  update->writes.clear();
  return absl::OkStatus();
}

}  // namespace moert::model
