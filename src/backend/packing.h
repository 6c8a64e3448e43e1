// Converting weight matrices into the runtime layouts the microkernels read
// (kernels/ukernel.h; docs/formats.md, "Runtime formats"): 8-row tiles of 32-column
// blocks in W4 (symmetric int4), W4M (int4 with an offset), W8 (int8) or W4S24 (2:4
// structured-sparse int4). Lossless where the source allows it (Q4_0 -> W4, Q4_1 ->
// W4M, Q8_0 -> W8); everything else is dequantized and requantized.
#ifndef MOERT_BACKEND_PACKING_H_
#define MOERT_BACKEND_PACKING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "format/ggml_types.h"

namespace moert::backend {

enum class WeightFormat { kW4, kW4M, kW8, kW4S24 };

// "w4", "w4m", "w8", "w4s24".
std::string_view WeightFormatName(WeightFormat format);

// Bytes of a `rows` x `cols` matrix in `format`: ceil(rows / 8) tiles of cols / 32
// blocks. `cols` must be a multiple of 32.
size_t PackedBytes(WeightFormat format, int64_t rows, int64_t cols);

// The layout a GGUF type repacks into best: Q4_0 -> W4; Q4_1, Q4_K -> W4M; any other
// type -> W8 (F32, F16, BF16, Q8_0, Q5_*, Q6_K, ...).
WeightFormat NaturalFormat(format::GgmlType type);

// Whether PackRows can convert `type` (everything format::CanDequantize accepts).
bool CanPack(format::GgmlType type);

// Packs `rows` x `cols` values stored as GGUF rows of `type` (`src`, exactly
// rows * GgmlRowBytes(type, cols) bytes) into `dst` (exactly PackedBytes(target, rows,
// cols) bytes, padding rows included). Lossless for Q4_0 -> W4, Q4_1 -> W4M, Q8_0 ->
// W8. Other conversions dequantize to fp32 and quantize each 32-block: to W8 like
// Q8_0, to W4 like Q4_0, to W4M like Q4_1 (Q4_K -> W4M keeps Q4_K's 32-value
// sub-blocks and rounds their scale and min to fp16). target W4S24 prunes 2:4 by
// magnitude (see PruneW4ToW4S24) after packing as W4. InvalidArgument naming the
// problem for a cols not a multiple of 32 (or of the type's block), wrong buffer sizes,
// a type that cannot be packed.
absl::Status PackRows(format::GgmlType type, std::span<const uint8_t> src, int64_t rows,
                      int64_t cols, WeightFormat target, std::span<uint8_t> dst);

// 2:4 pruning of a W4 matrix: in each group of 4 columns keeps the 2 weights with the
// largest |value| * importance[column] (importance: `cols` non-negative floats, e.g.
// the RMS of the activations that column sees on a calibration text; empty means
// all 1), ties to the lower column; the kept values keep their W4 nibble and scale.
absl::Status PruneW4ToW4S24(std::span<const uint8_t> w4, int64_t rows, int64_t cols,
                            std::span<const float> importance, std::span<uint8_t> dst);

// Rows [row0, row0 + n) of a packed matrix as fp32 (n * cols floats): what the kernels
// multiply by, for the reference path and tests.
absl::Status UnpackRows(WeightFormat format, std::span<const uint8_t> packed, int64_t rows,
                        int64_t cols, int64_t row0, int64_t n, std::span<float> dst);

// The GGUF type each layout reads back into without loss: W4 and W4S24 -> Q4_0 (a
// pruned weight becomes nibble 8, i.e. 0), W4M -> Q4_1, W8 -> Q8_0.
format::GgmlType LosslessGgmlType(WeightFormat format);

// The rows of a packed matrix as GGUF rows of LosslessGgmlType(format) (`dst`: exactly
// rows * GgmlRowBytes(that type, cols) bytes), dequantizing to the same values as
// UnpackRows: the inverse of PackRows' lossless conversions. InvalidArgument for bad
// sizes.
absl::Status UnpackToGgml(WeightFormat format, std::span<const uint8_t> packed, int64_t rows,
                          int64_t cols, std::span<uint8_t> dst);

// moert's GGUF tensor types for the layouts (moert-pack's output; format/ggml_types.h):
// kW4 <-> moert_w4, kW4M <-> moert_w4m, kW8 <-> moert_w8, kW4S24 <-> moert_w4s24.
format::GgmlType PackedTypeOf(WeightFormat format);
// The layout of a moert packed type; nullopt for any other type.
std::optional<WeightFormat> PackedFormatOf(format::GgmlType type);

// The `rows` x `cols` fp32 values (dst: rows * cols floats) of a tensor of one of
// moert's packed types, as a GGUF file holds it (`bytes`: PackedBytes(format, rows,
// cols)). A stacked expert tensor [n_expert][n][cols] with n % 8 == 0 reads as one
// matrix of n_expert * n rows: its experts' tiles follow each other. InvalidArgument
// for another type, a size mismatch or cols not a multiple of 32.
absl::Status DequantizePackedTensor(format::GgmlType type, std::span<const uint8_t> bytes,
                                    int64_t rows, int64_t cols, std::span<float> dst);

}  // namespace moert::backend

#endif  // MOERT_BACKEND_PACKING_H_
