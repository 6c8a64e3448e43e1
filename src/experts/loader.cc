// The expert loader's I/O thread: chunked reads through a ReadEngine (O_DIRECT,
// buffered) or mapping copy into a staging buffer, checksum, repack into the pool block.
#include "experts/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_format.h"
#include "backend/packing.h"
#include "core/file_identity.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/checksum.h"
#include "telemetry/platform.h"
#include "telemetry/trace.h"

namespace moert::experts {

// Where a load is. The destination is written only in kCommitting (by the I/O thread)
// or after kTakenBack (by the Wait that took it back).
enum class JobState {
  kQueued,      // in queue_
  kReading,     // the I/O thread reads it into its staging buffer
  kCommitting,  // the I/O thread writes the destination
  kDone,        // result is set
  kTakenBack,   // its waiter gave up on the I/O thread: a read in progress is dropped
};

struct Loader::Job {
  const ExpertInfo* info = nullptr;
  uint8_t* dst = nullptr;
  std::optional<uint64_t> expected;
  LoadResult result;
  JobState state = JobState::kQueued;
  bool urgent = false;
  uint64_t trace_id = 0;  // its "expert load" async event, until ended (mu_)
};

namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Who(const ExpertInfo& info) {
  return StrCat("layer ", info.layer, ", expert ", info.expert);
}

std::string Where(const ExpertPart& part, const std::string& path) {
  return StrCat("tensor '", part.tensor, "' at file offset ", part.file_offset, " (",
                part.file_bytes, " bytes) of '", path, "'");
}

absl::Status OpenError(const std::string& path, int err) {
  const std::string message = StrCat("cannot open '", path, "' for expert loads: ",
                                     std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// Chunks above this would not fit an io_uring read's 32-bit length.
constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;

// madvise over the pages holding [bytes, bytes + n) (the view of a mapping need not
// start on a page).
void AdviseMapped(const uint8_t* bytes, uint64_t n, int advice) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes) / page * page;
  ::madvise(reinterpret_cast<void*>(begin), reinterpret_cast<uintptr_t>(bytes) + n - begin,
            advice);
}

using telemetry::NowNs;

constexpr char kLoadEvent[] = "expert load";
constexpr char kLoaderTrack[] = "loader";

// Ends the job's "expert load" async event once (mu_ held).
void EndLoadTrace(Loader::Job& job) {
  telemetry::TraceAsyncEnd(job.trace_id, kLoadEvent, kLoaderTrack);
  job.trace_id = 0;
}

}  // namespace

