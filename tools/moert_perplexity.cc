// moert-perplexity: perplexity of a GGUF model over a text file, computed as
// llama.cpp's llama-perplexity does (model/perplexity.h), so the numbers compare
// directly. Progress goes to stderr; the result is the last line on stdout:
// `PPL = <value> +/- <error>`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/kv_type.h"
#include "experts/io_mode.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "telemetry/trace.h"
#include "metrics_file.h"
#include "telemetry/runtime_metrics.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kUsage[] =
    "usage: moert-perplexity -m FILE -f TEXT_FILE -c CTX [-b BATCH] [-t THREADS]\n"
    "\n"
    "Perplexity of the GGUF model FILE over TEXT_FILE, as llama-perplexity computes\n"
    "it: the text is tokenized with BOS and cut into chunks of CTX tokens; each chunk\n"
    "starts with BOS and an empty context, and its second half is scored.\n"
    "\n"
    "  -m, --model FILE        GGUF model\n"
    "  -f, --file TEXT_FILE    text to score (at least 2 * CTX tokens)\n"
    "  -c, --ctx-size CTX      tokens per chunk\n"
    "  -b, --batch-size BATCH  tokens per forward pass (default: CTX)\n"
    "  -t, --threads N         compute threads (default: 1; 0: one per core)\n"
    "  -ctk, --cache-type-k T  KV cache type for K: f32 (default), f16, q8_0\n"
    "  -ctv, --cache-type-v T  KV cache type for V: f32 (default), f16, q8_0\n"
    "  --chunks N              score only the first N chunks\n"
    "  --mlock                 lock the weights outside the expert pool in RAM\n"
    "  --cache-dir DIR         where OpenCL program binaries are kept\n"
    "  --memory-budget-mb N    everything the model may hold, in MiB: the routed\n"
    "                          experts are then loaded on demand into an expert pool\n"
    "  --expert-pool-mb N      an expert pool of N MiB\n"
    "  --expert-pool FRACTION  an expert pool of this fraction (0, 1] of what all\n"
    "                          routed experts take (1: every expert fits)\n"
    "  --io MODE               how pooled experts are read: direct (default),\n"
    "                          buffered or mmap\n"
    "  --router-alpha A        under memory pressure, lower non-resident experts'\n"
    "                          gate logits by A * pressure (default 1; 0: off)\n"
    "  --dynamic-k P           each token takes the fewest experts whose routing\n"
    "                          probability reaches P (0 < P <= 1; default off)\n"
    "  --thermal-limit C       above C degrees Celsius, one expert fewer per token\n"
    "                          (default 0: no limit)\n"
    "  --prefetch on|off       with a pool, read the experts the next layer's router\n"
    "                          predicts while this layer computes (default on)\n"
    "  --prefetch-depth N      predict N layers ahead (default 1)\n"
    "  --dense-fallback        run each MoE layer's dense fallback FFN (moert-pack\n"
    "                          --dense-fallback) instead of its routed experts\n"
    "  --backend cpu|opencl|auto  where the model runs (default cpu; auto: an OpenCL\n"
    "                          GPU that passes a self-test, else the CPU)\n"
    "  --trace FILE            record trace spans and write them to FILE at exit\n"
    "                          (Chrome trace-event JSON: open in ui.perfetto.dev)\n"
    "  --metrics FILE          write the metrics (Prometheus text) to FILE at exit\n"
    "  --metrics-interval N    ... and every N seconds (default 0: only at exit)\n"
    "  -h, --help              show this help\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-perplexity: error: %s\n", message.c_str());
  return 1;
}

