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
    : options_(std::move(options)), pressure_override_(kNone), host_temperature_(kNone) {
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

float ResourceMonitor::MemoryPressure(uint64_t wanted) const {
  const float fixed = pressure_override_.load(std::memory_order_relaxed);
  if (!std::isnan(fixed)) return fixed;
  if (capacity_ == 0 || wanted <= capacity_) return 0.0f;
  return static_cast<float>(static_cast<double>(wanted - capacity_) / static_cast<double>(wanted));
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
