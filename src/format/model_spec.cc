// Reads ModelSpec from GGUF metadata and checks the model's tensors against it.
#include "format/model_spec.h"

#include <algorithm>
#include <vector>

#include "core/status.h"
#include "core/strings.h"

namespace moert::format {
namespace {

// Caps on hyperparameters: far above any real model, low enough that derived sizes
// (n_embd * n_vocab, n_expert * n_ff ...) cannot overflow 64 bits.
constexpr uint64_t kMaxLayers = 4096;
constexpr uint64_t kMaxWidth = 1u << 20;
constexpr uint64_t kMaxHeads = 4096;
constexpr uint64_t kMaxContext = 1u << 24;
constexpr uint64_t kMaxExperts = 4096;
constexpr uint64_t kMaxVocab = 1u << 24;

class SpecReader {
 public:
  SpecReader(const GgufFile& file, const ArchInfo& arch) : file_(file), arch_(arch) {}

  bool Has(ArchKey key) const { return file_.FindKey(ArchKeyName(arch_, key)) != nullptr; }

  // A required positive integer no larger than `max`. Per-layer arrays are accepted
  // when every layer has the same value.
  absl::StatusOr<uint32_t> Required(ArchKey key, uint64_t max) const {
    std::string name = ArchKeyName(arch_, key);
    if (file_.FindKey(name) == nullptr) {
      return absl::InvalidArgumentError(
          StrCat(file_.name(), ": missing metadata key '", name, "'"));
    }
    return Bounded(name, max);
  }

  // An optional integer; `fallback` when absent.
  absl::StatusOr<uint32_t> Optional(ArchKey key, uint64_t max, uint32_t fallback) const {
    std::string name = ArchKeyName(arch_, key);
    if (file_.FindKey(name) == nullptr) return fallback;
    return Bounded(name, max);
  }

  absl::StatusOr<float> OptionalFloat(ArchKey key, float fallback) const {
    std::string name = ArchKeyName(arch_, key);
    if (file_.FindKey(name) == nullptr) return fallback;
    MOERT_ASSIGN_OR_RETURN(double v, file_.GetFloat(name));
    return static_cast<float>(v);
  }

 private:
  absl::StatusOr<uint32_t> Bounded(const std::string& name, uint64_t max) const {
    const GgufKeyValue* kv = file_.FindKey(name);
    uint64_t value = 0;
    if (kv->value.type == GgufValueType::kArray) {
      MOERT_ASSIGN_OR_RETURN(std::vector<int64_t> values, file_.GetIntArray(name));
      if (values.empty()) {
        return absl::InvalidArgumentError(
            StrCat(file_.name(), ": metadata key '", name, "' is an empty array"));
      }
      if (std::any_of(values.begin(), values.end(),
                      [&](int64_t v) { return v != values[0]; })) {
        return absl::UnimplementedError(StrCat(
            file_.name(), ": metadata key '", name,
            "' differs between layers; per-layer values are not supported"));
      }
      if (values[0] < 0) {
        return absl::InvalidArgumentError(
            StrCat(file_.name(), ": metadata key '", name, "' is negative"));
      }
      value = static_cast<uint64_t>(values[0]);
    } else {
      MOERT_ASSIGN_OR_RETURN(value, file_.GetUint(name));
    }
    if (value > max) {
      return absl::InvalidArgumentError(StrCat(file_.name(), ": metadata key '", name,
                                                     "' = ", value, " exceeds the limit ",
                                                     max));
    }
    return static_cast<uint32_t>(value);
  }

  const GgufFile& file_;
  const ArchInfo& arch_;
};

absl::Status Invalid(const GgufFile& file, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(file.name(), ": ", what));
}

std::string ShapeString(const std::vector<uint64_t>& dims) {
  return StrCat("[", StrJoin(dims, ", "), "]");
}

// Shapes compare without trailing 1s: GGUF writers differ in whether they keep them.
std::vector<uint64_t> Trimmed(std::vector<uint64_t> dims) {
  while (dims.size() > 1 && dims.back() == 1) dims.pop_back();
  return dims;
}

class TensorChecker {
 public:
  explicit TensorChecker(const GgufFile& file) : file_(file) {}

  absl::Status Expect(const std::string& name, std::vector<uint64_t> shape,
                      bool required = true) const {
    const GgufTensorInfo* t = file_.FindTensor(name);
    if (t == nullptr) {
      if (!required) return absl::OkStatus();
      return absl::InvalidArgumentError(
          StrCat(file_.name(), ": missing tensor '", name, "'"));
    }
    if (Trimmed(t->dims) != Trimmed(shape)) {
      return absl::InvalidArgumentError(
          StrCat(file_.name(), ": tensor '", name, "' has shape ",
                       ShapeString(t->dims), ", expected ", ShapeString(shape)));
    }
    return absl::OkStatus();
  }

