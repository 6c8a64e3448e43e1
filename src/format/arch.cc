// The architecture table (after llama.cpp's llama-arch.cpp): names, keys, tensors.
#include "format/arch.h"

#include <array>
#include <vector>

#include "core/strings.h"


namespace moert::format {
namespace {

constexpr std::array kArchs = {
    // arch, name, rope, qk_norm, qkv_bias, may_experts, requires, shared, renorm
    ArchInfo{Arch::kLlama, "llama", RopeLayout::kNormal, QkNorm::kNone, false, true, false,
             false, true},
    ArchInfo{Arch::kQwen2, "qwen2", RopeLayout::kNeox, QkNorm::kNone, true, false, false,
             false, false},
    ArchInfo{Arch::kQwen2Moe, "qwen2moe", RopeLayout::kNeox, QkNorm::kNone, true, true, true,
             true, false},
    ArchInfo{Arch::kQwen3, "qwen3", RopeLayout::kNeox, QkNorm::kPerHead, false, false, false,
             false, false},
    ArchInfo{Arch::kQwen3Moe, "qwen3moe", RopeLayout::kNeox, QkNorm::kPerHead, false, true,
             true, false, true},
    ArchInfo{Arch::kOlmoe, "olmoe", RopeLayout::kNeox, QkNorm::kFullWidth, false, true, true,
             false, false},
};

std::string_view KeySuffix(ArchKey key) {
  switch (key) {
    case ArchKey::kContextLength: return "context_length";
    case ArchKey::kEmbeddingLength: return "embedding_length";
    case ArchKey::kBlockCount: return "block_count";
    case ArchKey::kFeedForwardLength: return "feed_forward_length";
    case ArchKey::kHeadCount: return "attention.head_count";
    case ArchKey::kHeadCountKv: return "attention.head_count_kv";
    case ArchKey::kKeyLength: return "attention.key_length";
    case ArchKey::kValueLength: return "attention.value_length";
    case ArchKey::kRmsEpsilon: return "attention.layer_norm_rms_epsilon";
    case ArchKey::kRopeFreqBase: return "rope.freq_base";
    case ArchKey::kRopeDimensionCount: return "rope.dimension_count";
    case ArchKey::kRopeScalingType: return "rope.scaling.type";
    case ArchKey::kRopeScalingFactor: return "rope.scaling.factor";
    case ArchKey::kRopeScalingOrigContext: return "rope.scaling.original_context_length";
    case ArchKey::kExpertCount: return "expert_count";
    case ArchKey::kExpertUsedCount: return "expert_used_count";
    case ArchKey::kExpertFeedForwardLength: return "expert_feed_forward_length";
    case ArchKey::kExpertSharedFeedForwardLength: return "expert_shared_feed_forward_length";
    case ArchKey::kExpertWeightsNorm: return "expert_weights_norm";
    case ArchKey::kVocabSize: return "vocab_size";
  }
  return "";
}

std::string_view TensorPattern(TensorKind kind) {
  switch (kind) {
    case TensorKind::kTokenEmbd: return "token_embd";
    case TensorKind::kOutputNorm: return "output_norm";
    case TensorKind::kOutput: return "output";
    case TensorKind::kRopeFreqs: return "rope_freqs";
    case TensorKind::kAttnNorm: return "attn_norm";
    case TensorKind::kAttnQ: return "attn_q";
    case TensorKind::kAttnK: return "attn_k";
    case TensorKind::kAttnV: return "attn_v";
    case TensorKind::kAttnOut: return "attn_output";
    case TensorKind::kAttnQNorm: return "attn_q_norm";
    case TensorKind::kAttnKNorm: return "attn_k_norm";
    case TensorKind::kFfnNorm: return "ffn_norm";
    case TensorKind::kFfnGate: return "ffn_gate";
    case TensorKind::kFfnUp: return "ffn_up";
    case TensorKind::kFfnDown: return "ffn_down";
    case TensorKind::kFfnGateInp: return "ffn_gate_inp";
    case TensorKind::kFfnGateExps: return "ffn_gate_exps";
    case TensorKind::kFfnUpExps: return "ffn_up_exps";
    case TensorKind::kFfnDownExps: return "ffn_down_exps";
    case TensorKind::kFfnGateInpShexp: return "ffn_gate_inp_shexp";
    case TensorKind::kFfnGateShexp: return "ffn_gate_shexp";
    case TensorKind::kFfnUpShexp: return "ffn_up_shexp";
    case TensorKind::kFfnDownShexp: return "ffn_down_shexp";
    case TensorKind::kFfnGateDenseFallback: return "ffn_gate_dense_fallback";
    case TensorKind::kFfnUpDenseFallback: return "ffn_up_dense_fallback";
    case TensorKind::kFfnDownDenseFallback: return "ffn_down_dense_fallback";
  }
  return "";
}

}  // namespace

std::span<const ArchInfo> SupportedArchs() { return kArchs; }

absl::StatusOr<const ArchInfo*> FindArch(std::string_view name) {
  for (const ArchInfo& info : kArchs) {
    if (info.name == name) return &info;
  }
  std::vector<std::string_view> names;
  for (const ArchInfo& info : kArchs) names.push_back(info.name);
  return absl::InvalidArgumentError(StrCat("unsupported architecture '", name,
                                                 "' (supported: ", StrJoin(names, ", "),
                                                 ")"));
}

const ArchInfo& InfoOf(Arch arch) {
  for (const ArchInfo& info : kArchs) {
    if (info.arch == arch) return info;
  }
  return kArchs[0];  // Unreachable for a valid enum value.
}

std::string ArchKeyName(const ArchInfo& arch, ArchKey key) {
  return StrCat(arch.name, ".", KeySuffix(key));
}

bool IsPerLayer(TensorKind kind) {
  switch (kind) {
    case TensorKind::kTokenEmbd:
    case TensorKind::kOutputNorm:
    case TensorKind::kOutput:
    case TensorKind::kRopeFreqs:
      return false;
    default:
      return true;
  }
}

std::string TensorBaseName(TensorKind kind, int layer) {
  if (!IsPerLayer(kind)) return std::string(TensorPattern(kind));
  return StrCat("blk.", layer, ".", TensorPattern(kind));
}

std::string TensorWeightName(TensorKind kind, int layer) {
  return StrCat(TensorBaseName(kind, layer), ".weight");
}

std::string TensorBiasName(TensorKind kind, int layer) {
  return StrCat(TensorBaseName(kind, layer), ".bias");
}

}  // namespace moert::format
