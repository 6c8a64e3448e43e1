// moert-bench-update: what an expert hot update costs a runtime that is generating.
// It copies the model into --dir, perturbs the listed experts (a stand-in for retrained
// ones, as moert-delta perturb does), makes the signed delta package, loads the copy,
// starts a greedy generation and applies the package from another thread after
// --update-at tokens. It reports the package against the changed experts' bytes, how
// the update went (in place or a reload, the runtime's metric), how long ApplyUpdate
// took and how long it held the steps off (the swap), the steps while it ran against
// the median step before it (a session's first step after the swap evaluates its
// context again on the new weights: a prompt's time), and the
// resident set before and at its peak during the update (sampled every 2 ms).
//
// Run: moert-bench-update -m MODEL [--experts L:E,...] [--fraction F] [--steps N]
//        [-t THREADS] [--pool-fraction F] [-n TOKENS] [--update-at K] [--dir FOLDER]
//        [--reload]
//   -n           tokens per generation (default 64): generations follow one another
//                until the update is done and 8 more tokens came
//   --experts    the experts to change (default 0:0,0:1,1:0,1:1)
//   --fraction   the share of their weights moved (default 0.25), --steps by how many
//                quantization steps (default 1)
//   --reload     also change the model's name in the header, so the update cannot go
//                in place (the whole model is loaded again): the cost before issue 21
//   --dir        where the copy and the package go (default the temp folder; removed)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "experts/delta_make.h"
#include "experts/delta_package.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "moert/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  std::vector<std::pair<int, int>> experts = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  double fraction = 0.25;
  int steps = 1;
  int threads = 2;
  double pool_fraction = 0;
  int tokens = 64;  // per generation
  int update_at = 16;
  std::string dir;
  bool reload = false;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "moert-bench-update: %s\n"
               "usage: moert-bench-update -m MODEL [--experts L:E,...] [--fraction F] "
               "[--steps N] [-t THREADS] [--pool-fraction F] [-n TOKENS] [--update-at K] "
               "[--dir FOLDER] [--reload]\n",
               why.c_str());
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(flag + " needs a value");
      return argv[++i];
    };
    const auto number = [&](double lo, double hi) {
      const std::string v = value();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(d >= lo && d <= hi)) {
        Usage(flag + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "], got '" + v + "'");
      }
      return d;
    };
    if (flag == "-m" || flag == "--model") {
      a.model = value();
    } else if (flag == "--experts") {
      auto experts = moert::experts::ParseExpertList(value());
      if (!experts.ok()) Usage("--experts: " + std::string(experts.status().message()));
      a.experts = std::move(*experts);
    } else if (flag == "--fraction") {
      a.fraction = number(1e-6, 1);
    } else if (flag == "--steps") {
      a.steps = static_cast<int>(number(1, 127));
    } else if (flag == "-t" || flag == "--threads") {
      a.threads = static_cast<int>(number(1, 256));
    } else if (flag == "--pool-fraction") {
      a.pool_fraction = number(0, 1);
    } else if (flag == "-n") {
      a.tokens = static_cast<int>(number(2, 100000));
    } else if (flag == "--update-at") {
      a.update_at = static_cast<int>(number(1, 100000));
    } else if (flag == "--dir") {
      a.dir = value();
    } else if (flag == "--reload") {
      a.reload = true;
    } else {
      Usage("unknown argument '" + flag + "'");
    }
  }
  if (a.model.empty()) Usage("-m MODEL is required");
  if (a.update_at >= a.tokens) Usage("--update-at must be below -n");
  return a;
}

// This process's resident set in bytes: all of it (VmRSS) and its anonymous part
// (RssAnon: what is not file pages the kernel can drop); 0 where unknown.
struct Resident {
  uint64_t all = 0;
  uint64_t anon = 0;
};
Resident ResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  Resident r;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) r.all = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    if (line.rfind("RssAnon:", 0) == 0) r.anon = std::strtoull(line.c_str() + 8, nullptr, 10) * 1024;
  }
  return r;
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The counter's value in the runtime's metrics text (0 when absent).
double Metric(const moert::MoERuntime& runtime, const std::string& key) {
  // A sample line starts with its name (# HELP and # TYPE lines name it too).
  const std::string text = "\n" + runtime.Metrics();
  const size_t at = text.find("\n" + key + " ");
  return at == std::string::npos ? 0 : std::strtod(text.c_str() + at + key.size() + 2, nullptr);
}

