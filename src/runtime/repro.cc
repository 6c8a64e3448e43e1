// What a session's repro bundle holds (see repro.h).
#include "runtime/repro.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "core/cache_dir.h"
#include "core/strings.h"
#include "experts/io_mode.h"
#include "runtime/internal.h"
#include "telemetry/platform.h"
#include "telemetry/trace.h"

namespace moert::runtime {

namespace {

std::string OptionsText(const RuntimeOptions& o) {
  return StrCat("threads=", o.threads, "\ncontext_length=", o.context_length,
                "\nmemory_budget_bytes=", o.memory_budget_bytes,
                "\nexpert_pool_bytes=", o.expert_pool_bytes,
                "\nexpert_pool_fraction=", o.expert_pool_fraction, "\nio_mode=", experts::IoModeName(ToExpertsIoMode(o.io_mode)),
                "\nshrink_pool_for_sessions=", o.shrink_pool_for_sessions ? 1 : 0,
                "\nexpert_pool_floor_bytes=", o.expert_pool_floor_bytes,
                "\ncache_type_k=", o.cache_type_k, "\ncache_type_v=", o.cache_type_v,
                "\nhot_set=", o.hot_set ? 1 : 0, "\nlock_weights=", o.lock_weights ? 1 : 0,
                "\nloader_wait_deadline_ms=", o.loader_wait_deadline_ms,
                "\nrouter_alpha=", o.router_alpha, "\ndynamic_k=", o.dynamic_k,
                "\nthermal_limit_c=", o.thermal_limit_c, "\nprefetch=", o.prefetch ? 1 : 0,
                "\nprefetch_depth=", o.prefetch_depth, "\nbackend=", model::BackendName(ToModelBackend(o.backend)),
                "\nmodality_lambda=", o.modality_lambda,
                "\nmodality_bias_path=", o.modality_bias_path,
                "\ninference_guard=", o.inference_guard ? 1 : 0,
                "\ndegrade_policy=", o.degrade_policy ? 1 : 0,
                "\ndegrade_rules_path=", o.degrade_rules_path, "\n");
}

// The first line of `path` that starts with `key`, after its ':' (trimmed); "" if none.
std::string ProcField(const char* path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

// One line per value: a newline in a value would start a key of its own.
std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

ReproSettings MakeReproSettings(const RuntimeOptions& options, const ModelInfo& info) {
  ReproSettings s;
  s.on_error = options.repro_on_error;
  s.on_degrade = options.repro_on_degrade;
  if (!options.repro_dir.empty()) {
    s.dir = options.repro_dir;
  } else if (const std::string cache = core::CacheDirOr(options.cache_dir); !cache.empty()) {
    s.dir = cache + "/repro";
  }
  s.max_bytes = options.repro_max_bytes > 0 ? static_cast<uint64_t>(options.repro_max_bytes)
                                            : telemetry::kReproDefaultMaxBytes;
  s.options = OptionsText(options);
  s.fingerprint = DeviceFingerprint(info);
  s.model = StrCat("path=", OneLine(info.path), "\nhash=", ModelHash(info.path),
                   "\narchitecture=", info.architecture, "\nname=", OneLine(info.name),
                   "\nbackend=", info.backend, "\ncontext_length=", info.context_length, "\n");
  return s;
}

std::string ModelHash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable";
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(std::max<std::streamoff>(in.tellg(), 0));
  in.seekg(0);
  uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](uint8_t byte) {
    h ^= byte;
    h *= 0x100000001b3ull;
  };
  for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(size >> (8 * i)));
  std::vector<char> buf(1 << 16);
  uint64_t left = std::min<uint64_t>(size, 4u << 20);
  while (left > 0 && in) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    in.read(buf.data(), static_cast<std::streamsize>(want));
    const size_t got = static_cast<size_t>(in.gcount());
    for (size_t i = 0; i < got; ++i) mix(static_cast<uint8_t>(buf[i]));
    if (got == 0) break;
    left -= got;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return StrCat("fnv1a64:", hex);
}

