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

// What issues the pread modes' reads (kDirect, kBuffered; kMmap copies and has none).
// Both keep up to LoaderOptions::queue_depth chunk reads of a load in flight.
enum class IoEngine {
  kAuto,   // io_uring where the kernel allows it, else kPread
  kUring,  // io_uring (liburing); where the build lacks it or io_uring_queue_init fails
           // (seccomp, an old kernel, kernel.io_uring_disabled), kPread, and the loader
           // says why (Loader::io_engine_fallback_reason)
  kPread,  // pread on queue_depth threads (the loader's I/O thread and queue_depth - 1
           // workers); queue depth 1 is plain sequential preads
};

// "direct", "buffered", "mmap".
std::string_view IoModeName(IoMode mode);
// The mode of a name IoModeName gives; nullopt for anything else.
std::optional<IoMode> ParseIoMode(std::string_view name);
// "auto", "io_uring", "pread".
std::string_view IoEngineName(IoEngine engine);
// The engine of a name IoEngineName gives; nullopt for anything else.
std::optional<IoEngine> ParseIoEngine(std::string_view name);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_IO_MODE_H_
