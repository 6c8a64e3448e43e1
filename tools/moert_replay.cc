// moert-replay: re-runs a repro bundle (docs/repro.md) on the fp32 reference path and
// on the bundle's backend, op by op, and prints the first layer and op whose outputs
// differ past the bound, as "layer 12 expert 3 down: max abs diff 0.012". Exit status:
// 0 no difference, 1 an error, 2 a difference.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "replay.h"

namespace {

constexpr char kUsage[] =
    "usage: moert-replay BUNDLE -m MODEL [--tolerance T] [--max-tokens N] [-t THREADS]\n"
    "\n"
    "Re-runs the repro bundle BUNDLE's token ids through MODEL twice, on the fp32\n"
    "reference path and on the bundle's backend (the quantized CPU kernels), token by\n"
    "token, comparing each op's output in each layer (attention, router, each chosen\n"
    "expert's gate, up and down, ffn). Prints the first op past the bound\n"
    "(\"layer 12 expert 3 down: max abs diff 0.012\") and exits 2, or \"no difference\"\n"
    "and exits 0.\n"
    "\n"
    "  -m, --model FILE     the bundle's GGUF model (its hash must match)\n"
    "  --tolerance T        an op differs when its max abs diff passes\n"
    "                       T * max(1, max |reference|) (default 0.25)\n"
    "  --max-tokens N       replay the bundle's first N tokens (default 64)\n"
    "  -t, --threads N      compute threads (default 1; results do not depend on it)\n"
    "  --ignore-hash        replay on a model whose hash is not the bundle's\n"
    "  --inject-fault SPEC  testing: add DELTA (default 1) to one op's output on the\n"
    "                       backend run, SPEC = LAYER:OP[:EXPERT][=DELTA]\n"
    "  -h, --help           show this help\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-replay: error: %s\n", message.c_str());
  return 1;
}

bool ParseInt(const char* text, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 0 || v > 1 << 24) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  moert::tools::ReplayOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "-m" || arg == "--model") {
      const char* v = value();
      if (v == nullptr) return Fail("-m needs a FILE");
      options.model = v;
    } else if (arg == "--tolerance") {
      const char* v = value();
      char* end = nullptr;
      options.tolerance = v != nullptr ? std::strtod(v, &end) : 0;
      if (v == nullptr || *end != '\0' || *v == '\0') return Fail("--tolerance needs a number");
    } else if (arg == "--max-tokens") {
      const char* v = value();
      if (v == nullptr || !ParseInt(v, &options.max_tokens)) return Fail("--max-tokens needs a count");
    } else if (arg == "-t" || arg == "--threads") {
      const char* v = value();
      if (v == nullptr || !ParseInt(v, &options.threads)) return Fail("-t needs a count");
    } else if (arg == "--ignore-hash") {
      options.ignore_hash = true;
    } else if (arg == "--inject-fault") {
      const char* v = value();
      if (v == nullptr) return Fail("--inject-fault needs LAYER:OP[:EXPERT][=DELTA]");
      auto fault = moert::tools::ParseReplayFault(v);
      if (!fault.ok()) return Fail(std::string(fault.status().message()));
      options.fault = *fault;
    } else if (!arg.empty() && arg[0] == '-') {
      return Fail("unknown option " + std::string(arg) + " (see --help)");
    } else if (options.bundle.empty()) {
      options.bundle = std::string(arg);
    } else {
      return Fail("expected exactly one BUNDLE");
    }
  }
  if (options.bundle.empty()) return Fail("expected exactly one BUNDLE (see --help)");
  if (options.model.empty()) return Fail("no model: give -m MODEL");
  auto report = moert::tools::Replay(options);
  if (!report.ok()) return Fail(std::string(report.status().message()));
  std::fprintf(stderr, "moert-replay: %s; %d tokens, %lld op outputs compared\n",
               report->backend.c_str(), report->tokens, static_cast<long long>(report->ops));
  if (!report->note.empty()) std::fprintf(stderr, "moert-replay: note: %s\n", report->note.c_str());
  if (!report->first) {
    std::printf("no difference (largest diff %.3g of the bound)\n", report->largest_ratio);
    return 0;
  }
  const moert::tools::ReplayDiff& d = *report->first;
  std::printf("%s\n", moert::tools::FormatReplayDiff(d).c_str());
  std::fprintf(stderr, "moert-replay: at token %lld of the bundle%s (bound %.3g)\n",
               static_cast<long long>(d.token),
               d.routing_differs ? ", where the two runs chose different experts" : "", d.bound);
  return 2;
}
