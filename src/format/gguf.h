// GGUF (v2 and v3) reader over a memory mapping. Every count, length, dimension and
// offset read from the file is checked and capped; a malformed file yields a Status
// whose message names the key or tensor and the byte offset where reading failed.
// Error codes: DataLoss when the file ends before something it declares (a truncated
// header, string, array or tensor data); InvalidArgument for every other malformed
// value (bad magic or version, a cap exceeded, unknown type, overflow, misalignment,
// overlap, duplicates). Arrays of arrays are parsed (each level capped like any
// array, nesting capped by GgufLimits::max_array_depth); the typed array accessors
// do not decode them.
#ifndef MOERT_FORMAT_GGUF_H_
#define MOERT_FORMAT_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "format/ggml_types.h"

namespace moert::format {

// Value types of GGUF metadata (gguf_type in the spec).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufValueTypeName(GgufValueType type);

// Caps applied while parsing; a file that exceeds one is rejected, not truncated.
struct GgufLimits {
  uint64_t max_tensors = 1u << 16;
  uint64_t max_metadata = 1u << 16;
  uint64_t max_string_bytes = 1u << 20;       // one key or string value
  uint64_t max_array_elements = 1u << 24;     // one metadata array
  uint32_t max_dims = 4;                      // GGML_MAX_DIMS
  uint64_t max_alignment = 1u << 16;
  uint32_t max_array_depth = 4;               // an array is depth 1
};

// One metadata entry. Scalars are decoded at parse time; strings and arrays point
// into the mapping (no copies).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Scalar payloads (valid for the matching `type`).
  uint64_t u64 = 0;  // kUint8/16/32/64 and kBool (0 or 1)
  int64_t i64 = 0;   // kInt8/16/32/64
  double f64 = 0;    // kFloat32/64
  std::string_view str;  // kString
  // kArray: element type, element count and the raw bytes of the elements as they
  // lie in the file (strings inside are length-prefixed and already validated).
  GgufValueType array_type = GgufValueType::kUint8;
  uint64_t array_size = 0;
  std::span<const uint8_t> array_bytes;
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
  uint64_t file_offset = 0;  // where the entry starts in the file
};

struct GgufTensorInfo {
  std::string_view name;
  GgmlType type = GgmlType::kF32;
  // ggml order: dims[0] is the innermost (contiguous) dimension.
  std::vector<uint64_t> dims;
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t offset = 0;       // relative to the data section, as stored
  uint64_t file_offset = 0;  // absolute offset of the data in the file
  uint64_t info_offset = 0;  // where the tensor info starts in the file
};

class GgufFile {
 public:
  // Maps and parses `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path,
                                                        const GgufLimits& limits = {});
  // Maps and parses the GGUF held in the `length` bytes of `path` from `offset` on (a
  // model stored in an APK); tensor offsets stay relative to the GGUF's start.
  static absl::StatusOr<std::unique_ptr<GgufFile>> OpenRange(const std::string& path,
                                                             uint64_t offset, uint64_t length,
                                                             const GgufLimits& limits = {});
  // Parses bytes the caller keeps alive for the lifetime of the result (tests,
  // fuzzing). `name` appears in error messages.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(
      std::span<const uint8_t> bytes, std::string name = "<buffer>",
      const GgufLimits& limits = {});

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& name() const { return name_; }
  // Where the GGUF starts in the file name() (0 but for OpenRange).
  uint64_t file_offset() const { return mapping_ != nullptr ? mapping_->file_offset() : 0; }
  std::span<const uint8_t> bytes() const { return bytes_; }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // nullptr when absent.
  const GgufKeyValue* FindKey(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed accessors. NotFound when the key is absent; InvalidArgument naming the key,
  // the expected and the actual type when the type does not fit. Integer accessors
  // accept any integer type whose value fits the result.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // f32 or f64
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  // Arrays, decoded; the element type must match (ints: any integer type that fits;
  // floats: float32 only).
  absl::StatusOr<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  // The bytes of a tensor's data (already checked to lie inside the file). Empty for
  // a tensor whose range does not lie inside this file (one from another file).
  std::span<const uint8_t> TensorData(const GgufTensorInfo& tensor) const;

 private:
  GgufFile() = default;
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromMapping(
      std::unique_ptr<core::MappedFile> mapping, const std::string& path,
      const GgufLimits& limits);
  absl::Status Parse(const GgufLimits& limits);

  std::unique_ptr<core::MappedFile> mapping_;  // null for FromBuffer
  std::string name_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  // Name -> index into metadata_ / tensors_; the views point into bytes_.
  absl::flat_hash_map<std::string_view, size_t> key_index_;
  absl::flat_hash_map<std::string_view, size_t> tensor_index_;
};

}  // namespace moert::format

#endif  // MOERT_FORMAT_GGUF_H_
