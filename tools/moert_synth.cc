// moert-synth: writes a GGUF model with random weights in the exact shape of a real
// MoE model (tiny, OLMoE-1B-7B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B), for testing and
// benchmarking at real sizes without downloading anything. The generator is the synth
// library (synth.h), which moert-bench --synthetic shares.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/strings.h"
#include "format/ggml_types.h"
#include "synth.h"

namespace {

using moert::StrCat;
using moert::format::GgmlTypeName;
using moert::synth::SynthModel;
using moert::synth::SynthOptions;
using moert::synth::SynthTensor;

constexpr char kUsage[] =
    "usage: moert-synth --shape NAME --type TYPE -o FILE [options]\n"
    "\n"
    "Writes a GGUF model with seeded random weights in the shape of a real MoE model.\n"
    "Matrices (embeddings, attention, experts, output) get TYPE; norms, biases and the\n"
    "router stay f32, as llama.cpp keeps them. A K type falls back to q5_0 (q4_K) or\n"
    "q8_0 (q6_K) for rows that are not a multiple of 256, as llama-quantize does.\n"
    "\n"
    "  --shape NAME     tiny, olmoe-1b-7b, qwen15-moe-a27b, mixtral-8x7b\n"
    "  --type TYPE      f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K\n"
    "  -o, --output FILE  where to write the model\n"
    "  --layers N       only the first N layers (default: all of the shape's)\n"
    "  --seed S         random seed (default 1)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --dry-run        print the tensors and the file size, write nothing\n"
    "  -h, --help       show this help\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-synth: error: %s\n", message.c_str());
  return 1;
}

std::optional<uint64_t> ParseUint(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

std::string ShapeString(const std::vector<uint64_t>& dims) {
  return StrCat("[", moert::StrJoin(dims, ", "), "]");
}

int Run(const SynthOptions& options, const std::string& output, bool dry_run) {
  const auto start = std::chrono::steady_clock::now();
  auto model = SynthModel::Plan(options);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  if (dry_run) {
    for (const SynthTensor& t : model->tensors()) {
      std::printf("%-34s %-5s %-22s %14llu\n", t.name.c_str(),
                  std::string(GgmlTypeName(t.type)).c_str(), ShapeString(t.dims).c_str(),
                  static_cast<unsigned long long>(t.n_bytes()));
    }
    std::printf("total %zu tensors, %llu bytes\n", model->tensors().size(),
                static_cast<unsigned long long>(model->file_size()));
    std::fprintf(stderr, "moert-synth: dry run: %s\n", model->Describe().c_str());
    return 0;
  }
  absl::Status written = model->Write(output);
  if (!written.ok()) return Fail(std::string(written.message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "moert-synth: wrote %s: %s in %.1f s\n", output.c_str(),
               model->Describe().c_str(), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SynthOptions o;
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  std::string output;
  bool dry_run = false;
  std::string type_name;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string_view value;
    auto take = [&]() {
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--shape") {
      if (!take()) return Fail("--shape needs a NAME (see --help)");
      o.shape = moert::synth::FindShape(value);
      if (o.shape == nullptr) {
        return Fail(
            StrCat("unknown shape '", value, "' (known: ", moert::synth::ShapeNames(), ")"));
      }
    } else if (arg == "--type") {
      if (!take()) return Fail("--type needs a TYPE (see --help)");
      type_name = std::string(value);
      std::optional<moert::format::GgmlType> type = moert::synth::FindMatrixType(value);
      if (!type) {
        return Fail(StrCat("unsupported --type '", value,
                           "' (supported: ", moert::synth::MatrixTypeNames(), ")"));
      }
      o.type = *type;
    } else if (arg == "-o" || arg == "--output") {
      if (!take()) return Fail("-o needs a FILE (see --help)");
      output = std::string(value);
    } else if (arg == "--layers") {
      if (!take()) return Fail("--layers needs a number (see --help)");
      std::optional<uint64_t> layers = ParseUint(value);
      if (!layers || *layers == 0 || *layers > 4096) {
        return Fail(StrCat("--layers '", value, "' is not a number from 1 to 4096"));
      }
      o.n_layer = static_cast<uint32_t>(*layers);
    } else if (arg == "--seed") {
      if (!take()) return Fail("--seed needs a number (see --help)");
      std::optional<uint64_t> seed = ParseUint(value);
      if (!seed) return Fail(StrCat("--seed '", value, "' is not a number"));
      o.seed = *seed;
    } else if (arg == "--threads") {
      if (!take()) return Fail("--threads needs a number (see --help)");
      std::optional<uint64_t> threads = ParseUint(value);
      if (!threads || *threads == 0 || *threads > 1024) {
        return Fail(StrCat("--threads '", value, "' is not a number from 1 to 1024"));
      }
      o.threads = static_cast<unsigned>(*threads);
    } else if (arg == "--dry-run") {
      dry_run = true;
    } else {
      return Fail(StrCat("unknown argument '", arg, "' (see --help)"));
    }
  }
  if (o.shape == nullptr) return Fail("no shape: give --shape NAME (see --help)");
  if (type_name.empty()) return Fail("no type: give --type TYPE (see --help)");
  if (output.empty() && !dry_run) return Fail("no output: give -o FILE (see --help)");
  return Run(o, output, dry_run);
}
