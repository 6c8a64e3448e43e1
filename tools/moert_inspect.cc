// moert-inspect FILE: what a GGUF model file holds - architecture, hyperparameters,
// tokenizer, moert-pack's packing, a tensor table and the routed experts summarised
// per layer. A bad file gives exit code 1 and one line naming what is wrong.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "moert/version.h"

namespace {

using moert::StrCat;
using moert::StrJoin;
using moert::format::GgufFile;
using moert::format::GgufTensorInfo;
using moert::format::ModelSpec;
using moert::format::TensorKind;

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-inspect: error: %s\n", message.c_str());
  return 1;
}

int Fail(const absl::Status& status) { return Fail(std::string(status.message())); }

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string Shape(const std::vector<uint64_t>& dims) {
  return StrCat("[", StrJoin(dims, ", "), "]");
}

std::string_view RopeName(moert::format::RopeLayout rope) {
  return rope == moert::format::RopeLayout::kNeox ? "neox" : "normal";
}

std::string_view ScalingName(moert::format::RopeScaling s) {
  switch (s) {
    case moert::format::RopeScaling::kNone: return "none";
    case moert::format::RopeScaling::kLinear: return "linear";
    case moert::format::RopeScaling::kYarn: return "yarn";
  }
  return "?";
}

// Optional metadata as text for the tokenizer line; empty when absent.
std::string UintKey(const GgufFile& file, std::string_view key) {
  auto v = file.GetUint(key);
  return v.ok() ? StrCat(*v) : "-";
}

std::string BoolKey(const GgufFile& file, std::string_view key) {
  auto v = file.GetBool(key);
  return v.ok() ? (*v ? "true" : "false") : "-";
}

void PrintTokenizer(const GgufFile& file) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) {
    std::printf("tokenizer   none\n");
    return;
  }
  std::string kind = std::string(*model);
  if (*model == "llama") kind += " (SentencePiece)";
  if (*model == "gpt2") kind += " (byte-level BPE)";
  const auto* tokens = file.FindKey("tokenizer.ggml.tokens");
  uint64_t count = tokens != nullptr ? tokens->value.array_size : 0;
  std::string pre;
  if (auto p = file.GetString("tokenizer.ggml.pre"); p.ok()) pre = StrCat(", pre '", *p, "'");
  std::printf("tokenizer   %s%s, %llu tokens, bos %s, eos %s, add_bos %s, add_eos %s\n",
              kind.c_str(), pre.c_str(), static_cast<unsigned long long>(count),
              UintKey(file, "tokenizer.ggml.bos_token_id").c_str(),
              UintKey(file, "tokenizer.ggml.eos_token_id").c_str(),
              BoolKey(file, "tokenizer.ggml.add_bos_token").c_str(),
              BoolKey(file, "tokenizer.ggml.add_eos_token").c_str());
}

// moert-pack's keys (docs/formats.md, "Packed GGUF files"), when the file has them.
void PrintPacking(const GgufFile& file) {
  auto version = file.GetUint("moert.pack.version");
  if (!version.ok()) return;
  auto text = [&](std::string_view key) {
    auto v = file.GetString(key);
    return v.ok() ? std::string(*v) : std::string("-");
  };
  const std::string calibration = text("moert.pack.calibration");
  std::printf("packed      moert-pack v%llu, sparsity %s, %s-row tiles, calibration %s\n",
              static_cast<unsigned long long>(*version), text("moert.pack.sparsity").c_str(),
              UintKey(file, "moert.pack.tile_rows").c_str(),
              calibration.empty() ? "none" : StrCat("'", calibration, "'").c_str());
}

void PrintSpec(const ModelSpec& s) {
  std::printf("arch        %.*s", static_cast<int>(s.arch->name.size()), s.arch->name.data());
  if (s.is_moe()) {
    std::printf(" (MoE: %u experts, %u used per token, expert FFN %u%s)", s.n_expert,
                s.n_expert_used, s.n_ff_expert,
                s.n_ff_shared_expert ? StrCat(", shared expert FFN ",
                                                    s.n_ff_shared_expert).c_str()
                                     : "");
  } else {
    std::printf(" (dense, FFN %u)", s.n_ff);
  }
  std::printf("\n");
  std::printf("layers      %u\n", s.n_layer);
  std::printf("embedding   %u\n", s.n_embd);
  std::printf("heads       %u query, %u key/value, head dim %u\n", s.n_head, s.n_head_kv,
              s.head_dim_k);
  std::printf("context     %u (training)\n", s.n_ctx_train);
  std::printf("rope        theta %g, %u dims, %.*s layout, scaling %.*s\n", s.rope_theta, s.n_rot,
              static_cast<int>(RopeName(s.arch->rope).size()), RopeName(s.arch->rope).data(),
              static_cast<int>(ScalingName(s.rope_scaling).size()),
              ScalingName(s.rope_scaling).data());
  std::printf("rms eps     %g\n", s.rms_eps);
  std::printf("vocab       %u%s\n", s.n_vocab, s.tied_embeddings ? " (output tied to embedding)" : "");
  if (s.is_moe()) {
    std::printf("routing     softmax, top-%u, %s\n", s.n_expert_used,
                s.renormalize_topk ? "renormalised" : "not renormalised");
  }
}

