// What the router needs to know about the device: memory pressure on the expert pool
// and on the device, and whether the chip is too hot. Each can be set from outside
// (tests, and the host app: phones often forbid reading /sys/class/thermal and
// /proc/pressure).
//
// Pool pressure, in [0, 1]: the share of the experts the model wanted in the last
// `pressure_window_steps` steps that the pool cannot hold, (wanted - capacity) /
// wanted; 0 while that working set fits, and always 0 without a pool. "Wanted" counts
// the unadjusted choices, so the penalty does not switch itself off by shrinking the
// working set it measures.
//
// Device pressure, in [0, 1] (device_memory.h): the largest of what PSI, MemAvailable
// under `device_memory_root` (read at most every `device_memory_poll_ms`) and the host's
// trim level say, each 0 below its threshold. The router's pressure is the larger of the
// two, max(pool, device): with no device pressure it is the pool's, bit for bit.
//
// Temperature: the host's value when set, else the hottest CPU-like zone under
// `thermal_root` (zones whose type names a CPU, SoC or package), read at most every
// `thermal_poll_ms`. Throttled: thermal_limit_c > 0 and the temperature is above it.
#ifndef MOERT_ROUTER_RESOURCE_MONITOR_H_
#define MOERT_ROUTER_RESOURCE_MONITOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "router/device_memory.h"

namespace moert::router {

struct ResourceMonitorOptions {
  float thermal_limit_c = 0;  // 0: no thermal limit
  std::string thermal_root = "/sys/class/thermal";
  int thermal_poll_ms = 1000;
  int pressure_window_steps = 4;
  // The folder with pressure/memory and meminfo; empty: neither is read (the host's
  // trim level still counts).
  std::string device_memory_root = "/proc";
  int device_memory_poll_ms = 1000;
  DevicePressureThresholds device_pressure;
};

class ResourceMonitor {
 public:
  explicit ResourceMonitor(ResourceMonitorOptions options = {});

  const ResourceMonitorOptions& options() const { return options_; }
  void set_thermal_limit(float celsius) { options_.thermal_limit_c = celsius; }

  // The expert pool's capacity in experts; 0: no pool (pressure 0).
  void set_pool_capacity(uint64_t experts) { capacity_ = experts; }
  uint64_t pool_capacity() const { return capacity_; }

  // The pool's pressure for `wanted` experts in the window.
  float PoolPressure(uint64_t wanted) const;
  // The device's pressure: reads the files when due (rate-limited), combines them with
  // the trim level and records the readings for device_stats(). The routing thread.
  float DevicePressure();
  // The router's pressure: the override, else max(PoolPressure(wanted), DevicePressure()).
  // The device is read (and its stats recorded) under an override too.
  float MemoryPressure(uint64_t wanted);
  // A fixed pressure in [0, 1] (clamped); nullopt: computed again.
  void OverridePressure(std::optional<float> pressure);

  // The host app's memory signal (onTrimMemory); any thread. It holds until set again
  // (kNone: no signal).
  void SetTrimLevel(TrimLevel level);
  TrimLevel trim_level() const;
  // The readings behind the last DevicePressure(); any thread.
  DeviceMemoryStats device_stats() const;
  // How many times the device files were read (tests of the rate limit).
  uint64_t device_memory_reads() const { return device_reader_.reads(); }

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
  std::atomic<int> trim_level_{0};         // a TrimLevel
  DeviceMemoryReader device_reader_;       // the routing thread only
  mutable std::mutex device_stats_mutex_;
  DeviceMemoryStats device_stats_;         // under device_stats_mutex_
  std::vector<std::string> zones_;
  std::optional<float> zone_temperature_;
  std::chrono::steady_clock::time_point last_poll_{};
  bool polled_ = false;
};

}  // namespace moert::router

#endif  // MOERT_ROUTER_RESOURCE_MONITOR_H_