// A non-negative int, or false.
bool ParseCount(const char* text, int* out) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value > (1L << 30)) return false;
  *out = static_cast<int>(value);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  std::string text_path;
  int n_ctx = -1;
  int n_batch = 0;
  int threads = 1;
  int max_chunks = 0;
  int memory_budget_mb = 0;
  int expert_pool_mb = 0;
  double expert_pool_fraction = 0;
  moert::experts::IoMode io = moert::experts::IoMode::kDirect;
  moert::router::RouterOptions router;
  moert::backend::KvType kv_type_k = moert::backend::KvType::kF32;
  moert::backend::KvType kv_type_v = moert::backend::KvType::kF32;
  bool load_options_lock = false;  // --mlock
  std::string cache_dir;           // --cache-dir
  float thermal_limit = 0;
  bool prefetch = true;
  int prefetch_depth = 1;
  bool dense_fallback = false;
  moert::model::Backend backend = moert::model::Backend::kCpu;
  std::string trace_path;  // --trace FILE
  moert::tools::MetricsFlags metrics_flags;

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (std::string error; moert::tools::ParseMetricsFlag(argc, argv, &i, &metrics_flags, &error)) {
      if (!error.empty()) return Fail(error);
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    auto value = [&](std::string_view what) -> const char* {
      if (i + 1 >= argc) {
        Fail(std::string(arg) + " needs " + std::string(what) + " (see --help)");
        return nullptr;
      }
      return argv[++i];
    };
    auto count = [&](std::string_view what, int* out) {
      const char* v = value(what);
      if (v == nullptr) return false;
      if (!ParseCount(v, out)) {
        Fail(std::string(arg) + " needs " + std::string(what) + ", got '" + v + "'");
        return false;
      }
      return true;
    };
    // A float within [low, high] (an open end when `open_low`).
    auto number = [&](std::string_view what, float low, bool open_low, float high, float* out) {
      const char* v = value(what);
      if (v == nullptr) return false;
      char* end = nullptr;
      const float x = std::strtof(v, &end);
      if (end == v || *end != '\0' || !(open_low ? x > low : x >= low) || !(x <= high)) {
        Fail(std::string(arg) + " needs " + std::string(what) + ", got '" + v + "'");
        return false;
      }
      *out = x;
      return true;
    };
    if (arg == "-m" || arg == "--model") {
      const char* v = value("a FILE");
      if (v == nullptr) return 1;
      model_path = v;
    } else if (arg == "-f" || arg == "--file") {
      const char* v = value("a TEXT_FILE");
      if (v == nullptr) return 1;
      text_path = v;
    } else if (arg == "-c" || arg == "--ctx-size") {
      if (!count("a number of tokens", &n_ctx)) return 1;
    } else if (arg == "-b" || arg == "--batch-size") {
      if (!count("a number of tokens", &n_batch)) return 1;
    } else if (arg == "-t" || arg == "--threads") {
      if (!count("a number of threads", &threads)) return 1;
    } else if (arg == "--chunks") {
      if (!count("a number of chunks", &max_chunks)) return 1;
    } else if (arg == "--memory-budget-mb") {
      if (!count("a number of MiB", &memory_budget_mb)) return 1;
    } else if (arg == "--expert-pool-mb") {
      if (!count("a number of MiB", &expert_pool_mb)) return 1;
    } else if (arg == "--expert-pool") {
      const char* v = value("a FRACTION");
      if (v == nullptr) return 1;
      char* end = nullptr;
      expert_pool_fraction = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(expert_pool_fraction > 0 && expert_pool_fraction <= 1)) {
        return Fail(std::string(arg) + " needs a fraction in (0, 1], got '" + v + "'");
      }
    } else if (arg == "--io") {
      const char* v = value("a MODE");
      if (v == nullptr) return 1;
      const std::optional<moert::experts::IoMode> mode = moert::experts::ParseIoMode(v);
      if (!mode) {
        return Fail(std::string(arg) + " needs direct, buffered or mmap, got '" + v + "'");
      }
      io = *mode;
    } else if (arg == "--router-alpha") {
      if (!number("a number >= 0", 0, false, 1e30f, &router.alpha)) return 1;
    } else if (arg == "--dynamic-k") {
      if (!number("a probability in (0, 1]", 0, true, 1, &router.dynamic_k_p)) return 1;
    } else if (arg == "--thermal-limit") {
      if (!number("degrees Celsius > 0", 0, true, 1e30f, &thermal_limit)) return 1;
    } else if (arg == "--prefetch") {
      const char* v = value("on or off");
      if (v == nullptr) return 1;
      if (std::string_view(v) != "on" && std::string_view(v) != "off") {
        return Fail(std::string(arg) + " needs on or off, got '" + v + "'");
      }
      prefetch = std::string_view(v) == "on";
    } else if (arg == "--mlock") {
      load_options_lock = true;
    } else if (arg == "--cache-dir") {
      const char* v = value("a DIR");
      if (v == nullptr) return 1;
      cache_dir = v;
    } else if (arg == "--trace") {
      const char* v = value("a FILE");
      if (v == nullptr) return 1;
      trace_path = v;
    } else if (arg == "--dense-fallback") {
      dense_fallback = true;
    } else if (arg == "--prefetch-depth") {
      if (!count("a number of layers", &prefetch_depth)) return 1;
    } else if (arg == "-ctk" || arg == "--cache-type-k" || arg == "-ctv" ||
               arg == "--cache-type-v") {
      const char* v = value("a TYPE");
      if (v == nullptr) return 1;
      auto parsed = moert::backend::ParseKvType(v);
      if (!parsed.ok()) return Fail(std::string(arg) + ": " + std::string(parsed.status().message()));
      (arg == "-ctk" || arg == "--cache-type-k" ? kv_type_k : kv_type_v) = *parsed;
    } else if (arg == "--backend") {
      const char* v = value("cpu, opencl or auto");
      if (v == nullptr) return 1;
      auto parsed = moert::model::ParseBackend(v);
      if (!parsed.ok()) {
        return Fail(std::string(arg) + ": " + std::string(parsed.status().message()));
      }
      backend = *parsed;
    } else {
      return Fail("unknown argument '" + std::string(arg) + "' (see --help)");
    }
  }
  if (model_path.empty()) return Fail("no model: give -m FILE (see --help)");
  if (text_path.empty()) return Fail("no text: give -f TEXT_FILE (see --help)");
  if (n_ctx < 0) return Fail("no context size: give -c CTX (see --help)");
  if (n_ctx < 3) return Fail("-c needs at least 3 tokens, got " + std::to_string(n_ctx));
  if (n_batch == 0) n_batch = n_ctx;
  // Declared before the model: written once it (and its loader thread) is gone.
  std::optional<moert::telemetry::TraceFile> trace;
  if (!trace_path.empty()) trace.emplace(trace_path);

  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail("cannot read '" + text_path + "'");
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();

  auto file = moert::format::GgufFile::Open(model_path);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  auto tokenizer = moert::tokenizer::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));
  if (expert_pool_mb > 0 && expert_pool_fraction > 0) {
    return Fail("give either --expert-pool-mb or --expert-pool, not both");
  }
  moert::model::ModelLoadOptions load_options;
  load_options.threads = threads;
  load_options.memory_budget_bytes = static_cast<uint64_t>(memory_budget_mb) << 20;
  load_options.expert_pool_bytes = static_cast<uint64_t>(expert_pool_mb) << 20;
  load_options.expert_pool_fraction = expert_pool_fraction;
  load_options.io_mode = io;
  load_options.kv_cache_positions = n_ctx;
  load_options.kv_type_k = kv_type_k;
  load_options.kv_type_v = kv_type_v;
  load_options.lock_weights = load_options_lock;
  load_options.cache_dir = cache_dir;
  load_options.router = router;
  load_options.resource_monitor.thermal_limit_c = thermal_limit;
  load_options.prefetch = prefetch;
  load_options.prefetch_depth = prefetch_depth;
  load_options.backend = backend;
  const auto registry = std::make_shared<moert::telemetry::Registry>();
  moert::telemetry::RegisterRuntimeMetrics(*registry);
  load_options.metrics = registry;
  moert::tools::MetricsFile metrics(
      metrics_flags, [registry] { return registry->PrometheusText(); }, "moert-perplexity");
  auto model = moert::model::Model::Load(**file, load_options);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  if (dense_fallback) {
    if (absl::Status status = (*model)->SetDenseFallback(true); !status.ok()) {
      return Fail(model_path + ": " + std::string(status.message()));
    }
    std::fprintf(stderr, "moert-perplexity: dense fallback FFN instead of the routed experts\n");
  }
  const moert::model::BackendStats backend_stats = (*model)->backend_stats();
  if (backend_stats.backend != "CPU") {
    std::fprintf(stderr, "moert-perplexity: backend %s on %s, driver %s\n",
                 backend_stats.backend.c_str(), backend_stats.device.c_str(),
                 backend_stats.driver.c_str());
    if (!backend_stats.pooled_experts.empty()) {
      std::fprintf(stderr, "moert-perplexity: pooled experts on the %s\n",
                   backend_stats.pooled_experts.c_str());
    }
  } else if (!backend_stats.cpu_reason.empty()) {
    std::fprintf(stderr, "moert-perplexity: backend CPU: OpenCL not used: %s\n",
                 backend_stats.cpu_reason.c_str());
  }

  // llama-perplexity: add_special (BOS as the vocabulary asks), no special parsing.
  const std::vector<moert::tokenizer::TokenId> tokens = tokenizer->Encode(text, true, false);
  if (tokens.size() < 2 * static_cast<size_t>(n_ctx)) {
    return Fail("'" + text_path + "' has " + std::to_string(tokens.size()) + " tokens; -c " +
                std::to_string(n_ctx) + " needs at least " +
                std::to_string(2 * static_cast<int64_t>(n_ctx)));
  }
  const int n_chunks_all = static_cast<int>(tokens.size() / static_cast<size_t>(n_ctx));
  const int n_chunks = max_chunks > 0 ? std::min(max_chunks, n_chunks_all) : n_chunks_all;
  std::fprintf(stderr,
               "moert-perplexity: %zu tokens, %d chunks of %d, scoring %d tokens per chunk, "
               "batch %d, %d thread(s)\n",
               tokens.size(), n_chunks, n_ctx, n_ctx - 1 - n_ctx / 2, n_batch, threads);

  moert::model::PerplexityOptions options;
  options.n_ctx = n_ctx;
  options.n_batch = n_batch;
  options.max_chunks = max_chunks;
  options.bos = tokenizer->vocab().add_bos() ? tokenizer->vocab().bos() : -1;
  options.progress = [](const moert::model::PerplexityProgress& p) {
    std::fprintf(stderr, "[%d]%.4f,", p.chunk, p.ppl);
    if (p.chunk % 10 == 0 || p.chunk == p.n_chunks) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
  const auto start = std::chrono::steady_clock::now();
  auto result = moert::model::ComputePerplexity(**model, tokens, options);
  if (!result.ok()) return Fail(std::string(result.status().message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "moert-perplexity: %d chunks, %lld tokens scored in %.1f s (%.0f tokens/s)\n",
               result->n_chunks, static_cast<long long>(result->n_scored), seconds,
               static_cast<double>(result->n_chunks) * n_ctx / seconds);
  const moert::model::MemoryStats memory = (*model)->memory_stats();
  if (load_options_lock) {
    if (memory.lock_error.empty()) {
      std::fprintf(stderr, "moert-perplexity: mlock: %llu bytes of weights locked\n",
                   static_cast<unsigned long long>(memory.locked_bytes));
    } else {
      std::fprintf(stderr, "moert-perplexity: mlock: %s\n", memory.lock_error.c_str());
    }
  }
  if (memory.expert_pool) {
    const moert::experts::ExpertCacheStats& pool = memory.pool;
    std::fprintf(stderr,
                 "moert-perplexity: expert pool %.1f MiB of a %.1f MiB budget, io %s: hit rate "
                 "%.2f%% (%llu hits, %llu misses), %llu evictions, %.1f MiB read\n",
                 static_cast<double>(pool.pool_bytes) / (1 << 20),
                 static_cast<double>(memory.budget_bytes) / (1 << 20), memory.io_mode.c_str(),
                 100 * pool.hit_rate(), static_cast<unsigned long long>(pool.hits),
                 static_cast<unsigned long long>(pool.misses),
                 static_cast<unsigned long long>(pool.evictions),
                 static_cast<double>(pool.bytes_loaded) / (1 << 20));
  }
  if (memory.prefetch) {
    const moert::pipeline::PrefetchStats& f = memory.prefetcher;
    std::fprintf(stderr,
                 "moert-perplexity: prefetch depth %d: precision %.2f%%, recall %.2f%%, %llu "
                 "loads started, %llu backed off\n",
                 memory.prefetch_depth, 100 * f.precision(), 100 * f.recall(),
                 static_cast<unsigned long long>(f.issued),
                 static_cast<unsigned long long>(f.backed_off));
  }
  if (const moert::router::Router* r = (*model)->router(); r != nullptr) {
    const moert::router::RouterStats& s = r->stats();
    std::fprintf(stderr,
                 "moert-perplexity: router alpha %g, dynamic k %g: average k %.3f, choice "
                 "changed at %.2f%% of %llu token-layers\n",
                 static_cast<double>(router.alpha), static_cast<double>(router.dynamic_k_p),
                 s.average_k(), 100 * s.changed_fraction(),
                 static_cast<unsigned long long>(s.token_layers));
  }
  if (const uint64_t f = (*model)->backend_stats().fallbacks; f > 0) {
    std::fprintf(stderr, "moert-perplexity: %llu request(s) fell back to the CPU; last: %s\n",
                 static_cast<unsigned long long>(f),
                 (*model)->backend_stats().last_fallback.c_str());
  }
  std::printf("PPL = %.4f +/- %.5f\n", result->ppl, result->ppl_error);
  if (std::fflush(stdout) != 0) return Fail("cannot write the output");
  return metrics.Finish() ? 0 : 1;
}
