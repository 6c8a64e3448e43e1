// Memory pressure on the whole device, from outside the expert pool: the kernel's
// pressure stall information (PSI, /proc/pressure/memory), MemAvailable against MemTotal
// (/proc/meminfo), and the host app's own signal, a trim level after Android's
// onTrimMemory. ResourceMonitor combines them with the pool's pressure (docs/routing.md,
// "Device memory pressure").
//
// Every source is optional: a file that is missing, unreadable (Android's SELinux denies
// /proc/pressure to apps; kernels without CONFIG_PSI have none) or garbled is "unknown",
// which adds no pressure. Nothing here returns an error: inference never stops over it.
#ifndef MOERT_ROUTER_DEVICE_MEMORY_H_
#define MOERT_ROUTER_DEVICE_MEMORY_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moert::router {

// The host app's memory signal. The running levels say the device is short of memory
// while the app is in front; the others that the app is not visible, and how likely the
// system is to kill it.
enum class TrimLevel : int {
  kNone = 0,             // no signal, or memory is fine again
  kRunningModerate = 1,  // Android TRIM_MEMORY_RUNNING_MODERATE (5): memory is getting low
  kRunningLow = 2,       // TRIM_MEMORY_RUNNING_LOW (10): low; the app should release memory
  kRunningCritical = 3,  // TRIM_MEMORY_RUNNING_CRITICAL (15): the system kills background apps
  kUiHidden = 4,         // TRIM_MEMORY_UI_HIDDEN (20): the UI went away; no shortage by itself
  kBackground = 5,       // TRIM_MEMORY_BACKGROUND (40), _MODERATE (60): backgrounded, may be killed
  kComplete = 6,         // TRIM_MEMORY_COMPLETE (80): among the first processes to be killed
};
inline constexpr int kTrimLevelCount = 7;

// Android's onTrimMemory level to TrimLevel. A value between the known constants counts as
// the next lower one (Android's advice: compare with >=); below 5: kNone.
TrimLevel TrimLevelFromAndroid(int android_level);
// TrimLevel's own numbers (0 to kTrimLevelCount - 1); nullopt for any other value.
std::optional<TrimLevel> TrimLevelFromInt(int value);
// "none", "running-moderate", "running-low", "running-critical", "ui-hidden",
// "background", "complete".
const char* TrimLevelName(TrimLevel level);
// The pressure the trim level alone stands for, in [0, 1]: 0 for none and ui-hidden,
// 0.25 running-moderate, 0.5 running-low and background, 1 running-critical and complete.
float TrimLevelPressure(TrimLevel level);

// One line of a PSI file: the shares of wall time (percent, [0, 100]) in which tasks
// stalled on memory over the last 10, 60 and 300 seconds, and the total stall time.
struct PsiLine {
  float avg10 = 0;
  float avg60 = 0;
  float avg300 = 0;
  uint64_t total_us = 0;
};

// /proc/pressure/memory: "some" (at least one task stalled) and "full" (all non-idle
// tasks stalled); a line that is absent or malformed is nullopt.
struct MemoryPsi {
  std::optional<PsiLine> some;
  std::optional<PsiLine> full;
};
MemoryPsi ParseMemoryPsi(std::string_view text);

// MemAvailable and MemTotal of /proc/meminfo in bytes; absent or malformed: nullopt.
struct MemInfo {
  std::optional<uint64_t> available_bytes;
  std::optional<uint64_t> total_bytes;
};
MemInfo ParseMemInfo(std::string_view text);

struct DeviceMemoryReading {
  MemoryPsi psi;
  MemInfo meminfo;

  // MemAvailable / MemTotal in [0, 1]; nullopt unless both are known and MemTotal > 0.
  std::optional<float> available_fraction() const;
};

// Where each source starts to count and where it reaches full pressure; pressure rises
// linearly in between. The defaults leave an ordinary desktop or phone at 0.
struct DevicePressureThresholds {
  // PSI "some" avg10, percent: 0 at or below start, 1 at or above full.
  float psi_some_start = 10;
  float psi_some_full = 50;
  // PSI "full" avg10, percent.
  float psi_full_start = 5;
  float psi_full_full = 25;
  // MemAvailable / MemTotal: 0 at or above start, 1 at or below full.
  float available_start = 0.10f;
  float available_full = 0.02f;
};

// The device's memory pressure in [0, 1]: the largest of what PSI some, PSI full, the
// MemAvailable fraction and the trim level each say; a source that is unknown says 0.
// 0 whenever every known source is on the quiet side of its start threshold.
float DeviceMemoryPressure(const DeviceMemoryReading& reading, TrimLevel trim,
                           const DevicePressureThresholds& thresholds = {});

// The readings behind the device pressure, as last read (ResourceMonitor::device_stats,
// RouterStats::device).
struct DeviceMemoryStats {
  std::optional<float> psi_some_avg10;  // percent
  std::optional<float> psi_full_avg10;
  std::optional<uint64_t> mem_available_bytes;
  std::optional<uint64_t> mem_total_bytes;
  TrimLevel trim_level = TrimLevel::kNone;
  float pressure = 0;  // DeviceMemoryPressure of the above
};

// Reads `root`/pressure/memory and `root`/meminfo, at most every `poll_ms`.
class DeviceMemoryReader {
 public:
  // root: the folder holding pressure/memory and meminfo ("/proc"); empty: nothing is
  // read (every reading unknown).
  DeviceMemoryReader(std::string root, int poll_ms);

  // The reading from the files on the first call and whenever the last read is poll_ms
  // old or more; else the last one.
  const DeviceMemoryReading& Read();

  // How many times the files were read (diagnostics, tests of the rate limit).
  uint64_t reads() const { return reads_; }

 private:
  std::string root_;
  std::chrono::milliseconds poll_;
  DeviceMemoryReading last_;
  std::chrono::steady_clock::time_point last_read_{};
  uint64_t reads_ = 0;
};

}  // namespace moert::router

#endif  // MOERT_ROUTER_DEVICE_MEMORY_H_
