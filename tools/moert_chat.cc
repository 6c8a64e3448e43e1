// moert-chat: generate text with a GGUF model through the public C++ API, with
// llama.cpp's flag names. With -p it continues the raw prompt once (no chat
// template: base models) and stdout holds the continuation only; without -p it is
// an interactive chat that reads lines from stdin and streams the replies (chat
// template from the model, /reset to start over, /exit or end of input to quit).
// Loading progress, the speed line and errors go to stderr.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <system_error>

#include "cli_escapes.h"
#include "moert/runtime.h"
#include "moert/version.h"

namespace {

#ifndef MOERT_DEFAULT_MODEL
#define MOERT_DEFAULT_MODEL ""
#endif
// Where the example model lies when the source tree is gone (an installed tool run
// from a checkout).
constexpr char kRelativeDefaultModel[] = "examples/models/tiny-moe-shakespeare-q8_0.gguf";

constexpr char kUsage[] =
    "usage: moert-chat [-m FILE] [-p PROMPT] [options]\n"
    "\n"
    "Generates text with a GGUF model. With -p, continues PROMPT once (no chat\n"
    "template) and prints only the continuation. Without -p, chats: type a message\n"
    "per line; /reset starts over, /exit or end of input quits.\n"
    "\n"
    "  -m, --model FILE         GGUF model (default: the example model,\n"
    "                           examples/models/tiny-moe-shakespeare-q8_0.gguf)\n"
    "  -p, --prompt TEXT        prompt to continue (escapes such as \\n are processed)\n"
    "  -n, --n-predict N        tokens to generate (default -1: until the end of text\n"
    "                           or a full context)\n"
    "  --temp T                 temperature (default 0.8; 0: greedy)\n"
    "  --top-k N                top-k sampling (default 40; 0: off)\n"
    "  --top-p P                top-p sampling (default 0.95; 1: off)\n"
    "  --min-p P                min-p sampling (default 0.05; 0: off)\n"
    "  --repeat-penalty F       penalty for repeated tokens (default 1.0: off)\n"
    "  -s, --seed N             RNG seed (default -1: random)\n"
    "  -t, --threads N          compute threads (default 0: one per CPU)\n"
    "  -c, --ctx-size N         context length (default 0: the model's)\n"
    "  --memory-budget-mb N     everything the model may hold, in MiB: the routed\n"
    "                           experts are then loaded on demand into an expert pool\n"
    "                           of what the other weights, KV cache and scratch leave\n"
    "  --expert-pool-mb N       an expert pool of N MiB\n"
    "  --expert-pool FRACTION   an expert pool of this fraction (0, 1] of what all\n"
    "                           routed experts take (1: every expert fits)\n"
    "  --io MODE                how pooled experts are read: direct (default),\n"
    "                           buffered or mmap\n"
    "  --no-hot-set             with a pool, do not read or write MODEL.gguf.moert-hot\n"
    "                           (the most used experts, loaded first at start)\n"
    "  --router-alpha A         under memory pressure, lower non-resident experts'\n"
    "                           gate logits by A * pressure (default 1; 0: off)\n"
    "  --dynamic-k P            each token takes the fewest experts whose routing\n"
    "                           probability reaches P (0 < P <= 1; default off)\n"
    "  --thermal-limit C        above C degrees Celsius, one expert fewer per token\n"
    "                           (default 0: no limit)\n"
    "  --prefetch on|off        with a pool, read the experts the next layer's router\n"
    "                           predicts while this layer computes (default off)\n"
    "  --prefetch-depth N       predict N layers ahead (default 1)\n"
    "  --backend cpu|opencl|auto where the model runs (default cpu; auto: an OpenCL\n"
    "                           GPU that passes a self-test, else the CPU)\n"
    "  -h, --help               show this help\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-chat: error: %s\n", message.c_str());
  return 1;
}

