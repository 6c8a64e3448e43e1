// Writes GGUF v3 files (v2 on request): metadata of every value type and tensors with
// their data, laid out byte for byte as llama.cpp and gguf-py write them (the tests
// rewrite the tiny models identically). Dims are written as given. Used by tests,
// moert-pack and the synthetic-model tool; models too large for memory are written
// through a GgufTensorStream, one tensor's data at a time.
#ifndef MOERT_FORMAT_GGUF_WRITER_H_
#define MOERT_FORMAT_GGUF_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::format {

class GgufTensorStream;

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
  // Every metadata entry of `file`, as stored (arrays' element bytes verbatim), except
  // those `skip` (may be empty) says yes to.
  void CopyMetadata(const GgufFile& file,
                    const std::function<bool(std::string_view key)>& skip = {});
  // Removes `key` where it is set (tests and the model fuzzer leave keys out); for
  // general.alignment the layout goes back to the default alignment.
  void Remove(std::string_view key);

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

  // The whole file in memory, or written to `path`. Every tensor needs its data:
  // with a declared tensor (below) WriteFile is FailedPrecondition, and Serialize,
  // which cannot fail, asserts and writes zeros in its place.
  std::vector<uint8_t> Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

  // Streaming, for files larger than memory. DeclareTensor records a tensor's name,
  // type and dims, checked as AddTensor checks them, and leaves its data to the
  // stream OpenStream returns: OpenStream writes the header to `path`, and the
  // stream then takes the data of each declared tensor in declaration order
  // (tensors added with AddTensor may be mixed in; the stream writes their data
  // itself when it gets to them). The file is byte for byte what WriteFile would
  // write had every tensor been added with its data. The writer must outlive the
  // stream and stay unchanged while it is open.
  absl::Status DeclareTensor(std::string_view name, GgmlType type, std::vector<uint64_t> dims);
  absl::StatusOr<std::unique_ptr<GgufTensorStream>> OpenStream(const std::string& path) const;

  // Size in bytes of the file Serialize, WriteFile or a stream produces.
  uint64_t FileSize() const;

 private:
  friend class GgufTensorStream;
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> payload;  // encoded value without the key and type
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> dims;
    uint64_t n_bytes = 0;
    bool declared = false;      // data comes through a GgufTensorStream
    std::vector<uint8_t> data;  // empty when declared
  };
  void SetRaw(std::string_view key, GgufValueType type, std::vector<uint8_t> payload);
  // AddTensor's checks; the tensor's data size in bytes.
  absl::StatusOr<uint64_t> CheckTensor(std::string_view name, GgmlType type,
                                       const std::vector<uint64_t>& dims) const;
  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> SerializeMetadata() const;

  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
};

// The data section of a file being written by GgufWriter::OpenStream.
class GgufTensorStream {
 public:
  GgufTensorStream(const GgufTensorStream&) = delete;
  GgufTensorStream& operator=(const GgufTensorStream&) = delete;
  // Closes the file; without a successful Finish it is left incomplete.
  ~GgufTensorStream();

  // The declared tensor the next Write continues, or "" when none is left.
  std::string_view current_tensor() const;

  // Appends bytes of the current declared tensor; a tensor's data may come in any
  // number of pieces, and a piece may run on into the next declared tensors.
  // InvalidArgument (and nothing written) for bytes past the end of the last
  // declared tensor.
  absl::Status Write(std::span<const uint8_t> bytes);

  // Checks that every tensor was written in full (FailedPrecondition naming the
  // first one short), then flushes and closes the file.
  absl::Status Finish();

 private:
  friend class GgufWriter;
  GgufTensorStream(const GgufWriter& writer, std::string path, std::FILE* file);
  // Writes the padding after a complete tensor and any held tensors that follow.
  absl::Status Advance();
  absl::Status WriteBytes(std::span<const uint8_t> bytes);

  const GgufWriter& writer_;
  std::string path_;
  std::FILE* file_;
  size_t index_ = 0;            // tensor being written
  uint64_t written_ = 0;        // bytes of it written so far
  uint64_t declared_left_ = 0;  // bytes of declared tensors still to come
  absl::Status error_;          // the first write error; later calls repeat it
};

}  // namespace moert::format

#endif  // MOERT_FORMAT_GGUF_WRITER_H_
