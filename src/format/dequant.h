// Dequantization of ggml block formats to float, bit-exact with llama.cpp's
// dequantize_row_* reference functions. docs/formats.md states each block layout.
#ifndef MOERT_FORMAT_DEQUANT_H_
#define MOERT_FORMAT_DEQUANT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "format/ggml_types.h"

namespace moert::format {

// True for the types Dequantize handles: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q8_K, Q4_K, Q5_K, Q6_K (and any others listed in dequant.cc).
bool CanDequantize(GgmlType type);

// Dequantizes dst.size() values of `type` from `src`. `src` must hold exactly
// GgmlRowBytes(type, dst.size()) bytes and dst.size() must be a whole number of
// blocks; otherwise InvalidArgument. Unimplemented for a type CanDequantize rejects.
absl::Status Dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst);

// Sub-block j (0..7, 32 values each) of a Q4_K or Q5_K super-block starting at
// `block`: its values are scale * q - min with these scale (d * sc_j) and min
// (dmin * m_j), as Dequantize computes them. Lets backend/packing.h keep Q4_K's
// sub-blocks when it repacks them.
struct KSubBlockScaleMin {
  float scale;
  float min;
};
KSubBlockScaleMin QKSubBlockScaleMin(const uint8_t* block, size_t j);

}  // namespace moert::format

#endif  // MOERT_FORMAT_DEQUANT_H_