bool WriteFile(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out.flush());
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int Run(const Args& a, const std::string& dir) {
  const std::string base = dir + "/base.gguf";
  const std::string package_path = dir + "/update.moert-delta";
  std::error_code ec;
  std::filesystem::copy_file(a.model, base, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) {
    std::fprintf(stderr, "moert-bench-update: copying %s: %s\n", a.model.c_str(), ec.message().c_str());
    return 1;
  }
  moert::experts::KeyPair keys = moert::experts::GenerateKeyPair();
  uint64_t package_bytes = 0, changed_bytes = 0;
  {
    auto file = moert::format::GgufFile::Open(base);
    if (!file.ok()) {
      std::fprintf(stderr, "moert-bench-update: %s\n", file.status().ToString().c_str());
      return 1;
    }
    auto target = moert::experts::PerturbExperts(**file, a.experts, a.fraction, 7, a.steps);
    if (!target.ok()) {
      std::fprintf(stderr, "moert-bench-update: %s\n", target.status().ToString().c_str());
      return 1;
    }
    if (a.reload) {
      auto parsed = moert::format::GgufFile::FromBuffer(*target, "target");
      const moert::format::GgufKeyValue* name =
          parsed.ok() ? (*parsed)->FindKey("general.name") : nullptr;
      if (name == nullptr || name->value.str.empty()) {
        std::fprintf(stderr, "moert-bench-update: --reload needs a general.name in the model\n");
        return 1;
      }
      uint8_t& c = (*target)[static_cast<size_t>(
          reinterpret_cast<const uint8_t*>(name->value.str.data()) - target->data())];
      c = c == 'X' ? 'Y' : 'X';
    }
    auto target_file = moert::format::GgufFile::FromBuffer(*target, "target");
    if (!target_file.ok()) {
      std::fprintf(stderr, "moert-bench-update: %s\n", target_file.status().ToString().c_str());
      return 1;
    }
    auto package = moert::experts::MakeDeltaPackage(**file, **target_file, keys.secret_key);
    if (!package.ok()) {
      std::fprintf(stderr, "moert-bench-update: %s\n", package.status().ToString().c_str());
      return 1;
    }
    package_bytes = package->size();
    if (!WriteFile(package_path, *package)) {
      std::fprintf(stderr, "moert-bench-update: cannot write %s\n", package_path.c_str());
      return 1;
    }
    for (const auto& [layer, expert] : a.experts) {
      (void)expert;
      for (moert::format::TensorKind kind :
           {moert::format::TensorKind::kFfnGateExps, moert::format::TensorKind::kFfnUpExps,
            moert::format::TensorKind::kFfnDownExps}) {
        const moert::format::GgufTensorInfo* t =
            (*file)->FindTensor(moert::format::TensorWeightName(kind, layer));
        // A stacked expert tensor: [cols][rows][n_expert] in ggml order.
        if (t == nullptr || t->dims.size() != 3 || t->dims[2] == 0) continue;
        changed_bytes += t->n_bytes / t->dims[2];
      }
    }
  }

  moert::RuntimeOptions options;
  options.threads = a.threads;
  options.hot_set = false;
  options.cache_dir = dir + "/cache";
  options.expert_pool_fraction = a.pool_fraction;
  options.update_public_key = moert::experts::ToHex(keys.public_key);
  std::unique_ptr<moert::MoERuntime> runtime;
  moert::Status status = moert::MoERuntime::Create(options, &runtime);
  if (status.ok()) status = runtime->LoadModel(base);
  std::unique_ptr<moert::Session> session;
  if (status.ok()) status = runtime->CreateSession(&session);
  if (!status.ok()) {
    std::fprintf(stderr, "moert-bench-update: %s\n", status.ToString().c_str());
    return 1;
  }

  // The resident set, sampled until the generation ends.
  std::atomic<bool> sampling{true};
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, Resident>> rss;
  std::thread sampler([&] {
    while (sampling.load()) {
      const Resident bytes = ResidentBytes();
      {
        std::lock_guard<std::mutex> lock(mu);
        rss.emplace_back(Clock::now(), bytes);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  std::condition_variable cv;
  bool update_now = false;
  std::atomic<bool> update_done{false};
  Clock::time_point applied_from, applied_to;
  moert::Status applied;
  std::thread updater([&] {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return update_now; });
    }
    applied_from = Clock::now();
    applied = runtime->ApplyUpdate(package_path);
    applied_to = Clock::now();
    update_done = true;
  });

  // Generations of -n tokens one after another (the context reset between them) until
  // the update is done and 8 more tokens came: each step's time is the gap between two
  // tokens of one generation (a generation's first token holds its prompt).
  std::vector<std::pair<Clock::time_point, Clock::time_point>> steps;  // from, to
  int tokens = 0, after_update = 0;
  bool stop = false;
  moert::GenerateRequest request;
  request.prompt = "Once upon a time";
  request.max_tokens = a.tokens;
  request.temperature = 0.0f;
  while (status.ok() && !stop) {
    Clock::time_point last{};
    moert::GenerateResult result;
    status = session->Generate(
        request,
        [&](std::string_view, int32_t) {
          const Clock::time_point now = Clock::now();
          if (last != Clock::time_point{}) steps.emplace_back(last, now);
          last = now;
          if (++tokens == a.update_at) {
            std::lock_guard<std::mutex> lock(mu);
            update_now = true;
            cv.notify_one();
          }
          if (update_done.load() && ++after_update >= 8) stop = true;
          return !stop;
        },
        &result);
    if (stop && status.code() == moert::StatusCode::kCancelled) status = moert::Status();
    session->Reset();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    update_now = true;  // a generation that failed early
    cv.notify_one();
  }
  updater.join();
  sampling = false;
  sampler.join();
  if (!status.ok() || !applied.ok()) {
    std::fprintf(stderr, "moert-bench-update: generation: %s; update: %s\n",
                 status.ToString().c_str(), applied.ToString().c_str());
    return 1;
  }

  std::vector<double> before, during;
  for (const auto& [from, to] : steps) {
    if (to < applied_from) {
      before.push_back(Ms(to - from));
    } else if (from <= applied_to) {
      during.push_back(Ms(to - from));
    }
  }
  std::sort(before.begin(), before.end());
  Resident rss_before, rss_peak;
  for (const auto& [at, bytes] : rss) {
    if (at <= applied_from) rss_before = bytes;
    if (at >= applied_from && at <= applied_to + std::chrono::milliseconds(20)) {
      rss_peak.all = std::max(rss_peak.all, bytes.all);
      rss_peak.anon = std::max(rss_peak.anon, bytes.anon);
    }
  }
  const bool in_place = Metric(*runtime, "moert_expert_updates_total{how=\"in_place\"}") > 0;
  const double mib = 1024.0 * 1024.0;
  std::printf("cpu: %s\n", CpuName().c_str());
  std::printf("model: %s, threads %d, pool fraction %.2f\n", a.model.c_str(), a.threads,
              a.pool_fraction);
  std::printf("experts changed: %zu, their bytes: %llu, package: %llu bytes (%.1f%%)\n",
              a.experts.size(), static_cast<unsigned long long>(changed_bytes),
              static_cast<unsigned long long>(package_bytes),
              changed_bytes > 0 ? 100.0 * static_cast<double>(package_bytes) /
                                      static_cast<double>(changed_bytes)
                                : 0.0);
  std::printf("update: %s, ApplyUpdate %.1f ms, steps held off %.1f ms\n",
              in_place ? "in_place" : "reload", Ms(applied_to - applied_from),
              1e3 * Metric(*runtime, "moert_update_steps_held_seconds_total"));
  std::sort(during.begin(), during.end());
  std::printf(
      "steps: median before %.2f ms; while updating: median %.2f ms, longest %.2f ms (%zu steps)\n",
      before.empty() ? 0.0 : before[before.size() / 2],
      during.empty() ? 0.0 : during[during.size() / 2], during.empty() ? 0.0 : during.back(),
      during.size());
  const auto print_rss = [&](const char* what, uint64_t was, uint64_t peak) {
    std::printf("%s: before %.1f MiB, peak while updating %.1f MiB (+%.1f MiB)\n", what,
                static_cast<double>(was) / mib, static_cast<double>(peak) / mib,
                (static_cast<double>(peak) - static_cast<double>(was)) / mib);
  };
  print_rss("rss", rss_before.all, rss_peak.all);
  print_rss("rss_anon", rss_before.anon, rss_peak.anon);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const std::string root = a.dir.empty() ? std::filesystem::temp_directory_path().string() : a.dir;
  const std::string dir = root + "/moert-bench-update-" + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "moert-bench-update: %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  const int rc = Run(a, dir);
  std::filesystem::remove_all(dir, ec);
  return rc;
}
