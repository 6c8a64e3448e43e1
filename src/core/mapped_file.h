// A read-only memory mapping of a file, or of a byte range inside one (a model stored
// uncompressed in an APK lies at some offset of it); model files are read through this.
//
// A mapping outlives changes to its file: pages past the end of a file truncated
// after it was mapped raise SIGBUS when touched. Code that reads a mapping after the
// model has loaded (the expert loader's mmap mode) copies through CopyOut, which
// answers such a page with a Status, and checks identity() against the path first
// (core/file_identity.h).
#ifndef MOERT_CORE_MAPPED_FILE_H_
#define MOERT_CORE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/file_identity.h"

namespace moert::core {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to an empty span.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  // Maps the `length` bytes of `path` from byte `offset` on (any offset: the mapping
  // starts at the page below it and bytes() is the view). OutOfRange naming the path,
  // the range and the file's size when the range does not lie inside the file.
  static absl::StatusOr<std::unique_ptr<MappedFile>> OpenRange(const std::string& path,
                                                               uint64_t offset, uint64_t length);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Where bytes() starts in the file (0 for Open).
  uint64_t file_offset() const { return file_offset_; }
  // The file as it was when it was mapped.
  const FileIdentity& identity() const { return identity_; }

  // Copies the view's bytes [offset, offset + dst.size()) into dst (core/guarded_copy.h):
  // DataLoss naming the path and the range when it lies outside the mapping or its
  // pages are gone (the file shrank since it was mapped), never SIGBUS.
  absl::Status CopyOut(uint64_t offset, std::span<uint8_t> dst) const;
  // Drops the pages holding the view's bytes [offset, offset + n) from the resident set
  // (madvise MADV_DONTNEED: they stay in the page cache, and a later read maps them
  // again; the bytes never change). For a pass over a large file that should not grow
  // the process's resident set by the file's size. A range past the view is clipped.
  void DropPages(uint64_t offset, uint64_t n) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, const FileIdentity& identity)
      : path_(std::move(path)), data_(data), size_(size), identity_(identity) {}

  std::string path_;
  const uint8_t* data_;  // the view: map_base_ + (file_offset_ - the mapping's file offset)
  size_t size_;
  FileIdentity identity_;
  uint64_t file_offset_ = 0;
  void* map_base_ = nullptr;  // what mmap returned (null: nothing mapped)
  size_t map_bytes_ = 0;
};

}  // namespace moert::core

#endif  // MOERT_CORE_MAPPED_FILE_H_
