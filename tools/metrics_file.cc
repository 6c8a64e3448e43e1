// The tools' metrics file: flag parsing, atomic writes, the periodic writer thread.
#include "metrics_file.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

namespace moert::tools {

bool ParseMetricsFlag(int argc, char** argv, int* i, MetricsFlags* flags, std::string* error) {
  const std::string_view arg = argv[*i];
  if (arg != "--metrics" && arg != "--metrics-interval") return false;
  if (*i + 1 >= argc) {
    *error = std::string(arg) + (arg == "--metrics" ? " needs a FILE" : " needs a number") +
             " (see --help)";
    return true;
  }
  const std::string_view v = argv[++*i];
  if (arg == "--metrics") {
    flags->path = std::string(v);
    if (flags->path.empty()) *error = "--metrics needs a FILE (see --help)";
    return true;
  }
  int64_t seconds = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
  if (ec != std::errc() || ptr != v.data() + v.size() || v.empty() || seconds < 0 ||
      seconds > 86400) {
    *error = "invalid value '" + std::string(v) +
             "' for --metrics-interval: expected seconds in [0, 86400] (0: only at exit)";
    return true;
  }
  flags->interval_s = seconds;
  return true;
}

std::string WriteFileAtomically(const std::string& path, const std::string& text) {
  // Beside the target, so the rename stays on one file system; the pid keeps two tools
  // writing the same file from sharing a temporary.
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) return "cannot create " + temp + ": " + std::strerror(errno);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(temp.c_str());
    return "cannot write " + temp + ": " + std::strerror(written ? errno : write_errno);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp.c_str());
    return "cannot rename " + temp + " to " + path + ": " + std::strerror(rename_errno);
  }
  return {};
}

MetricsFile::MetricsFile(MetricsFlags flags, std::function<std::string()> text, std::string tool)
    : flags_(std::move(flags)), text_(std::move(text)), tool_(std::move(tool)) {
  if (flags_.path.empty() || flags_.interval_s == 0) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::seconds(flags_.interval_s), [&] { return stop_; })) {
      lock.unlock();
      Write();
      lock.lock();
    }
  });
}

MetricsFile::~MetricsFile() {
  if (!finished_) Finish();
}

bool MetricsFile::Finish() {
  finished_ = true;
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  return Write();
}

bool MetricsFile::Write() {
  if (flags_.path.empty()) return true;
  const std::string error = WriteFileAtomically(flags_.path, text_());
  if (error.empty()) return true;
  std::fprintf(stderr, "%s: error: --metrics: %s\n", tool_.c_str(), error.c_str());
  return false;
}

}  // namespace moert::tools