Loader::Loader(const ExpertDirectory& directory, const LoaderOptions& options)
    : directory_(directory),
      requested_mode_(options.mode),
      queue_capacity_(std::max<size_t>(1, options.queue_capacity)),
      wait_deadline_(options.wait_deadline_ms),
      before_read_(options.before_read_for_testing),
      registry_(telemetry::RegistryOrOwn(options.metrics)),
      metrics_(*registry_),
      read_queue_depth_(std::max(1u, options.read_queue_depth)),
      read_chunk_bytes_(options.read_chunk_bytes == 0
                            ? kMaxChunkBytes
                            : std::min(options.read_chunk_bytes, kMaxChunkBytes)),
      mode_(options.mode) {}

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(const ExpertDirectory& directory,
                                                       const LoaderOptions& options) {
  std::unique_ptr<Loader> loader(new Loader(directory, options));
  const std::string& path = directory.path();
  uint64_t size = 0;
  if (options.mode == IoMode::kMmap) {
    // A model inside a bigger file maps its own bytes only.
    auto mapping = directory.file_offset() == 0
                       ? core::MappedFile::Open(path)
                       : core::MappedFile::OpenRange(path, directory.file_offset(),
                                                     directory.file_size());
    if (!mapping.ok()) return mapping.status();
    loader->mapping_ = std::move(*mapping);
    loader->identity_ = loader->mapping_->identity();
    size = loader->mapping_->size();
  } else {
    loader->buffered_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (loader->buffered_fd_ < 0) return OpenError(path, errno);
    if (options.mode == IoMode::kDirect) {
      loader->direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (loader->direct_fd_ < 0 && errno != EINVAL) return OpenError(path, errno);
      if (loader->direct_fd_ < 0) {
        loader->mode_ = IoMode::kBuffered;
        loader->fallback_reason_ =
            "the file system refuses O_DIRECT (open: EINVAL); buffered reads with "
            "posix_fadvise(DONTNEED) instead";
      }
    }
    struct stat st {};
    if (::fstat(loader->buffered_fd_, &st) != 0) return OpenError(path, errno);
    loader->identity_ = core::IdentityFromStat(st);
    size = static_cast<uint64_t>(st.st_size);
    // The GGUF's bytes only, for a model that starts inside a bigger file.
    size = directory.file_offset() > 0 && size >= directory.file_offset()
               ? std::min<uint64_t>(size - directory.file_offset(), directory.file_size())
               : size;
  }
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  loader->absolute_path_ = error ? path : absolute.string();
  if (size != directory.file_size()) {
    return absl::FailedPreconditionError(StrCat("'", path, "' is ", size,
                                                " bytes now but was ", directory.file_size(),
                                                " when the model was loaded"));
  }
  loader->slot_bytes_ =
      AlignUp(directory.max_part_file_bytes() + 2 * kDirectAlignment, kDirectAlignment);
  loader->staging_bytes_ = loader->slot_bytes_ * kExpertParts;
  const size_t io_threads = std::max(options.io_threads, 1u);
  for (size_t i = 0; i < io_threads; ++i) {
    auto* staging =
        static_cast<uint8_t*>(std::aligned_alloc(kDirectAlignment, loader->staging_bytes_));
    if (staging == nullptr) {
      return absl::ResourceExhaustedError(StrCat("cannot allocate the loader's staging buffer of ",
                                                 loader->staging_bytes_, " bytes"));
    }
    loader->staging_.push_back(staging);
    if (loader->mapping_ == nullptr) {
      OpenedReadEngine opened = OpenReadEngine(options.io_engine, loader->read_queue_depth_);
      loader->engine_kind_ = opened.engine->kind();
      if (i == 0) loader->engine_fallback_reason_ = std::move(opened.fallback_reason);
      loader->engines_.push_back(std::move(opened.engine));
    }
  }
  for (size_t i = 0; i < io_threads; ++i) {
    loader->threads_.emplace_back([l = loader.get(), i] { l->ThreadMain(i); });
  }
  return loader;
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // Nobody waits for these any more; the read in progress is dropped when it ends.
    for (const Ticket& job : queue_) {
      job->state = JobState::kTakenBack;
      EndLoadTrace(*job);
    }
    stats_.queued_dropped += queue_.size();
    queue_.clear();
  }
  queue_cv_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
  for (uint8_t* staging : staging_) std::free(staging);
}

IoMode Loader::mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_;
}

std::string Loader::fallback_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fallback_reason_;
}

std::optional<IoEngine> Loader::io_engine() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_kind_;
}

std::string Loader::io_engine_fallback_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_fallback_reason_;
}

LoaderStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Loader::InjectFault(int layer, int expert, LoaderFault fault, int times) {
  std::lock_guard<std::mutex> lock(mu_);
  if (times <= 0) {
    faults_.erase({layer, expert});
  } else {
    faults_[{layer, expert}] = {fault, times};
  }
}

std::optional<LoaderFault> Loader::TakeFault(int layer, int expert) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = faults_.find({layer, expert});
  if (it == faults_.end()) return std::nullopt;
  const LoaderFault fault = it->second.first;
  if (--it->second.second <= 0) faults_.erase(it);
  return fault;
}

Loader::Ticket Loader::Submit(const ExpertInfo& info, uint8_t* dst,
                              std::optional<uint64_t> expected_checksum, bool urgent) {
  auto job = std::make_shared<Job>();
  job->info = &info;
  job->dst = dst;
  job->expected = expected_checksum;
  job->urgent = urgent;
  // From Submit to the bytes in place (or the load dropped), on the loader's track.
  job->trace_id = telemetry::TraceAsyncBegin(kLoadEvent, kLoaderTrack, "layer", info.layer,
                                             "expert", info.expert);
  std::unique_lock<std::mutex> lock(mu_);
  if (urgent) {
    queue_.insert(FirstNotUrgent(), job);
  } else if (space_cv_.wait_for(lock, wait_deadline_,
                                [&] { return queue_.size() < queue_capacity_; })) {
    queue_.push_back(job);
  } else {
    job->state = JobState::kTakenBack;  // Wait reads it
    ++stats_.wait_timeouts;
    return job;
  }
  lock.unlock();
  queue_cv_.notify_one();
  return job;
}

bool Loader::Done(const Ticket& ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket->state == JobState::kDone;
}