std::string DeviceFingerprint(const ModelInfo& info) {
  std::string cpu = ProcField("/proc/cpuinfo", "model name");
  if (cpu.empty()) cpu = ProcField("/proc/cpuinfo", "Hardware");
  if (cpu.empty()) cpu = ProcField("/proc/cpuinfo", "CPU part");
  std::string features = ProcField("/proc/cpuinfo", "flags");
  if (features.empty()) features = ProcField("/proc/cpuinfo", "Features");
  struct utsname u = {};
  const bool named = uname(&u) == 0;
  std::string out = StrCat(
      "cpu=", cpu, "\ncpu_features=", features, "\ncores=", std::thread::hardware_concurrency(),
      "\nmem_total=", ProcField("/proc/meminfo", "MemTotal"),
      "\nmem_available=", ProcField("/proc/meminfo", "MemAvailable"),
      "\nkernel=", named ? StrCat(u.sysname, " ", u.release) : std::string(),
      "\nmachine=", named ? std::string(u.machine) : std::string(), "\nbackend=", info.backend, "\n");
  if (info.backend == "OpenCL") {
    out += StrCat("opencl_device=", OneLine(info.device), "\nopencl_driver=", OneLine(info.driver), "\n");
  }
  return out;
}

telemetry::ReproBundle BuildReproBundle(const ReproSettings& settings, model::Model& model,
                                        const ReproCapture& capture) {
  telemetry::ReproBundle b;
  b.trigger = capture.trigger;
  b.error = capture.error;
  b.created_ns = telemetry::NowNs();
  b.fingerprint = settings.fingerprint;
  b.model = settings.model;
  b.options = settings.options;
  b.tokens.assign(capture.tokens.begin(), capture.tokens.end());
  if (capture.router_logits != nullptr) {
    telemetry::ReproRouterLogits& r = b.router_logits;
    for (size_t l = 0; l < capture.router_logits->size(); ++l) {
      const std::vector<float>& row = (*capture.router_logits)[l];
      if (row.empty()) continue;
      if (r.width == 0) r.width = static_cast<int32_t>(row.size());
      if (row.size() != static_cast<size_t>(r.width)) continue;  // one width per bundle
      r.layers.push_back(static_cast<int32_t>(l));
      r.logits.insert(r.logits.end(), row.begin(), row.end());
    }
  }
  if (capture.cache != nullptr && capture.cache->size() > 0) {
    telemetry::ReproKv& kv = b.kv;
    const int layers = std::min<int>(kReproKvLayers, static_cast<int>(model.spec().n_layer));
    const int positions = std::min(capture.cache->size(), kReproKvPositions);
    std::vector<float> keys, values;
    int64_t kw = 0, vw = 0;
    for (int l = 0; l < layers; ++l) {
      if (!capture.cache->ReadF32(l, positions, &keys, &values, &kw, &vw).ok()) {
        kv = telemetry::ReproKv();  // a cache that is not f32: no KV section
        break;
      }
      kv.layers = l + 1;
      kv.positions = positions;
      kv.key_width = static_cast<int32_t>(kw);
      kv.value_width = static_cast<int32_t>(vw);
      kv.keys.insert(kv.keys.end(), keys.begin(), keys.end());
      kv.values.insert(kv.values.end(), values.begin(), values.end());
    }
  }
  b.pool = model.pool_state();
  // The last 2 s of trace events (none unless tracing is on).
  const uint64_t since = b.created_ns - std::min<uint64_t>(b.created_ns, 2'000'000'000);
  const telemetry::TraceSnapshot trace = telemetry::CollectTrace(since);
  if (!trace.events.empty()) b.trace = telemetry::TraceJson(trace);
  return b;
}

std::string ReproPath(const std::string& dir, const std::string& trigger) {
  static std::atomic<uint64_t> counter{0};
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return StrCat(dir, "/repro-", ms, "-", static_cast<int64_t>(getpid()), "-", counter++, "-",
                trigger, ".moert-repro");
}

}  // namespace moert::runtime
