// The expert loader: I/O threads (two by default, LoaderOptions::io_threads) over a
// bounded queue, each of which reads an expert's gate/up/down bytes from the model
// file into its own staging buffer, checks them against the expert's checksum and
// writes them into the expert's pool block in the runtime layout (backend::PackRows,
// or a plain copy when the file is already packed).
//
// Reads: IoMode::kDirect reads with O_DIRECT (offset, length and buffer aligned to
// kDirectAlignment); a file system that refuses O_DIRECT (EINVAL at open or at the
// first read: tmpfs, some overlayfs) makes the loader fall back to kBuffered for good,
// and fallback_reason() says why. kBuffered reads through the page cache and then
// drops the range from it (posix_fadvise DONTNEED), so repeated misses really read the
// file. kMmap copies out of a read-only mapping and then drops the mapped pages from
// the resident set (madvise DONTNEED).
//
// In kDirect and kBuffered a load's three parts are split into chunks of
// LoaderOptions::read_chunk_bytes and read together, up to read_queue_depth at a time
// (experts/read_engine.h): through io_uring where the build has liburing and the
// kernel allows a ring, else on a pool of pread threads (LoaderOptions::io_engine;
// io_engine() and io_engine_fallback_reason() say which and why). A Wait that reads
// an expert itself (below) uses plain sequential preads.
//
// Errors reach the waiter as a Status naming the layer, the expert, the tensor and the
// file offset: a short read and a checksum mismatch are DataLoss, an I/O error is
// DataLoss with the errno text. The destination block is then not to be used; the
// loader itself stays usable.
//
// A model file changed while loaded: before every load the loader checks that the path
// still names the file it opened, with the same size and modification time
// (core::CheckUnchanged): a file truncated, rewritten or replaced (renamed over) is
// FailedPrecondition naming it, and loads work again once the original is back. A
// change between that check and the read is a short read (DataLoss naming the file) in
// the pread modes; in kMmap the copy out of the mapping is guarded
// (core::CopyFromMapping), so a page the file lost is DataLoss too, never SIGBUS.
//
// Deadlines: no wait on the I/O thread is longer than LoaderOptions::wait_deadline_ms.
// A Wait whose load has not finished by then takes the load back: a load still queued
// leaves the queue, a read in progress is left to finish and its bytes are dropped
// (they stay in the I/O thread's staging buffer; the destination is written only by
// whoever holds the load, and never after the Wait that gave up on it returns). Wait
// then reads the expert itself on the calling thread, into the same destination, from
// a staging buffer of its own (OnDeadline::kReadHere), or returns DeadlineExceeded
// (OnDeadline::kGiveUp). A load already writing its destination (no I/O left, only
// the copy or repack) is waited for. A Submit that finds the queue full past the
// deadline hands back a load that Wait reads itself. Either is counted
// (LoaderStats::wait_timeouts) and marked in the LoadResult; the bytes are the same
// either way.
//
// Destruction drops the queued loads and waits only for the read in progress, whose
// bytes are dropped too.
//
// Threads: Submit, Done and Wait are called from one owner thread (the expert cache's).
// The destination bytes belong to the loader from Submit until Wait returns. Loads
// start in queue order (with one I/O thread they also end in it), except that urgent
// loads (ones the compute thread waits for) go before queued prefetches, in the order
// they were made urgent. A queued load can be cancelled (a prefetch its layer no longer
// wants).
#ifndef MOERT_EXPERTS_LOADER_H_
#define MOERT_EXPERTS_LOADER_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/file_identity.h"
#include "core/mapped_file.h"
#include "experts/expert_directory.h"
#include "experts/io_mode.h"
#include "experts/read_engine.h"
#include "telemetry/runtime_metrics.h"