bool Loader::Cancel(const Ticket& ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find(queue_.begin(), queue_.end(), ticket);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  EndLoadTrace(*ticket);
  lock.unlock();
  space_cv_.notify_one();
  return true;
}

void Loader::Promote(const Ticket& ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(queue_.begin(), queue_.end(), ticket);
  if (it == queue_.end() || ticket->urgent) return;
  queue_.erase(it);
  ticket->urgent = true;
  queue_.insert(FirstNotUrgent(), ticket);
}

std::deque<Loader::Ticket>::iterator Loader::FirstNotUrgent() {
  return std::find_if(queue_.begin(), queue_.end(), [](const Ticket& t) { return !t->urgent; });
}

size_t Loader::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void Loader::set_delay_for_testing(uint64_t delay_us) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_us_ = delay_us;
}

LoadResult Loader::Wait(const Ticket& ticket, OnDeadline on_deadline) {
  MOERT_TRACE_SCOPE_ARG("expert wait", "layer", ticket->info->layer);
  std::unique_lock<std::mutex> lock(mu_);
  Job& job = *ticket;
  if (job.state != JobState::kTakenBack) {  // else Submit gave up on the queue already
    done_cv_.wait_for(lock, wait_deadline_, [&] { return job.state == JobState::kDone; });
    // Only the copy or repack into the destination is left: no I/O to wait for.
    done_cv_.wait(lock, [&] { return job.state != JobState::kCommitting; });
    if (job.state == JobState::kDone) return std::move(job.result);
    if (job.state == JobState::kQueued) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
      space_cv_.notify_one();
    }
    job.state = JobState::kTakenBack;  // a read in progress is dropped when it ends
    ++stats_.wait_timeouts;
  }
  lock.unlock();
  LoadResult result;
  if (on_deadline == OnDeadline::kGiveUp) {
    result.status = absl::DeadlineExceededError(
        StrCat(Who(*job.info), ": the load of '", directory_.path(), "' did not finish within ",
               wait_deadline_.count(), " ms; given up"));
  } else {
    result = ReadHere(job);
  }
  {
    std::lock_guard<std::mutex> end_lock(mu_);
    EndLoadTrace(job);
  }
  result.timed_out = true;
  return result;
}

LoadResult Loader::ReadHere(const Job& job) {
  LoadResult result;
  uint8_t* staging = static_cast<uint8_t*>(std::aligned_alloc(kDirectAlignment, staging_bytes_));
  if (staging == nullptr) {
    result.status = absl::ResourceExhaustedError(
        StrCat(Who(*job.info), ": cannot allocate ", staging_bytes_,
               " bytes of staging to read it after the loader's deadline passed"));
    return result;
  }
  std::span<uint8_t> bytes[kExpertParts];
  // Sequential preads: rare, and the I/O thread's engine is its own.
  OpenedReadEngine preads = OpenReadEngine(IoEngine::kPread, 1);
  result = Read(job, staging, bytes, /*io_thread=*/false, preads.engine.get());
  if (result.status.ok()) result.status = Commit(job, bytes);
  std::free(staging);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.loads;
  if (!result.status.ok()) ++stats_.failed_loads;
  stats_.bytes_read += result.bytes_read;
  metrics_.read_bytes.Increment(result.bytes_read);
  return result;
}

void Loader::AdviseWillNeed(const ExpertInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ExpertPart& part : info.parts) {
    if (mode_ == IoMode::kBuffered && buffered_fd_ >= 0) {
      ::posix_fadvise(buffered_fd_, static_cast<off_t>(directory_.file_offset() + part.file_offset),
                      static_cast<off_t>(part.file_bytes), POSIX_FADV_WILLNEED);
    } else if (mode_ == IoMode::kMmap && mapping_ != nullptr) {
      AdviseMapped(mapping_->data() + part.file_offset, part.file_bytes, MADV_WILLNEED);
    }
  }
}

