// The expert loader's chunk reads, several in flight: a load's gate/up/down ranges are
// split into chunks (experts/loader.h, LoaderOptions::read_chunk_bytes) and handed to
// a ReadEngine as one batch, which keeps up to its depth of them in flight: through an
// io_uring (liburing) where the build has it and the kernel allows it, else on a small
// pool of pread threads. Flash needs several requests in flight to reach its bandwidth;
// one pread at a time gets its queue-depth-1 figure.
//
// An engine belongs to one thread at a time (the loader's I/O thread): a ring is never
// shared without a lock, and Run is not reentrant.
#ifndef MOERT_EXPERTS_READ_ENGINE_H_
#define MOERT_EXPERTS_READ_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "experts/io_mode.h"

namespace moert::experts {

// One read of a batch: up to `want` bytes of `fd` at `offset` into `buf`, done once
// `need` of them are in (short reads are continued) or the file ends. O_DIRECT wants
// `buf`, `offset` and `want` aligned; the engine passes them on as given.
struct ChunkRead {
  int fd = -1;
  uint8_t* buf = nullptr;
  uint64_t want = 0;
  uint64_t need = 0;  // <= want
  uint64_t offset = 0;
  // O_DIRECT moves whole blocks except where the file ends, so a read that stops off
  // this alignment is the end of the file, not a read to continue (a continuation at an
  // unaligned offset may be refused as EINVAL, which the loader would take for a file
  // system without O_DIRECT). 1: plain reads.
  uint64_t align = 1;
  // After Run: the bytes read (below `need` only where the file ended), or -errno.
  int64_t result = 0;
};

// Called with a chunk's index once its result is final (see ReadEngine::Run).
using ChunkFinished = std::function<void(size_t index)>;

class ReadEngine {
 public:
  virtual ~ReadEngine() = default;
  // Reads every chunk, at most depth() at a time, in no particular order, and returns
  // when all are done (each with its result). Not OK only when the engine itself
  // failed (an io_uring_enter error other than EINTR/EAGAIN/EBUSY): the chunks are then
  // read with preads all the same, the engine is a sequential pread engine from then
  // on, and the status says why.
  //
  // `on_finished` (may be empty) is called on the calling thread exactly once per
  // chunk, after its result is set and its bytes are in, before Run returns: io_uring
  // and sequential preads call it as each chunk completes, so the caller can work on
  // early chunks (hash them) while later ones are still being read; the pread pool
  // calls it for every chunk once the batch is done.
  virtual absl::Status Run(std::span<ChunkRead> chunks, const ChunkFinished& on_finished) = 0;
  absl::Status Run(std::span<ChunkRead> chunks) { return Run(chunks, ChunkFinished()); }
  // kUring or kPread (never kAuto).
  virtual IoEngine kind() const = 0;
  virtual unsigned depth() const = 0;
};

struct OpenedReadEngine {
  std::unique_ptr<ReadEngine> engine;
  // Why the engine is not the one asked for (kUring asked, or kAuto where io_uring is
  // unavailable); empty otherwise.
  std::string fallback_reason;
};

// The engine `wanted` names, `depth` reads deep (0 counts as 1): kUring and kAuto try
// io_uring first and fall back to the pread pool, saying why (a build without
// liburing, io_uring_queue_init's errno: ENOSYS on an old kernel, EPERM under seccomp
// or kernel.io_uring_disabled). Never fails: the pread pool needs no kernel support.
OpenedReadEngine OpenReadEngine(IoEngine wanted, unsigned depth);

// Reads until `need` bytes are in (asking for up to `want`) or the file ends (a read
// that stops off `align`, see ChunkRead::align); EINTR is retried. Returns the bytes
// read, or -errno.
int64_t PreadAtLeast(int fd, uint8_t* buf, uint64_t want, uint64_t need, uint64_t offset,
                     uint64_t align = 1);

#ifdef MOERT_HAVE_IO_URING
// The io_uring engine (read_engine_uring.cc, built with liburing only): Unavailable
// naming io_uring_queue_init's errno where the kernel refuses a ring.
absl::StatusOr<std::unique_ptr<ReadEngine>> OpenUringReadEngine(unsigned depth);
#endif

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_READ_ENGINE_H_