bool ParseInt(std::string_view text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool ParseFloat(std::string_view text, float* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

struct Args {
  std::string model;
  std::string prompt;
  bool have_prompt = false;
  int64_t n_predict = -1;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int64_t seed = -1;
  int64_t threads = 0;
  int64_t ctx_size = 0;
  int64_t memory_budget_mb = 0;
  int64_t expert_pool_mb = 0;
  float expert_pool_fraction = 0;
  moert::IoMode io = moert::IoMode::kDirect;
  bool hot_set = true;
  float router_alpha = 1.0f;
  float dynamic_k = 0;
  float thermal_limit = 0;
  bool prefetch = false;
  int64_t prefetch_depth = 1;
  moert::Backend backend = moert::Backend::kCpu;
  bool backend_given = false;
};

// Parses argv into `args`; "" on success, else the error line. Sets *help for -h.
std::string ParseArgs(int argc, char** argv, Args* args, bool* help) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](std::string_view* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string_view v;
    const auto need = [&](const char* what) {
      return std::string(arg) + " needs " + what + " (see --help)";
    };
    const auto bad = [&](const char* what) {
      return "invalid value '" + std::string(v) + "' for " + std::string(arg) + ": expected " +
             what;
    };
    const auto int_flag = [&](int64_t* out, int64_t min) -> std::string {
      if (!value(&v)) return need("a number");
      if (!ParseInt(v, out) || *out < min || *out > INT32_MAX) {
        return bad(min == 0 ? "an integer >= 0" : "an integer");
      }
      return {};
    };
    const auto float_flag = [&](float* out) -> std::string {
      if (!value(&v)) return need("a number");
      if (!ParseFloat(v, out)) return bad("a number");
      return {};
    };
    std::string error;
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return {};
    } else if (arg == "-m" || arg == "--model") {
      if (!value(&v)) return need("a FILE");
      args->model = std::string(v);
    } else if (arg == "-p" || arg == "--prompt") {
      if (!value(&v)) return need("a TEXT");
      args->prompt = moert::tools::ProcessEscapes(v);
      args->have_prompt = true;
    } else if (arg == "-n" || arg == "--n-predict") {
      error = int_flag(&args->n_predict, INT32_MIN);
    } else if (arg == "--temp") {
      error = float_flag(&args->temperature);
    } else if (arg == "--top-k") {
      error = int_flag(&args->top_k, INT32_MIN);
    } else if (arg == "--top-p") {
      error = float_flag(&args->top_p);
    } else if (arg == "--min-p") {
      error = float_flag(&args->min_p);
    } else if (arg == "--repeat-penalty") {
      error = float_flag(&args->repeat_penalty);
    } else if (arg == "-s" || arg == "--seed") {
      error = int_flag(&args->seed, -1);
      if (error.empty() && args->seed < -1) error = bad("-1 or a seed >= 0");
    } else if (arg == "-t" || arg == "--threads") {
      error = int_flag(&args->threads, 0);
    } else if (arg == "-c" || arg == "--ctx-size") {
      error = int_flag(&args->ctx_size, 0);
    } else if (arg == "--memory-budget-mb") {
      error = int_flag(&args->memory_budget_mb, 1);
      if (error.empty() && args->memory_budget_mb < 1) error = bad("a number of MiB >= 1");
    } else if (arg == "--expert-pool-mb") {
      error = int_flag(&args->expert_pool_mb, 1);
      if (error.empty() && args->expert_pool_mb < 1) error = bad("a number of MiB >= 1");
    } else if (arg == "--expert-pool") {
      error = float_flag(&args->expert_pool_fraction);
      if (error.empty() && !(args->expert_pool_fraction > 0 && args->expert_pool_fraction <= 1)) {
        error = bad("a fraction in (0, 1]");
      }
    } else if (arg == "--io") {
      if (!value(&v)) return need("a MODE");
      if (v == "direct") {
        args->io = moert::IoMode::kDirect;
      } else if (v == "buffered") {
        args->io = moert::IoMode::kBuffered;
      } else if (v == "mmap") {
        args->io = moert::IoMode::kMmap;
      } else {
        error = bad("direct, buffered or mmap");
      }
    } else if (arg == "--no-hot-set") {
      args->hot_set = false;
    } else if (arg == "--router-alpha") {
      error = float_flag(&args->router_alpha);
      if (error.empty() && !(args->router_alpha >= 0)) error = bad("a number >= 0");
    } else if (arg == "--dynamic-k") {
      error = float_flag(&args->dynamic_k);
      if (error.empty() && !(args->dynamic_k > 0 && args->dynamic_k <= 1)) {
        error = bad("a probability in (0, 1]");
      }
    } else if (arg == "--thermal-limit") {
      error = float_flag(&args->thermal_limit);
      if (error.empty() && !(args->thermal_limit > 0)) error = bad("degrees Celsius > 0");
    } else if (arg == "--prefetch") {
      if (!value(&v)) return need("on or off");
      if (v == "on" || v == "off") {
        args->prefetch = v == "on";
      } else {
        error = bad("on or off");
      }
    } else if (arg == "--prefetch-depth") {
      error = int_flag(&args->prefetch_depth, 1);
      if (error.empty() && args->prefetch_depth < 1) error = bad("a number of layers >= 1");
    } else if (arg == "--backend") {
      if (!value(&v)) return need("cpu, opencl or auto");
      args->backend_given = true;
      if (v == "cpu") {
        args->backend = moert::Backend::kCpu;
      } else if (v == "opencl") {
        args->backend = moert::Backend::kOpenCl;
      } else if (v == "auto") {
        args->backend = moert::Backend::kAuto;
      } else {
        error = bad("cpu, opencl or auto");
      }
    } else {
      return "unknown argument '" + std::string(arg) + "' (see --help)";
    }
    if (!error.empty()) return error;
  }
  if (args->expert_pool_mb > 0 && args->expert_pool_fraction > 0) {
    return "give either --expert-pool-mb or --expert-pool, not both";
  }
  return {};
}

