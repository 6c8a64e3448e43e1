// What the router needs to know about the device: memory pressure on the expert pool
// and whether the chip is too hot. Both can be set from outside (tests, and the host
// app: phones often forbid reading /sys/class/thermal).
//
// Pressure, in [0, 1]: the share of the experts the model wanted in the last
// `pressure_window_steps` steps that the pool cannot hold, (wanted - capacity) /
// wanted; 0 while that working set fits, and always 0 without a pool. "Wanted" counts
// the unadjusted choices, so the penalty does not switch itself off by shrinking the
// working set it measures.
//
// Temperature: the host's value when set, else the hottest CPU-like zone under
// `thermal_root` (zones whose type names a CPU, SoC or package), read at most every
// `thermal_poll_ms`. Throttled: thermal_limit_c > 0 and the temperature is above it.
#ifndef MOERT_ROUTER_RESOURCE_MONITOR_H_
#define MOERT_ROUTER_RESOURCE_MONITOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moert::router {

struct ResourceMonitorOptions {
  float thermal_limit_c = 0;  // 0: no thermal limit
  std::string thermal_root = "/sys/class/thermal";
  int thermal_poll_ms = 1000;
  int pressure_window_steps = 4;
};

class ResourceMonitor {
 public:
  explicit ResourceMonitor(ResourceMonitorOptions options = {});

  const ResourceMonitorOptions& options() const { return options_; }
  void set_thermal_limit(float celsius) { options_.thermal_limit_c = celsius; }

  // The expert pool's capacity in experts; 0: no pool (pressure 0).
  void set_pool_capacity(uint64_t experts) { capacity_ = experts; }
  uint64_t pool_capacity() const { return capacity_; }

  // Pressure for `wanted` experts in the window, or the override.
  float MemoryPressure(uint64_t wanted) const;
  // A fixed pressure in [0, 1] (clamped); nullopt: computed again.
  void OverridePressure(std::optional<float> pressure);

  // The temperature in degrees Celsius (nullopt: unknown: no host value, no readable zone).
  std::optional<float> TemperatureC();
  // The host app's temperature reading; nullopt: back to sysfs. Any thread.
  void SetTemperature(std::optional<float> celsius);
  bool ThermalThrottled();

  // The zones' temp files found under thermal_root (tests, diagnostics).
  const std::vector<std::string>& thermal_zones() const { return zones_; }

 private:
  std::optional<float> ReadZones() const;

  ResourceMonitorOptions options_;
  uint64_t capacity_ = 0;
  std::atomic<float> pressure_override_;  // NaN: none
  std::atomic<float> host_temperature_;   // NaN: none
  std::vector<std::string> zones_;
  std::optional<float> zone_temperature_;
  std::chrono::steady_clock::time_point last_poll_{};
  bool polled_ = false;
};

}  // namespace moert::router

#endif  // MOERT_ROUTER_RESOURCE_MONITOR_H_
