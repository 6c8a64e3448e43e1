// Memory pressure and thermal state for the router (see resource_monitor.h).
#include "router/resource_monitor.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <system_error>

namespace moert::router {
namespace {

constexpr float kNone = std::numeric_limits<float>::quiet_NaN();

std::string ReadLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// Zone types that measure a CPU cluster, the SoC or the package: "cpu0-thermal",
// "cpu-1-0-usr", "x86_pkg_temp", "soc_thermal", "tsens_tz_sensor1", "mtktscpu", ...
bool LooksLikeCpu(std::string type) {
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view word : {"cpu", "x86_pkg", "soc", "tsens", "cluster", "core"}) {
    if (type.find(word) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

ResourceMonitor::ResourceMonitor(ResourceMonitorOptions options)
    : options_(std::move(options)),
      pressure_override_(kNone),
      host_temperature_(kNone),
      device_reader_(options_.device_memory_root, options_.device_memory_poll_ms) {
  std::error_code ec;
  std::filesystem::directory_iterator it(options_.thermal_root, ec);
  if (ec) return;  // no sysfs (or not readable): the host may still report a temperature
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("thermal_zone", 0) != 0) continue;
    if (!LooksLikeCpu(ReadLine(entry.path() / "type"))) continue;
    zones_.push_back((entry.path() / "temp").string());
  }
  std::sort(zones_.begin(), zones_.end());
}

float ResourceMonitor::PoolPressure(uint64_t wanted) const {
  if (capacity_ == 0 || wanted <= capacity_) return 0.0f;
  return static_cast<float>(static_cast<double>(wanted - capacity_) / static_cast<double>(wanted));
}

float ResourceMonitor::DevicePressure() {
  const DeviceMemoryReading& reading = device_reader_.Read();
  DeviceMemoryStats stats;
  if (reading.psi.some) stats.psi_some_avg10 = reading.psi.some->avg10;
  if (reading.psi.full) stats.psi_full_avg10 = reading.psi.full->avg10;
  stats.mem_available_bytes = reading.meminfo.available_bytes;
  stats.mem_total_bytes = reading.meminfo.total_bytes;
  stats.trim_level = trim_level();
  stats.pressure = DeviceMemoryPressure(reading, stats.trim_level, options_.device_pressure);
  std::lock_guard<std::mutex> lock(device_stats_mutex_);
  device_stats_ = stats;
  return stats.pressure;
}

float ResourceMonitor::MemoryPressure(uint64_t wanted) {
  const float device = DevicePressure();
  const float fixed = pressure_override_.load(std::memory_order_relaxed);
  if (!std::isnan(fixed)) return fixed;
  return std::max(PoolPressure(wanted), device);
}

void ResourceMonitor::SetTrimLevel(TrimLevel level) {
  trim_level_.store(static_cast<int>(level), std::memory_order_relaxed);
}

TrimLevel ResourceMonitor::trim_level() const {
  return static_cast<TrimLevel>(trim_level_.load(std::memory_order_relaxed));
}

DeviceMemoryStats ResourceMonitor::device_stats() const {
  std::lock_guard<std::mutex> lock(device_stats_mutex_);
  return device_stats_;
}

void ResourceMonitor::OverridePressure(std::optional<float> pressure) {
  pressure_override_.store(pressure ? std::clamp(*pressure, 0.0f, 1.0f) : kNone,
                           std::memory_order_relaxed);
}

void ResourceMonitor::SetTemperature(std::optional<float> celsius) {
  host_temperature_.store(celsius.value_or(kNone), std::memory_order_relaxed);
}

std::optional<float> ResourceMonitor::ReadZones() const {
  std::optional<float> hottest;
  for (const std::string& zone : zones_) {
    // Millidegrees Celsius; a zone that fails to read (a sensor powered down) is skipped.
    std::ifstream in(zone);
    long long milli = 0;
    if (!(in >> milli)) continue;
    const float c = static_cast<float>(milli) / 1000.0f;
    if (!hottest || c > *hottest) hottest = c;
  }
  return hottest;
}

std::optional<float> ResourceMonitor::TemperatureC() {
  const float host = host_temperature_.load(std::memory_order_relaxed);
  if (!std::isnan(host)) return host;
  if (zones_.empty()) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  if (!polled_ || now - last_poll_ >= std::chrono::milliseconds(options_.thermal_poll_ms)) {
    zone_temperature_ = ReadZones();
    last_poll_ = now;
    polled_ = true;
  }
  return zone_temperature_;
}

bool ResourceMonitor::ThermalThrottled() {
  if (options_.thermal_limit_c <= 0) return false;
  const std::optional<float> c = TemperatureC();
  return c && *c > options_.thermal_limit_c;
}

}  // namespace moert::router
