// moert-bench: prefill and decode speed of a GGUF model, measured and reported as
// llama.cpp's llama-bench does, so the numbers compare directly: one warm-up, then
// -r repetitions of each test, tokens/s as the mean and the sample standard
// deviation over the repetitions; `-o json` prints llama-bench's JSON records (plus
// moert's own fields), `-o md` its table. Results go to stdout, progress to stderr.
//
// Tests (each in its own KV cache, sized for the test):
//   ppN  one Forward over N random token ids in an empty cache (n_gen 0);
//   tgN  N one-token Forwards from an empty cache (n_prompt 0).
// Warm-up as llama-bench does it: the whole prompt for ppN, one token for tgN.
//
// --synthetic SHAPE benchmarks a model moert-synth's generator makes on the spot
// (synth.h), written to a temporary file that is removed once loaded.
//
// Decode tests also report their share of the decode roofline (decode_roofline.h):
// the weight bytes a decoded token reads times tokens/s, over the read bandwidth
// measured at startup with the bench's threads (--read-bw gives it instead).
// --routing uniform draws every token-layer's experts uniformly at random
// (router/router.h): the worst case for the expert pool, where the model's own routing
// (a random-weight model's especially) repeats experts from token to token.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench/decode_roofline.h"
#include "core/strings.h"
#include "backend/kv_type.h"
#include "experts/io_mode.h"
#include "format/arch.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "model/model.h"
#include "router/router.h"
#include "image_bench.h"
#include "metrics_file.h"
#include "moert/version.h"
#include "synth.h"
#include "telemetry/trace.h"
#include "telemetry/runtime_metrics.h"
#include "tokenizer/tokenizer.h"

namespace {

using moert::StrAppend;
using moert::StrCat;

constexpr char kTool[] = "moert-bench";

// --- Options -------------------------------------------------------------------------

enum class OutputFormat { kJson, kMarkdown };

struct Params {
  std::string model_path;
  const moert::synth::Shape* synthetic = nullptr;
  std::string synthetic_out;  // empty: a temporary file
  std::optional<moert::format::GgmlType> synthetic_type;
  uint32_t synthetic_layers = 0;  // 0: all of the shape's
  int n_prompt = 512;
  int n_gen = 128;
  int repetitions = 5;
  int threads = 0;  // 0: one per core
  int poll = -1;    // ModelLoadOptions::poll
  OutputFormat output = OutputFormat::kMarkdown;
  // Memory budget (model::ModelLoadOptions): 0 = unset.
  uint64_t memory_budget_mb = 0;
  uint64_t expert_pool_mb = 0;
  double expert_pool_fraction = 0;
  moert::experts::IoMode io = moert::experts::IoMode::kDirect;
  // Routing (model::ModelLoadOptions::router, resource_monitor).
  float router_alpha = 1.0f;
  float dynamic_k = 0;
  float thermal_limit = 0;
  moert::router::RoutingOverride routing = moert::router::RoutingOverride::kModel;
  uint64_t routing_seed = 1;
  // The read bandwidth the roofline divides by, in GB/s; 0: measured at startup.
  float read_bw_gbps = 0;
  // Prefetch of predicted experts, one run of the tests per value (--prefetch on,off).
  std::vector<bool> prefetch = {true};
  int prefetch_depth = 1;
  int io_threads = 2;  // experts::LoaderOptions::io_threads
  int read_chunk_kib = 256;  // experts::LoaderOptions::read_chunk_bytes / 1024
  int read_queue_depth = 8;  // experts::LoaderOptions::read_queue_depth
  int prefetch_protect = 2;  // ExpertCacheOptions::prefetch_protect_steps
  moert::model::Backend backend = moert::model::Backend::kCpu;
  moert::model::PooledExperts pooled_experts = moert::model::PooledExperts::kDevice;
  bool kv_half = false;  // --cache-type f16
  // The host KV cache's types (-ctk / -ctv, llama-bench's flags); not f32: the CPU only.
  moert::backend::KvType kv_type_k = moert::backend::KvType::kF32;
  moert::backend::KvType kv_type_v = moert::backend::KvType::kF32;
  bool mlock = false;  // --mlock: the weights outside the pool locked in RAM
  std::string cache_dir;  // --cache-dir: OpenCL program binaries
  std::string trace;   // --trace FILE: tracing on for the whole run, the JSON at exit
  // The image turn instead of pp/tg (bench/image_bench.h).
  std::string mmproj;
  std::string image;
  std::vector<float> image_keep = {1.0f, 0.5f, 0.3f};
  // Sessions decoding in turn, one test per value (--sessions 1,2,4); empty: pp/tg.
  std::vector<int> sessions;
  moert::tools::MetricsFlags metrics;  // --metrics FILE, --metrics-interval N
};

constexpr int kMaxTokens = 1 << 20;

// A usage error: what was wrong with which argument.
struct UsageError {
  std::string message;
};

std::optional<int> ParseInt(std::string_view text, int min, int max) {
  if (text.empty() || text.size() > 10) return std::nullopt;
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return std::nullopt;
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    v = v * 10 + (text[i] - '0');
  }
  if (text[0] == '-') v = -v;
  if (v < min || v > max) return std::nullopt;
  return static_cast<int>(v);
}

// One command-line flag. Adding a flag is adding an entry to Flags(): the parser and
// the usage text both come from the table.
struct Flag {
  std::string_view short_name;  // "-p", or empty
  std::string_view long_name;   // "--n-prompt"
  std::string_view value_name;  // "N"; empty for a switch
  std::string_view help;
  // Applies the value (empty for a switch); an error message names what is wrong.
  std::function<std::optional<std::string>(std::string_view value, Params& p)> apply;
};

// A setter for a KV cache type flag (-ctk / -ctv).
auto KvTypeSetter(moert::backend::KvType Params::*field) {
  return [=](std::string_view value, Params& p) -> std::optional<std::string> {
    auto type = moert::backend::ParseKvType(value);
    if (!type.ok()) return std::string("expected f32, f16 or q8_0");
    p.*field = *type;
    return std::nullopt;
  };
}

// A setter for an int flag in [min, max]; `what` describes the expected value.
auto IntSetter(int Params::*field, int min, int max, std::string_view what) {
  return [=](std::string_view value, Params& p) -> std::optional<std::string> {
    std::optional<int> v = ParseInt(value, min, max);
    if (!v) return StrCat("expected ", what, " from ", min, " to ", max);
    p.*field = *v;
    return std::nullopt;
  };
}

