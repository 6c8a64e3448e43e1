// The ggml tensor types a GGUF file can name: ids, block shapes and names, as llama.cpp
// defines them, plus moert's own packed types (moert-pack's output). Dequantization
// lives in format/dequant.h (ggml's types) and backend/packing.h (moert's).
#ifndef MOERT_FORMAT_GGML_TYPES_H_
#define MOERT_FORMAT_GGML_TYPES_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace moert::format {

// Values are the on-disk ids (ggml's `enum ggml_type`); gaps are ids ggml removed.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  // moert extensions, far from ggml's ids: the runtime layouts of kernels/ukernel.h
  // (8-row tiles of 32-column blocks; docs/formats.md, "Runtime formats"), as
  // moert-pack writes routed-expert tensors. Their block shape is the per-row share
  // of a tile block (32 values; 18, 20, 34 and 13 bytes), so sizes compute as for any
  // ggml type; the values cannot be read without the row count (the tiles), so
  // format::Dequantize rejects them: backend::DequantizePackedTensor reads them.
  kMoertW4 = 0x4D0,
  kMoertW4M = 0x4D1,
  kMoertW8 = 0x4D2,
  // 0x4D3 was W4S24's first layout (14 bytes a row-block, 2-bit positions); the reader
  // refuses it by name (kMoertW4S24FirstLayoutId).
  kMoertW4S24 = 0x4D4,
};

// The type id of W4S24's first layout, which no build since reads: GGUF readers answer
// it with an error that says to repack.
inline constexpr uint32_t kMoertW4S24FirstLayoutId = 0x4D3;

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;     // as llama.cpp prints it: "f32", "q4_0", "q4_K"
  uint32_t block_elements;   // values per block (1 for plain types)
  uint32_t block_bytes;      // bytes per block
};

// Traits of a known type id, or nullopt for an id ggml does not define.
std::optional<GgmlTypeTraits> LookupGgmlType(uint32_t id);

// Traits of a valid enum value (always found).
const GgmlTypeTraits& TraitsOf(GgmlType type);

std::string_view GgmlTypeName(GgmlType type);

// Whether `type` is one of moert's packed types (kMoertW4 ... kMoertW4S24), whose
// tensors hold a whole number of 8-row tiles.
bool IsMoertPackedType(GgmlType type);

// Bytes of a row of `elements` values, or nullopt when `elements` is not a whole
// number of blocks or the size overflows.
std::optional<uint64_t> GgmlRowBytes(GgmlType type, uint64_t elements);

}  // namespace moert::format

#endif  // MOERT_FORMAT_GGML_TYPES_H_
