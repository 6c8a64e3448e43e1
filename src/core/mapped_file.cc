// Read-only mmap of a file; errors name the path and the failing call.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoError("cannot mmap", path, err);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // The mapping keeps the file alive.
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size, IdentityFromStat(st)));
}

absl::Status MappedFile::CopyOut(uint64_t offset, std::span<uint8_t> dst) const {
  const auto where = [&] {
    return absl::StrCat("'", path_, "': the mapped bytes at file offset ", offset, " (",
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

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace moert::core
