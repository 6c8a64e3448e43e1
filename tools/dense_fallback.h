// moert-pack --dense-fallback: the routing frequencies of a calibration text and, per
// MoE layer, one dense FFN whose gate/up/down are the frequency-weighted mean of the
// layer's experts, quantized (docs/degrade-fallback.md). A library so that the tests
// can recompute what the tool wrote.
#ifndef MOERT_TOOLS_DENSE_FALLBACK_H_
#define MOERT_TOOLS_DENSE_FALLBACK_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/matrix.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/perplexity.h"

namespace moert::tools {

// The frequencies moert-pack stored: n_layer * n_expert floats, layer-major.
inline constexpr char kDenseFallbackFrequencyKey[] = "moert.dense_fallback.frequency";
// The calibration text's file name.
inline constexpr char kDenseFallbackCalibrationKey[] = "moert.dense_fallback.calibration";

// How much each expert of each layer contributes over a text. Weighted by the router's
// weights, not by counts: a layer's output is sum_k w_k * expert_k(x), so an expert's
// share of the output is the sum of its weights; an expert picked often as a weak
// second choice counts for less than one picked as often with most of the weight.
class RoutingFrequencies {
 public:
  RoutingFrequencies(int n_layer, int n_expert);

  // ModelLoadOptions::route_observer's arguments: n tokens of `slots` (expert,
  // weight) pairs each; an expert of -1 is an empty slot.
  void Observe(int layer, int64_t n, int slots, const int* experts, const float* weights);

  // Layer `layer`'s frequencies: per expert its summed weight over the sum for all
  // experts (they sum to 1); uniform when no token reached the layer.
  std::vector<double> Of(int layer) const;
  // Every layer's, layer-major (kDenseFallbackFrequencyKey's layout).
  std::vector<float> All() const;
  // Tokens routed through `layer`.
  int64_t tokens(int layer) const { return tokens_[static_cast<size_t>(layer)]; }
  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }

 private:
  int n_layer_, n_expert_;
  std::vector<double> sums_;  // [layer][expert]
  std::vector<int64_t> tokens_;
};

// What a calibration run measured.
struct RoutingCalibration {
  RoutingFrequencies frequencies;
  model::PerplexityResult perplexity;  // of the model over the text
};

// Runs `tokens` through `file`'s model on the fp32 reference path, in perplexity
// chunks of n_ctx tokens (the first max_chunks; 0: all, model::ComputePerplexity),
// and counts the routing of every position. `progress` as ComputePerplexity's.
absl::StatusOr<RoutingCalibration> MeasureRoutingFrequencies(
    const format::GgufFile& file, std::span<const int32_t> tokens, int n_ctx, int max_chunks,
    int32_t bos, int threads,
    std::function<void(const model::PerplexityProgress&)> progress = {});

// The fp32 frequency-weighted mean of layer `layer`'s routed experts: gate and up
// n_ff_expert x n_embd, down n_embd x n_ff_expert (row-major, as Matrix holds them).
struct MeanFfn {
  backend::Matrix gate, up, down;
};
absl::StatusOr<MeanFfn> MeanExperts(const format::GgufFile& file, const format::ModelSpec& spec,
                                    int layer, std::span<const double> frequencies);

// The type the fallback of an expert tensor of type `expert_type` with rows of `cols`
// values is written in: Q4_0 for 4-bit experts, Q8_0 for the rest, F32 for rows that
// are not whole 32-value blocks.
format::GgmlType FallbackType(format::GgmlType expert_type, int64_t cols);

// One tensor to write: name, type, ggml dims (columns first) and its bytes.
struct FallbackTensor {
  std::string name;
  format::GgmlType type = format::GgmlType::kF32;
  std::vector<uint64_t> dims;
  std::vector<uint8_t> bytes;
};

// The three fallback tensors of every MoE layer (format::TensorKind::kFfn*DenseFallback),
// each the MeanExperts matrix quantized to FallbackType of its expert tensor's type.
absl::StatusOr<std::vector<FallbackTensor>> DenseFallbackTensors(
    const format::GgufFile& file, const format::ModelSpec& spec,
    const RoutingFrequencies& frequencies);

}  // namespace moert::tools

#endif  // MOERT_TOOLS_DENSE_FALLBACK_H_
