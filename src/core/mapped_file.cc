// Read-only mmap of a file; errors name the path and the failing call.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/guarded_copy.h"

namespace moert::core {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  return OpenRange(path, 0, std::numeric_limits<uint64_t>::max());
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::OpenRange(const std::string& path,
                                                                  uint64_t offset,
                                                                  uint64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  const bool whole = offset == 0 && length == std::numeric_limits<uint64_t>::max();
  if (whole) length = file_size;
  if (offset > file_size || length > file_size - offset) {
    ::close(fd);
    return absl::OutOfRangeError(absl::StrCat("'", path, "': the range of ", length,
                                              " bytes at offset ", offset,
                                              " does not lie inside its ", file_size, " bytes"));
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t map_offset = offset / page * page;  // mmap wants a page-aligned offset
  const size_t map_bytes = static_cast<size_t>(length + (offset - map_offset));
  std::unique_ptr<MappedFile> file(new MappedFile(path, nullptr, static_cast<size_t>(length),
                                                  IdentityFromStat(st)));
  file->file_offset_ = offset;
  if (length > 0) {
    void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(map_offset));
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoError("cannot mmap", path, err);
    }
    file->map_base_ = p;
    file->map_bytes_ = map_bytes;
    file->data_ = static_cast<const uint8_t*>(p) + (offset - map_offset);
  }
  ::close(fd);  // The mapping keeps the file alive.
  return file;
}

absl::Status MappedFile::CopyOut(uint64_t offset, std::span<uint8_t> dst) const {
  const auto where = [&] {
    return absl::StrCat("'", path_, "': the mapped bytes at file offset ", file_offset_ + offset, " (",
                        dst.size(), " bytes)");
  };
  if (offset > size_ || dst.size() > size_ - offset) {
    return absl::DataLossError(absl::StrCat(where(), " lie outside the ", size_,
                                            " bytes mapped"));
  }
  if (!CopyFromMapping(dst.data(), data_ + offset, dst.size())) {
    return absl::DataLossError(absl::StrCat(
        where(), " cannot be read (SIGBUS): the file shrank since it was mapped"));
  }
  return absl::OkStatus();
}

void MappedFile::DropPages(uint64_t offset, uint64_t n) const {
  if (offset >= size_ || n == 0) return;
  n = std::min<uint64_t>(n, size_ - offset);
  const long page_long = sysconf(_SC_PAGESIZE);
  const uintptr_t page = page_long > 0 ? static_cast<uintptr_t>(page_long) : 4096;
  // The mapping starts on the page below data_, so rounding down stays inside it.
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_ + offset) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_ + offset + n);
  // Only a hint: on failure the pages just stay.
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (map_base_ != nullptr) ::munmap(map_base_, map_bytes_);
}

}  // namespace moert::core
