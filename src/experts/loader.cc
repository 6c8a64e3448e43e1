// The expert loader's I/O thread: pread (O_DIRECT, buffered) or mapping copy into a
// staging buffer, checksum, repack into the pool block.
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

#include "absl/strings/str_format.h"
#include "backend/packing.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/checksum.h"

namespace moert::experts {

struct Loader::Job {
  const ExpertInfo* info = nullptr;
  uint8_t* dst = nullptr;
  std::optional<uint64_t> expected;
  LoadResult result;
  bool done = false;
  bool urgent = false;
};

namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Who(const ExpertInfo& info) {
  return StrCat("layer ", info.layer, ", expert ", info.expert);
}

std::string Where(const ExpertPart& part) {
  return StrCat("tensor '", part.tensor, "' at file offset ", part.file_offset, " (",
                part.file_bytes, " bytes)");
}

absl::Status OpenError(const std::string& path, int err) {
  const std::string message = StrCat("cannot open '", path, "' for expert loads: ",
                                     std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// Reads until `need` bytes are in (asking for up to `want`) or the file ends.
// Returns the bytes read, or -errno.
int64_t PreadAtLeast(int fd, uint8_t* buf, uint64_t want, uint64_t need, uint64_t offset) {
  uint64_t done = 0;
  while (done < need) {
    const ssize_t n = ::pread(fd, buf + done, want - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -static_cast<int64_t>(errno);
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  return static_cast<int64_t>(done);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

Loader::Loader(const ExpertDirectory& directory, const LoaderOptions& options)
    : directory_(directory),
      requested_mode_(options.mode),
      queue_capacity_(std::max<size_t>(1, options.queue_capacity)),
      mode_(options.mode) {}

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(const ExpertDirectory& directory,
                                                       const LoaderOptions& options) {
  std::unique_ptr<Loader> loader(new Loader(directory, options));
  const std::string& path = directory.path();
  uint64_t size = 0;
  if (options.mode == IoMode::kMmap) {
    auto mapping = core::MappedFile::Open(path);
    if (!mapping.ok()) return mapping.status();
    loader->mapping_ = std::move(*mapping);
    size = loader->mapping_->size();
  } else {
    int fd = -1;
    if (options.mode == IoMode::kDirect) {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (fd < 0 && errno == EINVAL) {
        loader->mode_ = IoMode::kBuffered;
        loader->fallback_reason_ =
            "the file system refuses O_DIRECT (open: EINVAL); buffered reads with "
            "posix_fadvise(DONTNEED) instead";
      }
    }
    if (fd < 0) {
      if (options.mode == IoMode::kDirect && loader->mode_ == IoMode::kDirect) {
        return OpenError(path, errno);
      }
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return OpenError(path, errno);
    }
    loader->fd_ = fd;
    struct stat st {};
    if (::fstat(fd, &st) != 0) return OpenError(path, errno);
    size = static_cast<uint64_t>(st.st_size);
  }
  if (size != directory.file_size()) {
    return absl::FailedPreconditionError(StrCat("'", path, "' is ", size,
                                                " bytes now but was ", directory.file_size(),
                                                " when the model was loaded"));
  }
  loader->slot_bytes_ =
      AlignUp(directory.max_part_file_bytes() + 2 * kDirectAlignment, kDirectAlignment);
  loader->staging_bytes_ = loader->slot_bytes_ * kExpertParts;
  loader->staging_ =
      static_cast<uint8_t*>(std::aligned_alloc(kDirectAlignment, loader->staging_bytes_));
  if (loader->staging_ == nullptr) {
    return absl::ResourceExhaustedError(
        StrCat("cannot allocate the loader's staging buffer of ", loader->staging_bytes_, " bytes"));
  }
  loader->thread_ = std::thread([l = loader.get()] { l->ThreadMain(); });
  return loader;
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
  std::free(staging_);
}

IoMode Loader::mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_;
}

std::string Loader::fallback_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fallback_reason_;
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
  std::unique_lock<std::mutex> lock(mu_);
  if (urgent) {
    queue_.insert(FirstNotUrgent(), job);
  } else {
    space_cv_.wait(lock, [&] { return queue_.size() < queue_capacity_; });
    queue_.push_back(job);
  }
  lock.unlock();
  queue_cv_.notify_one();
  return job;
}

bool Loader::Done(const Ticket& ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket->done;
}

bool Loader::Cancel(const Ticket& ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find(queue_.begin(), queue_.end(), ticket);
  if (it == queue_.end()) return false;
  queue_.erase(it);
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

LoadResult Loader::Wait(const Ticket& ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return ticket->done; });
  return std::move(ticket->result);
}

void Loader::AdviseWillNeed(const ExpertInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ExpertPart& part : info.parts) {
    if (mode_ == IoMode::kBuffered && fd_ >= 0) {
      ::posix_fadvise(fd_, static_cast<off_t>(part.file_offset),
                      static_cast<off_t>(part.file_bytes), POSIX_FADV_WILLNEED);
    } else if (mode_ == IoMode::kMmap && mapping_ != nullptr) {
      const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
      const uint64_t begin = part.file_offset / page * page;
      ::madvise(const_cast<uint8_t*>(mapping_->data()) + begin,
                part.file_offset + part.file_bytes - begin, MADV_WILLNEED);
    }
  }
}

void Loader::ThreadMain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    Ticket job = queue_.front();
    queue_.pop_front();
    space_cv_.notify_one();
    const uint64_t delay_us = delay_us_;
    lock.unlock();
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const uint64_t start = NowNs();
    LoadResult result = Run(*job);
    const uint64_t busy = NowNs() - start;
    lock.lock();
    ++stats_.loads;
    if (!result.status.ok()) ++stats_.failed_loads;
    stats_.bytes_read += result.bytes_read;
    stats_.busy_ns += busy;
    job->result = std::move(result);
    job->done = true;
    done_cv_.notify_all();
  }
}

