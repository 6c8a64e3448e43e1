// The dense fallback FFN moert-pack --dense-fallback writes (see dense_fallback.h).
#include "dense_fallback.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/dequant.h"
#include "format/quantize.h"
#include "model/model.h"

namespace moert::tools {

using format::GgmlType;
using format::TensorKind;

RoutingFrequencies::RoutingFrequencies(int n_layer, int n_expert)
    : n_layer_(n_layer),
      n_expert_(n_expert),
      sums_(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert), 0.0),
      tokens_(static_cast<size_t>(n_layer), 0) {}

void RoutingFrequencies::Observe(int layer, int64_t n, int slots, const int* experts,
                                 const float* weights) {
  if (layer < 0 || layer >= n_layer_) return;
  double* sums = sums_.data() + static_cast<size_t>(layer) * static_cast<size_t>(n_expert_);
  for (int64_t i = 0; i < n * slots; ++i) {
    const int e = experts[i];
    if (e < 0 || e >= n_expert_) continue;  // an empty slot
    sums[e] += weights[i];
  }
  tokens_[static_cast<size_t>(layer)] += n;
}

std::vector<double> RoutingFrequencies::Of(int layer) const {
  const double* sums = sums_.data() + static_cast<size_t>(layer) * static_cast<size_t>(n_expert_);
  double total = 0;
  for (int e = 0; e < n_expert_; ++e) total += sums[e];
  std::vector<double> out(static_cast<size_t>(n_expert_), 1.0 / n_expert_);
  if (!(total > 0)) return out;
  for (int e = 0; e < n_expert_; ++e) out[static_cast<size_t>(e)] = sums[e] / total;
  return out;
}

std::vector<float> RoutingFrequencies::All() const {
  std::vector<float> out;
  out.reserve(sums_.size());
  for (int il = 0; il < n_layer_; ++il) {
    for (double f : Of(il)) out.push_back(static_cast<float>(f));
  }
  return out;
}

absl::StatusOr<RoutingCalibration> MeasureRoutingFrequencies(
    const format::GgufFile& file, std::span<const int32_t> tokens, int n_ctx, int max_chunks,
    int32_t bos, int threads, std::function<void(const model::PerplexityProgress&)> progress) {
  MOERT_ASSIGN_OR_RETURN(format::ModelSpec spec, format::ReadModelSpec(file));
  if (!spec.is_moe()) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": a dense model has no experts to make a dense fallback of"));
  }
  auto frequencies = std::make_shared<RoutingFrequencies>(static_cast<int>(spec.n_layer),
                                                          static_cast<int>(spec.n_expert));
  model::ModelLoadOptions load;
  load.threads = threads;
  load.quantized_kernels = false;
  load.route_observer = [frequencies](int layer, int64_t n, int slots, const int* experts,
                                      const float* weights) {
    frequencies->Observe(layer, n, slots, experts, weights);
  };
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::Load(file, load));
  model::PerplexityOptions ppl;
  ppl.n_ctx = n_ctx;
  ppl.n_batch = n_ctx;
  ppl.max_chunks = max_chunks;
  ppl.bos = bos;
  ppl.progress = std::move(progress);
  MOERT_ASSIGN_OR_RETURN(model::PerplexityResult result,
                         model::ComputePerplexity(*m, tokens, ppl));
  return RoutingCalibration{*frequencies, result};
}

namespace {

// out += weight * expert `e` of the stacked expert tensor `name` (rows x cols each).
absl::Status AddExpert(const format::GgufFile& file, const std::string& name, int64_t e,
                       int64_t rows, int64_t cols, double weight, std::vector<float>* scratch,
                       backend::Matrix* out) {
  const format::GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(StrCat(file.name(), ": no tensor '", name, "'"));
  const uint64_t n = static_cast<uint64_t>(rows * cols);
  const std::optional<uint64_t> bytes = format::GgmlRowBytes(t->type, n);
  const std::span<const uint8_t> data = file.TensorData(*t);
  if (!bytes || data.size() < *bytes * static_cast<uint64_t>(e + 1) ||
      t->n_elements % n != 0 || t->n_elements / n <= static_cast<uint64_t>(e)) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' does not hold expert ",
                                             e, " of ", rows, " x ", cols, " values"));
  }
  scratch->resize(static_cast<size_t>(n));
  absl::Status status = format::Dequantize(
      t->type, data.subspan(static_cast<size_t>(*bytes * static_cast<uint64_t>(e)), *bytes),
      *scratch);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        StrCat(file.name(), ": tensor '", name, "': ", std::string(status.message())));
  }
  const float w = static_cast<float>(weight);
  for (size_t i = 0; i < scratch->size(); ++i) out->data[i] += w * (*scratch)[i];
  return absl::OkStatus();
}