// A setter for a float flag above `low` (or at least it, when `inclusive`) and at most
// `high`; `what` describes the expected value.
auto FloatSetter(float Params::*field, float low, bool inclusive, float high, std::string_view what) {
  return [=](std::string_view value, Params& p) -> std::optional<std::string> {
    const std::string text(value);
    char* end = nullptr;
    const float v = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(inclusive ? v >= low : v > low) || !(v <= high)) {
      return StrCat("expected ", what);
    }
    p.*field = v;
    return std::nullopt;
  };
}

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      {"-m", "--model", "FILE", "GGUF model to benchmark",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.model_path = std::string(v);
         return std::nullopt;
       }},
      {"-p", "--n-prompt", "N", "prompt tokens of the prefill test, 0: none (default 512)",
       IntSetter(&Params::n_prompt, 0, kMaxTokens, "a number of tokens")},
      {"-n", "--n-gen", "N", "tokens of the decode test, 0: none (default 128)",
       IntSetter(&Params::n_gen, 0, kMaxTokens, "a number of tokens")},
      {"-r", "--repetitions", "N", "timed runs of each test (default 5)",
       IntSetter(&Params::repetitions, 1, 1000000, "a number of repetitions")},
      {"-t", "--threads", "N", "compute threads, 0: one per core (default 0)",
       IntSetter(&Params::threads, 0, 1024, "a number of threads")},
      {"", "--poll", "N",
       "1..100: idle compute threads spin a while before\nthey sleep; 0: they sleep at once; -1 (default):\nspin on the CPU with every expert resident, else\nsleep",
       IntSetter(&Params::poll, -1, 100, "a level")},
      {"-o", "--output", "FORMAT", "json or md (default md)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         if (v == "json") {
           p.output = OutputFormat::kJson;
         } else if (v == "md") {
           p.output = OutputFormat::kMarkdown;
         } else {
           return std::string("expected json or md");
         }
         return std::nullopt;
       }},
      {"", "--synthetic", "SHAPE",
       "benchmark a synthetic model of this shape instead of -m\n"
       "(tiny, olmoe-1b-7b, qwen15-moe-a27b, mixtral-8x7b)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.synthetic = moert::synth::FindShape(v);
         if (p.synthetic == nullptr) {
           return StrCat("unknown shape (known: ", moert::synth::ShapeNames(), ")");
         }
         return std::nullopt;
       }},
      {"", "--type", "TYPE", "matrix type of the synthetic model (default q4_0)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.synthetic_type = moert::synth::FindMatrixType(v);
         if (!p.synthetic_type) {
           return StrCat("unsupported type (supported: ", moert::synth::MatrixTypeNames(), ")");
         }
         return std::nullopt;
       }},
      {"", "--layers", "N", "only the first N layers of the synthetic model (default: all)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::optional<int> n = ParseInt(v, 1, 4096);
         if (!n) return std::string("expected a number of layers from 1 to 4096");
         p.synthetic_layers = static_cast<uint32_t>(*n);
         return std::nullopt;
       }},
      {"", "--synthetic-out", "FILE",
       "keep the synthetic model in FILE\n(default: a temporary file, removed once loaded)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         if (v.empty()) return std::string("expected a file name");
         p.synthetic_out = std::string(v);
         return std::nullopt;
       }},
      {"", "--expert-pool-mb", "N",
       "keep the routed experts in an expert pool of N MiB,\nloaded on demand (default: all resident)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::optional<int> n = ParseInt(v, 1, 1 << 30);
         if (!n) return std::string("expected a number of MiB >= 1");
         p.expert_pool_mb = static_cast<uint64_t>(*n);
         return std::nullopt;
       }},
      {"", "--expert-pool", "FRACTION",
       "an expert pool of this fraction (0, 1] of what all\nrouted experts take (1: all fit)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         const std::string text(v);
         char* end = nullptr;
         const double f = std::strtod(text.c_str(), &end);
         if (text.empty() || *end != '\0' || !(f > 0 && f <= 1)) {
           return std::string("expected a fraction in (0, 1]");
         }
         p.expert_pool_fraction = f;
         return std::nullopt;
       }},
      {"", "--memory-budget-mb", "N",
       "everything the model may hold, in MiB (the pool\ngets what the weights, KV cache and scratch leave)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::optional<int> n = ParseInt(v, 1, 1 << 30);
         if (!n) return std::string("expected a number of MiB >= 1");
         p.memory_budget_mb = static_cast<uint64_t>(*n);
         return std::nullopt;
       }},
      {"", "--io", "MODE", "how pooled experts are read: direct, buffered or mmap\n(default direct)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::optional<moert::experts::IoMode> mode = moert::experts::ParseIoMode(v);
         if (!mode) return std::string("expected direct, buffered or mmap");
         p.io = *mode;
         return std::nullopt;
       }},
      {"", "--backend", "cpu|opencl|auto",
       "where the model runs (default cpu; auto: an OpenCL\nGPU that passes a self-test, else the CPU)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         auto backend = moert::model::ParseBackend(v);
         if (!backend.ok()) return std::string("expected cpu, opencl or auto");
         p.backend = *backend;
         return std::nullopt;
       }},
      {"", "--pooled-experts", "device|copy|host",
       "with --backend opencl and an expert pool, where the\npooled experts compute: on the device "
       "from the pool's\nmemory (default; copy: from a device copy written per\nload) or on the host",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         if (v == "device") {
           p.pooled_experts = moert::model::PooledExperts::kDevice;
         } else if (v == "copy") {
           p.pooled_experts = moert::model::PooledExperts::kDeviceCopy;
         } else if (v == "host") {
           p.pooled_experts = moert::model::PooledExperts::kHost;
         } else {
           return std::string("expected device, copy or host");
         }
         return std::nullopt;
       }},
      {"", "--cache-type", "f32|f16",
       "the KV cache's type on the OpenCL device (default f32;\nf16: half its memory, "
       "needs --backend opencl or auto)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         if (v != "f32" && v != "f16") return std::string("expected f32 or f16");
         p.kv_half = v == "f16";
         return std::nullopt;
       }},
      {"-ctk", "--cache-type-k", "T",
       "the KV cache's key type on the CPU: f32 (default),\nf16 or q8_0",
       KvTypeSetter(&Params::kv_type_k)},
      {"-ctv", "--cache-type-v", "T",
       "the KV cache's value type on the CPU: f32 (default),\nf16 or q8_0",
       KvTypeSetter(&Params::kv_type_v)},
      {"", "--metrics", "FILE",
       "write the metrics (Prometheus text) to FILE at exit",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         if (v.empty()) return std::string("a file name");
         p.metrics.path = std::string(v);
         return std::nullopt;
       }},
      {"", "--metrics-interval", "N",
       "... and every N seconds (default 0: only at exit)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         const std::optional<int> seconds = ParseInt(v, 0, 86400);
         if (!seconds) return std::string("expected seconds from 0 to 86400");
         p.metrics.interval_s = *seconds;
         return std::nullopt;
       }},
      {"", "--mlock", "",
       "lock the weights outside the expert pool in RAM",
       [](std::string_view, Params& p) -> std::optional<std::string> {
         p.mlock = true;
         return std::nullopt;
       }},
      {"", "--cache-dir", "DIR",
       "where OpenCL program binaries are kept (default\n$XDG_CACHE_HOME/moert or ~/.cache/moert)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.cache_dir = std::string(v);
         return std::nullopt;
       }},
      {"", "--router-alpha", "A",
       "under memory pressure, lower non-resident experts'\ngate logits by A * pressure (default 1; 0: off)",
       FloatSetter(&Params::router_alpha, 0, true, 1e30f, "a number >= 0")},
      {"", "--dynamic-k", "P",
       "each token takes the fewest experts whose routing\nprobability reaches P (default off)",
       FloatSetter(&Params::dynamic_k, 0, false, 1, "a probability in (0, 1]")},
      {"", "--routing", "model|uniform",
       "who picks the experts: the model's router (default)\nor uniform: k distinct experts "
       "drawn at random per\ntoken and layer (no locality: the worst case)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         const std::optional<moert::router::RoutingOverride> routing =
             moert::router::ParseRouting(v);
         if (!routing) return std::string("expected model or uniform");
         p.routing = *routing;
         return std::nullopt;
       }},
      {"", "--routing-seed", "N", "the seed of --routing uniform's draws (default 1)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         const std::string text(v);
         char* end = nullptr;
         errno = 0;
         const unsigned long long seed = std::strtoull(text.c_str(), &end, 10);
         if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE) {
           return std::string("expected a number from 0 to 2^64 - 1");
         }
         p.routing_seed = seed;
         return std::nullopt;
       }},
      {"", "--read-bw", "GBPS",
       "the read bandwidth the decode roofline divides by,\nin GB/s (default 0: measured at "
       "startup with -t\nthreads, as moert-bench-bandwidth measures it)",
       FloatSetter(&Params::read_bw_gbps, 0, true, 1e30f, "GB/s >= 0 (0: measure)")},
      {"", "--prefetch", "on|off[,...]",
       "prefetch predicted experts while a layer computes;\na list runs the tests once per value "
       "(default on)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::vector<bool> values;
         for (std::string_view rest = v; !rest.empty();) {
           const size_t comma = rest.find(',');
           const std::string_view item = rest.substr(0, comma);
           if (item == "on" || item == "1") {
             values.push_back(true);
           } else if (item == "off" || item == "0") {
             values.push_back(false);
           } else {
             return std::string("expected on or off, or a comma list of them");
           }
           rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
         }
         if (values.empty()) return std::string("expected on or off, or a comma list of them");
         p.prefetch = values;
         return std::nullopt;
       }},
      {"", "--trace", "FILE",
       "record trace spans and write them to FILE at exit\n(Chrome trace-event JSON: open in "
       "ui.perfetto.dev)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.trace = std::string(v);
         return std::nullopt;
       }},
      {"", "--mmproj", "FILE",
       "with --image: the model's vision projector\n(llama.cpp's clip GGUF)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.mmproj = std::string(v);
         return std::nullopt;
       }},
      {"", "--image", "FILE",
       "benchmark the image turn of this PNG/JPEG instead of\npp/tg: encode ms per slice and "
       "image, prefill t/s,\npeak RSS, and pruning's KL and greedy agreement",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         p.image = std::string(v);
         return std::nullopt;
       }},
      {"", "--image-keep", "R[,...]",
       "visual-token keep ratios in (0, 1] (default 1,0.5,0.3)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::vector<float> values;
         for (std::string_view rest = v; !rest.empty();) {
           const size_t comma = rest.find(',');
           const std::string item(rest.substr(0, comma));
           char* end = nullptr;
           const float r = std::strtof(item.c_str(), &end);
           if (item.empty() || *end != '\0' || !(r > 0 && r <= 1)) {
             return std::string("expected ratios in (0, 1], comma-separated");
           }
           values.push_back(r);
           rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
         }
         if (values.empty()) return std::string("expected ratios in (0, 1], comma-separated");
         p.image_keep = values;
         return std::nullopt;
       }},
      {"", "--sessions", "N[,...]",
       "N sessions, each with its own KV cache of -p tokens\nof context, decoding -n tokens in "
       "turn; a list\nruns once per value (the pool shrinks for their\ncaches under a budget)",
       [](std::string_view v, Params& p) -> std::optional<std::string> {
         std::vector<int> values;
         for (std::string_view rest = v; !rest.empty();) {
           const size_t comma = rest.find(',');
           const std::optional<int> n = ParseInt(rest.substr(0, comma), 1, 256);
           if (!n) return std::string("expected session counts in [1, 256], comma separated");
           values.push_back(*n);
           rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
         }
         if (values.empty()) return std::string("expected at least one session count");
         p.sessions = std::move(values);
         return std::nullopt;
       }},
      {"", "--prefetch-depth", "N", "prefetch for the layer N ahead (default 1)",
       IntSetter(&Params::prefetch_depth, 1, 1 << 16, "layers ahead")},
      {"", "--io-threads", "N",
       "expert loader threads: loads read at once, each\nwith its own staging buffer (default 2)",
       IntSetter(&Params::io_threads, 1, 16, "threads")},
      {"", "--read-chunk-kib", "N",
       "expert reads are split into requests of N KiB\n(default 256; O_DIRECT rounds to 4 KiB)",
       IntSetter(&Params::read_chunk_kib, 4, 1 << 20, "KiB")},
      {"", "--read-queue-depth", "N",
       "expert read requests in flight per loader thread\n(default 8)",
       IntSetter(&Params::read_queue_depth, 1, 256, "requests")},
      {"", "--prefetch-protect", "N",
       "prefetch never evicts experts used in the last N\nsteps (default 2, the lazy window)",
       IntSetter(&Params::prefetch_protect, 0, 1 << 16, "steps")},
      {"", "--thermal-limit", "C",
       "above C degrees Celsius, one expert fewer per token\n(default 0: no limit)",
       FloatSetter(&Params::thermal_limit, 0, false, 1e30f, "degrees Celsius > 0")},
  };
  return flags;
}

