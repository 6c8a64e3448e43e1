// Applying delta packages to files: decode, check, write new, fsync, rename.
#include "experts/delta_apply.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/checksum.h"
#include "experts/delta_codec.h"

namespace moert::experts {
namespace {

std::string EntryName(const DeltaEntry& e) {
  return e.kind == DeltaKind::kHeader ? std::string("the header")
                                      : StrCat("layer ", e.layer, ", expert ", e.expert);
}

std::span<const uint8_t> Range(std::span<const uint8_t> file, uint64_t offset, uint64_t n) {
  return file.subspan(static_cast<size_t>(offset), static_cast<size_t>(n));
}

// The checksum of an entry's bytes: the expert checksum over its three parts, or XXH64.
uint64_t EntryChecksum(const DeltaEntry& e, std::span<const uint8_t> a, std::span<const uint8_t> b,
                       std::span<const uint8_t> c) {
  return e.kind == DeltaKind::kHeader ? XxHash64(a) : ExpertChecksum(a, b, c);
}

// Decodes `e` against the base into *out (its target bytes, the ranges back to back),
// checking the base's bytes and the result against the manifest.
absl::Status DecodeEntry(std::span<const uint8_t> base, const DeltaPackage& package,
                         const DeltaEntry& e, std::vector<uint8_t>* prefix,
                         std::vector<uint8_t>* out) {
  std::array<std::span<const uint8_t>, 3> was{};
  prefix->clear();
  for (int r = 0; r < e.range_count(); ++r) {
    const DeltaRange& x = e.ranges[static_cast<size_t>(r)];
    was[static_cast<size_t>(r)] = Range(base, x.base_offset, x.base_bytes);
    prefix->insert(prefix->end(), was[static_cast<size_t>(r)].begin(),
                   was[static_cast<size_t>(r)].end());
  }
  const uint64_t old_sum = EntryChecksum(e, was[0], was[1], was[2]);
  if (old_sum != e.old_checksum) {
    return absl::FailedPreconditionError(
        StrCat("delta package: ", EntryName(e), " of the base has checksum ", old_sum,
               ", the package was made against ", e.old_checksum));
  }
  out->resize(static_cast<size_t>(e.target_bytes()));
  absl::Status decoded = DecodePatch(*prefix, package.Frame(e), *out);
  if (!decoded.ok()) {
    return absl::DataLossError(StrCat("delta package: ", EntryName(e), ": ", decoded.message()));
  }
  std::array<std::span<const uint8_t>, 3> now{};
  size_t at = 0;
  for (int r = 0; r < e.range_count(); ++r) {
    const size_t n = static_cast<size_t>(e.ranges[static_cast<size_t>(r)].target_bytes);
    now[static_cast<size_t>(r)] = std::span<const uint8_t>(*out).subspan(at, n);
    at += n;
  }
  const uint64_t new_sum = EntryChecksum(e, now[0], now[1], now[2]);
  if (new_sum != e.new_checksum) {
    return absl::DataLossError(StrCat("delta package: ", EntryName(e), " decodes to checksum ",
                                      new_sum, ", the manifest says ", e.new_checksum));
  }
  return absl::OkStatus();
}

std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The temporary file being written: removed on destruction unless committed.
class TempFile {
 public:
  TempFile(std::string path, uint64_t disk_limit) : path_(std::move(path)), limit_(disk_limit) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && opened_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  absl::Status Open() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Error("cannot create");
    // Another update writing the same output holds the lock; a crashed one does not.
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            StrCat("another update is writing '", path_, "'; try again when it is done"));
      }
      errno = err;
      return Error("cannot lock");
    }
    opened_ = true;
    if (::ftruncate(fd_, 0) != 0) return Error("cannot truncate");
    return absl::OkStatus();
  }
  absl::Status Write(uint64_t offset, std::span<const uint8_t> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      size_t n = bytes.size() - done;
      if (limit_ > 0) {
        const uint64_t end = offset + done;
        if (end >= limit_) {
          errno = ENOSPC;
          return Error("cannot write");
        }
        n = static_cast<size_t>(std::min<uint64_t>(n, limit_ - end));
      }
      const ssize_t w = ::pwrite(fd_, bytes.data() + done, n, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Error("cannot write");
      done += static_cast<size_t>(w);
    }
    written_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status Sync() {
    if (::fsync(fd_) != 0) return Error("cannot fsync");
    if (::close(fd_) != 0) {
      fd_ = -1;
      return Error("cannot close");
    }
    fd_ = -1;
    return absl::OkStatus();
  }
  absl::Status RenameTo(const std::string& out) {
    if (::rename(path_.c_str(), out.c_str()) != 0) return Error(StrCat("cannot rename to '", out, "':"));
    committed_ = true;
    return absl::OkStatus();
  }
  const std::string& path() const { return path_; }
  uint64_t written() const { return written_; }

 private:
  absl::Status Error(const std::string& what) const {
    const int err = errno;
    const std::string text = StrCat(what, " '", path_, "': ", std::strerror(err));
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(text);
    return absl::InternalError(text);
  }

  std::string path_;
  uint64_t limit_ = 0;
  int fd_ = -1;
  bool opened_ = false;
  bool committed_ = false;
  uint64_t written_ = 0;
};

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(StrCat("cannot open '", dir, "': ", std::strerror(errno)));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) return absl::InternalError(StrCat("cannot fsync '", dir, "': ", std::strerror(err)));
  return absl::OkStatus();
}

}  // namespace