constexpr TensorKind kExpertKinds[3] = {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps,
                                        TensorKind::kFfnDownExps};
constexpr TensorKind kFallbackKinds[3] = {TensorKind::kFfnGateDenseFallback,
                                          TensorKind::kFfnUpDenseFallback,
                                          TensorKind::kFfnDownDenseFallback};

}  // namespace

absl::StatusOr<MeanFfn> MeanExperts(const format::GgufFile& file, const format::ModelSpec& spec,
                                    int layer, std::span<const double> frequencies) {
  const int64_t n_embd = spec.n_embd, n_ff = spec.n_ff_expert, n_expert = spec.n_expert;
  if (static_cast<int64_t>(frequencies.size()) != n_expert) {
    return absl::InvalidArgumentError(StrCat("layer ", layer, ": ", frequencies.size(),
                                             " frequencies for ", n_expert, " experts"));
  }
  MeanFfn mean;
  backend::Matrix* outs[3] = {&mean.gate, &mean.up, &mean.down};
  std::vector<float> scratch;
  for (int k = 0; k < 3; ++k) {
    const bool down = kExpertKinds[k] == TensorKind::kFfnDownExps;
    backend::Matrix& m = *outs[k];
    m.rows = down ? n_embd : n_ff;
    m.cols = down ? n_ff : n_embd;
    m.data.assign(static_cast<size_t>(m.rows * m.cols), 0.0f);
    const std::string name = format::TensorWeightName(kExpertKinds[k], layer);
    for (int64_t e = 0; e < n_expert; ++e) {
      const double f = frequencies[static_cast<size_t>(e)];
      if (f == 0) continue;
      MOERT_RETURN_IF_ERROR(AddExpert(file, name, e, m.rows, m.cols, f, &scratch, &m));
    }
  }
  return mean;
}

GgmlType FallbackType(GgmlType expert_type, int64_t cols) {
  if (cols % 32 != 0) return GgmlType::kF32;
  switch (expert_type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ4_K:
      return GgmlType::kQ4_0;
    default:
      return GgmlType::kQ8_0;
  }
}

absl::StatusOr<std::vector<FallbackTensor>> DenseFallbackTensors(
    const format::GgufFile& file, const format::ModelSpec& spec,
    const RoutingFrequencies& frequencies) {
  std::vector<FallbackTensor> out;
  for (int il = 0; il < static_cast<int>(spec.n_layer); ++il) {
    MOERT_ASSIGN_OR_RETURN(MeanFfn mean, MeanExperts(file, spec, il, frequencies.Of(il)));
    const backend::Matrix* parts[3] = {&mean.gate, &mean.up, &mean.down};
    for (int k = 0; k < 3; ++k) {
      const backend::Matrix& m = *parts[k];
      const format::GgufTensorInfo* experts =
          file.FindTensor(format::TensorWeightName(kExpertKinds[k], il));
      FallbackTensor t;
      t.name = format::TensorWeightName(kFallbackKinds[k], il);
      t.type = FallbackType(experts->type, m.cols);  // MeanExperts found it
      t.dims = {static_cast<uint64_t>(m.cols), static_cast<uint64_t>(m.rows)};
      t.bytes.resize(*format::GgmlRowBytes(t.type, m.data.size()));
      absl::Status status = format::Quantize(t.type, m.data, t.bytes);
      if (!status.ok()) {
        return absl::Status(status.code(), StrCat(t.name, ": ", std::string(status.message())));
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace moert::tools
