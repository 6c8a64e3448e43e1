// The platform hooks library code times and logs through, after ExecuTorch's PAL
// (runtime/platform/platform.h): a monotonic clock and a log sink with levels, each
// replaceable by the host app (an Android app routes the log to logcat, a test freezes
// the clock). No module keeps its own clock or prints: it calls NowNs() and Log().
// Every function here is thread-safe.
#ifndef MOERT_TELEMETRY_PLATFORM_H_
#define MOERT_TELEMETRY_PLATFORM_H_

#include <cstdint>
#include <functional>
#include <string_view>

namespace moert::telemetry {

// Monotonic nanoseconds (steady_clock unless replaced).
uint64_t NowNs();
// Replaces the clock (nullptr: steady_clock again). The function must be monotonic and
// callable from any thread.
using ClockFn = uint64_t (*)();
void SetClock(ClockFn clock);

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
std::string_view LogLevelName(LogLevel level);  // "debug", "info", "warning", "error"

// Receives each message at or above the minimum level, from any thread, one call per
// message (no trailing newline). The default writes "moert: <level>: <message>\n" to
// stderr.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;
// Replaces the sink (empty: the default). Messages already being delivered finish on
// the old sink.
void SetLogSink(LogSink sink);
// Messages below `level` are dropped before formatting reaches the sink (default kInfo).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
bool LogEnabled(LogLevel level);

void Log(LogLevel level, std::string_view message);

}  // namespace moert::telemetry

#endif  // MOERT_TELEMETRY_PLATFORM_H_
