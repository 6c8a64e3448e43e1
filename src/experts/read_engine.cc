// The pread engine (the calling thread and depth - 1 workers taking chunks of a batch)
// and the choice between it and io_uring (see read_engine.h).
#include "experts/read_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/strings.h"
#include "telemetry/trace.h"

namespace moert::experts {

int64_t PreadAtLeast(int fd, uint8_t* buf, uint64_t want, uint64_t need, uint64_t offset,
                     uint64_t align) {
  uint64_t done = 0;
  while (done < need) {
    const ssize_t n = ::pread(fd, buf + done, want - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -static_cast<int64_t>(errno);
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
    if (done % align != 0) break;
  }
  return static_cast<int64_t>(done);
}

namespace {

void ReadChunk(ChunkRead& chunk) {
  chunk.result =
      PreadAtLeast(chunk.fd, chunk.buf, chunk.want, chunk.need, chunk.offset, chunk.align);
}

// Depth 1 has no workers: plain sequential preads on the calling thread.
class PreadReadEngine final : public ReadEngine {
 public:
  explicit PreadReadEngine(unsigned depth) : depth_(depth) {
    for (unsigned i = 1; i < depth; ++i) {
      workers_.emplace_back([this] { WorkerMain(); });
    }
  }

  ~PreadReadEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  using ReadEngine::Run;
  absl::Status Run(std::span<ChunkRead> chunks, const ChunkFinished& on_finished) override {
    if (workers_.empty() || chunks.size() <= 1) {
      for (size_t i = 0; i < chunks.size(); ++i) {
        ReadChunk(chunks[i]);
        if (on_finished) on_finished(i);
      }
      return absl::OkStatus();
    }
    std::unique_lock<std::mutex> lock(mu_);
    batch_ = chunks;
    next_ = 0;
    pending_ = chunks.size();
    lock.unlock();
    work_cv_.notify_all();
    lock.lock();
    // The caller takes chunks too: depth threads in all.
    while (next_ < batch_.size()) TakeOne(lock);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    batch_ = {};
    next_ = 0;
    lock.unlock();
    if (on_finished) {
      for (size_t i = 0; i < chunks.size(); ++i) on_finished(i);
    }
    return absl::OkStatus();
  }

  IoEngine kind() const override { return IoEngine::kPread; }
  unsigned depth() const override { return depth_; }

 private:
  // Reads the next chunk of the batch (mu_ held on entry and on return).
  void TakeOne(std::unique_lock<std::mutex>& lock) {
    ChunkRead& chunk = batch_[next_++];
    lock.unlock();
    ReadChunk(chunk);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_all();
  }

  void WorkerMain() {
    telemetry::SetTraceThreadName("moert-loader-pread");
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&] { return stop_ || next_ < batch_.size(); });
      if (stop_) return;
      TakeOne(lock);
    }
  }

  const unsigned depth_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // workers: a batch with chunks left, or stop
  std::condition_variable done_cv_;  // Run: the batch's last chunk is done
  std::span<ChunkRead> batch_;
  size_t next_ = 0;     // the batch's next chunk nobody has taken
  size_t pending_ = 0;  // the batch's chunks not done
  bool stop_ = false;
};

}  // namespace

OpenedReadEngine OpenReadEngine(IoEngine wanted, unsigned depth) {
  depth = std::max(depth, 1u);
  OpenedReadEngine opened;
  if (wanted != IoEngine::kPread) {
#ifdef MOERT_HAVE_IO_URING
    absl::StatusOr<std::unique_ptr<ReadEngine>> ring = OpenUringReadEngine(depth);
    if (ring.ok()) {
      opened.engine = std::move(*ring);
      return opened;
    }
    opened.fallback_reason = StrCat(std::string(ring.status().message()),
                                    "; reads go through a pool of pread threads instead");
#else
    opened.fallback_reason =
        "moert was built without liburing (MOERT_IO_URING); reads go through a pool of "
        "pread threads instead";
#endif
  }
  opened.engine = std::make_unique<PreadReadEngine>(depth);
  return opened;
}

}  // namespace moert::experts
