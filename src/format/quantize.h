// Reference quantization of float values to ggml block formats, byte for byte what
// llama.cpp's quantize_row_*_ref functions write (and so what llama-quantize writes
// without an importance matrix). The inverse of format/dequant.h; used to make test
// models and by the synthetic-model tool, not on any hot path.
#ifndef MOERT_FORMAT_QUANTIZE_H_
#define MOERT_FORMAT_QUANTIZE_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "format/ggml_types.h"

namespace moert::format {

// True for the types Quantize writes: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K and Q6_K.
bool CanQuantize(GgmlType type);

// Quantizes the values of `src` to `type` into `dst`. src.size() must be a whole
// number of blocks and `dst` exactly GgmlRowBytes(type, src.size()) bytes; every
// value must be finite (llama.cpp's result for NaN or infinity is undefined).
// InvalidArgument otherwise, naming the type and the sizes; Unimplemented for a
// type CanQuantize rejects.
absl::Status Quantize(GgmlType type, std::span<const float> src, std::span<uint8_t> dst);

}  // namespace moert::format

#endif  // MOERT_FORMAT_QUANTIZE_H_