bool FileExists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string DefaultModel() {
  const std::string built_in = MOERT_DEFAULT_MODEL;
  if (!built_in.empty() && FileExists(built_in)) return built_in;
  return kRelativeDefaultModel;
}

// Drawn on stderr only when it is a terminal, so logs and tests stay clean.
class ProgressBar {
 public:
  ProgressBar() : enabled_(isatty(STDERR_FILENO) == 1) {}
  void Draw(float fraction) {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth + 0.5f);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\rloading [%s] %3d%%", bar.c_str(), static_cast<int>(fraction * 100));
    if (fraction >= 1.0f) std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  // Clears an unfinished bar (before an error line).
  void Clear() {
    if (enabled_) std::fputs("\r\033[K", stderr);
  }

 private:
  bool enabled_;
};

void PrintStats(const moert::GenerationStats& s) {
  std::fprintf(stderr,
               "moert-chat: prompt %d tokens (%d cached) %.1f ms, %.1f t/s; generated %d "
               "tokens %.1f t/s; first token %.1f ms; peak RSS %.1f MiB; %s\n",
               s.prompt_tokens, s.cached_tokens, s.prefill_ms, s.prefill_tokens_per_second,
               s.generated_tokens, s.decode_tokens_per_second, s.time_to_first_token_ms,
               static_cast<double>(s.peak_rss_bytes) / (1024.0 * 1024.0),
               moert::FinishReasonName(s.finish_reason));
  if (s.expert_pool_bytes > 0) {
    std::fprintf(stderr,
                 "moert-chat: budget %.1f MiB, expert pool %.1f MiB (%.1f MiB used), hit rate "
                 "%.1f%%, %.2f MiB read and %.2f ms stalled per token\n",
                 static_cast<double>(s.budget_bytes) / (1024.0 * 1024.0),
                 static_cast<double>(s.expert_pool_bytes) / (1024.0 * 1024.0),
                 static_cast<double>(s.expert_pool_used_bytes) / (1024.0 * 1024.0),
                 100 * s.expert_hit_rate, s.expert_bytes_read_per_token / (1024.0 * 1024.0),
                 s.expert_stall_ms_per_token);
  }
}

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};

// Ctrl-C stops the reply being generated; when none is, it quits.
extern "C" void OnInterrupt(int) {
  if (g_generating.load()) {
    g_cancel.store(true);
  } else {
    _exit(130);
  }
}

bool WritePiece(std::string_view piece) {
  if (piece.empty()) return true;
  return std::fwrite(piece.data(), 1, piece.size(), stdout) == piece.size() &&
         std::fflush(stdout) == 0;
}

