// What every backend shares (see backend.h).
#include "backend/backend.h"

#include <cstring>

#include "core/status.h"
#include "core/strings.h"

namespace moert::backend {

std::string_view WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32:
      return "f32";
    case WeightType::kF16:
      return "f16";
    case WeightType::kW4:
      return "w4";
    case WeightType::kW4M:
      return "w4m";
    case WeightType::kW8:
      return "w8";
    case WeightType::kW4S24:
      return "w4s24";
  }
  return "f32";
}

WeightType WeightTypeOf(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return WeightType::kW4;
    case WeightFormat::kW4M:
      return WeightType::kW4M;
    case WeightFormat::kW8:
      return WeightType::kW8;
    case WeightFormat::kW4S24:
      return WeightType::kW4S24;
  }
  return WeightType::kW8;
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kMatMul:
      return "matmul";
    case Op::kRmsNorm:
      return "rms_norm";
    case Op::kLayerNorm:
      return "layer_norm";
    case Op::kRope:
      return "rope";
    case Op::kAttention:
      return "attention";
    case Op::kFullAttention:
      return "full_attention";
    case Op::kAttentionEntropy:
      return "attention_entropy";
    case Op::kSoftmax:
      return "softmax";
    case Op::kSiluMul:
      return "silu_mul";
    case Op::kGelu:
      return "gelu";
    case Op::kAdd:
      return "add";
    case Op::kAddBias:
      return "add_bias";
    case Op::kTopK:
      return "top_k";
    case Op::kFusedMoe:
      return "fused_moe";
    case Op::kGatherRows:
      return "gather_rows";
    case Op::kMoeCombine:
      return "moe_combine";
    case Op::kStoreHalf:
      return "store_half";
    case Op::kGatedAdd:
      return "gated_add";
    case Op::kStoreKv:
      return "store_kv";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Buffer>> Backend::UploadFloats(std::span<const float> values) {
  if (values.empty()) return std::unique_ptr<Buffer>();
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, Allocate(values.size_bytes()));
  MOERT_RETURN_IF_ERROR(Write(TensorRef(buffer), values.data(), values.size_bytes()));
  return buffer;
}

absl::Status Backend::Unsupported(Op op, WeightType type) const {
  const bool typed = op == Op::kMatMul || op == Op::kFusedMoe;
  return absl::UnimplementedError(StrCat("the ", name(), " backend has no ", OpName(op),
                                         typed ? StrCat(" for ", WeightTypeName(type), " weights")
                                               : std::string()));
}

}  // namespace moert::backend
