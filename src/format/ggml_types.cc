// Block shapes of ggml's tensor types (ggml.c's type_traits table) and of moert's
// packed types.
#include "format/ggml_types.h"

#include <array>
#include <limits>

namespace moert::format {
namespace {

constexpr std::array kTraits = {
    GgmlTypeTraits{GgmlType::kF32, "f32", 1, 4},
    GgmlTypeTraits{GgmlType::kF16, "f16", 1, 2},
    GgmlTypeTraits{GgmlType::kQ4_0, "q4_0", 32, 18},
    GgmlTypeTraits{GgmlType::kQ4_1, "q4_1", 32, 20},
    GgmlTypeTraits{GgmlType::kQ5_0, "q5_0", 32, 22},
    GgmlTypeTraits{GgmlType::kQ5_1, "q5_1", 32, 24},
    GgmlTypeTraits{GgmlType::kQ8_0, "q8_0", 32, 34},
    GgmlTypeTraits{GgmlType::kQ8_1, "q8_1", 32, 36},
    GgmlTypeTraits{GgmlType::kQ2_K, "q2_K", 256, 84},
    GgmlTypeTraits{GgmlType::kQ3_K, "q3_K", 256, 110},
    GgmlTypeTraits{GgmlType::kQ4_K, "q4_K", 256, 144},
    GgmlTypeTraits{GgmlType::kQ5_K, "q5_K", 256, 176},
    GgmlTypeTraits{GgmlType::kQ6_K, "q6_K", 256, 210},
    GgmlTypeTraits{GgmlType::kQ8_K, "q8_K", 256, 292},
    GgmlTypeTraits{GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66},
    GgmlTypeTraits{GgmlType::kIQ2_XS, "iq2_xs", 256, 74},
    GgmlTypeTraits{GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98},
    GgmlTypeTraits{GgmlType::kIQ1_S, "iq1_s", 256, 50},
    GgmlTypeTraits{GgmlType::kIQ4_NL, "iq4_nl", 32, 18},
    GgmlTypeTraits{GgmlType::kIQ3_S, "iq3_s", 256, 110},
    GgmlTypeTraits{GgmlType::kIQ2_S, "iq2_s", 256, 82},
    GgmlTypeTraits{GgmlType::kIQ4_XS, "iq4_xs", 256, 136},
    GgmlTypeTraits{GgmlType::kI8, "i8", 1, 1},
    GgmlTypeTraits{GgmlType::kI16, "i16", 1, 2},
    GgmlTypeTraits{GgmlType::kI32, "i32", 1, 4},
    GgmlTypeTraits{GgmlType::kI64, "i64", 1, 8},
    GgmlTypeTraits{GgmlType::kF64, "f64", 1, 8},
    GgmlTypeTraits{GgmlType::kIQ1_M, "iq1_m", 256, 56},
    GgmlTypeTraits{GgmlType::kBF16, "bf16", 1, 2},
    GgmlTypeTraits{GgmlType::kTQ1_0, "tq1_0", 256, 54},
    GgmlTypeTraits{GgmlType::kTQ2_0, "tq2_0", 256, 66},
    GgmlTypeTraits{GgmlType::kMXFP4, "mxfp4", 32, 17},
    // moert's: bytes per row and 32-column block of each layout in kernels/ukernel.h
    // (sizeof(moert_w4_block) / 8 and so on).
    GgmlTypeTraits{GgmlType::kMoertW4, "moert_w4", 32, 18},
    GgmlTypeTraits{GgmlType::kMoertW4M, "moert_w4m", 32, 20},
    GgmlTypeTraits{GgmlType::kMoertW8, "moert_w8", 32, 34},
    GgmlTypeTraits{GgmlType::kMoertW4S24, "moert_w4s24", 32, 13},
};

}  // namespace

std::optional<GgmlTypeTraits> LookupGgmlType(uint32_t id) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& TraitsOf(GgmlType type) {
  for (const GgmlTypeTraits& t : kTraits) {
    if (t.type == type) return t;
  }
  return kTraits[0];  // Unreachable for a valid enum value.
}

std::string_view GgmlTypeName(GgmlType type) { return TraitsOf(type).name; }

bool IsMoertPackedType(GgmlType type) {
  return type == GgmlType::kMoertW4 || type == GgmlType::kMoertW4M ||
         type == GgmlType::kMoertW8 || type == GgmlType::kMoertW4S24;
}

std::optional<uint64_t> GgmlRowBytes(GgmlType type, uint64_t elements) {
  const GgmlTypeTraits& t = TraitsOf(type);
  if (elements % t.block_elements != 0) return std::nullopt;
  uint64_t blocks = elements / t.block_elements;
  if (blocks > std::numeric_limits<uint64_t>::max() / t.block_bytes) return std::nullopt;
  return blocks * t.block_bytes;
}

}  // namespace moert::format
