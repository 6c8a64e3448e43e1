// ModelSpec: the hyperparameters of a model, read from GGUF metadata through the
// architecture table, with clear errors for a missing key, an unsupported
// architecture or values that cannot describe a working model.
#ifndef MOERT_FORMAT_MODEL_SPEC_H_
#define MOERT_FORMAT_MODEL_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/arch.h"
#include "format/gguf.h"

namespace moert::format {

enum class RopeScaling { kNone, kLinear, kYarn };

struct ModelSpec {
  const ArchInfo* arch = nullptr;
  std::string name;  // general.name, may be empty

  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim_k = 0;  // attention.key_length, or n_embd / n_head
  uint32_t head_dim_v = 0;
  uint32_t n_ff = 0;        // dense FFN width (0 for MoE-only models)
  float rms_eps = 0;

  float rope_theta = 10000.0f;
  uint32_t n_rot = 0;       // rope.dimension_count, or head_dim_k
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;
  uint32_t rope_orig_ctx = 0;

  // Mixture of experts (n_expert == 0: dense).
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_ff_expert = 0;
  uint32_t n_ff_shared_expert = 0;  // qwen2moe
  bool renormalize_topk = false;

  bool tied_embeddings = false;  // no output.weight: the lm head is token_embd

  bool is_moe() const { return n_expert > 0; }
};

// Reads the spec from `file`'s metadata and checks the tensors it implies exist
// with consistent shapes (CheckModelTensors).
absl::StatusOr<ModelSpec> ReadModelSpec(const GgufFile& file);

// Checks every tensor the spec needs is present with the expected shape; the error
// names the tensor, its shape and the expected one.
absl::Status CheckModelTensors(const ModelSpec& spec, const GgufFile& file);

}  // namespace moert::format

#endif  // MOERT_FORMAT_MODEL_SPEC_H_
