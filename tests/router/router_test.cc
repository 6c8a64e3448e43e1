// The hardware-aware router and its resource monitor: bit-identical to the reference
// routing (model::RouteToken) with no adjustment in force, and each adjustment
// (residency under pressure, modality bias, thermal k, dynamic k) doing what
// router/router.h says, on hand-made logits.
#include "router/router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/config.h"
#include "model/layers.h"
#include "router/resource_monitor.h"
#include "router/temp_dir.h"

namespace moert::router {
namespace {

std::vector<uint64_t> Bitmap(int n_expert, std::initializer_list<int> resident) {
  std::vector<uint64_t> bits(static_cast<size_t>((n_expert + 63) / 64), 0);
  for (int e : resident) bits[static_cast<size_t>(e / 64)] |= uint64_t{1} << (e % 64);
  return bits;
}

struct Routed {
  std::vector<int> experts;
  std::vector<float> weights;
};

Routed Route(Router& router, int layer, const std::vector<float>& logits, int n_used,
             bool renormalize, std::span<const uint64_t> resident = {}) {
  const int n_expert = static_cast<int>(logits.size());
  (void)n_expert;
  Routed r;
  const int slots = router.slots(n_used);
  r.experts.resize(static_cast<size_t>(slots));
  r.weights.resize(static_cast<size_t>(slots));
  router.Route(layer, logits.data(), 1, n_used, renormalize, resident, r.experts.data(),
               r.weights.data());
  return r;
}

// Softmax over all, as the reference computes it.
std::vector<float> Probabilities(const std::vector<float>& logits) {
  std::vector<float> p(logits.size());
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] - max);
  for (float& v : p) v *= static_cast<float>(1.0 / sum);
  return p;
}

// Where a test's monitor gets the device's memory state from; never this machine's /proc,
// whose pressure would make the tests depend on what else runs.
enum class DeviceSource {
  kOff,     // device_memory_root empty: nothing read
  kAbsent,  // a root without the files (no /proc/pressure, as on many phones)
  kIdle,    // fake files: no PSI stalls, three quarters of the memory available
};
constexpr DeviceSource kDeviceSources[] = {DeviceSource::kOff, DeviceSource::kAbsent,
                                           DeviceSource::kIdle};

constexpr char kIdlePsi[] =
    "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
constexpr char kIdleMemInfo[] = "MemTotal:       16777216 kB\nMemAvailable:   12582912 kB\n";
constexpr uint64_t kIdleAvailableBytes = uint64_t{12} << 30;

void WriteDeviceFiles(const TempDir& dir, const std::string& psi, const std::string& meminfo) {
  WriteFile(dir.path() / "proc/pressure/memory", psi);
  WriteFile(dir.path() / "proc/meminfo", meminfo);
}

// `options` reading the device from `source` (files under `dir`), re-read at every step.
ResourceMonitorOptions WithDevice(DeviceSource source, const TempDir& dir,
                                  ResourceMonitorOptions options = {}) {
  options.device_memory_poll_ms = 0;
  options.device_memory_root = source == DeviceSource::kOff ? "" : (dir.path() / "proc").string();
  std::filesystem::remove_all(dir.path() / "proc");
  if (source == DeviceSource::kIdle) WriteDeviceFiles(dir, kIdlePsi, kIdleMemInfo);
  return options;
}

ResourceMonitorOptions WithoutDevice(ResourceMonitorOptions options = {}) {
  options.device_memory_root = "";
  return options;
}

class RouterIsaTest : public ::testing::TestWithParam<kernels::Isa> {};