int Interactive(moert::MoERuntime& runtime, moert::GenerateRequest request) {
  std::unique_ptr<moert::Session> session;
  moert::Status status = runtime.CreateSession(&session);
  if (!status.ok()) return Fail(status.message());
  const moert::ModelInfo info = runtime.model_info();
  std::fprintf(stderr,
               "moert-chat: %s (%s, context %d, chat template %s). Type a message; /reset "
               "starts over, /exit quits.\n",
               info.path.c_str(), info.architecture.c_str(), info.context_length,
               info.chat_template.c_str());
  request.context_policy = moert::ContextPolicy::kSlide;
  request.cancel = &g_cancel;
  std::signal(SIGINT, OnInterrupt);

  std::string line;
  while (true) {
    std::fputs("> ", stderr);
    std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      session->Reset();
      std::fputs("moert-chat: conversation cleared\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    g_cancel.store(false);
    g_generating.store(true);
    // Templates such as plain end the prompt at "assistant:": the reply's leading
    // space is not shown.
    bool reply_started = false;
    status = session->Chat(line, request, [&](std::string_view piece, int32_t) {
      if (!reply_started) {
        piece.remove_prefix(std::min(piece.find_first_not_of(' '), piece.size()));
        reply_started = !piece.empty();
      }
      return WritePiece(piece);
    });
    g_generating.store(false);
    WritePiece("\n");
    if (!status.ok() && status.code() != moert::StatusCode::kCancelled) {
      std::fprintf(stderr, "moert-chat: error: %s\n", status.message().c_str());
      continue;
    }
    PrintStats(session->Stats());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  bool help = false;
  const std::string error = ParseArgs(argc, argv, &args, &help);
  if (!error.empty()) return Fail(error);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.model.empty()) args.model = DefaultModel();

  moert::RuntimeOptions options;
  options.threads = static_cast<int>(args.threads);
  options.context_length = static_cast<int>(args.ctx_size);
  options.memory_budget_bytes = args.memory_budget_mb << 20;
  options.expert_pool_bytes = args.expert_pool_mb << 20;
  options.expert_pool_fraction = args.expert_pool_fraction;
  options.io_mode = args.io;
  options.hot_set = args.hot_set;
  options.router_alpha = args.router_alpha;
  options.dynamic_k = args.dynamic_k;
  options.thermal_limit_c = args.thermal_limit;
  options.prefetch = args.prefetch;
  options.prefetch_depth = static_cast<int>(std::min<int64_t>(args.prefetch_depth, INT32_MAX));
  options.backend = args.backend;
  std::unique_ptr<moert::MoERuntime> runtime;
  moert::Status status = moert::MoERuntime::Create(options, &runtime);
  if (!status.ok()) return Fail(status.message());

  ProgressBar bar;
  status = runtime->LoadModel(args.model, [&bar](float f) { bar.Draw(f); });
  if (!status.ok()) {
    bar.Clear();
    return Fail(status.message());
  }
  if (args.backend_given) {
    const moert::ModelInfo info = runtime->model_info();
    bar.Clear();
    if (info.backend == "CPU") {
      std::fprintf(stderr, "moert-chat: backend CPU%s%s\n",
                   info.backend_note.empty() ? "" : ": OpenCL not used: ",
                   info.backend_note.c_str());
    } else {
      std::fprintf(stderr, "moert-chat: backend %s on %s, driver %s\n", info.backend.c_str(),
                   info.device.c_str(), info.driver.c_str());
      if (!info.pooled_experts.empty()) {
        std::fprintf(stderr, "moert-chat: pooled experts on the %s\n",
                     info.pooled_experts.c_str());
      }
    }
  }

  moert::GenerateRequest request;
  request.max_tokens = static_cast<int>(args.n_predict);
  request.temperature = args.temperature;
  request.top_k = static_cast<int>(args.top_k);
  request.top_p = args.top_p;
  request.min_p = args.min_p;
  request.repeat_penalty = args.repeat_penalty;
  request.seed = args.seed >= 0 ? static_cast<uint64_t>(args.seed) : std::random_device()();

  if (!args.have_prompt) return Interactive(*runtime, request);

  request.prompt = args.prompt;
  bool write_failed = false;
  status = runtime->Generate(request, [&](std::string_view piece, int32_t) {
    write_failed = !WritePiece(piece);
    return !write_failed;
  });
  if (write_failed) return Fail("cannot write the output");
  if (!status.ok()) {
    std::fflush(stdout);
    return Fail(status.message());
  }
  PrintStats(runtime->Stats());
  return 0;
}