void Loader::ThreadMain(size_t index) {
  telemetry::SetTraceThreadName("moert-loader");
  std::unique_lock<std::mutex> lock(mu_);
  // Whether the job was taken back by its waiter (or the loader is going): mu_ held.
  const auto dropped = [&](const Job& job) { return stop_ || job.state == JobState::kTakenBack; };
  while (true) {
    queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // the destructor dropped the queue
    Ticket job = queue_.front();
    queue_.pop_front();
    job->state = JobState::kReading;
    space_cv_.notify_one();
    const uint64_t delay_us = delay_us_;
    lock.unlock();
    MOERT_TRACE_SCOPE_ARG("expert read", "layer", job->info->layer);
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const uint64_t start = NowNs();
    std::span<uint8_t> bytes[kExpertParts];
    LoadResult result = Read(*job, staging_[index], bytes, /*io_thread=*/true,
                             engines_.empty() ? nullptr : engines_[index].get());
    lock.lock();
    stats_.bytes_read += result.bytes_read;
    metrics_.read_bytes.Increment(result.bytes_read);
    if (dropped(*job)) {
      EndLoadTrace(*job);
      ++stats_.late_reads_dropped;
      stats_.busy_ns += NowNs() - start;
      continue;
    }
    job->state = JobState::kCommitting;
    lock.unlock();
    if (result.status.ok()) result.status = Commit(*job, bytes);
    const uint64_t busy = NowNs() - start;
    lock.lock();
    ++stats_.loads;
    if (!result.status.ok()) ++stats_.failed_loads;
    stats_.busy_ns += busy;
    job->result = std::move(result);
    job->state = JobState::kDone;
    EndLoadTrace(*job);
    done_cv_.notify_all();
  }
}

void Loader::SwitchToBuffered(std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  mode_ = IoMode::kBuffered;
  fallback_reason_ = std::move(reason);
}

namespace {

// A part's error Statuses, naming the expert, the tensor and the file offset.
absl::Status PartIoError(const ExpertInfo& info, const ExpertPart& part, const std::string& path,
                         int err) {
  return absl::DataLossError(
      StrCat(Who(info), ": I/O error reading ", Where(part, path), ": ", std::strerror(err)));
}

absl::Status PartShortRead(const ExpertInfo& info, const ExpertPart& part, const std::string& path,
                           uint64_t got) {
  return absl::DataLossError(StrCat(Who(info), ": short read of ", Where(part, path), ": got ", got,
                                    " of ", part.file_bytes, " bytes (was the file truncated?)"));
}

}  // namespace

absl::StatusOr<std::span<uint8_t>> Loader::CopyPart(const ExpertInfo& info, const ExpertPart& part,
                                                    uint8_t* slot, const LoaderFault* fault,
                                                    uint64_t* bytes_read) {
  const std::string& path = directory_.path();
  if (fault != nullptr && *fault == LoaderFault::kIoError) {
    return PartIoError(info, part, path, EIO);
  }
  *bytes_read += part.file_bytes;
  if (fault != nullptr && *fault == LoaderFault::kShortRead) {
    return PartShortRead(info, part, path, part.file_bytes / 2);
  }
  // Guarded: the file may have lost these pages since the check before this load.
  const absl::Status copied = mapping_->CopyOut(part.file_offset, {slot, part.file_bytes});
  if (!copied.ok()) {
    return absl::DataLossError(
        StrCat(Who(info), ", tensor '", part.tensor, "': ", std::string(copied.message())));
  }
  AdviseMapped(mapping_->data() + part.file_offset, part.file_bytes, MADV_DONTNEED);
  return std::span<uint8_t>(slot, part.file_bytes);
}

