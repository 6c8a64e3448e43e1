#include "telemetry/crash_repro.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <bit>
#include <cstring>
#include <mutex>

#include "core/cache_dir.h"
#include "core/status.h"
#include "core/strings.h"
#include "telemetry/platform.h"
#include "telemetry/repro_bundle.h"

namespace moert::telemetry {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the crash record is written in the host's byte order: little-endian");

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kSignalCount = sizeof(kSignals) / sizeof(kSignals[0]);
constexpr size_t kPathBytes = 4096;

// Two records: publishing fills the one the handler is not reading, then flips.
struct Record {
  size_t size = 0;
  char bytes[kCrashRecordBytes];
};
Record g_records[2];
std::atomic<int> g_published{-1};
std::mutex g_publish_mutex;  // one publisher at a time

char g_path[kPathBytes] = {};
std::atomic<bool> g_installed{false};
std::atomic<bool> g_in_handler{false};
struct sigaction g_previous[kSignalCount];
std::mutex g_install_mutex;

void Put(char* out, size_t* at, const void* data, size_t n) {
  std::memcpy(out + *at, data, n);
  *at += n;
}
void PutU32(char* out, size_t* at, uint32_t v) { Put(out, at, &v, 4); }

// The 16-byte header: magic, version, signal.
void Header(int signal, char out[16]) {
  size_t at = 0;
  Put(out, &at, kReproCrashMagic, sizeof(kReproCrashMagic));
  PutU32(out, &at, kReproCrashVersion);
  PutU32(out, &at, static_cast<uint32_t>(signal));
}

// Async-signal-safe: write(2) until done or an error.
void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t wrote = ::write(fd, data, n);
    if (wrote <= 0) return;
    data += wrote;
    n -= static_cast<size_t>(wrote);
  }
}

void OnCrash(int signal, siginfo_t*, void*) {
  // Only the first crashing thread writes; the others go straight on to the old handler.
  if (!g_in_handler.exchange(true)) {
    const int published = g_published.load(std::memory_order_acquire);
    if (published >= 0) {
      const int fd = ::open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        char header[16];
        Header(signal, header);
        WriteAll(fd, header, sizeof(header));
        WriteAll(fd, g_records[published].bytes, g_records[published].size);
        ::close(fd);
      }
    }
  }
  // What the signal did before: the previous handler (ASan's, the app's) or the
  // default, which ends the process. A fault re-runs the instruction and comes back to
  // it; a raised signal is delivered once this handler returns (it is blocked here).
  for (int i = 0; i < kSignalCount; ++i) {
    if (kSignals[i] == signal) ::sigaction(signal, &g_previous[i], nullptr);
  }
  ::raise(signal);
}

}  // namespace

absl::Status InstallCrashHandler(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("crash bundles: no directory given");
  MOERT_RETURN_IF_ERROR(core::EnsureDirectory(dir));
  const std::string path = StrCat(dir, "/crash-", static_cast<int64_t>(::getpid()), ".moert-repro");
  if (path.size() >= kPathBytes) {
    return absl::InvalidArgumentError(
        StrCat("crash bundles: the path ", path, " is longer than ", kPathBytes - 1, " bytes"));
  }
  std::lock_guard<std::mutex> lock(g_install_mutex);
  // The handler may read the path at any moment: it changes only before installing
  // (the common case: one directory per process) or between two whole copies.
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  if (g_installed.load()) return absl::OkStatus();
  for (int i = 0; i < kSignalCount; ++i) {
    struct sigaction action {};
    action.sa_sigaction = OnCrash;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (::sigaction(kSignals[i], &action, &g_previous[i]) != 0) {
      const int error = errno;
      for (int j = 0; j < i; ++j) ::sigaction(kSignals[j], &g_previous[j], nullptr);
      return absl::InternalError(
          StrCat("crash bundles: sigaction(", kSignals[i], "): ", std::strerror(error)));
    }
  }
  g_installed.store(true);
  return absl::OkStatus();
}

bool CrashHandlerInstalled() { return g_installed.load(std::memory_order_relaxed); }

void PublishCrashRecord(std::string_view fingerprint, std::string_view model,
                        std::string_view options, std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(g_publish_mutex);
  const int next = g_published.load(std::memory_order_relaxed) == 0 ? 1 : 0;
  Record& r = g_records[next];
  size_t at = 0;
  const uint64_t now = NowNs();
  Put(r.bytes, &at, &now, 8);
  // The texts are small (a few KiB); each is cut to fit a quarter of the record.
  for (std::string_view text : {fingerprint, model, options}) {
    const size_t n = std::min(text.size(), kCrashRecordBytes / 4);
    PutU32(r.bytes, &at, static_cast<uint32_t>(n));
    Put(r.bytes, &at, text.data(), n);
  }
  const size_t room = (kCrashRecordBytes - at - 8) / 4;
  const size_t kept = std::min(tokens.size(), room);
  PutU32(r.bytes, &at, static_cast<uint32_t>(tokens.size()));
  PutU32(r.bytes, &at, static_cast<uint32_t>(kept));
  if (kept > 0) Put(r.bytes, &at, tokens.data(), kept * 4);
  r.size = at;
  g_published.store(next, std::memory_order_release);
}

std::string CrashBundlePath() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  return std::string(g_path);
}

std::string CrashBundleBytesForTest(int signal) {
  std::lock_guard<std::mutex> lock(g_publish_mutex);
  char header[16];
  Header(signal, header);
  std::string out(header, sizeof(header));
  const int published = g_published.load();
  if (published >= 0) out.append(g_records[published].bytes, g_records[published].size);
  return out;
}

}  // namespace moert::telemetry
