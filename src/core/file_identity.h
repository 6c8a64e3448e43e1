// Which file a path or descriptor is (device, inode, size, modification time), so that
// a reader that keeps a model file open or mapped can tell, before it reads more of
// it, that the file was truncated, rewritten or replaced since it was opened.
#ifndef MOERT_CORE_FILE_IDENTITY_H_
#define MOERT_CORE_FILE_IDENTITY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

struct stat;

namespace moert::core {

struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;

  bool operator==(const FileIdentity&) const = default;
};

// The identity in a stat / fstat result.
FileIdentity IdentityFromStat(const struct stat& st);

// OK when `path` still names the file `was` describes, byte count and modification
// time included. FailedPrecondition naming the path and what changed otherwise (the
// file is gone, another file took its name, it was truncated, grown or rewritten).
absl::Status CheckUnchanged(const std::string& path, const FileIdentity& was);

}  // namespace moert::core

#endif  // MOERT_CORE_FILE_IDENTITY_H_
