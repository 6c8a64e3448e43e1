// The default clock and log sink, and the hooks that replace them.
#include "telemetry/platform.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace moert::telemetry {
namespace {

uint64_t SteadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::atomic<ClockFn> g_clock{nullptr};
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

std::mutex& SinkMutex() {
  static std::mutex* mutex = new std::mutex;  // never destroyed: logging at exit is safe
  return *mutex;
}
std::shared_ptr<const LogSink>& Sink() {
  static auto* sink = new std::shared_ptr<const LogSink>;
  return *sink;
}

void DefaultSink(LogLevel level, std::string_view message) {
  std::string line = "moert: ";
  line += LogLevelName(level);
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace

uint64_t NowNs() {
  const ClockFn clock = g_clock.load(std::memory_order_acquire);
  return clock != nullptr ? clock() : SteadyNs();
}

void SetClock(ClockFn clock) { g_clock.store(clock, std::memory_order_release); }

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void SetLogSink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(next);
}

void SetMinLogLevel(LogLevel level) {
  g_min_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load(std::memory_order_relaxed)); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_min_level.load(std::memory_order_relaxed);
}

void Log(LogLevel level, std::string_view message) {
  if (!LogEnabled(level)) return;
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(SinkMutex());
    sink = Sink();
  }
  if (sink != nullptr) {
    (*sink)(level, message);
  } else {
    DefaultSink(level, message);
  }
}

}  // namespace moert::telemetry
