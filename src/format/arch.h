// The architecture table: every supported architecture's name, its GGUF metadata
// keys, its tensor names and the facts of its MoE FFN. One place, so the model code
// and the tools never spell a key or a tensor name themselves.
#ifndef MOERT_FORMAT_ARCH_H_
#define MOERT_FORMAT_ARCH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace moert::format {

enum class Arch {
  kLlama,     // dense llama, and Mixtral-style experts in the same layout
  kQwen2,     // dense, q/k/v biases
  kQwen2Moe,  // experts plus a shared expert with a sigmoid gate
  kQwen3,     // dense, per-head q/k RMSNorm
  kQwen3Moe,  // experts, per-head q/k RMSNorm
  kOlmoe,     // experts, q/k RMSNorm over the whole projection
};

// How RoPE rotates: adjacent pairs (llama's GGUF layout) or halves (GPT-NeoX).
enum class RopeLayout { kNormal, kNeox };

// Where the q/k RMSNorm (if any) applies.
enum class QkNorm { kNone, kPerHead, kFullWidth };

// Per-architecture hyperparameter keys: the GGUF key is "<arch>.<suffix>".
enum class ArchKey {
  kContextLength,
  kEmbeddingLength,
  kBlockCount,
  kFeedForwardLength,
  kHeadCount,
  kHeadCountKv,
  kKeyLength,
  kValueLength,
  kRmsEpsilon,
  kRopeFreqBase,
  kRopeDimensionCount,
  kRopeScalingType,
  kRopeScalingFactor,
  kRopeScalingOrigContext,
  kExpertCount,
  kExpertUsedCount,
  kExpertFeedForwardLength,
  kExpertSharedFeedForwardLength,
  kExpertWeightsNorm,
  kVocabSize,
};

// Tensor kinds; the name is "<base>.weight" / "<base>.bias", with "blk.N." in front
// of per-layer ones.
enum class TensorKind {
  kTokenEmbd,
  kOutputNorm,
  kOutput,
  kRopeFreqs,
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOut,
  kAttnQNorm,
  kAttnKNorm,
  kFfnNorm,
  kFfnGate,
  kFfnUp,
  kFfnDown,
  kFfnGateInp,
  kFfnGateExps,
  kFfnUpExps,
  kFfnDownExps,
  kFfnGateInpShexp,
  kFfnGateShexp,
  kFfnUpShexp,
  kFfnDownShexp,
  // A MoE layer's dense fallback FFN (moert-pack --dense-fallback): the routing-
  // frequency-weighted mean of its experts, run instead of them in a degraded mode.
  kFfnGateDenseFallback,
  kFfnUpDenseFallback,
  kFfnDownDenseFallback,
};

struct ArchInfo {
  Arch arch;
  std::string_view name;  // general.architecture
  RopeLayout rope;
  QkNorm qk_norm;
  bool qkv_bias;             // attn_q/k/v carry .bias tensors
  bool may_have_experts;     // routed experts possible (llama: when expert_count > 0)
  bool requires_experts;     // a MoE-only architecture
  bool shared_expert;        // qwen2moe's shared expert with a sigmoid gate
  bool renormalize_topk;     // default: top-k routing weights rescaled to sum to 1
};

// Every supported architecture, in table order.
std::span<const ArchInfo> SupportedArchs();

// The table entry for `name`; InvalidArgument naming it and the supported ones.
absl::StatusOr<const ArchInfo*> FindArch(std::string_view name);
const ArchInfo& InfoOf(Arch arch);

// "<arch>.<suffix>", e.g. "llama.expert_count".
std::string ArchKeyName(const ArchInfo& arch, ArchKey key);

// Base name of a tensor: "token_embd", "blk.3.ffn_gate_exps".
std::string TensorBaseName(TensorKind kind, int layer = -1);
// "<base>.weight" / "<base>.bias".
std::string TensorWeightName(TensorKind kind, int layer = -1);
std::string TensorBiasName(TensorKind kind, int layer = -1);
bool IsPerLayer(TensorKind kind);

}  // namespace moert::format

#endif  // MOERT_FORMAT_ARCH_H_