std::string Usage() {
  std::string out =
      "usage: moert-bench (-m FILE | --synthetic SHAPE) [options]\n"
      "\n"
      "Prefill (ppN) and decode (tgN) speed, measured as llama-bench measures it: one\n"
      "warm-up, then -r repetitions; tokens/s as mean +/- standard deviation.\n"
      "Results go to stdout (-o json: llama-bench's JSON records), progress to stderr.\n"
      "\n";
  for (const Flag& f : Flags()) {
    std::string names = f.short_name.empty() ? StrCat("    ", f.long_name)
                                             : StrCat(f.short_name, ", ", f.long_name);
    if (!f.value_name.empty()) StrAppend(&names, " ", f.value_name);
    // Continuation lines of the help (after '\n') line up under its first line.
    std::string help(f.help);
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1)) {
      help.insert(at + 1, std::string(29, ' '));
    }
    out += absl::StrFormat("  %-26s %s\n", names, help);
  }
  out += absl::StrFormat("  %-26s %s\n", "-h, --help", "show this help");
  out +=
      "\n"
      "Environment: MOERT_ISA=scalar|avx2|neondot|neoni8mm|sme2 forces the kernels' ISA;\n"
      "the `isa` field reports the one in use.\n";
  return out;
}

// Parses argv into `p`; nullopt with p filled, or the usage error. Sets *help for -h.
std::optional<UsageError> ParseArgs(int argc, char** argv, Params& p, bool* help) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return std::nullopt;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : Flags()) {
      if (arg == f.short_name || arg == f.long_name) flag = &f;
    }
    if (flag == nullptr) return UsageError{StrCat("unknown argument '", arg, "'")};
    std::string_view value;
    if (!flag->value_name.empty()) {
      if (i + 1 >= argc) return UsageError{StrCat("missing ", flag->value_name, " after ", arg)};
      value = argv[++i];
    }
    if (std::optional<std::string> error = flag->apply(value, p)) {
      return UsageError{StrCat("invalid value '", value, "' for ", arg, ": ", *error)};
    }
  }
  if (*help) return std::nullopt;
  if (p.model_path.empty() && p.synthetic == nullptr) {
    return UsageError{"no model: give -m FILE or --synthetic SHAPE"};
  }
  if (!p.model_path.empty() && p.synthetic != nullptr) {
    return UsageError{"give either -m FILE or --synthetic SHAPE, not both"};
  }
  if (p.synthetic == nullptr &&
      (p.synthetic_type || p.synthetic_layers > 0 || !p.synthetic_out.empty())) {
    return UsageError{"--type, --layers and --synthetic-out need --synthetic SHAPE"};
  }
  if (p.n_prompt == 0 && p.n_gen == 0) return UsageError{"nothing to run: -p and -n are both 0"};
  if (p.expert_pool_mb > 0 && p.expert_pool_fraction > 0) {
    return UsageError{"give either --expert-pool-mb or --expert-pool, not both"};
  }
  if (!p.sessions.empty() && (!p.image.empty() || p.n_gen == 0)) {
    return UsageError{"--sessions runs decode tests: it needs -n > 0 and no --image"};
  }
  if (p.image.empty() != p.mmproj.empty()) {
    return UsageError{"--image and --mmproj go together"};
  }
  if ((p.kv_type_k != moert::backend::KvType::kF32 ||
       p.kv_type_v != moert::backend::KvType::kF32) &&
      (p.kv_half || p.backend == moert::model::Backend::kOpenCl)) {
    return UsageError{"-ctk / -ctv set the CPU's KV cache: not with --backend opencl or --cache-type"};
  }
  if (p.kv_half && p.backend == moert::model::Backend::kCpu) {
    return UsageError{"--cache-type f16 needs --backend opencl or auto (the CPU's cache is f32)"};
  }
  return std::nullopt;
}

// --- What is benchmarked -------------------------------------------------------------

// llama.cpp's llama_model_ftype_name for general.file_type.
std::string FileTypeName(uint64_t file_type) {
  switch (file_type) {
    case 0:
      return "all F32";
    case 1:
      return "F16";
    case 2:
      return "Q4_0";
    case 3:
      return "Q4_1";
    case 7:
      return "Q8_0";
    case 8:
      return "Q5_0";
    case 9:
      return "Q5_1";
    case 10:
      return "Q2_K - Medium";
    case 11:
      return "Q3_K - Small";
    case 12:
      return "Q3_K - Medium";
    case 13:
      return "Q3_K - Large";
    case 14:
      return "Q4_K - Small";
    case 15:
      return "Q4_K - Medium";
    case 16:
      return "Q5_K - Small";
    case 17:
      return "Q5_K - Medium";
    case 18:
      return "Q6_K";
    case 32:
      return "BF16";
    default:
      return StrCat("ftype ", file_type);
  }
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// The model as llama-bench describes it.
struct ModelInfo {
  std::string filename;
  std::string type;       // "<arch> <params> <file type>", like llama_model_desc
  uint64_t size = 0;      // bytes of tensor data
  uint64_t n_params = 0;  // elements of all tensors
};

std::string ParamsLabel(uint64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e9) return absl::StrFormat("%.1fB", v * 1e-9);
  return absl::StrFormat("%.0fM", v * 1e-6);
}