absl::Status Loader::ReadParts(const ExpertInfo& info, uint8_t* staging, const LoaderFault* fault,
                               ReadEngine& engine, std::span<uint8_t>* bytes, uint64_t* bytes_read,
                               std::optional<uint64_t>* checksum) {
  checksum->reset();
  const std::string& path = directory_.path();
  if (fault != nullptr && *fault == LoaderFault::kIoError) {
    return PartIoError(info, info.parts[0], path, EIO);
  }
  bool direct;
  {
    std::lock_guard<std::mutex> lock(mu_);
    direct = mode_ == IoMode::kDirect;
  }
  // Where each part is read from: [begin, end) holds its bytes, [begin, want_end) is
  // asked for (O_DIRECT: both ends on the alignment). The GGUF may start inside a
  // bigger file (an APK).
  struct Range {
    uint64_t at, begin, end, want_end;
    size_t first_chunk;
  };
  Range ranges[kExpertParts];
  const uint64_t chunk_bytes =
      direct ? AlignUp(read_chunk_bytes_, kDirectAlignment) : read_chunk_bytes_;
  std::vector<ChunkRead> chunks;
  for (int p = 0; p < kExpertParts; ++p) {
    const ExpertPart& part = info.parts[static_cast<size_t>(p)];
    Range& r = ranges[p];
    r.at = directory_.file_offset() + part.file_offset;
    r.begin = direct ? r.at / kDirectAlignment * kDirectAlignment : r.at;
    r.end = r.at + part.file_bytes;
    r.want_end = direct ? AlignUp(r.end, kDirectAlignment) : r.end;
    r.first_chunk = chunks.size();
    uint8_t* slot = staging + static_cast<uint64_t>(p) * slot_bytes_;
    // Every chunk starts before `end` (want_end is less than an alignment past it).
    for (uint64_t off = r.begin; off < r.want_end; off += chunk_bytes) {
      const uint64_t want = std::min(chunk_bytes, r.want_end - off);
      chunks.push_back({.fd = direct ? direct_fd_ : buffered_fd_,
                        .buf = slot + (off - r.begin),
                        .want = want,
                        .need = std::min(off + want, r.end) - off,
                        .offset = off,
                        .align = direct ? kDirectAlignment : 1});
    }
  }
  // The expert's checksum over the chunks in file order, each hashed as soon as it and
  // every chunk before it are in (ExpertChecksum's chaining: a part's digest seeds the
  // next part's). A chunk that failed or came back short stops it: that load fails.
  size_t next_to_hash = 0;
  int hash_part = 0;
  bool hash_broken = false;
  std::vector<bool> finished(chunks.size(), false);
  XxHash64Stream stream(0);
  const auto hash_ready_chunks = [&](size_t index) {
    finished[index] = true;
    while (!hash_broken && next_to_hash < chunks.size() && finished[next_to_hash]) {
      const ChunkRead& c = chunks[next_to_hash];
      if (c.result < 0 || static_cast<uint64_t>(c.result) < c.need) {
        hash_broken = true;
        break;
      }
      while (hash_part + 1 < kExpertParts && ranges[hash_part + 1].first_chunk <= next_to_hash) {
        stream = XxHash64Stream(stream.Digest());
        ++hash_part;
      }
      // The part's own bytes in this chunk: [max(offset, at), min(offset + need, end)).
      const Range& r = ranges[hash_part];
      const uint64_t from = std::max(c.offset, r.at);
      const uint64_t to = std::min(c.offset + c.need, r.end);
      if (to > from) stream.Update({c.buf + (from - c.offset), to - from});
      ++next_to_hash;
    }
  };
  if (direct && fault != nullptr && *fault == LoaderFault::kDirectRefused) {
    for (ChunkRead& c : chunks) c.result = -int64_t{EINVAL};
  } else {
    const absl::Status ran = engine.Run(chunks, hash_ready_chunks);
    const bool io_thread_engine =
        std::any_of(engines_.begin(), engines_.end(),
                    [&engine](const std::unique_ptr<ReadEngine>& e) { return e.get() == &engine; });
    if (!ran.ok() && io_thread_engine) {
      std::lock_guard<std::mutex> lock(mu_);
      engine_kind_ = engine.kind();
      engine_fallback_reason_ = std::string(ran.message());
    }
  }
  if (direct) {
    const auto refused = std::find_if(chunks.begin(), chunks.end(), [](const ChunkRead& c) {
      return c.result == -int64_t{EINVAL};
    });
    if (refused != chunks.end()) {
      SwitchToBuffered(StrCat("an O_DIRECT read was refused (EINVAL) at file offset ",
                              refused->offset,
                              "; buffered reads with posix_fadvise(DONTNEED) instead"));
      return ReadParts(info, staging, nullptr, engine, bytes, bytes_read, checksum);
    }
  }
  for (const ChunkRead& c : chunks) *bytes_read += c.want;
  absl::Status status;
  for (int p = 0; p < kExpertParts; ++p) {
    const ExpertPart& part = info.parts[static_cast<size_t>(p)];
    const Range& r = ranges[p];
    if (!direct) {
      ::posix_fadvise(buffered_fd_, static_cast<off_t>(r.at), static_cast<off_t>(part.file_bytes),
                      POSIX_FADV_DONTNEED);
    }
    if (!status.ok()) continue;  // the first failed part is the one named
    const size_t last_chunk = p + 1 < kExpertParts ? ranges[p + 1].first_chunk : chunks.size();
    // The part's bytes in from `begin` on, up to the first chunk that came back short.
    uint64_t got = r.end - r.begin;
    for (size_t i = r.first_chunk; i < last_chunk; ++i) {
      const ChunkRead& c = chunks[i];
      if (c.result < 0) {
        status = PartIoError(info, part, path, static_cast<int>(-c.result));
        break;
      }
      if (static_cast<uint64_t>(c.result) < c.need) {
        got = c.offset + static_cast<uint64_t>(c.result) - r.begin;
        break;
      }
    }
    if (!status.ok()) continue;
    if (p == 0 && fault != nullptr && *fault == LoaderFault::kShortRead) {
      got = (r.end - r.begin) / 2;
    }
    if (got < r.end - r.begin) {
      status = PartShortRead(info, part, path, got > r.at - r.begin ? got - (r.at - r.begin) : 0);
      continue;
    }
    bytes[p] = std::span<uint8_t>(
        staging + static_cast<uint64_t>(p) * slot_bytes_ + (r.at - r.begin), part.file_bytes);
  }
  if (status.ok() && !hash_broken && next_to_hash == chunks.size()) {
    // Parts with no chunk of their own (empty) still chain.
    while (hash_part + 1 < kExpertParts) {
      stream = XxHash64Stream(stream.Digest());
      ++hash_part;
    }
    *checksum = stream.Digest();
  }
  return status;
}