const char* ApplyStepName(ApplyStep step) {
  switch (step) {
    case ApplyStep::kTempWritten: return "temp_written";
    case ApplyStep::kTempSynced: return "temp_synced";
    case ApplyStep::kRenamed: return "renamed";
  }
  return "?";
}

absl::Status CheckDeltaBase(std::span<const uint8_t> base, const DeltaManifest& m,
                            const FileHash* base_hash) {
  const FileHash hash = base_hash != nullptr ? *base_hash : HashBytes(base);
  if (base.size() != m.base_size || hash != m.base_hash) {
    if (base.size() == m.target_size && hash == m.target_hash) {
      return absl::FailedPreconditionError(
          "the delta package's update is already applied (the file is its target)");
    }
    return absl::FailedPreconditionError(
        StrCat("the delta package is for another base: it wants ", m.base_size, " bytes hashing to ",
               ToHex(m.base_hash), ", the file has ", base.size(), " bytes hashing to ",
               ToHex(hash)));
  }
  return absl::OkStatus();
}

absl::Status VerifyDelta(std::span<const uint8_t> base, const DeltaPackage& package) {
  MOERT_RETURN_IF_ERROR(CheckDeltaBase(base, package.manifest));
  std::vector<uint8_t> prefix, out;
  for (const DeltaEntry& e : package.manifest.entries) {
    MOERT_RETURN_IF_ERROR(DecodeEntry(base, package, e, &prefix, &out));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeltaApplyResult> ApplyDeltaFile(const std::string& base_path,
                                                const DeltaPackage& package,
                                                const std::string& out_path,
                                                const DeltaApplyOptions& options) {
  const DeltaManifest& m = package.manifest;
  DeltaApplyResult result;
  const auto step = [&](ApplyStep s) {
    return options.after_step_for_testing ? options.after_step_for_testing(s) : absl::OkStatus();
  };
  TempFile temp(out_path + ".moert-update", options.disk_bytes_for_testing);
  {
    MOERT_ASSIGN_OR_RETURN(const std::unique_ptr<core::MappedFile> mapped,
                           core::MappedFile::Open(base_path));
    const std::span<const uint8_t> base = mapped->bytes();
    // Each pass over the model drops the pages it read from the resident set: an update
    // does not grow the process by the model's size (the page cache keeps them).
    const FileHash base_hash = HashMapped(*mapped);
    MOERT_RETURN_IF_ERROR(CheckDeltaBase(base, m, &base_hash));
    MOERT_RETURN_IF_ERROR(temp.Open());
    std::vector<uint8_t> prefix, out;
    // The header, then the data section copied, then each expert over its place.
    MOERT_RETURN_IF_ERROR(DecodeEntry(base, package, m.entries[0], &prefix, &out));
    MOERT_RETURN_IF_ERROR(temp.Write(0, out));
    constexpr uint64_t kChunk = uint64_t{4} << 20;
    for (uint64_t at = m.base_data_offset; at < m.base_size; at += kChunk) {
      const uint64_t n = std::min(kChunk, m.base_size - at);
      MOERT_RETURN_IF_ERROR(
          temp.Write(at - m.base_data_offset + m.target_data_offset, Range(base, at, n)));
      mapped->DropPages(at, n);
    }
    for (size_t i = 1; i < m.entries.size(); ++i) {
      const DeltaEntry& e = m.entries[i];
      MOERT_RETURN_IF_ERROR(DecodeEntry(base, package, e, &prefix, &out));
      size_t at = 0;
      for (const DeltaRange& x : e.ranges) {
        MOERT_RETURN_IF_ERROR(temp.Write(
            x.target_offset, std::span<const uint8_t>(out).subspan(at, x.target_bytes)));
        at += x.target_bytes;
      }
      result.experts.emplace_back(e.layer, e.expert);
    }
  }
  MOERT_RETURN_IF_ERROR(step(ApplyStep::kTempWritten));
  MOERT_RETURN_IF_ERROR(temp.Sync());
  MOERT_ASSIGN_OR_RETURN(const FileHash written, HashFile(temp.path()));
  if (written != m.target_hash) {
    return absl::DataLossError(StrCat("the file written, '", temp.path(), "', hashes to ",
                                      ToHex(written), ", not to the package's target ",
                                      ToHex(m.target_hash)));
  }
  MOERT_RETURN_IF_ERROR(step(ApplyStep::kTempSynced));
  if (options.before_rename) options.before_rename();
  MOERT_RETURN_IF_ERROR(temp.RenameTo(out_path));
  MOERT_RETURN_IF_ERROR(step(ApplyStep::kRenamed));
  MOERT_RETURN_IF_ERROR(SyncDir(Dir(out_path)));
  result.bytes_written = temp.written();
  return result;
}

absl::StatusOr<FileHash> HashFile(const std::string& path) {
  MOERT_ASSIGN_OR_RETURN(const std::unique_ptr<core::MappedFile> mapped,
                         core::MappedFile::Open(path));
  return HashMapped(*mapped);
}

}  // namespace moert::experts
