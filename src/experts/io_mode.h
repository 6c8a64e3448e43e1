// How the expert loader reads the model file (see experts/loader.h).
#ifndef MOERT_EXPERTS_IO_MODE_H_
#define MOERT_EXPERTS_IO_MODE_H_

#include <optional>
#include <string_view>

namespace moert::experts {

enum class IoMode {
  // pread with O_DIRECT (aligned offset, length and buffer): no page cache at all.
  // Where the file system refuses it (EINVAL: tmpfs, some overlayfs), the loader
  // falls back to kBuffered and says so.
  kDirect,
  // pread through the page cache, then posix_fadvise(DONTNEED) on the range, so the
  // page cache neither hides misses nor grows with the model.
  kBuffered,
  // memcpy from a read-only mapping of the file, then madvise(DONTNEED) on the range
  // so the mapped pages leave the process's resident set.
  kMmap,
};

// "direct", "buffered", "mmap".
std::string_view IoModeName(IoMode mode);
// The mode of a name IoModeName gives; nullopt for anything else.
std::optional<IoMode> ParseIoMode(std::string_view name);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_IO_MODE_H_