 private:
  const GgufFile& file_;
};

}  // namespace

absl::StatusOr<ModelSpec> ReadModelSpec(const GgufFile& file) {
  ModelSpec spec;
  auto arch_name = file.GetString("general.architecture");
  if (!arch_name.ok()) {
    if (absl::IsNotFound(arch_name.status())) {
      return Invalid(file, "missing metadata key 'general.architecture'");
    }
    return arch_name.status();
  }
  MOERT_ASSIGN_OR_RETURN(spec.arch, FindArch(*arch_name));
  const ArchInfo& arch = *spec.arch;
  if (file.FindKey("general.name") != nullptr) {
    MOERT_ASSIGN_OR_RETURN(std::string_view name, file.GetString("general.name"));
    spec.name = std::string(name);
  }

  SpecReader keys(file, arch);
  MOERT_ASSIGN_OR_RETURN(spec.n_ctx_train, keys.Required(ArchKey::kContextLength, kMaxContext));
  MOERT_ASSIGN_OR_RETURN(spec.n_embd, keys.Required(ArchKey::kEmbeddingLength, kMaxWidth));
  MOERT_ASSIGN_OR_RETURN(spec.n_layer, keys.Required(ArchKey::kBlockCount, kMaxLayers));
  MOERT_ASSIGN_OR_RETURN(spec.n_head, keys.Required(ArchKey::kHeadCount, kMaxHeads));
  MOERT_ASSIGN_OR_RETURN(spec.n_head_kv,
                         keys.Optional(ArchKey::kHeadCountKv, kMaxHeads, spec.n_head));
  MOERT_ASSIGN_OR_RETURN(spec.n_ff, keys.Optional(ArchKey::kFeedForwardLength, kMaxWidth, 0));
  if (!keys.Has(ArchKey::kRmsEpsilon)) {
    return Invalid(file, StrCat("missing metadata key '",
                                      ArchKeyName(arch, ArchKey::kRmsEpsilon), "'"));
  }
  MOERT_ASSIGN_OR_RETURN(spec.rms_eps, keys.OptionalFloat(ArchKey::kRmsEpsilon, 0));
  if (spec.n_embd == 0 || spec.n_layer == 0 || spec.n_head == 0 || spec.n_head_kv == 0 ||
      spec.n_ctx_train == 0) {
    return Invalid(file, "embedding_length, block_count, head counts and context_length "
                         "must be positive");
  }
  if (spec.n_head % spec.n_head_kv != 0) {
    return Invalid(file, StrCat("head_count ", spec.n_head,
                                      " is not a multiple of head_count_kv ",
                                      spec.n_head_kv));
  }
  if (!(spec.rms_eps > 0.0f && spec.rms_eps < 1.0f)) {
    return Invalid(file, StrCat("RMSNorm epsilon ", spec.rms_eps, " is out of range"));
  }

  uint32_t default_head_dim = spec.n_embd / spec.n_head;
  if (!keys.Has(ArchKey::kKeyLength) && spec.n_embd % spec.n_head != 0) {
    return Invalid(file, StrCat("embedding_length ", spec.n_embd,
                                      " is not a multiple of head_count ", spec.n_head,
                                      " and attention.key_length is absent"));
  }
  MOERT_ASSIGN_OR_RETURN(spec.head_dim_k,
                         keys.Optional(ArchKey::kKeyLength, kMaxWidth, default_head_dim));
  MOERT_ASSIGN_OR_RETURN(spec.head_dim_v,
                         keys.Optional(ArchKey::kValueLength, kMaxWidth, spec.head_dim_k));
  MOERT_ASSIGN_OR_RETURN(spec.n_rot,
                         keys.Optional(ArchKey::kRopeDimensionCount, kMaxWidth, spec.head_dim_k));
  if (spec.head_dim_k == 0 || spec.head_dim_v == 0 || spec.n_rot > spec.head_dim_k ||
      spec.n_rot % 2 != 0) {
    return Invalid(file, StrCat("inconsistent head dimensions: key ", spec.head_dim_k,
                                      ", value ", spec.head_dim_v, ", rope ", spec.n_rot));
  }

  MOERT_ASSIGN_OR_RETURN(spec.rope_theta, keys.OptionalFloat(ArchKey::kRopeFreqBase, 10000.0f));
  if (!(spec.rope_theta > 0.0f)) {
    return Invalid(file, StrCat("rope.freq_base ", spec.rope_theta, " must be positive"));
  }
  std::string scaling_key = ArchKeyName(arch, ArchKey::kRopeScalingType);
  if (file.FindKey(scaling_key) != nullptr) {
    MOERT_ASSIGN_OR_RETURN(std::string_view scaling, file.GetString(scaling_key));
    if (scaling == "none") {
      spec.rope_scaling = RopeScaling::kNone;
    } else if (scaling == "linear") {
      spec.rope_scaling = RopeScaling::kLinear;
    } else if (scaling == "yarn") {
      spec.rope_scaling = RopeScaling::kYarn;
    } else {
      return absl::UnimplementedError(StrCat(file.name(), ": ", scaling_key, " '",
                                                   scaling, "' is not supported"));
    }
  }
  MOERT_ASSIGN_OR_RETURN(spec.rope_scaling_factor,
                         keys.OptionalFloat(ArchKey::kRopeScalingFactor, 1.0f));
  if (spec.rope_scaling_factor == 0.0f) spec.rope_scaling_factor = 1.0f;  // llama.cpp: 0 = off
  if (!(spec.rope_scaling_factor > 0.0f)) {
    return Invalid(file, "rope.scaling.factor must be positive");
  }
  MOERT_ASSIGN_OR_RETURN(spec.rope_orig_ctx, keys.Optional(ArchKey::kRopeScalingOrigContext,
                                                           kMaxContext, spec.n_ctx_train));

  // Mixture of experts.
  MOERT_ASSIGN_OR_RETURN(spec.n_expert, keys.Optional(ArchKey::kExpertCount, kMaxExperts, 0));
  if (spec.n_expert > 0 && !arch.may_have_experts) {
    return Invalid(file, StrCat("architecture '", arch.name,
                                      "' does not support experts, but expert_count is ",
                                      spec.n_expert));
  }
  if (spec.n_expert == 0 && arch.requires_experts) {
    return Invalid(file, StrCat("architecture '", arch.name, "' needs ",
                                      ArchKeyName(arch, ArchKey::kExpertCount), " > 0"));
  }
  if (spec.is_moe()) {
    MOERT_ASSIGN_OR_RETURN(spec.n_expert_used,
                           keys.Required(ArchKey::kExpertUsedCount, kMaxExperts));
    if (spec.n_expert_used == 0 || spec.n_expert_used > spec.n_expert) {
      return Invalid(file, StrCat("expert_used_count ", spec.n_expert_used,
                                        " must be in [1, expert_count ", spec.n_expert, "]"));
    }
    // Mixtral-style llama files give the expert width as feed_forward_length.
    MOERT_ASSIGN_OR_RETURN(spec.n_ff_expert, keys.Optional(ArchKey::kExpertFeedForwardLength,
                                                           kMaxWidth, spec.n_ff));
    if (spec.n_ff_expert == 0) {
      const GgufTensorInfo* gate = file.FindTensor(TensorWeightName(TensorKind::kFfnGateExps, 0));
      if (gate != nullptr && gate->dims.size() >= 2 && gate->dims[1] <= kMaxWidth) {
        spec.n_ff_expert = static_cast<uint32_t>(gate->dims[1]);
      } else {
        return Invalid(file, StrCat("missing metadata key '",
                                          ArchKeyName(arch, ArchKey::kExpertFeedForwardLength),
                                          "'"));
      }
    }
    if (arch.shared_expert) {
      const GgufTensorInfo* shared =
          file.FindTensor(TensorWeightName(TensorKind::kFfnGateShexp, 0));
      uint32_t fallback = (shared != nullptr && shared->dims.size() >= 2 &&
                           shared->dims[1] <= kMaxWidth)
                              ? static_cast<uint32_t>(shared->dims[1])
                              : 0;
      MOERT_ASSIGN_OR_RETURN(
          spec.n_ff_shared_expert,
          keys.Optional(ArchKey::kExpertSharedFeedForwardLength, kMaxWidth, fallback));
      if (spec.n_ff_shared_expert == 0) {
        return Invalid(file, "the shared expert's width is unknown (no "
                             "expert_shared_feed_forward_length and no ffn_gate_shexp)");
      }
    }
    spec.renormalize_topk = arch.renormalize_topk;
    std::string norm_key = ArchKeyName(arch, ArchKey::kExpertWeightsNorm);
    if (file.FindKey(norm_key) != nullptr) {
      MOERT_ASSIGN_OR_RETURN(spec.renormalize_topk, file.GetBool(norm_key));
    }
  } else if (spec.n_ff == 0) {
    return Invalid(file, StrCat("missing metadata key '",
                                      ArchKeyName(arch, ArchKey::kFeedForwardLength), "'"));
  }

  // Vocabulary size: the explicit key, else the embedding's rows, else the tokens.
  const GgufTensorInfo* embd = file.FindTensor(TensorWeightName(TensorKind::kTokenEmbd));
  if (keys.Has(ArchKey::kVocabSize)) {
    MOERT_ASSIGN_OR_RETURN(spec.n_vocab, keys.Required(ArchKey::kVocabSize, kMaxVocab));
  } else if (embd != nullptr && embd->dims.size() == 2 && embd->dims[1] <= kMaxVocab) {
    spec.n_vocab = static_cast<uint32_t>(embd->dims[1]);
  } else if (const GgufKeyValue* tokens = file.FindKey("tokenizer.ggml.tokens");
             tokens != nullptr && tokens->value.type == GgufValueType::kArray &&
             tokens->value.array_size <= kMaxVocab) {
    spec.n_vocab = static_cast<uint32_t>(tokens->value.array_size);
  }
  if (spec.n_vocab == 0) return Invalid(file, "cannot tell the vocabulary size");
  spec.tied_embeddings = file.FindTensor(TensorWeightName(TensorKind::kOutput)) == nullptr;

  MOERT_RETURN_IF_ERROR(CheckModelTensors(spec, file));
  return spec;
}