LoadResult Loader::Read(const Job& job, uint8_t* staging, std::span<uint8_t>* bytes, bool io_thread,
                        ReadEngine* engine) {
  const ExpertInfo& info = *job.info;
  LoadResult result;
  // The file as it was when the model loaded, or a clear error (never SIGBUS).
  result.status = core::CheckUnchanged(absolute_path_, identity_);
  if (!result.status.ok()) {
    result.status = absl::FailedPreconditionError(
        StrCat(Who(info), ": ", std::string(result.status.message())));
    return result;
  }
  if (io_thread && before_read_) before_read_(info);
  // A plain flag and value (an optional's empty payload upsets valgrind at -O2).
  const std::optional<LoaderFault> taken = TakeFault(info.layer, info.expert);
  const bool has_fault = taken.has_value();
  const LoaderFault fault = taken.value_or(LoaderFault::kShortRead);
  std::optional<uint64_t> streamed;  // the checksum ReadParts computed as the bytes came in
  if (mapping_ != nullptr) {  // kMmap
    for (int p = 0; p < kExpertParts; ++p) {
      auto copied = CopyPart(info, info.parts[static_cast<size_t>(p)],
                             staging + static_cast<uint64_t>(p) * slot_bytes_,
                             p == 0 && has_fault ? &fault : nullptr, &result.bytes_read);
      if (!copied.ok()) {
        result.status = copied.status();
        return result;
      }
      bytes[p] = *copied;
    }
  } else {
    result.status = ReadParts(info, staging, has_fault ? &fault : nullptr, *engine, bytes,
                              &result.bytes_read, &streamed);
    if (!result.status.ok()) return result;
  }
  // A bit flipped on its way from the disk, as far as anyone can tell.
  if (has_fault && fault == LoaderFault::kChecksumMismatch && !bytes[0].empty()) {
    bytes[0][bytes[0].size() / 2] ^= 0x10;
    streamed.reset();  // hashed before the flip
  }
  result.checksum = streamed.has_value() ? *streamed : ExpertChecksum(bytes[0], bytes[1], bytes[2]);
  if (job.expected && *job.expected != result.checksum) {
    result.status = absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch in the bytes of tensors '%s', '%s', '%s' at file offsets %d, "
        "%d, %d: expected xxh64 %016x, got %016x",
        Who(info), info.parts[0].tensor, info.parts[1].tensor, info.parts[2].tensor,
        info.parts[0].file_offset, info.parts[1].file_offset, info.parts[2].file_offset,
        *job.expected, result.checksum));
  }
  return result;
}

absl::Status Loader::Commit(const Job& job, const std::span<uint8_t>* bytes) {
  const ExpertInfo& info = *job.info;
  for (int p = 0; p < kExpertParts; ++p) {
    const ExpertPart& part = info.parts[static_cast<size_t>(p)];
    uint8_t* dst = job.dst + part.block_offset;
    if (part.packed_in_file) {
      std::memcpy(dst, bytes[p].data(), part.runtime_bytes);
      continue;
    }
    absl::Status status = backend::PackRows(part.file_type, bytes[p], part.rows, part.cols,
                                            part.format, {dst, part.runtime_bytes});
    if (!status.ok()) {
      return absl::Status(status.code(), StrCat(Who(info), ": cannot repack ",
                                                Where(part, directory_.path()), ": ",
                                                std::string(status.message())));
    }
  }
  return absl::OkStatus();
}

}  // namespace moert::experts