absl::Status Loader::SwitchToBuffered(std::string reason) {
  const int fd = ::open(directory_.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(directory_.path(), errno);
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  mode_ = IoMode::kBuffered;
  fallback_reason_ = std::move(reason);
  return absl::OkStatus();
}

absl::StatusOr<std::span<uint8_t>> Loader::ReadPart(const ExpertInfo& info,
                                                    const ExpertPart& part, uint8_t* slot,
                                                    const LoaderFault* fault,
                                                    uint64_t* bytes_read) {
  const auto io_error = [&](int err) {
    return absl::DataLossError(
        StrCat(Who(info), ": I/O error reading ", Where(part), ": ", std::strerror(err)));
  };
  const auto short_read = [&](uint64_t got) {
    return absl::DataLossError(StrCat(Who(info), ": short read of ", Where(part), ": got ", got,
                                      " of ", part.file_bytes, " bytes"));
  };
  if (fault != nullptr && *fault == LoaderFault::kIoError) return io_error(EIO);
  const bool simulate_short = fault != nullptr && *fault == LoaderFault::kShortRead;

  if (mapping_ != nullptr) {  // kMmap
    *bytes_read += part.file_bytes;
    if (part.file_offset + part.file_bytes > mapping_->size() || simulate_short) {
      return short_read(simulate_short ? part.file_bytes / 2 : 0);
    }
    std::memcpy(slot, mapping_->data() + part.file_offset, part.file_bytes);
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t begin = part.file_offset / page * page;
    ::madvise(const_cast<uint8_t*>(mapping_->data()) + begin,
              part.file_offset + part.file_bytes - begin, MADV_DONTNEED);
    return std::span<uint8_t>(slot, part.file_bytes);
  }

  bool direct;
  {
    std::lock_guard<std::mutex> lock(mu_);
    direct = mode_ == IoMode::kDirect;
  }
  if (direct) {
    const uint64_t begin = part.file_offset / kDirectAlignment * kDirectAlignment;
    const uint64_t end = part.file_offset + part.file_bytes;
    const uint64_t want = AlignUp(end, kDirectAlignment) - begin;
    const uint64_t need = end - begin;
    int64_t got = fault != nullptr && *fault == LoaderFault::kDirectRefused
                      ? -int64_t{EINVAL}
                      : PreadAtLeast(fd_, slot, want, need, begin);
    if (got == -int64_t{EINVAL}) {
      MOERT_RETURN_IF_ERROR(SwitchToBuffered(
          StrCat("an O_DIRECT read was refused (EINVAL) at file offset ", begin,
                 "; buffered reads with posix_fadvise(DONTNEED) instead")));
    } else {
      *bytes_read += want;
      if (got < 0) return io_error(static_cast<int>(-got));
      if (simulate_short) got = static_cast<int64_t>(need / 2);
      if (static_cast<uint64_t>(got) < need) {
        return short_read(static_cast<uint64_t>(got) > part.file_offset - begin
                              ? static_cast<uint64_t>(got) - (part.file_offset - begin)
                              : 0);
      }
      return std::span<uint8_t>(slot + (part.file_offset - begin), part.file_bytes);
    }
  }

  // kBuffered (or after a fallback).
  *bytes_read += part.file_bytes;
  int64_t got = PreadAtLeast(fd_, slot, part.file_bytes, part.file_bytes, part.file_offset);
  ::posix_fadvise(fd_, static_cast<off_t>(part.file_offset), static_cast<off_t>(part.file_bytes),
                  POSIX_FADV_DONTNEED);
  if (got < 0) return io_error(static_cast<int>(-got));
  if (simulate_short) got = static_cast<int64_t>(part.file_bytes / 2);
  if (static_cast<uint64_t>(got) < part.file_bytes) return short_read(static_cast<uint64_t>(got));
  return std::span<uint8_t>(slot, part.file_bytes);
}

LoadResult Loader::Run(const Job& job) {
  const ExpertInfo& info = *job.info;
  LoadResult result;
  // A plain flag and value (an optional's empty payload upsets valgrind at -O2).
  const std::optional<LoaderFault> taken = TakeFault(info.layer, info.expert);
  const bool has_fault = taken.has_value();
  const LoaderFault fault = taken.value_or(LoaderFault::kShortRead);
  std::span<uint8_t> bytes[kExpertParts];
  for (int p = 0; p < kExpertParts; ++p) {
    auto read = ReadPart(info, info.parts[static_cast<size_t>(p)],
                         staging_ + static_cast<uint64_t>(p) * slot_bytes_,
                         p == 0 && has_fault ? &fault : nullptr, &result.bytes_read);
    if (!read.ok()) {
      result.status = read.status();
      return result;
    }
    bytes[p] = *read;
  }
  // A bit flipped on its way from the disk, as far as anyone can tell.
  if (has_fault && fault == LoaderFault::kChecksumMismatch && !bytes[0].empty()) {
    bytes[0][bytes[0].size() / 2] ^= 0x10;
  }
  result.checksum = ExpertChecksum(bytes[0], bytes[1], bytes[2]);
  if (job.expected && *job.expected != result.checksum) {
    result.status = absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch in the bytes of tensors '%s', '%s', '%s' at file offsets %d, "
        "%d, %d: expected xxh64 %016x, got %016x",
        Who(info), info.parts[0].tensor, info.parts[1].tensor, info.parts[2].tensor,
        info.parts[0].file_offset, info.parts[1].file_offset, info.parts[2].file_offset,
        *job.expected, result.checksum));
    return result;
  }
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
      result.status = absl::Status(
          status.code(), StrCat(Who(info), ": cannot repack ", Where(part), ": ", std::string(status.message())));
      return result;
    }
  }
  return result;
}

}  // namespace moert::experts
