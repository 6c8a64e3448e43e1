// Synthetic MoE models: GGUF files with seeded random weights in the exact shape of
// a real MoE model (tiny, OLMoE-1B-7B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B), with the
// real architecture's metadata, tensor names and a small SentencePiece-style
// vocabulary, so every moert tool loads them end to end. moert-synth writes them to
// a file; moert-bench makes one to benchmark a shape without a download.
//
// Weights are a pure function of (seed, tensor name, element index), so a file does
// not depend on the thread count or on how the data is chunked; tensor data is
// generated, quantized and streamed to disk a chunk at a time, so a 90 GB model
// needs a few hundred MB of memory.
#ifndef MOERT_TOOLS_SYNTH_H_
#define MOERT_TOOLS_SYNTH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/arch.h"
#include "format/ggml_types.h"
#include "format/gguf_writer.h"

namespace moert::synth {

// The hyperparameters of a published model's config.json.
struct Shape {
  std::string_view name;
  format::Arch arch;
  uint32_t n_embd;
  uint32_t n_layer;
  uint32_t n_head;
  uint32_t n_head_kv;
  uint32_t n_expert;
  uint32_t n_expert_used;
  uint32_t n_ff_expert;
  uint32_t n_ff_shared_expert;  // 0: none
  uint32_t n_vocab;
  uint32_t n_ctx;
  float rope_theta;
  float rms_eps;
};

std::span<const Shape> Shapes();
// nullptr for a name that is not one of Shapes().
const Shape* FindShape(std::string_view name);
// "tiny, olmoe-1b-7b, ...", for error messages and usage text.
std::string ShapeNames();

// The types matrices can be written in.
std::span<const format::GgmlType> MatrixTypes();
// Case-insensitive ("Q4_0" and "q4_0"); nullopt for a type not in MatrixTypes().
std::optional<format::GgmlType> FindMatrixType(std::string_view name);
std::string MatrixTypeNames();

struct SynthOptions {
  const Shape* shape = nullptr;  // required
  // Matrices (embeddings, attention, experts, output) get this type; norms, biases
  // and the router stay f32, as llama.cpp keeps them. A K type falls back to q5_0
  // (q4_K) or q8_0 (q6_K) for rows that are not a multiple of 256, as
  // llama-quantize does.
  format::GgmlType type = format::GgmlType::kQ4_0;
  uint32_t n_layer = 0;  // only the first n_layer layers; 0: all of the shape's
  uint64_t seed = 1;
  unsigned threads = 1;  // worker threads generating and quantizing
  // A byte-level BPE vocabulary (tokenizer.ggml.model gpt2) instead of the generated
  // SentencePiece-style one; its size must be the shape's n_vocab.
  struct BpeVocab {
    std::string pre = "qwen2";
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
    uint32_t bos = 0;
    uint32_t eos = 0;
  };
  std::optional<BpeVocab> bpe_vocab;
};

// One tensor of the model and how its values are drawn.
struct SynthTensor {
  std::string name;
  std::vector<uint64_t> dims;
  format::GgmlType type;
  float mean;  // values are mean + std * u, u zero-mean, unit-variance, |u| < 3.5
  float std;
  bool matrix = false;  // takes SynthOptions::type (else f32)
  uint64_t n_elements() const;
  uint64_t n_bytes() const;
};

// A model planned but not yet written: its metadata and tensors, sized.
class SynthModel {
 public:
  // InvalidArgument for a missing shape, a type outside MatrixTypes(), n_layer above
  // 4096 or zero threads.
  static absl::StatusOr<SynthModel> Plan(const SynthOptions& options);

  const SynthOptions& options() const { return options_; }
  uint32_t n_layer() const { return options_.n_layer; }  // resolved, never 0
  const std::vector<SynthTensor>& tensors() const { return tensors_; }
  uint64_t n_params() const { return n_params_; }
  uint64_t file_size() const;
  // Matrices whose rows took a fallback type.
  size_t n_fallback() const { return n_fallback_; }
  // "tiny (llama, 4 of 4 layers), q8_0, 21.5M parameters, 22.1 MiB[, fallbacks]".
  std::string Describe() const;

  // Generates, quantizes and writes the file. Errors name the path or the tensor.
  // On error the file is left incomplete (the caller removes it).
  absl::Status Write(const std::string& path) const;

 private:
  SynthModel() = default;

  SynthOptions options_;
  std::vector<SynthTensor> tensors_;
  uint64_t n_params_ = 0;
  size_t n_fallback_ = 0;
  // Metadata set and every tensor declared; the data comes in Write.
  std::unique_ptr<format::GgufWriter> writer_;
};

}  // namespace moert::synth

#endif  // MOERT_TOOLS_SYNTH_H_