namespace moert::experts {

// Alignment of O_DIRECT offsets, lengths and buffers: the largest logical block size
// of common devices.
inline constexpr uint64_t kDirectAlignment = 4096;

// Test hook: a failure the loader pretends to meet on the next load(s) of an expert.
enum class LoaderFault {
  kShortRead,         // the read of the gate part ends early
  kIoError,           // the read of the gate part fails with EIO
  kChecksumMismatch,  // one bit of the gate part flips after reading
  kDirectRefused,     // an O_DIRECT read fails with EINVAL (exercises the fallback)
};

struct LoaderOptions {
  IoMode mode = IoMode::kDirect;
  size_t queue_capacity = 16;  // Submit blocks while this many loads wait
  // kDirect and kBuffered: what issues the reads, how many of a load's chunk reads are
  // in flight at once (0 counts as 1: one read at a time) and how large a chunk is
  // (0: a part in one read; kDirect rounds it up to kDirectAlignment).
  IoEngine io_engine = IoEngine::kAuto;
  unsigned read_queue_depth = 8;
  uint64_t read_chunk_bytes = 256 * 1024;
  // I/O threads, each with its own read engine and staging buffer: how many loads are
  // read, checked and written at once (0 counts as 1). With more than one, loads start
  // in queue order but may finish out of it, and one load's reads overlap another's
  // checksum and copy. 2 by default: on the 2-core development machine 2 decodes 20%
  // faster than 1 with prefetch on and 4% with it off (docs/performance.md).
  unsigned io_threads = 2;
  // The longest a Wait (or a Submit on a full queue) waits for the I/O thread before it
  // reads the expert itself (see the file comment); 0: at once. An expert's read takes
  // a few ms from flash, so this only fires on a stuck or badly contended device.
  uint32_t wait_deadline_ms = 1000;
  // Test hook: called on the I/O thread in each load, after the check of the file and
  // before the reads (not in the reads a Wait makes itself after its deadline): a sleep
  // in it is a slow device, a change to the file in it a change in the middle of a load.
  std::function<void(const ExpertInfo&)> before_read_for_testing = nullptr;
  // Where the bytes read are published (null: a registry of the loader's own).
  std::shared_ptr<telemetry::Registry> metrics = nullptr;
};

// What Wait does with a load that has not finished by the deadline.
enum class OnDeadline {
  kReadHere,  // read the expert on the calling thread (the result says timed_out)
  kGiveUp,    // DeadlineExceeded; the destination holds nothing usable
};

struct LoadResult {
  absl::Status status;
  uint64_t checksum = 0;    // of the file bytes read (when the read itself succeeded)
  uint64_t bytes_read = 0;  // bytes asked of the file system, alignment padding included
  bool timed_out = false;   // the deadline passed: read by the waiter, or given up
};

struct LoaderStats {
  uint64_t loads = 0;         // completed loads, failed ones included
  uint64_t failed_loads = 0;
  uint64_t bytes_read = 0;
  uint64_t busy_ns = 0;       // time the I/O thread spent reading, checking and repacking
  uint64_t wait_timeouts = 0; // waits (Wait, Submit) that passed the deadline
  uint64_t late_reads_dropped = 0;  // loads the I/O thread held when their waiter gave up
                                    // on them: what it read was dropped
  uint64_t queued_dropped = 0;      // loads still queued when the loader was destroyed
};

class Loader {
 public:
  struct Job;  // one queued load
  using Ticket = std::shared_ptr<Job>;

  // Opens the directory's file for `options.mode` (NotFound / PermissionDenied /
  // Internal naming the path; FailedPrecondition when its size is not the one the
  // directory was built from) and starts the I/O thread. `directory` must outlive the
  // loader.
  static absl::StatusOr<std::unique_ptr<Loader>> Create(const ExpertDirectory& directory,
                                                        const LoaderOptions& options);
  // Drops the queued loads (their tickets are dead) and waits for the read in progress.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Queues the load of `info` into `dst` (info.runtime_bytes writable bytes),
  // verified against `expected_checksum` when given. Blocks while the queue is full,
  // unless `urgent`: an urgent load goes in at once, after the urgent loads already
  // queued and before every other (the queue may then hold more than its capacity: the
  // owner waits for its urgent loads). Past the deadline on a full queue, the load is
  // not queued and Wait reads it.
  Ticket Submit(const ExpertInfo& info, uint8_t* dst, std::optional<uint64_t> expected_checksum,
                bool urgent = false);
  // Whether a submitted load has finished (never blocks).
  bool Done(const Ticket& ticket) const;
  // Takes a load that has not started out of the queue: true when it was still queued
  // (the ticket is then dead: never Wait on it, the destination was not touched); false
  // when it has started or finished (Wait for it as usual).
  bool Cancel(const Ticket& ticket);
  // Makes a load that has not started urgent (queued as Submit queues urgent loads);
  // nothing when it has started or is urgent already.
  void Promote(const Ticket& ticket);
  // Waits for a submitted load, at most wait_deadline_ms (then as `on_deadline` says),
  // and returns its result (once per ticket).
  LoadResult Wait(const Ticket& ticket, OnDeadline on_deadline = OnDeadline::kReadHere);
  // Loads queued and not yet started.
  size_t queued() const;
  size_t queue_capacity() const { return queue_capacity_; }

  // Asks the kernel to start reading the expert's bytes (buffered and mmap modes;
  // nothing in direct mode, which bypasses the page cache).
  void AdviseWillNeed(const ExpertInfo& info);

