// The crash path of repro bundles (docs/repro.md, "Crash bundles"): a handler of
// SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT that writes what the process last said it
// was doing, then lets the signal do what it did before (the previous handler, or the
// default: the process dies as it would have). A handler may only make async-signal-safe
// calls, so nothing is built in it: sessions publish a record at safe points (after each
// step: the device, the model, the options and the context's token ids, already
// serialized), and the handler writes the last published record with open/write/close.
// The file is the uncompressed crash variant of the format (magic MOERTCRS,
// docs/formats.md), which DecodeReproBundle reads as a bundle of trigger "crash".
#ifndef MOERT_TELEMETRY_CRASH_REPRO_H_
#define MOERT_TELEMETRY_CRASH_REPRO_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace moert::telemetry {

// The most a record holds; token ids past it are left out (the record says how many
// there were).
inline constexpr size_t kCrashRecordBytes = 128 << 10;

// Installs the handler (once per process; later calls only change the directory),
// writing to DIR/crash-<pid>.moert-repro. Makes the directory. FailedPrecondition when
// it cannot be made, InvalidArgument for an empty or too long path.
absl::Status InstallCrashHandler(const std::string& dir);

// True once InstallCrashHandler succeeded: sessions publish records only then.
bool CrashHandlerInstalled();

// Publishes what a crash now would write: key=value lines of the device, the model and
// the options, and the context's token ids. Any thread; the newest call wins.
void PublishCrashRecord(std::string_view fingerprint, std::string_view model,
                        std::string_view options, std::span<const int32_t> tokens);

// The path the handler writes to ("" before InstallCrashHandler).
std::string CrashBundlePath();

// Tests: the bytes the handler would write for `signal` now.
std::string CrashBundleBytesForTest(int signal);

}  // namespace moert::telemetry

#endif  // MOERT_TELEMETRY_CRASH_REPRO_H_