absl::Status CheckModelTensors(const ModelSpec& spec, const GgufFile& file) {
  const ArchInfo& arch = *spec.arch;
  TensorChecker check(file);
  const uint64_t embd = spec.n_embd;
  const uint64_t q_width = uint64_t{spec.n_head} * spec.head_dim_k;
  const uint64_t k_width = uint64_t{spec.n_head_kv} * spec.head_dim_k;
  const uint64_t v_width = uint64_t{spec.n_head_kv} * spec.head_dim_v;
  const uint64_t o_width = uint64_t{spec.n_head} * spec.head_dim_v;

  MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kTokenEmbd), {embd, spec.n_vocab}));
  MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kOutputNorm), {embd}));
  MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kOutput), {embd, spec.n_vocab},
                                     /*required=*/false));
  for (int il = 0; il < static_cast<int>(spec.n_layer); ++il) {
    if (spec.is_moe() && file.FindTensor(StrCat("blk.", il, ".ffn_gate.0.weight"))) {
      return absl::UnimplementedError(StrCat(
          file.name(), ": layer ", il, " stores experts as separate tensors "
          "(blk.N.ffn_gate.E.weight, an old Mixtral layout); re-convert the model with a "
          "current llama.cpp to get stacked ffn_*_exps tensors"));
    }
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnNorm, il), {embd}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnQ, il), {embd, q_width}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnK, il), {embd, k_width}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnV, il), {embd, v_width}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnOut, il), {o_width, embd}));
    // Biases are part of qwen2's layout and optional in llama's.
    MOERT_RETURN_IF_ERROR(check.Expect(TensorBiasName(TensorKind::kAttnQ, il), {q_width}, arch.qkv_bias));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorBiasName(TensorKind::kAttnK, il), {k_width}, arch.qkv_bias));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorBiasName(TensorKind::kAttnV, il), {v_width}, arch.qkv_bias));
    if (arch.qk_norm == QkNorm::kPerHead) {
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnQNorm, il), {spec.head_dim_k}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnKNorm, il), {spec.head_dim_k}));
    } else if (arch.qk_norm == QkNorm::kFullWidth) {
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnQNorm, il), {q_width}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kAttnKNorm, il), {k_width}));
    }
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnNorm, il), {embd}));
    if (!spec.is_moe()) {
      const uint64_t ff = spec.n_ff;
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnGate, il), {embd, ff}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnUp, il), {embd, ff}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnDown, il), {ff, embd}));
      continue;
    }
    const uint64_t ne = spec.n_expert;
    const uint64_t ff = spec.n_ff_expert;
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnGateInp, il), {embd, ne}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnGateExps, il), {embd, ff, ne}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnUpExps, il), {embd, ff, ne}));
    MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnDownExps, il), {ff, embd, ne}));
    if (arch.shared_expert) {
      const uint64_t sff = spec.n_ff_shared_expert;
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnGateInpShexp, il), {embd}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnGateShexp, il), {embd, sff}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnUpShexp, il), {embd, sff}));
      MOERT_RETURN_IF_ERROR(check.Expect(TensorWeightName(TensorKind::kFfnDownShexp, il), {sff, embd}));
    }
  }
  return absl::OkStatus();
}

}  // namespace moert::format