TEST_P(RouterIsaTest, WithoutAdjustmentsEqualsTheReferenceBitForBit) {
  auto config = kernels::KernelConfigFor(GetParam());
  ASSERT_TRUE(config.ok()) << config.status();
  TempDir dir;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (DeviceSource source : kDeviceSources) {
    for (int n_expert : {8, 60, 64, 128, 256, 300}) {
      for (int k : {1, 2, 4, 8}) {
        for (bool renormalize : {false, true}) {
          // No pool, no thermal limit, an idle device or none: pressure 0.
          ResourceMonitor monitor(WithDevice(source, dir));
          Router router(*config, RouterOptions{}, 1, n_expert, &monitor);
          router.BeginStep();
          for (int trial = 0; trial < 50; ++trial) {
            std::vector<float> logits(static_cast<size_t>(n_expert));
            for (float& v : logits) v = normal(rng);
            if (trial % 5 == 0) {
              // Ties: the reference breaks them toward the lower index.
              for (float& v : logits) v = std::round(v);
            }
            std::vector<int> want(static_cast<size_t>(k));
            std::vector<float> want_w(static_cast<size_t>(k));
            model::RouteToken(logits.data(), n_expert, k, renormalize, want.data(), want_w.data());
            // Every expert resident under full pressure is no adjustment either.
            const std::vector<uint64_t> all(static_cast<size_t>((n_expert + 63) / 64),
                                            ~uint64_t{0});
            const Routed got = Route(router, 0, logits, k, renormalize, all);
            ASSERT_EQ(got.experts, want) << "E " << n_expert << " k " << k;
            for (int i = 0; i < k; ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got.weights[static_cast<size_t>(i)]),
                        std::bit_cast<uint32_t>(want_w[static_cast<size_t>(i)]));
            }
          }
          EXPECT_EQ(router.stats().changed, 0u);
          EXPECT_EQ(router.stats().average_k(), k);
          EXPECT_EQ(router.pressure(), 0.0f);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, RouterIsaTest, ::testing::ValuesIn(kernels::AvailableIsas()),
                         [](const auto& p) { return std::string(kernels::IsaName(p.param)); });

TEST(RouterTest, ResidencyPenaltyPrefersResidentExpertsUnderPressure) {
  const std::vector<float> logits = {2.0f, 1.9f, 1.0f, 0.5f, -1.0f, 0.0f, 0.2f, 0.1f};
  const std::vector<float> p = Probabilities(logits);
  const std::vector<uint64_t> resident = Bitmap(8, {1, 2, 5});
  ResourceMonitor monitor;
  RouterOptions options;
  options.alpha = 1.0f;
  Router router(kernels::GetKernelConfig(), options, 1, 8, &monitor);

  // Full pressure: expert 0 scores 2.0 - 1 = 1.0 < 1.9 (expert 1) and ties expert 2
  // (1.0) with the lower index winning, so the top 2 are {1, 0}.
  monitor.OverridePressure(1.0f);
  router.BeginStep();
  EXPECT_FLOAT_EQ(router.pressure(), 1.0f);
  Routed r = Route(router, 0, logits, 2, false, resident);
  EXPECT_EQ(r.experts, (std::vector<int>{1, 0}));
  // Weights are the unadjusted probabilities of the chosen experts.
  EXPECT_EQ(r.weights[0], p[1]);
  EXPECT_EQ(r.weights[1], p[0]);
  r = Route(router, 0, logits, 1, true, resident);
  EXPECT_EQ(r.experts, (std::vector<int>{1}));
  EXPECT_EQ(r.weights[0], 1.0f);
  EXPECT_EQ(router.stats().changed, 1u);  // k = 2 chose the same set {0, 1}; k = 1 did not

  // Low pressure: a penalty of 0.05 leaves expert 0 on top.
  monitor.OverridePressure(0.05f);
  router.BeginStep();
  r = Route(router, 0, logits, 1, true, resident);
  EXPECT_EQ(r.experts, (std::vector<int>{0}));

  // alpha 0: no penalty at any pressure.
  options.alpha = 0;
  router.set_options(options);
  monitor.OverridePressure(1.0f);
  router.BeginStep();
  r = Route(router, 0, logits, 1, true, resident);
  EXPECT_EQ(r.experts, (std::vector<int>{0}));

  // A strong penalty pushes both choices onto resident experts.
  options.alpha = 4;
  router.set_options(options);
  r = Route(router, 0, logits, 2, false, resident);
  EXPECT_EQ(r.experts, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.weights[1], p[2]);
}

TEST(RouterTest, PressureIsTheWantedWorkingSetBeyondThePool) {
  ResourceMonitorOptions monitor_options = WithoutDevice();
  monitor_options.pressure_window_steps = 2;
  ResourceMonitor monitor(monitor_options);
  Router router(kernels::GetKernelConfig(), RouterOptions{}, 2, 8, &monitor);
  router.BeginStep();
  EXPECT_EQ(router.pressure(), 0.0f);  // no pool
  monitor.set_pool_capacity(4);
  std::vector<float> logits(8, 0.0f);
  // Step 1: layer 0 wants {0, 1}, layer 1 wants {2, 3}, then {4, 5}.
  logits = {5, 4, 0, 0, 0, 0, 0, 0};
  Route(router, 0, logits, 2, true);
  logits = {0, 0, 5, 4, 0, 0, 0, 0};
  Route(router, 1, logits, 2, true);
  logits = {0, 0, 0, 0, 5, 4, 0, 0};
  Route(router, 1, logits, 2, true);
  EXPECT_EQ(router.WantedExperts(2), 6u);
  router.BeginStep();
  EXPECT_FLOAT_EQ(router.pressure(), 2.0f / 6.0f);  // 6 wanted, 4 fit
  // Steps 2 and 3 want only {0, 1}: step 1 leaves the window, the working set fits.
  logits = {5, 4, 0, 0, 0, 0, 0, 0};
  Route(router, 0, logits, 2, true);
  router.BeginStep();
  Route(router, 0, logits, 2, true);
  router.BeginStep();
  EXPECT_EQ(router.WantedExperts(2), 2u);
  EXPECT_EQ(router.pressure(), 0.0f);
}

// Every decision of a run that mixes pool pressure (a pool that fits, then one that does
// not), partly resident experts, the thermal limit, dynamic k and a modality bias.
struct Trace {
  std::vector<int> experts;
  std::vector<uint32_t> weight_bits;
  std::vector<float> pressures;
  RouterStats stats;
};

Trace RouteMixedRun(ResourceMonitorOptions monitor_options) {
  constexpr int kLayers = 2, kExperts = 64, kTokens = 3, kUsed = 4;
  monitor_options.thermal_limit_c = 70;
  monitor_options.thermal_root = "/nonexistent";
  ResourceMonitor monitor(monitor_options);
  RouterOptions options;
  options.modality_lambda = 1;
  Router router(kernels::GetKernelConfig(), options, kLayers, kExperts, &monitor);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> bias(kLayers * kExperts);
  for (float& b : bias) b = normal(rng) / 4;
  EXPECT_TRUE(router.SetModalityBias(bias).ok());
  Trace trace;
  for (int step = 0; step < 40; ++step) {
    monitor.set_pool_capacity(step < 10 ? 1000 : 12);
    monitor.SetTemperature(step % 7 == 3 ? 90.0f : 40.0f);
    options.dynamic_k_p = step >= 20 && step < 30 ? 0.7f : 0;
    options.k_max = options.dynamic_k_p > 0 ? 6 : 0;
    router.set_options(options);
    router.SetImageShare(step % 2 == 1 ? 0.5f : 0);
    router.BeginStep();
    trace.pressures.push_back(router.pressure());
    std::vector<uint64_t> resident(1, static_cast<uint64_t>(rng()) << 32 | rng());
    for (int layer = 0; layer < kLayers; ++layer) {
      std::vector<float> logits(kTokens * kExperts);
      for (float& v : logits) v = normal(rng);
      const int slots = router.slots(kUsed);
      std::vector<int> experts(static_cast<size_t>(kTokens * slots));
      std::vector<float> weights(experts.size());
      router.Route(layer, logits.data(), kTokens, kUsed, layer == 0, resident, experts.data(),
                   weights.data());
      trace.experts.insert(trace.experts.end(), experts.begin(), experts.end());
      for (float w : weights) trace.weight_bits.push_back(std::bit_cast<uint32_t>(w));
    }
  }
  trace.stats = router.stats();
  return trace;
}

TEST(RouterTest, AnIdleDeviceRoutesBitForBitAsNoDeviceSource) {
  TempDir dir;
  const Trace want = RouteMixedRun(WithDevice(DeviceSource::kOff, dir));
  // The run exercises what it should: pressure 0 and above, changed choices, thermal k.
  EXPECT_EQ(want.pressures.front(), 0.0f);
  EXPECT_GT(want.pressures.back(), 0.0f);
  EXPECT_GT(want.stats.changed, 0u);
  EXPECT_GT(want.stats.thermal_drops, 0u);
  EXPECT_FALSE(want.stats.device.psi_some_avg10.has_value());
  for (DeviceSource source : {DeviceSource::kAbsent, DeviceSource::kIdle}) {
    const Trace got = RouteMixedRun(WithDevice(source, dir));
    EXPECT_EQ(got.experts, want.experts);
    EXPECT_EQ(got.weight_bits, want.weight_bits);
    EXPECT_EQ(got.pressures, want.pressures);
    EXPECT_EQ(got.stats.changed, want.stats.changed);
    EXPECT_EQ(got.stats.experts, want.stats.experts);
    EXPECT_EQ(got.stats.thermal_drops, want.stats.thermal_drops);
    EXPECT_EQ(got.stats.device.pressure, 0.0f);
    EXPECT_EQ(got.stats.pressure, got.stats.pool_pressure);
  }
  const Trace idle = RouteMixedRun(WithDevice(DeviceSource::kIdle, dir));
  EXPECT_EQ(idle.stats.device.psi_some_avg10, 0.0f);
  EXPECT_EQ(idle.stats.device.mem_available_bytes, kIdleAvailableBytes);
}

TEST(RouterTest, DevicePressurePrefersResidentExpertsAsPoolPressureDoes) {
  // The residency test's logits: expert 0 leads expert 1 by 0.1 and is not resident.
  const std::vector<float> logits = {2.0f, 1.9f, 1.0f, 0.5f, -1.0f, 0.0f, 0.2f, 0.1f};
  const std::vector<uint64_t> resident = Bitmap(8, {1, 2, 5});
  TempDir dir;
  ResourceMonitor monitor(WithDevice(DeviceSource::kIdle, dir));
  monitor.set_pool_capacity(100);  // the working set fits: no pool pressure
  Router router(kernels::GetKernelConfig(), RouterOptions{}, 1, 8, &monitor);
  const auto route = [&] {
    router.BeginStep();
    return Route(router, 0, logits, 1, true, resident).experts[0];
  };
  EXPECT_EQ(route(), 0);
  EXPECT_EQ(router.pressure(), 0.0f);

  // PSI some avg10 50%: device pressure 1, a penalty of 1 logit.
  WriteDeviceFiles(dir, "some avg10=50.00 avg60=20.00 avg300=5.00 total=999\n", kIdleMemInfo);
  EXPECT_EQ(route(), 1);
  EXPECT_EQ(router.pressure(), 1.0f);
  EXPECT_EQ(router.stats().pool_pressure, 0.0f);
  EXPECT_EQ(router.stats().device.psi_some_avg10, 50.0f);
  EXPECT_FALSE(router.stats().device.psi_full_avg10.has_value());
  EXPECT_EQ(router.stats().device.pressure, 1.0f);
  EXPECT_EQ(router.stats().changed, 1u);

  // 6% of the memory available: pressure 0.5.
  WriteDeviceFiles(dir, kIdlePsi, "MemTotal: 1000000 kB\nMemAvailable: 60000 kB\n");
  EXPECT_EQ(route(), 1);
  EXPECT_NEAR(router.pressure(), 0.5f, 1e-5f);
  EXPECT_EQ(router.stats().device.mem_available_bytes, uint64_t{60000} * 1024);

  // The host's trim level alone: running-moderate is 0.25 (1.75 < 1.9), ui-hidden 0.
  WriteDeviceFiles(dir, kIdlePsi, kIdleMemInfo);
  monitor.SetTrimLevel(TrimLevel::kRunningModerate);
  EXPECT_EQ(route(), 1);
  EXPECT_EQ(router.pressure(), 0.25f);
  EXPECT_EQ(router.stats().device.trim_level, TrimLevel::kRunningModerate);
  monitor.SetTrimLevel(TrimLevel::kUiHidden);
  EXPECT_EQ(route(), 0);
  EXPECT_EQ(router.pressure(), 0.0f);

  // alpha 0 turns the penalty off at any pressure.
  monitor.SetTrimLevel(TrimLevel::kComplete);
  RouterOptions no_penalty;
  no_penalty.alpha = 0;
  router.set_options(no_penalty);
  EXPECT_EQ(route(), 0);
  EXPECT_EQ(router.pressure(), 1.0f);
}

TEST(ResourceMonitorTest, MemoryPressureIsTheLargerOfPoolAndDevice) {
  TempDir dir;
  ResourceMonitor monitor(WithDevice(DeviceSource::kIdle, dir));
  monitor.set_pool_capacity(4);
  EXPECT_FLOAT_EQ(monitor.MemoryPressure(6), 1.0f / 3.0f);  // 6 wanted, 4 fit; device 0
  EXPECT_EQ(monitor.MemoryPressure(6), monitor.PoolPressure(6));
  monitor.SetTrimLevel(TrimLevel::kRunningModerate);  // 0.25 < 1/3
  EXPECT_FLOAT_EQ(monitor.MemoryPressure(6), 1.0f / 3.0f);
  EXPECT_EQ(monitor.MemoryPressure(2), 0.25f);  // the pool fits; the device does not
  monitor.SetTrimLevel(TrimLevel::kRunningLow);
  EXPECT_EQ(monitor.MemoryPressure(6), 0.5f);
  EXPECT_EQ(monitor.device_stats().trim_level, TrimLevel::kRunningLow);
  EXPECT_EQ(monitor.device_stats().pressure, 0.5f);

  // An override wins; the device is still read for the stats.
  monitor.OverridePressure(0.1f);
  monitor.SetTrimLevel(TrimLevel::kRunningCritical);
  EXPECT_FLOAT_EQ(monitor.MemoryPressure(6), 0.1f);
  EXPECT_EQ(monitor.device_stats().pressure, 1.0f);
  EXPECT_EQ(monitor.device_stats().mem_available_bytes, kIdleAvailableBytes);
}

TEST(ResourceMonitorTest, DeviceFilesAreReadAtMostOncePerPollInterval) {
  TempDir dir;
  ResourceMonitorOptions options = WithDevice(DeviceSource::kIdle, dir);
  options.device_memory_poll_ms = 3600 * 1000;
  ResourceMonitor monitor(options);
  EXPECT_EQ(monitor.DevicePressure(), 0.0f);
  WriteDeviceFiles(dir, "some avg10=90.00 avg60=0 avg300=0 total=1\n", kIdleMemInfo);
  EXPECT_EQ(monitor.DevicePressure(), 0.0f);  // the last reading
  EXPECT_EQ(monitor.device_memory_reads(), 1u);
  // The trim level is not rate-limited: it counts at the next step.
  monitor.SetTrimLevel(TrimLevel::kBackground);
  EXPECT_EQ(monitor.DevicePressure(), 0.5f);
  EXPECT_EQ(monitor.device_memory_reads(), 1u);
}

TEST(RouterTest, TheTrimLevelMayChangeFromAnotherThreadWhileRouting) {
  const std::vector<float> logits = {2.0f, 1.9f, 1.0f, 0.5f, -1.0f, 0.0f, 0.2f, 0.1f};
  const std::vector<uint64_t> resident = Bitmap(8, {1, 2, 5});
  ResourceMonitor monitor(WithoutDevice());
  monitor.set_pool_capacity(100);
  Router router(kernels::GetKernelConfig(), RouterOptions{}, 1, 8, &monitor);
  std::atomic<bool> done{false};
  std::thread host([&] {
    for (int i = 0; !done.load(); ++i) {
      monitor.SetTrimLevel(static_cast<TrimLevel>(i % kTrimLevelCount));
      (void)monitor.device_stats();
    }
  });
  int bad = 0;
  for (int step = 0; step < 5000; ++step) {
    router.BeginStep();
    const float p = router.pressure();
    bad += p != 0 && p != 0.25f && p != 0.5f && p != 1.0f;
    const int chosen = Route(router, 0, logits, 1, true, resident).experts[0];
    bad += chosen != (p > 0.1f ? 1 : 0);  // each step routes with the pressure it read
    bad += router.stats().device.pressure != p;
  }
  done = true;
  host.join();
  EXPECT_EQ(bad, 0);
  monitor.SetTrimLevel(TrimLevel::kNone);
  router.BeginStep();
  EXPECT_EQ(router.pressure(), 0.0f);
}

TEST(RouterTest, ThermalLimitDropsKByOneButNeverBelowOne) {
  ResourceMonitorOptions monitor_options;
  monitor_options.thermal_limit_c = 70;
  monitor_options.thermal_root = "/nonexistent";
  ResourceMonitor monitor(monitor_options);
  Router router(kernels::GetKernelConfig(), RouterOptions{}, 1, 8, &monitor);
  const std::vector<float> logits = {0.1f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f, 0.5f, 0.2f};
  const std::vector<float> p = Probabilities(logits);

  router.BeginStep();  // no temperature known: not throttled
  EXPECT_FALSE(router.thermal_throttled());
  EXPECT_EQ(Route(router, 0, logits, 2, false).experts, (std::vector<int>{1, 2}));

  monitor.SetTemperature(85.0f);
  router.BeginStep();
  EXPECT_TRUE(router.thermal_throttled());
  Routed r = Route(router, 0, logits, 2, true);
  EXPECT_EQ(r.experts, (std::vector<int>{1, -1}));
  EXPECT_EQ(r.weights, (std::vector<float>{1.0f, 0.0f}));  // renormalised over k = 1
  r = Route(router, 0, logits, 1, false);
  EXPECT_EQ(r.experts, (std::vector<int>{1}));
  EXPECT_EQ(r.weights[0], p[1]);
  EXPECT_EQ(router.stats().thermal_drops, 1u);

  monitor.SetTemperature(65.0f);
  router.BeginStep();
  EXPECT_EQ(Route(router, 0, logits, 2, false).experts, (std::vector<int>{1, 2}));
  monitor.SetTemperature(std::nullopt);
  router.BeginStep();
  EXPECT_FALSE(router.thermal_throttled());
}

TEST(RouterTest, KReductionTakesExpertsOffAndTheThermalDropDoesNotStackOnIt) {
  ResourceMonitorOptions monitor_options;
  monitor_options.thermal_limit_c = 70;
  monitor_options.thermal_root = "/nonexistent";
  ResourceMonitor monitor(monitor_options);
  RouterOptions options;
  options.k_reduction = 1;
  Router router(kernels::GetKernelConfig(), options, 1, 8, &monitor);
  const std::vector<float> logits = {0.1f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f, 0.5f, 0.2f};
  router.BeginStep();
  EXPECT_EQ(Route(router, 0, logits, 3, false).experts, (std::vector<int>{1, 2, -1}));
  monitor.SetTemperature(85.0f);  // k - 1 already: the heat takes no more
  router.BeginStep();
  EXPECT_EQ(Route(router, 0, logits, 3, false).experts, (std::vector<int>{1, 2, -1}));
  EXPECT_EQ(router.stats().thermal_drops, 0u);
  options.k_reduction = 5;  // never below one
  router.set_options(options);
  EXPECT_EQ(Route(router, 0, logits, 3, false).experts, (std::vector<int>{1, -1, -1}));
  options.k_reduction = -1;
  EXPECT_THAT(std::string(Router::Validate(options).message()),
              ::testing::HasSubstr("k_reduction"));
}

TEST(RouterTest, DynamicKTakesTheFewestExpertsThatCoverP) {
  // p ~ {0.665, 0.245, 0.090, ...}: log-odds chosen so the cumulative sums are clear.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, -6.0f, -6.0f, -6.0f, -6.0f, -6.0f};
  const std::vector<float> p = Probabilities(logits);
  RouterOptions options;
  options.dynamic_k_p = 0.5f;
  Router router(kernels::GetKernelConfig(), options, 1, 8, nullptr);
  router.BeginStep();
  EXPECT_EQ(Route(router, 0, logits, 2, false).experts, (std::vector<int>{0, -1}));
  options.dynamic_k_p = 0.8f;
  router.set_options(options);
  Routed r = Route(router, 0, logits, 2, false);
  EXPECT_EQ(r.experts, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.weights, (std::vector<float>{p[0], p[1]}));
  // k_max above the model's k widens the slots.
  options.dynamic_k_p = 0.95f;
  options.k_max = 4;
  router.set_options(options);
  EXPECT_EQ(router.slots(2), 4);
  EXPECT_EQ(Route(router, 0, logits, 2, false).experts, (std::vector<int>{0, 1, 2, -1}));
  // k_min holds even when one expert covers p.
  options.dynamic_k_p = 0.1f;
  options.k_min = 2;
  router.set_options(options);
  EXPECT_EQ(Route(router, 0, logits, 2, false).experts, (std::vector<int>{0, 1, -1, -1}));
  EXPECT_DOUBLE_EQ(router.stats().average_k(), (1 + 2 + 3 + 2) / 4.0);
}

TEST(RouterTest, ModalityBiasFollowsTheImageShare) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, 0.0f};
  RouterOptions options;
  options.modality_lambda = 4.0f;
  Router router(kernels::GetKernelConfig(), options, 2, 4, nullptr);
  EXPECT_EQ(router.SetModalityBias({1, 2, 3}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(router.SetModalityBias({0, 0, 0, 0, /*layer 1*/ 0, 0, 0, 1}).ok());
  router.BeginStep();
  EXPECT_EQ(Route(router, 1, logits, 1, true).experts, (std::vector<int>{0}));  // text only
  router.SetImageShare(0.25f);  // lambda 1: expert 3 scores 1.0, ties expert 1, loses
  EXPECT_EQ(Route(router, 1, logits, 2, true).experts, (std::vector<int>{0, 1}));
  router.SetImageShare(1.0f);  // lambda 4
  Routed r = Route(router, 1, logits, 2, false);
  EXPECT_EQ(r.experts, (std::vector<int>{3, 0}));
  EXPECT_EQ(Route(router, 0, logits, 1, true).experts, (std::vector<int>{0}));  // no bias there
}

TEST(RouterTest, BadOptionsAreNamed) {
  RouterOptions options;
  options.alpha = -1;
  EXPECT_NE(std::string(Router::Validate(options).message()).find("alpha"), std::string::npos);
  options.alpha = std::nanf("");
  EXPECT_FALSE(Router::Validate(options).ok());
  options = {};
  options.dynamic_k_p = 1.5f;
  EXPECT_NE(std::string(Router::Validate(options).message()).find("dynamic k"), std::string::npos);
  options = {};
  options.k_min = 0;
  EXPECT_FALSE(Router::Validate(options).ok());
  options = {};
  options.k_min = 3;
  options.k_max = 2;
  EXPECT_FALSE(Router::Validate(options).ok());
  EXPECT_TRUE(Router::Validate(RouterOptions{}).ok());
}

// Random gate logits for `n` tokens of `n_expert` experts.
std::vector<float> RandomLogits(int64_t n, int n_expert, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(n * n_expert));
  for (float& v : logits) v = normal(rng);
  return logits;
}

Routed RouteMany(Router& router, const std::vector<float>& logits, int64_t n, int n_used,
                 bool renormalize) {
  Routed r;
  const size_t slots = static_cast<size_t>(router.slots(n_used));
  r.experts.resize(static_cast<size_t>(n) * slots);
  r.weights.resize(static_cast<size_t>(n) * slots);
  router.Route(0, logits.data(), n, n_used, renormalize, {}, r.experts.data(), r.weights.data());
  return r;
}

RouterOptions Uniform(uint64_t seed) {
  RouterOptions options;
  options.routing = RoutingOverride::kUniform;
  options.routing_seed = seed;
  return options;
}

TEST(RouterUniformTest, DrawsKDistinctExpertsWeightedByTheirProbabilities) {
  constexpr int kExperts = 16, kUsed = 4;
  constexpr int64_t kTokens = 500;
  const std::vector<float> logits = RandomLogits(kTokens, kExperts, 7);
  for (bool renormalize : {true, false}) {
    SCOPED_TRACE(renormalize ? "renormalized" : "plain");
    Router router(kernels::GetKernelConfig(), Uniform(42), 1, kExperts, nullptr);
    router.BeginStep();
    const Routed r = RouteMany(router, logits, kTokens, kUsed, renormalize);
    for (int64_t t = 0; t < kTokens; ++t) {
      const std::vector<float> p = Probabilities(std::vector<float>(
          logits.begin() + t * kExperts, logits.begin() + (t + 1) * kExperts));
      std::vector<bool> seen(kExperts, false);
      float chosen_p = 0, sum = 0;
      for (int i = 0; i < kUsed; ++i) {
        const int e = r.experts[static_cast<size_t>(t * kUsed + i)];
        ASSERT_GE(e, 0) << "token " << t;
        ASSERT_LT(e, kExperts) << "token " << t;
        ASSERT_FALSE(seen[static_cast<size_t>(e)]) << "token " << t << " drew expert " << e << " twice";
        seen[static_cast<size_t>(e)] = true;
        chosen_p += p[static_cast<size_t>(e)];
        sum += r.weights[static_cast<size_t>(t * kUsed + i)];
      }
      for (int i = 0; i < kUsed; ++i) {
        const size_t at = static_cast<size_t>(t * kUsed + i);
        const float want = p[static_cast<size_t>(r.experts[at])] / (renormalize ? chosen_p : 1.0f);
        EXPECT_NEAR(r.weights[at], want, 1e-5f) << "token " << t << " slot " << i;
      }
      if (renormalize) {
        EXPECT_NEAR(sum, 1.0f, 1e-5f) << "token " << t;
      }
    }
    EXPECT_EQ(router.stats().token_layers, static_cast<uint64_t>(kTokens));
    EXPECT_EQ(router.stats().experts, static_cast<uint64_t>(kTokens * kUsed));
    EXPECT_EQ(router.stats().changed, 0u);
    // Over 500 tokens every expert was drawn: the working set is all of them.
    EXPECT_EQ(router.WantedExperts(1), static_cast<uint64_t>(kExperts));
  }
}

TEST(RouterUniformTest, IsDeterministicForASeedAndDiffersAcrossSeeds) {
  constexpr int kExperts = 32, kUsed = 2;
  constexpr int64_t kTokens = 64;
  const std::vector<float> logits = RandomLogits(kTokens, kExperts, 3);
  const auto draw = [&](uint64_t seed) {
    Router router(kernels::GetKernelConfig(), Uniform(seed), 1, kExperts, nullptr);
    router.BeginStep();
    return RouteMany(router, logits, kTokens, kUsed, true).experts;
  };
  EXPECT_EQ(draw(1), draw(1));
  EXPECT_EQ(draw(99), draw(99));
  EXPECT_NE(draw(1), draw(2));
  EXPECT_NE(draw(1), draw(99));
  // Not the model's choice either.
  Router model(kernels::GetKernelConfig(), RouterOptions{}, 1, kExperts, nullptr);
  model.BeginStep();
  EXPECT_NE(draw(1), RouteMany(model, logits, kTokens, kUsed, true).experts);
}

TEST(RouterUniformTest, EveryExpertIsDrawnAboutKOverNOfTheTime) {
  // Logits that all but force expert 0 in the model's routing: the draw ignores them.
  constexpr int kExperts = 8, kUsed = 2;
  constexpr int64_t kTokens = 20000;
  std::vector<float> logits(static_cast<size_t>(kTokens * kExperts), 0.0f);
  for (int64_t t = 0; t < kTokens; ++t) logits[static_cast<size_t>(t * kExperts)] = 20.0f;
  Router router(kernels::GetKernelConfig(), Uniform(2024), 1, kExperts, nullptr);
  router.BeginStep();
  const Routed r = RouteMany(router, logits, kTokens, kUsed, true);
  std::vector<int64_t> count(kExperts, 0);
  for (int e : r.experts) ++count[static_cast<size_t>(e)];
  // Expected k/n of the tokens (5000); one standard deviation is about 61, so 10%
  // (500) is 8 of them (and the seed is fixed: the figure cannot move from run to run).
  const double expected = static_cast<double>(kTokens) * kUsed / kExperts;
  for (int e = 0; e < kExperts; ++e) {
    EXPECT_NEAR(static_cast<double>(count[static_cast<size_t>(e)]), expected, 0.1 * expected)
        << "expert " << e;
  }
}

TEST(RouterUniformTest, KeepsDynamicAndReducedK) {
  constexpr int kExperts = 8;
  RouterOptions options = Uniform(5);
  options.k_reduction = 1;
  Router router(kernels::GetKernelConfig(), options, 1, kExperts, nullptr);
  router.BeginStep();
  const std::vector<float> logits = RandomLogits(1, kExperts, 11);
  const Routed r = Route(router, 0, logits, 3, true);
  ASSERT_EQ(r.experts.size(), 3u);
  // Slots 0 and 1 hold two distinct real experts, slot 2 none (k 3 less one).
  EXPECT_GE(r.experts[1], 0);
  EXPECT_LT(r.experts[1], kExperts);
  EXPECT_NE(r.experts[0], r.experts[1]);
  EXPECT_EQ(r.experts[2], -1);
  EXPECT_EQ(r.weights[2], 0.0f);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6f);
}

