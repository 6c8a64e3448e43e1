// The io_uring read engine (liburing; built only where CMake finds it, MOERT_IO_URING):
// one ring of `depth` entries, owned by the thread that runs it (see read_engine.h).
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/strings.h"
#include "experts/read_engine.h"

namespace moert::experts {
namespace {

class UringReadEngine final : public ReadEngine {
 public:
  explicit UringReadEngine(unsigned depth) : depth_(depth) {}
  ~UringReadEngine() override {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  UringReadEngine(const UringReadEngine&) = delete;
  UringReadEngine& operator=(const UringReadEngine&) = delete;

  // 0, or -errno of io_uring_queue_init.
  int Init() {
    const int rc = io_uring_queue_init(depth_, &ring_, 0);
    ready_ = rc == 0;
    return rc;
  }

  using ReadEngine::Run;
  absl::Status Run(std::span<ChunkRead> chunks, const ChunkFinished& on_finished) override {
    finished_.assign(chunks.size(), false);
    if (broken_) {
      ReadWithPreads(chunks, on_finished);
      return absl::OkStatus();
    }
    done_.assign(chunks.size(), 0);
    size_t finished = 0;       // chunks with their result
    const auto finish = [&](size_t i) {
      finished_[i] = true;
      ++finished;
      if (on_finished) on_finished(i);
    };
    size_t next = 0;           // the next chunk never submitted
    unsigned in_flight = 0;    // sqes prepared and not yet completed
    unsigned unsubmitted = 0;  // of which not yet handed to the kernel
    const auto prepare = [&](size_t i) {
      ChunkRead& c = chunks[i];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        // Not expected: the ring has at least depth_ entries and never more than depth_
        // in flight. The rest of the chunk with a pread then.
        const int64_t rest =
            PreadAtLeast(c.fd, c.buf + done_[i], c.want - done_[i],
                         c.need - std::min(c.need, done_[i]), c.offset + done_[i], c.align);
        c.result = rest < 0 ? rest : static_cast<int64_t>(done_[i]) + rest;
        finish(i);
        return;
      }
      io_uring_prep_read(sqe, c.fd, c.buf + done_[i], static_cast<unsigned>(c.want - done_[i]),
                         c.offset + done_[i]);
      io_uring_sqe_set_data64(sqe, i);
      ++in_flight;
      ++unsubmitted;
    };
    while (finished < chunks.size()) {
      while (next < chunks.size() && in_flight < depth_) prepare(next++);
      if (in_flight == 0) continue;  // the last ones were read with preads
      const int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc >= 0) {
        unsubmitted -= std::min<unsigned>(unsubmitted, static_cast<unsigned>(rc));
      } else if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        return Fail(chunks, rc, in_flight - unsubmitted, on_finished);
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
        const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --in_flight;
        ChunkRead& c = chunks[i];
        if (res == -EINTR || res == -EAGAIN) {
          prepare(i);
        } else if (res < 0) {
          c.result = res;
          finish(i);
        } else {
          done_[i] += static_cast<uint64_t>(res);
          // Complete, or the end of the file.
          if (res == 0 || done_[i] >= c.need || done_[i] % c.align != 0) {
            c.result = static_cast<int64_t>(done_[i]);
            finish(i);
          } else {
            prepare(i);  // a short read: the rest
          }
        }
      }
    }
    return absl::OkStatus();
  }

  IoEngine kind() const override { return broken_ ? IoEngine::kPread : IoEngine::kUring; }
  unsigned depth() const override { return depth_; }

 private:
  // The ring failed: waits for the reads the kernel has, so that none lands in a
  // buffer after Run returns, then reads what is left with preads, now and from now on.
  absl::Status Fail(std::span<ChunkRead> chunks, int rc, unsigned submitted,
                    const ChunkFinished& on_finished) {
    broken_ = true;
    for (unsigned k = 0; k < submitted; ++k) {
      io_uring_cqe* cqe = nullptr;
      int wait = io_uring_wait_cqe(&ring_, &cqe);
      while (wait == -EINTR) wait = io_uring_wait_cqe(&ring_, &cqe);
      if (wait != 0) break;
      io_uring_cqe_seen(&ring_, cqe);
    }
    ReadWithPreads(chunks, on_finished);
    return absl::UnavailableError(StrCat("io_uring_enter failed (", std::strerror(-rc),
                                         "); reads go through sequential preads instead"));
  }

  // Every chunk without its result yet, whole (again, where the ring had read some),
  // one pread at a time.
  void ReadWithPreads(std::span<ChunkRead> chunks, const ChunkFinished& on_finished) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (finished_[i]) continue;
      ChunkRead& c = chunks[i];
      c.result = PreadAtLeast(c.fd, c.buf, c.want, c.need, c.offset, c.align);
      finished_[i] = true;
      if (on_finished) on_finished(i);
    }
  }

  const unsigned depth_;
  io_uring ring_{};
  bool ready_ = false;
  bool broken_ = false;
  std::vector<uint64_t> done_;  // per chunk of the batch: bytes in so far
  std::vector<bool> finished_;  // per chunk of the batch: result set (on_finished called)
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReadEngine>> OpenUringReadEngine(unsigned depth) {
  auto engine = std::make_unique<UringReadEngine>(depth);
  const int rc = engine->Init();
  if (rc < 0) {
    return absl::UnavailableError(
        StrCat("io_uring_queue_init(", depth, ") failed: ", std::strerror(-rc),
               rc == -ENOSYS  ? " (the kernel has no io_uring)"
               : rc == -EPERM ? " (refused: seccomp or kernel.io_uring_disabled)"
                              : ""));
  }
  return engine;
}

}  // namespace moert::experts
