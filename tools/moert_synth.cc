// moert-synth: writes a GGUF model with random weights in the exact shape of a real
// MoE model (tiny, OLMoE-1B-7B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B), for testing and
// benchmarking at real sizes without downloading anything. The generator is the synth
// library (synth.h), which moert-bench --synthetic shares. --preset writes a fixed
// oracle model set instead (minicpmv26-oracle: minicpmv_oracle.h).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/strings.h"
#include "format/ggml_types.h"
#include "minicpmv_oracle.h"
#include "synth.h"

namespace {

using moert::StrCat;
using moert::format::GgmlTypeName;
using moert::synth::SynthModel;
using moert::synth::SynthOptions;
using moert::synth::SynthTensor;

constexpr char kUsage[] =
    "usage: moert-synth --shape NAME --type TYPE -o FILE [options]\n"
    "       moert-synth --preset NAME --out-dir DIR [--vocab FILE]\n"
    "\n"
    "Writes a GGUF model with seeded random weights in the shape of a real MoE model.\n"
    "Matrices (embeddings, attention, experts, output) get TYPE; norms, biases and the\n"
    "router stay f32, as llama.cpp keeps them. A K type falls back to q5_0 (q4_K) or\n"
    "q8_0 (q6_K) for rows that are not a multiple of 256, as llama-quantize does.\n"
    "\n"
    "  --shape NAME     tiny, olmoe-1b-7b, qwen15-moe-a27b, mixtral-8x7b, minicpmv-moe\n"
    "                   (qwen2moe at the MiniCPM-V 2.6 oracle's width, 3584)\n"
    "  --type TYPE      f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K\n"
    "  -o, --output FILE  where to write the model\n"
    "  --layers N       only the first N layers (default: all of the shape's)\n"
    "  --seed S         random seed (default 1)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --dry-run        print the tensors and the file size, write nothing\n"
    "  --vocab FILE     with --shape: a vocab.json (tokens, token_type, merges) as the\n"
    "                   model's byte-level BPE vocabulary (BOS <|endoftext|>, EOS\n"
    "                   <|im_end|>), e.g. the oracle's for minicpmv-moe\n"
    "  -h, --help       show this help\n"
    "\n"
    "Presets write a fixed set of oracle files, byte for byte, into an existing DIR:\n"
    "  --preset NAME    minicpmv26-oracle: mmproj-minicpmv26-tiny-f32.gguf and\n"
    "                   llm-minicpmv26-tiny.gguf (../shared/mmproj/SPEC.md)\n"
    "  --out-dir DIR    where to write them\n"
    "  --vocab FILE     the oracle's vocab.json (default: " MOERT_DEFAULT_ORACLE_VOCAB ")\n";

// A preset: a fixed set of files written into a directory; the paths written.
struct Preset {
  std::string_view name;
  absl::StatusOr<std::vector<std::string>> (*write)(const std::string& out_dir,
                                                    const std::string& vocab_path);
};

constexpr Preset kPresets[] = {
    {moert::synth::kMinicpmv26OraclePreset, &moert::synth::WriteMinicpmv26Oracle},
};

const Preset* FindPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string PresetNames() {
  std::vector<std::string_view> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return moert::StrJoin(names, ", ");
}

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

int RunPreset(const Preset& preset, const std::string& out_dir, const std::string& vocab) {
  const auto start = std::chrono::steady_clock::now();
  auto paths = preset.write(out_dir, vocab);
  if (!paths.ok()) return Fail(std::string(paths.status().message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::string> written;
  for (const std::string& path : *paths) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    written.push_back(StrCat(path, " (", ec ? 0 : size, " bytes)"));
  }
  std::fprintf(stderr, "moert-synth: wrote %s: %s in %.1f s\n",
               moert::StrJoin(written, ", ").c_str(), std::string(preset.name).c_str(), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SynthOptions o;
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  std::string output;
  bool dry_run = false;
  std::string type_name;
  const Preset* preset = nullptr;
  std::string out_dir;
  std::string vocab = MOERT_DEFAULT_ORACLE_VOCAB;
  bool vocab_given = false;
  // The flags of a synthetic model, which a preset does not take.
  std::vector<std::string_view> model_flags;
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
    } else if (arg == "--preset") {
      if (!take()) return Fail("--preset needs a NAME (see --help)");
      preset = FindPreset(value);
      if (preset == nullptr) {
        return Fail(StrCat("unknown preset '", value, "' (known: ", PresetNames(), ")"));
      }
    } else if (arg == "--out-dir") {
      if (!take()) return Fail("--out-dir needs a DIR (see --help)");
      out_dir = std::string(value);
    } else if (arg == "--vocab") {
      if (!take()) return Fail("--vocab needs a FILE (see --help)");
      vocab = std::string(value);
      vocab_given = true;
    } else if (arg == "--shape") {
      model_flags.push_back(arg);
      if (!take()) return Fail("--shape needs a NAME (see --help)");
      o.shape = moert::synth::FindShape(value);
      if (o.shape == nullptr) {
        return Fail(
            StrCat("unknown shape '", value, "' (known: ", moert::synth::ShapeNames(), ")"));
      }
    } else if (arg == "--type") {
      model_flags.push_back(arg);
      if (!take()) return Fail("--type needs a TYPE (see --help)");
      type_name = std::string(value);
      std::optional<moert::format::GgmlType> type = moert::synth::FindMatrixType(value);
      if (!type) {
        return Fail(StrCat("unsupported --type '", value,
                           "' (supported: ", moert::synth::MatrixTypeNames(), ")"));
      }
      o.type = *type;
    } else if (arg == "-o" || arg == "--output") {
      model_flags.push_back(arg);
      if (!take()) return Fail("-o needs a FILE (see --help)");
      output = std::string(value);
    } else if (arg == "--layers") {
      model_flags.push_back(arg);
      if (!take()) return Fail("--layers needs a number (see --help)");
      std::optional<uint64_t> layers = ParseUint(value);
      if (!layers || *layers == 0 || *layers > 4096) {
        return Fail(StrCat("--layers '", value, "' is not a number from 1 to 4096"));
      }
      o.n_layer = static_cast<uint32_t>(*layers);
    } else if (arg == "--seed") {
      model_flags.push_back(arg);
      if (!take()) return Fail("--seed needs a number (see --help)");
      std::optional<uint64_t> seed = ParseUint(value);
      if (!seed) return Fail(StrCat("--seed '", value, "' is not a number"));
      o.seed = *seed;
    } else if (arg == "--threads") {
      model_flags.push_back(arg);
      if (!take()) return Fail("--threads needs a number (see --help)");
      std::optional<uint64_t> threads = ParseUint(value);
      if (!threads || *threads == 0 || *threads > 1024) {
        return Fail(StrCat("--threads '", value, "' is not a number from 1 to 1024"));
      }
      o.threads = static_cast<unsigned>(*threads);
    } else if (arg == "--dry-run") {
      model_flags.push_back(arg);
      dry_run = true;
    } else {
      return Fail(StrCat("unknown argument '", arg, "' (see --help)"));
    }
  }
  if (preset != nullptr) {
    if (!model_flags.empty()) {
      return Fail(StrCat("--preset takes only --out-dir and --vocab, not ", model_flags[0]));
    }
    if (out_dir.empty()) return Fail("no output directory: give --out-dir DIR (see --help)");
    return RunPreset(*preset, out_dir, vocab);
  }
  if (!out_dir.empty()) return Fail("--out-dir needs --preset NAME");
  if (vocab_given) {
    auto read = moert::synth::ReadOracleVocab(vocab);
    if (!read.ok()) return Fail(std::string(read.status().message()));
    SynthOptions::BpeVocab bpe;
    bpe.tokens = read->tokens;
    bpe.types = read->token_type;
    bpe.merges = read->merges;
    const auto id = [&](const char* token) {
      auto it = std::find(bpe.tokens.begin(), bpe.tokens.end(), token);
      return static_cast<uint32_t>(it == bpe.tokens.end() ? 0 : it - bpe.tokens.begin());
    };
    bpe.bos = id("<|endoftext|>");
    bpe.eos = id("<|im_end|>");
    o.bpe_vocab = std::move(bpe);
  }
  if (o.shape == nullptr) return Fail("no shape: give --shape NAME (see --help)");
  if (type_name.empty()) return Fail("no type: give --type TYPE (see --help)");
  if (output.empty() && !dry_run) return Fail("no output: give -o FILE (see --help)");
  return Run(o, output, dry_run);
}
