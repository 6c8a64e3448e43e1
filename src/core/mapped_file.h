// A read-only memory mapping of a whole file (model files are read through this).
#ifndef MOERT_CORE_MAPPED_FILE_H_
#define MOERT_CORE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace moert::core {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to an empty span.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace moert::core

#endif  // MOERT_CORE_MAPPED_FILE_H_