  IoMode requested_mode() const { return requested_mode_; }
  IoMode mode() const;                  // the mode in force (after any fallback)
  std::string fallback_reason() const;  // empty while the requested mode is in force
  // The engine the I/O thread reads with (kUring or kPread); nullopt in kMmap, which
  // copies from a mapping and issues no reads.
  std::optional<IoEngine> io_engine() const;
  // Why io_engine() is not io_uring where kAuto or kUring asked for it; empty else.
  std::string io_engine_fallback_reason() const;
  unsigned read_queue_depth() const { return read_queue_depth_; }
  uint64_t read_chunk_bytes() const { return read_chunk_bytes_; }
  uint64_t staging_bytes() const { return staging_bytes_ * staging_.size(); }  // all threads'
  size_t io_threads() const { return threads_.size(); }
  LoaderStats stats() const;

  // Test hook: the next `times` loads of (layer, expert) meet `fault`.
  void InjectFault(int layer, int expert, LoaderFault fault, int times = 1);
  // Test hook: every load sleeps this long first (a slow flash device); 0: none.
  void set_delay_for_testing(uint64_t delay_us);

 private:
  Loader(const ExpertDirectory& directory, const LoaderOptions& options);

  void ThreadMain(size_t index);  // I/O thread `index`: staging_[index], engines_[index]
  // Checks the file, then reads the job's three parts into `staging` (kExpertParts
  // slots) with `engine` and checks them; `bytes` gets where each part's file bytes
  // are. Any thread: the I/O thread with its staging buffer and engine (io_thread: the
  // test hook runs between the file check and the reads), a Wait past its deadline
  // with its own.
  // (`engine` unused in kMmap).
  LoadResult Read(const Job& job, uint8_t* staging, std::span<uint8_t>* bytes, bool io_thread,
                  ReadEngine* engine);
  // Writes what Read read into the job's destination.
  absl::Status Commit(const Job& job, const std::span<uint8_t>* bytes);
  // Read and Commit on the calling thread (a Wait past its deadline).
  LoadResult ReadHere(const Job& job);
  // kMmap: copies one part's file bytes into the staging slot `slot`; the span is the
  // bytes.
  absl::StatusOr<std::span<uint8_t>> CopyPart(const ExpertInfo& info, const ExpertPart& part,
                                              uint8_t* slot, const LoaderFault* fault,
                                              uint64_t* bytes_read);
  // kDirect, kBuffered: reads the three parts' file bytes into their staging slots in
  // chunks, all through `engine` at once; `bytes` gets where each part's bytes are.
  // `fault` is the gate part's. Switches to buffered reads for good where O_DIRECT is
  // refused, and reads again buffered. The checksum is computed as the chunks come in
  // (in file order, while later chunks are still being read): `checksum` gets it when
  // every part was read in full.
  absl::Status ReadParts(const ExpertInfo& info, uint8_t* staging, const LoaderFault* fault,
                         ReadEngine& engine, std::span<uint8_t>* bytes, uint64_t* bytes_read,
                         std::optional<uint64_t>* checksum);
  void SwitchToBuffered(std::string reason);
  std::optional<LoaderFault> TakeFault(int layer, int expert);
  // Where the next urgent load goes in queue_ (mu_ held).
  std::deque<Ticket>::iterator FirstNotUrgent();

  const ExpertDirectory& directory_;
  const IoMode requested_mode_;
  const size_t queue_capacity_;
  const std::chrono::milliseconds wait_deadline_;
  const std::function<void(const ExpertInfo&)> before_read_;
  const std::shared_ptr<telemetry::Registry> registry_;
  telemetry::LoaderMetrics metrics_;

  // Fixed after Create (read by the I/O thread and by a Wait past its deadline; both
  // descriptors stay open, so a fallback to buffered reads closes none under a read).
  int direct_fd_ = -1;    // kDirect: O_DIRECT
  int buffered_fd_ = -1;  // kDirect and kBuffered
  std::unique_ptr<core::MappedFile> mapping_;  // kMmap
  core::FileIdentity identity_;  // the file as opened
  std::string absolute_path_;    // where it is checked (a later chdir cannot move it)
  // The I/O thread's (mode_ and fallback_reason_ read under mu_).
  std::vector<uint8_t*> staging_;  // one per I/O thread
  uint64_t staging_bytes_ = 0;     // of one
  uint64_t slot_bytes_ = 0;
  std::vector<std::unique_ptr<ReadEngine>> engines_;  // one per I/O thread; none in kMmap
  const unsigned read_queue_depth_;
  const uint64_t read_chunk_bytes_;

  mutable std::mutex mu_;
  IoMode mode_;
  std::string fallback_reason_;
  std::optional<IoEngine> engine_kind_;  // the engines', as the I/O threads last saw them
  std::string engine_fallback_reason_;
  std::condition_variable queue_cv_;  // the thread: work or stop
  std::condition_variable space_cv_;  // Submit: room in the queue
  std::condition_variable done_cv_;   // Wait: a job finished
  std::deque<Ticket> queue_;
  bool stop_ = false;
  std::map<std::pair<int, int>, std::pair<LoaderFault, int>> faults_;
  LoaderStats stats_;
  uint64_t delay_us_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_LOADER_H_
