// stat / fstat into a FileIdentity and the message that says what changed.
#include "core/file_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/strings.h"

namespace moert::core {
namespace {

std::string Changed(const std::string& path, const std::string& what) {
  return StrCat("'", path, "' changed since the model was loaded (", what,
                "): reload the model, or put the original file back");
}

}  // namespace

FileIdentity IdentityFromStat(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                static_cast<int64_t>(st.st_mtim.tv_nsec);
  return id;
}

absl::Status CheckUnchanged(const std::string& path, const FileIdentity& was) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        Changed(path, StrCat("it cannot be opened now: ", std::strerror(errno))));
  }
  const FileIdentity now = IdentityFromStat(st);
  if (now.device != was.device || now.inode != was.inode) {
    return absl::FailedPreconditionError(Changed(path, "another file has taken its name"));
  }
  if (now.size != was.size) {
    return absl::FailedPreconditionError(
        Changed(path, StrCat("it is ", now.size, " bytes now, it was ", was.size)));
  }
  if (now.mtime_ns != was.mtime_ns) {
    return absl::FailedPreconditionError(Changed(path, "it was written to"));
  }
  return absl::OkStatus();
}

}  // namespace moert::core
