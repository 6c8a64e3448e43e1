// Writes GGUF v3 files (v2 on request): metadata of every value type and tensors with
// their data, laid out byte for byte as llama.cpp and gguf-py write them (the tests
// rewrite the tiny models identically). Dims are written as given. Used by tests,
// moert-pack and the synthetic-model tool.
#ifndef MOERT_FORMAT_GGUF_WRITER_H_
#define MOERT_FORMAT_GGUF_WRITER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::format {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void SetUint8(std::string_view key, uint8_t v);
  void SetInt8(std::string_view key, int8_t v);
  void SetUint16(std::string_view key, uint16_t v);
  void SetInt16(std::string_view key, int16_t v);
  void SetUint32(std::string_view key, uint32_t v);
  void SetInt32(std::string_view key, int32_t v);
  void SetUint64(std::string_view key, uint64_t v);
  void SetInt64(std::string_view key, int64_t v);
  void SetFloat32(std::string_view key, float v);
  void SetFloat64(std::string_view key, double v);
  void SetBool(std::string_view key, bool v);
  void SetString(std::string_view key, std::string_view v);
  void SetStringArray(std::string_view key, const std::vector<std::string>& v);
  void SetFloat32Array(std::string_view key, const std::vector<float>& v);
  void SetInt32Array(std::string_view key, const std::vector<int32_t>& v);
  // Any array: raw little-endian element bytes, written verbatim (not for strings;
  // for kArray the bytes are the nested arrays' encodings).
  void SetArray(std::string_view key, GgufValueType element_type, uint64_t count,
                std::span<const uint8_t> element_bytes);

  // `dims` in ggml order (dims[0] innermost); `data` must hold exactly the tensor's
  // bytes for `type`. Returns InvalidArgument otherwise.
  absl::Status AddTensor(std::string_view name, GgmlType type, std::vector<uint64_t> dims,
                         std::span<const uint8_t> data);

  // Alignment of the data section and of every tensor (general.alignment is written
  // when it differs from the default 32). `alignment` must be a nonzero power of two.
  // SetUint32("general.alignment", v) with such a v sets it too; any other value
  // there is written as given (tests use it for malformed files) and the layout keeps
  // the previous alignment.
  void SetAlignment(uint32_t alignment);

  // The whole file in memory, or written to `path`.
  std::vector<uint8_t> Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> payload;  // encoded value without the key and type
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> data;
  };
  void SetRaw(std::string_view key, GgufValueType type, std::vector<uint8_t> payload);
  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> SerializeMetadata() const;

  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

}  // namespace moert::format

#endif  // MOERT_FORMAT_GGUF_WRITER_H_