ModelInfo DescribeModel(const moert::format::GgufFile& file, std::string filename) {
  ModelInfo info;
  info.filename = std::move(filename);
  // The most common matrix type, for a file without general.file_type (llama.cpp
  // guesses the same way).
  std::array<uint64_t, 64> type_count{};
  for (const moert::format::GgufTensorInfo& t : file.tensors()) {
    info.size += t.n_bytes;
    info.n_params += t.n_elements;
    const auto type = static_cast<size_t>(t.type);
    if (t.dims.size() >= 2 && type < type_count.size()) ++type_count[type];
  }
  std::string arch = "unknown";
  if (auto a = file.GetString("general.architecture"); a.ok()) arch = std::string(*a);
  std::string ftype;
  if (auto f = file.GetUint("general.file_type"); f.ok()) {
    ftype = FileTypeName(*f);
  } else {
    const size_t most = static_cast<size_t>(std::max_element(type_count.begin(), type_count.end()) -
                                            type_count.begin());
    ftype = StrCat(Upper(moert::format::GgmlTypeName(static_cast<moert::format::GgmlType>(most))),
                   " (guessed)");
  }
  info.type = StrCat(arch, " ", ParamsLabel(info.n_params), " ", ftype);
  return info;
}

// --- The host ------------------------------------------------------------------------

std::string CpuInfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string hardware;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = line.substr(colon + 1);
    value.erase(0, std::min(value.find_first_not_of(' '), value.size()));
    if (key == "model name" && !value.empty()) return value;
    if (key == "Hardware" && hardware.empty()) hardware = value;
  }
  return hardware.empty() ? "unknown" : hardware;
}

uint64_t PeakRssBytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
#ifdef __APPLE__
  return static_cast<uint64_t>(usage.ru_maxrss);  // bytes on macOS
#else
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
#endif
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// --- Measuring -----------------------------------------------------------------------

struct TestResult {
  int n_prompt = 0;
  int n_gen = 0;
  int n_depth = 0;     // context each session held before the timed tokens (--sessions)
  int n_sessions = 0;  // sessions decoding in turn (--sessions); 0: one cache, pp/tg
  std::string test_time;
  std::vector<uint64_t> samples_ns;
  uint64_t peak_rss_bytes = 0;
  // The model's memory after the test, and what its expert pool did during the timed
  // repetitions (model::MemoryStats; zeros without a pool).
  moert::model::MemoryStats memory;
  double hit_rate = 0;
  double bytes_read_per_token = 0;
  double stall_ms_per_token = 0;
  double average_k = 0;        // experts per token-layer during the timed repetitions
  double router_changed = 0;   // share of token-layers whose choice an adjustment changed
  // Prefetch during the timed repetitions.
  bool prefetch = false;
  int prefetch_depth = 0;
  double prefetch_precision = 0;
  double prefetch_recall = 0;
  uint64_t loads_hidden = 0;
  uint64_t loads_waited = 0;
  uint64_t loads_streamed = 0;     // a layer's misses loading while its experts compute
  uint64_t streamed_hidden = 0;    // of those, in before their turn
  uint64_t prefetch_cancelled = 0; // prefetches dropped unread (the layer routed elsewhere)
  uint64_t prefetch_backed_off = 0;
  uint64_t prefetch_io_busy = 0;  // layers whose speculation the busy reads narrowed
  // The decode roofline (decode_roofline.h); roofline_tps and roofline_fraction are 0
  // for a prefill test, whose tokens share their weight reads.
  double weight_bytes_per_token = 0;
  double roofline_tps = 0;
  double roofline_fraction = 0;