TEST(RouterUniformTest, NamesAndValidation) {
  EXPECT_EQ(RoutingName(RoutingOverride::kModel), "model");
  EXPECT_EQ(RoutingName(RoutingOverride::kUniform), "uniform");
  EXPECT_EQ(ParseRouting("model"), RoutingOverride::kModel);
  EXPECT_EQ(ParseRouting("uniform"), RoutingOverride::kUniform);
  EXPECT_EQ(ParseRouting("foo"), std::nullopt);
  EXPECT_EQ(ParseRouting(""), std::nullopt);
  EXPECT_TRUE(Router::Validate(Uniform(0)).ok());
  RouterOptions bad;
  bad.routing = static_cast<RoutingOverride>(7);
  EXPECT_NE(std::string(Router::Validate(bad).message()).find("routing"), std::string::npos);
}

TEST(ResourceMonitorTest, ReadsTheHottestCpuZone) {
  TempDir dir;
  WriteFile(dir.path() / "thermal_zone0/type", "battery\n");
  WriteFile(dir.path() / "thermal_zone0/temp", "90000\n");
  WriteFile(dir.path() / "thermal_zone1/type", "cpu0-thermal\n");
  WriteFile(dir.path() / "thermal_zone1/temp", "45000\n");
  WriteFile(dir.path() / "thermal_zone2/type", "x86_pkg_temp\n");
  WriteFile(dir.path() / "thermal_zone2/temp", "52500\n");
  WriteFile(dir.path() / "thermal_zone3/type", "cpu-1-0-usr\n");
  WriteFile(dir.path() / "thermal_zone3/temp", "garbage\n");  // unreadable: skipped
  WriteFile(dir.path() / "cooling_device0/type", "cpu\n");
  ResourceMonitorOptions options;
  options.thermal_root = dir.path().string();
  options.thermal_limit_c = 50;
  options.thermal_poll_ms = 0;
  ResourceMonitor monitor(options);
  EXPECT_EQ(monitor.thermal_zones().size(), 3u);
  ASSERT_TRUE(monitor.TemperatureC().has_value());
  EXPECT_FLOAT_EQ(*monitor.TemperatureC(), 52.5f);
  EXPECT_TRUE(monitor.ThermalThrottled());
  WriteFile(dir.path() / "thermal_zone2/temp", "48000\n");
  EXPECT_FLOAT_EQ(*monitor.TemperatureC(), 48.0f);
  EXPECT_FALSE(monitor.ThermalThrottled());
  // The host's reading wins over sysfs.
  monitor.SetTemperature(75.0f);
  EXPECT_FLOAT_EQ(*monitor.TemperatureC(), 75.0f);
  EXPECT_TRUE(monitor.ThermalThrottled());
  monitor.set_thermal_limit(0);
  EXPECT_FALSE(monitor.ThermalThrottled());

  ResourceMonitorOptions missing;
  missing.thermal_root = (dir.path() / "nothing").string();
  ResourceMonitor none(missing);
  EXPECT_FALSE(none.TemperatureC().has_value());
}

TEST(ResourceMonitorTest, PressureOverrideIsClamped) {
  ResourceMonitor monitor(WithoutDevice());
  monitor.set_pool_capacity(10);
  EXPECT_EQ(monitor.MemoryPressure(8), 0.0f);
  EXPECT_FLOAT_EQ(monitor.MemoryPressure(40), 0.75f);
  monitor.OverridePressure(3.0f);
  EXPECT_EQ(monitor.MemoryPressure(8), 1.0f);
  monitor.OverridePressure(std::nullopt);
  EXPECT_EQ(monitor.MemoryPressure(8), 0.0f);
}

TEST(ModalityBiasFileTest, ReadsNumbersAndNamesBadOnes) {
  TempDir dir;
  WriteFile(dir.path() / "good", "0 1.5\n-2 3e-1\n");
  auto good = ReadModalityBias((dir.path() / "good").string());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, (std::vector<float>{0.0f, 1.5f, -2.0f, 0.3f}));
  WriteFile(dir.path() / "bad", "0 1 x2\n");
  auto bad = ReadModalityBias((dir.path() / "bad").string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("value 3 ('x2')"), std::string::npos);
  EXPECT_EQ(ReadModalityBias((dir.path() / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moert::router