void PrintTensors(const GgufFile& file) {
  size_t width = 4;
  size_t type_width = 7;
  for (const GgufTensorInfo& t : file.tensors()) {
    width = std::max(width, t.name.size());
    type_width = std::max(type_width, moert::format::GgmlTypeName(t.type).size());
  }
  std::printf("\ntensors\n  %-*s  %-*s  %-18s  %12s\n", static_cast<int>(width), "name",
              static_cast<int>(type_width), "type", "shape", "bytes");
  for (const GgufTensorInfo& t : file.tensors()) {
    std::string_view type = moert::format::GgmlTypeName(t.type);
    std::printf("  %-*.*s  %-*.*s  %-18s  %12llu\n", static_cast<int>(width),
                static_cast<int>(t.name.size()), t.name.data(), static_cast<int>(type_width),
                static_cast<int>(type.size()), type.data(), Shape(t.dims).c_str(),
                static_cast<unsigned long long>(t.n_bytes));
  }
}

// Routed experts per layer: count, types, bytes of one expert and of the layer.
uint64_t PrintExperts(const GgufFile& file, const ModelSpec& spec) {
  uint64_t total = 0;
  if (!spec.is_moe()) return 0;
  struct Row {
    std::string types;
    uint64_t bytes = 0;
  };
  std::vector<Row> rows;
  size_t types_width = 20;
  for (int il = 0; il < static_cast<int>(spec.n_layer); ++il) {
    const TensorKind kinds[] = {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps,
                                TensorKind::kFfnDownExps};
    Row row;
    std::vector<std::string> types;
    for (TensorKind kind : kinds) {
      const GgufTensorInfo* t = file.FindTensor(moert::format::TensorWeightName(kind, il));
      if (t == nullptr) continue;  // ReadModelSpec already required them
      row.bytes += t->n_bytes;
      types.emplace_back(moert::format::GgmlTypeName(t->type));
    }
    row.types = StrJoin(types, "/");
    types_width = std::max(types_width, row.types.size());
    total += row.bytes;
    rows.push_back(std::move(row));
  }
  std::printf("\nexperts per layer\n  %-5s  %-7s  %-*s  %14s  %14s\n", "layer", "experts",
              static_cast<int>(types_width), "gate/up/down types", "bytes/expert", "layer bytes");
  for (size_t il = 0; il < rows.size(); ++il) {
    std::printf("  %-5zu  %-7u  %-*s  %14llu  %14llu\n", il, spec.n_expert,
                static_cast<int>(types_width), rows[il].types.c_str(),
                static_cast<unsigned long long>(rows[il].bytes / spec.n_expert),
                static_cast<unsigned long long>(rows[il].bytes));
  }
  return total;
}

void PrintUsage() {
  std::printf(
      "usage: moert-inspect FILE\n"
      "Prints a GGUF model's architecture, hyperparameters, tokenizer, tensors and\n"
      "its routed experts per layer. Exit code 1 on a file moert cannot use.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      PrintUsage();
      return 0;
    }
    if (arg == "--version") {
      std::printf("moert-inspect %s\n", moert_version());
      return 0;
    }
    if (arg.size() > 1 && arg[0] == '-') return Fail(StrCat("unknown option '", arg, "'"));
    files.emplace_back(arg);
  }
  if (files.size() != 1) {
    PrintUsage();
    return Fail("expected exactly one FILE");
  }
  auto file_or = GgufFile::Open(files[0]);
  if (!file_or.ok()) return Fail(file_or.status());
  const GgufFile& file = **file_or;

  // A vocabulary-only file (no tensors) is still worth describing.
  ModelSpec spec;
  bool has_model = !file.tensors().empty();
  if (has_model) {
    auto spec_or = moert::format::ReadModelSpec(file);
    if (!spec_or.ok()) return Fail(spec_or.status());
    spec = *spec_or;
  }

  uint64_t tensor_bytes = 0;
  for (const GgufTensorInfo& t : file.tensors()) tensor_bytes += t.n_bytes;
  std::printf("file        %s\n", files[0].c_str());
  std::printf("gguf        v%u, %llu bytes (%s), alignment %llu, %zu metadata keys, %zu tensors\n",
              file.version(), static_cast<unsigned long long>(file.bytes().size()),
              Mib(file.bytes().size()).c_str(),
              static_cast<unsigned long long>(file.alignment()), file.metadata().size(),
              file.tensors().size());
  if (auto name = file.GetString("general.name"); name.ok()) {
    std::printf("name        %.*s\n", static_cast<int>(name->size()), name->data());
  }
  if (has_model) {
    PrintSpec(spec);
  } else if (auto arch = file.GetString("general.architecture"); arch.ok()) {
    std::printf("arch        %.*s (vocabulary only: no tensors)\n", static_cast<int>(arch->size()),
                arch->data());
  }
  PrintTokenizer(file);
  PrintPacking(file);
  if (!has_model) return 0;

  PrintTensors(file);
  uint64_t expert_bytes = PrintExperts(file, spec);
  std::printf("\ntotal       %zu tensors, %s", file.tensors().size(), Mib(tensor_bytes).c_str());
  if (expert_bytes > 0) {
    std::printf("; routed experts %s (%.1f%%), always resident %s",
                Mib(expert_bytes).c_str(),
                100.0 * static_cast<double>(expert_bytes) / static_cast<double>(tensor_bytes),
                Mib(tensor_bytes - expert_bytes).c_str());
  }
  std::printf("\n");
  return 0;
}