  bool decode() const { return n_prompt == 0; }
  int n_tokens() const { return n_prompt + n_gen * std::max(n_sessions, 1); }
  std::string name() const {
    if (n_sessions > 0) return StrCat("tg", n_gen, " x", n_sessions, " @ d", n_depth);
    return n_prompt > 0 ? StrCat("pp", n_prompt) : StrCat("tg", n_gen);
  }
  std::vector<double> samples_ts() const {
    std::vector<double> ts;
    for (uint64_t ns : samples_ns) ts.push_back(1e9 * n_tokens() / static_cast<double>(ns));
    return ts;
  }
};

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// The sample standard deviation (Bessel's correction, as llama-bench); 0 for one value.
double StdDev(const std::vector<double>& v) {
  if (v.size() <= 1) return 0;
  const double mean = Mean(v);
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

std::vector<double> AsDouble(const std::vector<uint64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

class Bench {
 public:
  Bench(moert::model::Model& model, uint64_t seed) : model_(model), rng_(seed) {}

  // One test: n_prompt > 0 is a prefill test, else a decode test of n_gen tokens.
  absl::StatusOr<TestResult> Run(int n_prompt, int n_gen, int repetitions) {
    TestResult r;
    r.n_prompt = n_prompt;
    r.n_gen = n_gen;
    r.test_time = UtcNow();
    auto cache = model_.NewKvCache(n_prompt + n_gen);
    if (!cache.ok()) return cache.status();
    // Warm-up, untimed: the whole prompt, or one decode step.
    if (n_prompt > 0) {
      if (auto s = Prefill(**cache, n_prompt); !s.ok()) return s.status();
    } else {
      if (auto s = Decode(**cache, 1); !s.ok()) return s.status();
    }
    const Counters before = Read();
    for (int i = 0; i < repetitions; ++i) {
      auto ns = n_prompt > 0 ? Prefill(**cache, n_prompt) : Decode(**cache, n_gen);
      if (!ns.ok()) return ns.status();
      r.samples_ns.push_back(*ns);
    }
    Summarize(before, repetitions, r);
    return r;
  }

  // --sessions: n_sessions caches, each prefilled with `depth` tokens (untimed), then
  // n_gen tokens of each in turn per repetition.
  absl::StatusOr<TestResult> RunSessions(int n_sessions, int depth, int n_gen, int repetitions) {
    TestResult r;
    r.n_gen = n_gen;
    r.n_depth = depth;
    r.n_sessions = n_sessions;
    r.test_time = UtcNow();
    std::vector<std::unique_ptr<moert::model::KvCache>> caches;
    for (int i = 0; i < n_sessions; ++i) {
      auto cache = model_.NewKvCache(depth + n_gen * repetitions + 1);
      if (!cache.ok()) {
        return absl::Status(cache.status().code(),
                            StrCat("session ", i + 1, " of ", n_sessions, ": ",
                                   cache.status().message()));
      }
      caches.push_back(std::move(*cache));
      if (depth > 0) {
        if (auto s = Prefill(*caches.back(), depth); !s.ok()) return s.status();
      }
      if (auto s = Step(*caches.back()); !s.ok()) return s;  // warm-up
    }
    const Counters before = Read();
    for (int rep = 0; rep < repetitions; ++rep) {
      const uint64_t start = NowNs();
      for (int t = 0; t < n_gen; ++t) {
        for (auto& cache : caches) {
          if (auto s = Step(*cache); !s.ok()) return s;
        }
      }
      r.samples_ns.push_back(std::max<uint64_t>(1, NowNs() - start));
    }
    Summarize(before, repetitions, r);
    return r;
  }

 private:
  struct Counters {
    moert::model::MemoryStats memory;
    moert::router::RouterStats routed;
  };

  Counters Read() const {
    Counters c;
    c.memory = model_.memory_stats();
    if (const moert::router::Router* router = model_.router(); router != nullptr) {
      c.routed = router->stats();
    }
    return c;
  }

  // What the pool, the prefetcher and the router did since `start`, per token.
  void Summarize(const Counters& start, int repetitions, TestResult& r) {
    const moert::model::MemoryStats& before = start.memory;
    const moert::router::RouterStats& routed_before = start.routed;
    r.peak_rss_bytes = PeakRssBytes();
    r.memory = model_.memory_stats();
    const moert::experts::ExpertCacheStats& a = r.memory.pool;
    const moert::experts::ExpertCacheStats& b = before.pool;
    const uint64_t needed = (a.hits - b.hits) + (a.misses - b.misses);
    r.hit_rate = needed > 0 ? static_cast<double>(a.hits - b.hits) / static_cast<double>(needed) : 0;
    const double tokens = static_cast<double>(repetitions) * r.n_tokens();
    r.bytes_read_per_token = static_cast<double>(a.bytes_loaded - b.bytes_loaded) / tokens;
    r.stall_ms_per_token = static_cast<double>(a.stall_ns - b.stall_ns) / 1e6 / tokens;
    r.prefetch = r.memory.prefetch;
    r.prefetch_depth = r.memory.prefetch_depth;
    r.loads_hidden = a.loads_hidden - b.loads_hidden;
    r.loads_waited = a.loads_waited - b.loads_waited;
    r.loads_streamed = a.streamed - b.streamed;
    r.streamed_hidden = a.streamed_hidden - b.streamed_hidden;
    r.prefetch_cancelled = a.prefetch_cancelled - b.prefetch_cancelled;
    {
      const moert::pipeline::PrefetchStats& pa = r.memory.prefetcher;
      const moert::pipeline::PrefetchStats& pb = before.prefetcher;
      const uint64_t predicted = pa.predicted - pb.predicted;
      const uint64_t used = pa.used - pb.used;
      const uint64_t correct = pa.correct - pb.correct;
      r.prefetch_precision =
          predicted > 0 ? static_cast<double>(correct) / static_cast<double>(predicted) : 0;
      r.prefetch_recall = used > 0 ? static_cast<double>(correct) / static_cast<double>(used) : 0;
      r.prefetch_backed_off = pa.backed_off - pb.backed_off;
      r.prefetch_io_busy = pa.io_busy - pb.io_busy;
    }
    if (const moert::router::Router* router = model_.router(); router != nullptr) {
      const moert::router::RouterStats& s = router->stats();
      const uint64_t n = s.token_layers - routed_before.token_layers;
      if (n > 0) {
        r.average_k = static_cast<double>(s.experts - routed_before.experts) / static_cast<double>(n);
        r.router_changed = static_cast<double>(s.changed - routed_before.changed) / static_cast<double>(n);
      }
    }
  }

  // One decode step with a random token.
  absl::Status Step(moert::model::KvCache& cache) {
    const std::vector<int32_t> token = Tokens(1);
    return model_.Forward(token, &cache, moert::model::LogitsFor::kLast, &logits_);
  }

  // Random token ids, drawn outside the timed region.
  std::vector<int32_t> Tokens(int n) {
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(model_.spec().n_vocab) - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = id(rng_);
    return tokens;
  }

  absl::StatusOr<uint64_t> Prefill(moert::model::KvCache& cache, int n) {
    const std::vector<int32_t> tokens = Tokens(n);
    cache.Truncate(0);
    const uint64_t start = NowNs();
    absl::Status s = model_.Forward(tokens, &cache, moert::model::LogitsFor::kLast, &logits_);
    const uint64_t end = NowNs();
    if (!s.ok()) return s;
    return std::max<uint64_t>(1, end - start);  // tokens/s stays finite
  }

  absl::StatusOr<uint64_t> Decode(moert::model::KvCache& cache, int n) {
    const std::vector<int32_t> tokens = Tokens(n);
    cache.Truncate(0);
    const uint64_t start = NowNs();
    for (int i = 0; i < n; ++i) {
      absl::Status s = model_.Forward(std::span(tokens).subspan(static_cast<size_t>(i), 1), &cache,
                                      moert::model::LogitsFor::kLast, &logits_);
      if (!s.ok()) return s;
    }
    return std::max<uint64_t>(1, NowNs() - start);
  }

  moert::model::Model& model_;
  std::mt19937_64 rng_;
  std::vector<float> logits_;
};

// --- Output --------------------------------------------------------------------------

// The fields every record shares.
struct RunInfo {
  ModelInfo model;
  std::string cpu_info;
  std::string isa;
  int n_threads = 0;
  float router_alpha = 0;
  float dynamic_k = 0;
  std::string routing = "model";  // --routing
  uint64_t routing_seed = 0;
  // The decode roofline's inputs: the weights a token reads and the read bandwidth
  // (bytes/s; measured, or --read-bw's).
  moert::bench::DecodeWeights weights;
  uint32_t n_expert_used = 0;  // the model's k, for a model without a router
  double read_bw = 0;
  // The model's backend: "CPU" or "OpenCL", with the OpenCL device and driver.
  std::string backend = "CPU";
  std::string device;
  std::string driver;
  // With an expert pool on OpenCL: where its experts compute (BackendStats).
  std::string pooled_experts;
  // The KV cache's key and value types: f16 on the device with --cache-type f16, else
  // -ctk / -ctv's.
  std::string type_k = "f32";
  std::string type_v = "f32";
};

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

class Printer {
 public:
  virtual ~Printer() = default;
  virtual void Header() {}
  virtual void Test(const TestResult& r) = 0;
  virtual void Footer() {}
};

// llama-bench's -o json: an array of flat records, samples last.
class JsonPrinter : public Printer {
 public:
  explicit JsonPrinter(const RunInfo& info) : info_(info) {}
  void Header() override { std::fputs("[\n", stdout); }
  void Test(const TestResult& r) override {
    const std::vector<double> ts = r.samples_ts();
    const std::vector<double> ns = AsDouble(r.samples_ns);
    std::vector<std::pair<std::string_view, std::string>> fields = {
        {"build_commit", JsonString(MOERT_VERSION_STRING)},
        {"cpu_info", JsonString(info_.cpu_info)},
        {"backends", JsonString(info_.backend)},
        {"device", JsonString(info_.device)},
        {"driver", JsonString(info_.driver)},
        {"pooled_experts", JsonString(info_.pooled_experts)},
        {"model_filename", JsonString(info_.model.filename)},
        {"model_type", JsonString(info_.model.type)},
        {"model_size", StrCat(info_.model.size)},
        {"model_n_params", StrCat(info_.model.n_params)},
        {"n_threads", StrCat(info_.n_threads)},
        {"type_k", JsonString(info_.type_k)},
        {"type_v", JsonString(info_.type_v)},
        {"n_prompt", StrCat(r.n_prompt)},
        {"n_gen", StrCat(r.n_gen)},
        {"n_depth", StrCat(r.n_depth)},
        {"n_sessions", StrCat(r.n_sessions)},
        {"kv_cache_bytes", StrCat(r.memory.ledger.kv_bytes)},
        {"test_time", JsonString(r.test_time)},
        {"avg_ns", StrCat(static_cast<uint64_t>(std::llround(Mean(ns))))},
        {"stddev_ns", StrCat(static_cast<uint64_t>(std::llround(StdDev(ns))))},
        {"avg_ts", absl::StrFormat("%.6f", Mean(ts))},
        {"stddev_ts", absl::StrFormat("%.6f", StdDev(ts))},
        {"peak_rss_bytes", StrCat(r.peak_rss_bytes)},
        {"isa", JsonString(info_.isa)},
        {"budget_bytes", StrCat(r.memory.budget_bytes)},
        {"expert_pool_bytes", StrCat(r.memory.pool.pool_bytes)},
        {"expert_pool_used_bytes", StrCat(r.memory.pool.used_bytes)},
        {"expert_pool_free_bytes", StrCat(r.memory.pool.free_bytes)},
        {"expert_pool_fragmentation", absl::StrFormat("%.6f", r.memory.pool.fragmentation)},
        {"expert_hit_rate", absl::StrFormat("%.6f", r.hit_rate)},
        {"expert_bytes_read_per_token", absl::StrFormat("%.1f", r.bytes_read_per_token)},
        {"expert_stall_ms_per_token", absl::StrFormat("%.6f", r.stall_ms_per_token)},
        {"io_mode", JsonString(r.memory.io_mode)},
        {"router_alpha", absl::StrFormat("%g", info_.router_alpha)},
        {"dynamic_k", absl::StrFormat("%g", info_.dynamic_k)},
        {"routing", JsonString(info_.routing)},
        {"routing_seed", StrCat(info_.routing_seed)},
        {"average_k", absl::StrFormat("%.4f", r.average_k)},
        {"router_changed", absl::StrFormat("%.6f", r.router_changed)},
        {"prefetch", r.prefetch ? "true" : "false"},
        {"prefetch_depth", StrCat(r.prefetch_depth)},
        {"prefetch_precision", absl::StrFormat("%.6f", r.prefetch_precision)},
        {"prefetch_recall", absl::StrFormat("%.6f", r.prefetch_recall)},
        {"loads_hidden", StrCat(r.loads_hidden)},
        {"loads_waited", StrCat(r.loads_waited)},
        {"loads_streamed", StrCat(r.loads_streamed)},
        {"streamed_hidden", StrCat(r.streamed_hidden)},
        {"prefetch_cancelled", StrCat(r.prefetch_cancelled)},
        {"weight_bytes_per_token", absl::StrFormat("%.1f", r.weight_bytes_per_token)},
        {"read_bw_gbps", absl::StrFormat("%.3f", info_.read_bw * 1e-9)},
        {"roofline_tps", absl::StrFormat("%.3f", r.roofline_tps)},
        {"roofline_fraction", absl::StrFormat("%.6f", r.roofline_fraction)},
    };
    std::vector<std::string> ts_text;
    for (double t : ts) ts_text.push_back(absl::StrFormat("%.6f", t));
    std::string out = first_ ? "  {\n" : ",\n  {\n";
    first_ = false;
    for (const auto& [key, value] : fields) StrAppend(&out, "    \"", key, "\": ", value, ",\n");
    StrAppend(&out, "    \"samples_ns\": [ ", moert::StrJoin(r.samples_ns, ", "), " ],\n");
    StrAppend(&out, "    \"samples_ts\": [ ", moert::StrJoin(ts_text, ", "), " ]\n  }");
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  void Footer() override { std::fputs(first_ ? "]\n" : "\n]\n", stdout); }

 private:
  const RunInfo& info_;
  bool first_ = true;
};

// llama-bench's -o md table: model | size | params | backend | threads | test | t/s.
class MarkdownPrinter : public Printer {
 public:
  explicit MarkdownPrinter(const RunInfo& info) : info_(info) {}
  void Header() override {
    std::printf("| %-30s | %10s | %10s | %-10s | %7s | %13s | %20s |\n", "model", "size", "params",
                "backend", "threads", "test", "t/s");
    std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: |\n", std::string(30, '-').c_str(),
                std::string(9, '-').c_str(), std::string(9, '-').c_str(),
                std::string(10, '-').c_str(), std::string(6, '-').c_str(),
                std::string(12, '-').c_str(), std::string(19, '-').c_str());
    std::fflush(stdout);
  }
  void Test(const TestResult& r) override {
    const std::vector<double> ts = r.samples_ts();
    const std::string tps = absl::StrFormat("%.2f ± %.2f", Mean(ts), StdDev(ts));
    if (r.decode()) {
      roofline_ += absl::StrFormat(
          "%s: %.2f MiB of weights per token: %.2f t/s at most, %.1f%% of it\n", r.name(),
          r.weight_bytes_per_token / (1 << 20), r.roofline_tps, 100 * r.roofline_fraction);
    }
    // "±" is two bytes but one column: pad one more.
    std::printf("| %-30s | %10s | %10s | %-10s | %7d | %13s | %21s |\n", info_.model.type.c_str(),
                Size(info_.model.size).c_str(), Params(info_.model.n_params).c_str(), info_.backend.c_str(),
                info_.n_threads, r.name().c_str(), tps.c_str());
    std::fflush(stdout);
  }
  void Footer() override {
    std::printf("\nbuild: moert %s, isa %s\n", MOERT_VERSION_STRING, info_.isa.c_str());
    if (!info_.device.empty()) {
      std::printf("device: %s, driver %s\n", info_.device.c_str(), info_.driver.c_str());
    }
    std::printf("routing: %s\n", info_.routing == "uniform"
                                      ? StrCat("uniform (seed ", info_.routing_seed, ")").c_str()
                                      : info_.routing.c_str());
    if (!roofline_.empty()) {
      std::printf("decode roofline at a read bandwidth of %.2f GB/s:\n%s", info_.read_bw * 1e-9,
                  roofline_.c_str());
    }
  }

 private:
  // llama-bench prints GiB and billions; small models get MiB and millions.
  static std::string Size(uint64_t bytes) {
    const double b = static_cast<double>(bytes);
    if (b >= 1024.0 * 1024.0 * 1024.0) return absl::StrFormat("%.2f GiB", b / (1 << 30));
    return absl::StrFormat("%.2f MiB", b / (1 << 20));
  }
  static std::string Params(uint64_t n) {
    const double v = static_cast<double>(n);
    if (v >= 1e9) return absl::StrFormat("%.2f B", v * 1e-9);
    return absl::StrFormat("%.2f M", v * 1e-6);
  }

  const RunInfo& info_;
  std::string roofline_;  // a line per decode test, printed after the table
};

// --- Running -------------------------------------------------------------------------

int UsageFail(const std::string& message) {
  std::fprintf(stderr, "%s: error: %s (see --help)\n", kTool, message.c_str());
  return 2;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kTool, message.c_str());
  return 1;
}

// Removes a file when it goes out of scope, unless released.
class RemoveOnExit {
 public:
  RemoveOnExit() = default;
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  ~RemoveOnExit() { Remove(); }
  void Reset(std::string path) {
    Remove();
    path_ = std::move(path);
  }
  void Remove() {
    if (!path_.empty()) std::remove(path_.c_str());
    path_.clear();
  }

 private:
  std::string path_;
};

// A new empty file under $TMPDIR (or /tmp) for the synthetic model.
absl::StatusOr<std::string> MakeTempFile() {
  const char* dir = std::getenv("TMPDIR");
  std::string path =
      StrCat(dir != nullptr && dir[0] != '\0' ? dir : "/tmp", "/moert-bench-XXXXXX.gguf");
  const int fd = mkstemps(path.data(), 5);
  if (fd < 0) return absl::UnavailableError(StrCat("cannot create a temporary file ", path));
  close(fd);
  return path;
}

// --image: the image turn at each keep ratio (bench/image_bench.h).
int RunImage(const Params& p, const RunInfo& info, moert::model::Model& model,
             const moert::tokenizer::Tokenizer& tokenizer) {
  moert::bench::ImageBenchOptions options;
  options.mmproj = p.mmproj;
  options.image = p.image;
  options.keep_ratios = p.image_keep;
  options.repetitions = p.repetitions;
  options.threads = info.n_threads;
  std::fprintf(stderr, "%s: image turn of %s: %d repetition(s) per keep ratio, %d thread(s)\n",
               kTool, p.image.c_str(), p.repetitions, info.n_threads);
  auto results = moert::bench::RunImageBench(model, tokenizer, options);
  if (!results.ok()) return Fail(std::string(results.status().message()));
  const auto tps = [](const moert::bench::ImageBenchResult& r) {
    std::vector<double> v;
    for (double ms : r.prefill_ms) v.push_back(1000.0 * r.prompt_tokens / std::max(ms, 1e-6));
    return v;
  };
  if (p.output == OutputFormat::kJson) {
    std::fputs("[\n", stdout);
    for (size_t i = 0; i < results->size(); ++i) {
      const moert::bench::ImageBenchResult& r = (*results)[i];
      std::printf(
          "  {\"build_commit\": %s, \"cpu_info\": %s, \"isa\": %s, \"model_filename\": %s, "
          "\"mmproj\": %s, \"image\": %s, \"n_threads\": %d, \"keep_ratio\": %.3f, "
          "\"slices\": %d, \"image_tokens\": %d, \"prompt_tokens\": %d, "
          "\"encode_ms_per_image\": %.3f, \"encode_ms_per_slice\": %.3f, "
          "\"encode_ms_stddev\": %.3f, \"prefill_ts\": %.3f, \"prefill_ts_stddev\": %.3f, "
          "\"kl\": %.6g, \"greedy_agreement\": %.4f, \"top1_equal\": %d, "
          "\"peak_rss_bytes\": %llu}%s\n",
          JsonString(MOERT_VERSION_STRING).c_str(), JsonString(info.cpu_info).c_str(),
          JsonString(info.isa).c_str(), JsonString(info.model.filename).c_str(),
          JsonString(p.mmproj).c_str(), JsonString(p.image).c_str(), info.n_threads,
          r.keep_ratio, r.slices, r.image_tokens, r.prompt_tokens, Mean(r.encode_ms),
          Mean(r.encode_ms) / std::max(1, r.slices), StdDev(r.encode_ms), Mean(tps(r)),
          StdDev(tps(r)), r.kl, r.greedy_agreement, r.top1_equal,
          static_cast<unsigned long long>(r.peak_rss_bytes), i + 1 < results->size() ? "," : "");
    }
    std::fputs("]\n", stdout);
  } else {
    std::printf("| %-24s | %4s | %6s | %6s | %16s | %16s | %18s | %9s | %6s | %8s |\n", "model",
                "keep", "slices", "tokens", "encode ms/slice", "encode ms/image", "prefill t/s",
                "KL", "greedy", "peak RSS");
    std::printf("| %s | %s: | %s: | %s: | %s: | %s: | %s: | %s: | %s: | %s: |\n",
                std::string(24, '-').c_str(), std::string(3, '-').c_str(),
                std::string(5, '-').c_str(), std::string(5, '-').c_str(),
                std::string(15, '-').c_str(), std::string(15, '-').c_str(),
                std::string(17, '-').c_str(), std::string(8, '-').c_str(),
                std::string(5, '-').c_str(), std::string(7, '-').c_str());
    for (const moert::bench::ImageBenchResult& r : *results) {
      const std::string enc = absl::StrFormat("%.1f ± %.1f", Mean(r.encode_ms) / std::max(1, r.slices),
                                              StdDev(r.encode_ms) / std::max(1, r.slices));
      const std::string img = absl::StrFormat("%.1f ± %.1f", Mean(r.encode_ms), StdDev(r.encode_ms));
      const std::string pre = absl::StrFormat("%.1f ± %.1f", Mean(tps(r)), StdDev(tps(r)));
      std::printf("| %-24s | %4.2f | %6d | %6d | %17s | %17s | %19s | %9.4f | %6.3f | %4.0f MiB |\n",
                  info.model.type.c_str(), r.keep_ratio, r.slices, r.image_tokens, enc.c_str(),
                  img.c_str(), pre.c_str(), r.kl, r.greedy_agreement,
                  static_cast<double>(r.peak_rss_bytes) / (1 << 20));
    }
    std::printf("\nbuild: moert %s, isa %s; cpu: %s\n", MOERT_VERSION_STRING, info.isa.c_str(),
                info.cpu_info.c_str());
    std::printf("KL: of the first step's next-token distribution from keep 1's (nats); greedy: "
                "share of %d greedy tokens equal to keep 1's, position by position\n",
                moert::bench::ImageBenchOptions().greedy_tokens);
  }
  if (std::fflush(stdout) != 0) return Fail("cannot write the output");
  return 0;
}

// The decode roofline of a finished test (decode_roofline.h).
void SetRoofline(const RunInfo& info, TestResult& r) {
  r.weight_bytes_per_token =
      info.weights.PerToken(r.average_k > 0 ? r.average_k : info.n_expert_used);
  if (!r.decode() || !(r.weight_bytes_per_token > 0) || !(info.read_bw > 0)) return;
  r.roofline_tps = info.read_bw / r.weight_bytes_per_token;
  r.roofline_fraction = Mean(r.samples_ts()) / r.roofline_tps;
}

int Run(const Params& p) {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int n_threads = p.threads > 0 ? p.threads : static_cast<int>(cores);
  // First, while this process has no other threads: the measurement forks.
  double read_bw = static_cast<double>(p.read_bw_gbps) * 1e9;
  if (read_bw == 0 && p.n_gen > 0 && p.image.empty()) {
    absl::StatusOr<double> measured = moert::bench::MeasureReadBandwidth(n_threads);
    if (measured.ok()) {
      read_bw = *measured;
      std::fprintf(stderr, "%s: read bandwidth %.2f GB/s with %d thread(s) (measured)\n", kTool,
                   read_bw * 1e-9, n_threads);
    } else {
      std::fprintf(stderr, "%s: no decode roofline: %s\n", kTool,
                   std::string(measured.status().message()).c_str());
    }
  }
  RemoveOnExit temp_file;
  const auto registry = std::make_shared<moert::telemetry::Registry>();
  moert::telemetry::RegisterRuntimeMetrics(*registry);
  moert::tools::MetricsFile metrics(
      p.metrics, [registry] { return registry->PrometheusText(); }, kTool);
  std::string path = p.model_path;
  std::string filename = p.model_path;
  if (p.synthetic != nullptr) {
    moert::synth::SynthOptions so;
    so.shape = p.synthetic;
    so.type = p.synthetic_type.value_or(moert::format::GgmlType::kQ4_0);
    so.n_layer = p.synthetic_layers;
    so.threads = cores;
    auto synth = moert::synth::SynthModel::Plan(so);
    if (!synth.ok()) return Fail(std::string(synth.status().message()));
    if (p.synthetic_out.empty()) {
      auto temp = MakeTempFile();
      if (!temp.ok()) return Fail(std::string(temp.status().message()));
      path = *temp;
      temp_file.Reset(path);
      filename = StrCat("synthetic:", p.synthetic->name);
    } else {
      path = p.synthetic_out;
      filename = path;
    }
    std::fprintf(stderr, "%s: writing the synthetic model %s to %s\n", kTool,
                 synth->Describe().c_str(), path.c_str());
    if (absl::Status s = synth->Write(path); !s.ok()) {
      std::remove(path.c_str());  // incomplete
      return Fail(StrCat("cannot write the synthetic model: ", s.message()));
    }
  }

  RunInfo info;
  info.cpu_info = CpuInfo();
  // The kernels' ISA actually dispatched (MOERT_ISA if it is usable here).
  info.isa = moert::kernels::IsaName(moert::kernels::GetKernelConfig().isa);
  info.n_threads = n_threads;
  info.router_alpha = p.router_alpha;
  info.dynamic_k = p.dynamic_k;
  info.routing = std::string(moert::router::RoutingName(p.routing));
  info.routing_seed = p.routing_seed;
  info.read_bw = read_bw;

  std::unique_ptr<moert::model::Model> model;
  std::optional<moert::tokenizer::Tokenizer> tokenizer;  // the image turn's
  {
    std::fprintf(stderr, "%s: loading %s\n", kTool, path.c_str());
    const auto start = std::chrono::steady_clock::now();
    auto file = moert::format::GgufFile::Open(path);
    if (!file.ok()) return Fail(StrCat("cannot load ", path, ": ", file.status().message()));
    info.model = DescribeModel(**file, filename);
    if (!p.image.empty()) {
      auto tok = moert::tokenizer::Tokenizer::FromGguf(**file);
      if (!tok.ok()) return Fail(StrCat("cannot load ", path, ": ", tok.status().message()));
      tokenizer.emplace(std::move(*tok));
    }
    moert::model::ModelLoadOptions options;
    options.threads = info.n_threads;
    options.poll = p.poll;
    options.memory_budget_bytes = p.memory_budget_mb << 20;
    options.expert_pool_bytes = p.expert_pool_mb << 20;
    options.expert_pool_fraction = p.expert_pool_fraction;
    options.io_mode = p.io;
    options.router.alpha = p.router_alpha;
    options.router.dynamic_k_p = p.dynamic_k;
    options.router.routing = p.routing;
    options.router.routing_seed = p.routing_seed;
    options.resource_monitor.thermal_limit_c = p.thermal_limit;
    options.prefetch = p.prefetch.front();
    options.prefetch_depth = p.prefetch_depth;
    options.expert_cache.prefetch_protect_steps = p.prefetch_protect;
    options.expert_cache.loader.io_threads = static_cast<unsigned>(p.io_threads);
    options.expert_cache.loader.read_chunk_bytes = static_cast<uint64_t>(p.read_chunk_kib) << 10;
    options.expert_cache.loader.read_queue_depth = static_cast<unsigned>(p.read_queue_depth);
    options.backend = p.backend;
    options.opencl_pooled_experts = p.pooled_experts;
    options.opencl_kv_half = p.kv_half;
    options.kv_type_k = p.kv_type_k;
    options.kv_type_v = p.kv_type_v;
    options.lock_weights = p.mlock;
    options.cache_dir = p.cache_dir;
    options.metrics = registry;
    // Each test has its own KV cache, one after the other; --sessions: the budget sets
    // one session's aside, and the pool shrinks for the others' (to its floor).
    options.kv_cache_positions = p.image.empty() ? std::max(p.n_prompt, p.n_gen) : 4096;
    if (!p.sessions.empty()) {
      options.kv_cache_positions = p.n_prompt + p.n_gen * p.repetitions + 1;
      options.shrink_pool_for_kv = true;
    }
    auto loaded = moert::model::Model::Load(**file, options);
    if (!loaded.ok()) return Fail(StrCat("cannot load ", path, ": ", loaded.status().message()));
    model = std::move(*loaded);
    if (p.routing != moert::router::RoutingOverride::kModel && model->router() == nullptr) {
      return Fail(StrCat("--routing ", info.routing, " needs a MoE model (this one has no router)"));
    }
    info.weights = moert::bench::CountDecodeWeights(**file, model->spec().n_expert);
    info.n_expert_used = model->spec().n_expert_used;
    const moert::model::BackendStats backend = model->backend_stats();
    info.backend = backend.backend;
    info.device = backend.device;
    info.driver = backend.driver;
    info.pooled_experts = backend.pooled_experts;
    info.type_k = std::string(moert::backend::KvTypeName(p.kv_type_k));
    info.type_v = std::string(moert::backend::KvTypeName(p.kv_type_v));
    if (p.kv_half && backend.backend != "CPU") info.type_k = info.type_v = "f16";
    if (p.mlock) {
      const moert::model::MemoryStats memory = model->memory_stats();
      std::fprintf(stderr, "%s: mlock: %s\n", kTool,
                   memory.lock_error.empty()
                       ? StrCat(memory.locked_bytes, " bytes of weights locked").c_str()
                       : memory.lock_error.c_str());
    }
    if (backend.backend != "CPU") {
      std::fprintf(stderr, "%s: backend %s on %s, driver %s\n", kTool, backend.backend.c_str(),
                   backend.device.c_str(), backend.driver.c_str());
      if (!backend.pooled_experts.empty()) {
        std::fprintf(stderr, "%s: pooled experts on the %s\n", kTool,
                     backend.pooled_experts.c_str());
      }
    } else if (!backend.cpu_reason.empty()) {
      std::fprintf(stderr, "%s: backend CPU: OpenCL not used: %s\n", kTool,
                   backend.cpu_reason.c_str());
    }
    std::fprintf(stderr, "%s: loaded %s (%s) in %.1f s\n", kTool, info.model.type.c_str(),
                 path.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    // The reference model copies its weights out: the mapping closes here, and a
    // temporary synthetic model is no longer needed (an expert pool's loader holds
    // its own descriptor or mapping of the file).
    const moert::model::MemoryStats m = model->memory_stats();
    if (m.expert_pool) {
      std::fprintf(stderr,
                   "%s: expert pool %.1f MiB (%llu of %llu experts), budget %.1f MiB, "
                   "io %s%s%s%s%s\n",
                   kTool, static_cast<double>(m.pool.pool_bytes) / (1 << 20),
                   static_cast<unsigned long long>(m.pool.capacity_experts),
                   static_cast<unsigned long long>(m.all_experts_bytes /
                                                   std::max<uint64_t>(m.pool.charge_bytes, 1)),
                   static_cast<double>(m.budget_bytes) / (1 << 20), m.io_mode.c_str(),
                   m.io_fallback.empty() ? "" : ": ", m.io_fallback.c_str(),
                   m.io_engine.empty() ? "" : ", reads through ", m.io_engine.c_str());
    }
  }
  temp_file.Remove();
  if (!p.image.empty()) return RunImage(p, info, *model, *tokenizer);

  std::unique_ptr<Printer> printer;
  if (p.output == OutputFormat::kJson) {
    printer = std::make_unique<JsonPrinter>(info);
  } else {
    printer = std::make_unique<MarkdownPrinter>(info);
  }
  Bench bench(*model, /*seed=*/1234);
  std::vector<std::pair<int, int>> tests;
  if (p.n_prompt > 0 && p.sessions.empty()) tests.emplace_back(p.n_prompt, 0);
  if (p.n_gen > 0 && p.sessions.empty()) tests.emplace_back(0, p.n_gen);
  for (int n : p.sessions) tests.emplace_back(-n, p.n_gen);  // negative: sessions
  printer->Header();
  int rc = 0;
  for (const bool prefetch : p.prefetch) {
    if (absl::Status s = model->SetPrefetch(prefetch, p.prefetch_depth); !s.ok()) {
      rc = Fail(StrCat("--prefetch: ", s.message()));
      break;
    }
    for (const auto& [n_prompt, n_gen] : tests) {
      const int n_sessions = n_prompt < 0 ? -n_prompt : 0;
      const std::string name =
          StrCat(n_sessions > 0 ? StrCat("tg", n_gen, " x", n_sessions, " sessions")
                 : n_prompt > 0 ? StrCat("pp", n_prompt)
                                : StrCat("tg", n_gen),
                 p.prefetch.size() > 1 ? (prefetch ? " prefetch on" : " prefetch off") : "");
      std::fprintf(stderr, "%s: %s: warm-up and %d repetition(s), %d thread(s)\n", kTool,
                   name.c_str(), p.repetitions, info.n_threads);
      auto result = n_sessions > 0
                        ? bench.RunSessions(n_sessions, p.n_prompt, n_gen, p.repetitions)
                        : bench.Run(n_prompt, n_gen, p.repetitions);
      if (!result.ok()) {
        rc = Fail(StrCat(name, " failed: ", result.status().message()));
        break;
      }
      if (result->memory.expert_pool) {
        std::fprintf(stderr,
                     "%s: %s: expert hit rate %.1f%%, %.2f MiB read and %.2f ms stalled per token, "
                     "peak RSS %.1f MiB of a %.1f MiB budget\n",
                     kTool, name.c_str(), 100 * result->hit_rate,
                     result->bytes_read_per_token / (1 << 20), result->stall_ms_per_token,
                     static_cast<double>(result->peak_rss_bytes) / (1 << 20),
                     static_cast<double>(result->memory.budget_bytes) / (1 << 20));
        if (result->prefetch) {
          std::fprintf(stderr,
                       "%s: %s: prefetch depth %d: precision %.3f, recall %.3f, %llu loads hidden, "
                       "%llu waited for, %llu backed off, %llu cancelled, %llu narrowed "
                       "(reads busy); %llu misses streamed, %llu of them in before their turn\n",
                       kTool, name.c_str(), result->prefetch_depth, result->prefetch_precision,
                       result->prefetch_recall,
                       static_cast<unsigned long long>(result->loads_hidden),
                       static_cast<unsigned long long>(result->loads_waited),
                       static_cast<unsigned long long>(result->prefetch_backed_off),
                       static_cast<unsigned long long>(result->prefetch_cancelled),
                       static_cast<unsigned long long>(result->prefetch_io_busy),
                       static_cast<unsigned long long>(result->loads_streamed),
                       static_cast<unsigned long long>(result->streamed_hidden));
        }
      }
      SetRoofline(info, *result);
      printer->Test(*result);
    }
    if (rc != 0) break;
  }
  printer->Footer();
  if (std::fflush(stdout) != 0) return Fail("cannot write the output");
  return metrics.Finish() ? rc : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  bool help = false;
  if (std::optional<UsageError> error = ParseArgs(argc, argv, p, &help)) {
    return UsageFail(error->message);
  }
  if (help) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  std::optional<moert::telemetry::TraceFile> trace;
  if (!p.trace.empty()) trace.emplace(p.trace);
  return Run(p);
}
