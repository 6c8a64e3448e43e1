// moert-pack IN.gguf OUT.gguf: rewrites a MoE model with its routed-expert tensors
// already in the kernels' runtime layouts (backend/packing.h; docs/formats.md,
// "Packed GGUF files"), so that loading them is a copy, and with every expert's
// checksum (moert.expert_xxh64), so that even the first load of one is verified. With
// --sparsity 2:4 the experts are pruned to W4S24, by magnitude or, given a calibration
// text, by |w| * RMS of the activations each input column sees; with a text it also
// prints the perplexity on that text before and after. With --dense-fallback (and a
// calibration text) it also writes each MoE layer's dense fallback FFN, the routing-
// frequency-weighted mean of its experts (dense_fallback.h), and prints its perplexity.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/packing.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/checksum.h"
#include "experts/expert_directory.h"
#include "format/arch.h"
#include "format/dequant.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/model_spec.h"
#include "kernels/ukernel.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "dense_fallback.h"
#include "modality_calib.h"
#include "router/modality_bias.h"
#include "router/router.h"
#include "tokenizer/tokenizer.h"

namespace {

using moert::StrCat;
using moert::backend::WeightFormat;
using moert::format::GgmlType;
using moert::format::GgufFile;
using moert::format::GgufTensorInfo;
using moert::format::GgufValueType;
using moert::format::ModelSpec;
using moert::format::TensorKind;

constexpr char kUsage[] =
    "usage: moert-pack IN.gguf OUT.gguf [--sparsity 2:4] [--calib TEXT] [options]\n"
    "\n"
    "Writes OUT.gguf: IN.gguf with every routed-expert tensor (blk.N.ffn_{gate,up,down}_exps)\n"
    "repacked into the runtime layout of its type (Q4_0 -> moert_w4, Q4_1/Q4_K ->\n"
    "moert_w4m, others -> moert_w8), each expert on its own, in 8-row tiles. A tensor\n"
    "whose rows are not a multiple of 8 or columns not a multiple of 32 is copied as is,\n"
    "and so is every other tensor and all metadata; moert.pack.* keys are added, and\n"
    "moert.expert_xxh64: each expert's checksum, which the runtime verifies from the\n"
    "first load on.\n"
    "\n"
    "  --sparsity 2:4|none    2:4: prune the experts to moert_w4s24, keeping 2 of every\n"
    "                         4 weights of a row (default: none)\n"
    "  --sparse-attn          with --sparsity 2:4, also prune each layer's attention\n"
    "                         projections (attn_q, attn_k, attn_v, attn_output) to\n"
    "                         moert_w4s24, by magnitude: a decoded token then reads\n"
    "                         2:4 weights for those too\n"
    "  --calib TEXT           calibration text: prune by |w| * RMS of the activations each\n"
    "                         input column sees on TEXT (a forward pass of IN over it), and\n"
    "                         print the perplexity on TEXT before and after packing\n"
    "  --dense-fallback       also write per MoE layer one dense FFN, the mean of its\n"
    "                         experts weighted by how much routing weight each got on\n"
    "                         CALIB (blk.N.ffn_{gate,up,down}_dense_fallback: Q4_0 for\n"
    "                         4-bit experts, else Q8_0), which the runtime can run instead\n"
    "                         of the experts (Model::SetDenseFallback); needs --calib,\n"
    "                         prints its perplexity (`PPL dense fallback = ...`)\n"
    "  --eval TEXT            score the perplexity on this text instead of the\n"
    "                         calibration text (held-out text: an honest comparison)\n"
    "  --prune-by magnitude|activations\n"
    "                         what pruning ranks by (default: activations with --calib,\n"
    "                         else magnitude)\n"
    "  -c, --ctx-size N       tokens per perplexity chunk (default: 128); each text\n"
    "                         needs at least 2 * N tokens\n"
    "  --chunks N             use only the first N chunks of each text\n"
    "  -t, --threads N        compute threads (default: 1; 0: one per core)\n"
    "  --modality-bias        route CALIB's text and the --calib-image images through IN\n"
    "                         and store the modality bias (moert.modality_bias: per layer\n"
    "                         and expert, ln of how much more often image tokens than text\n"
    "                         tokens chose it) in OUT; needs --calib, --mmproj and\n"
    "                         --calib-image. Without --sparsity or --eval, no perplexity\n"
    "  --mmproj FILE          the vision projector of IN (llama.cpp's clip GGUF)\n"
    "  --calib-image FILE     a calibration image (PNG or JPEG); repeatable\n"
    "  --bias-clip B          |bias| at most B (default: 4)\n"
    "  -h, --help             show this help\n"
    "\n"
    "Results go to stdout: one line per perplexity, `PPL before = X +/- E` and\n"
    "`PPL after = X +/- E (+P%)`, `PPL dense fallback = X +/- E (+P%)`; progress to\n"
    "stderr.\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-pack: error: %s\n", message.c_str());
  return 1;
}

int Fail(const absl::Status& status) { return Fail(std::string(status.message())); }

bool ParseCount(const char* text, int* out) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value > (1L << 30)) return false;
  *out = static_cast<int>(value);
  return true;
}

enum class PruneBy { kDefault, kMagnitude, kActivations };

struct Options {
  std::string in;
  std::string out;
  bool sparse = false;
  bool sparse_attn = false;  // --sparse-attn
  bool dense_fallback = false;  // --dense-fallback
  std::string calib;
  std::string eval;
  PruneBy prune_by = PruneBy::kDefault;
  int n_ctx = 128;
  int max_chunks = 0;
  int threads = 1;
  // --modality-bias: from routing over CALIB (text) and these images.
  bool modality_bias = false;
  std::string mmproj;
  std::vector<std::string> calib_images;
  float bias_clip = 4.0f;
};

constexpr TensorKind kExpertKinds[] = {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps,
                                       TensorKind::kFfnDownExps};
// What --sparse-attn prunes as well.
constexpr TensorKind kAttentionKinds[] = {TensorKind::kAttnQ, TensorKind::kAttnK,
                                          TensorKind::kAttnV, TensorKind::kAttnOut};

// Loads a tensor of `rows` x `cols` values as fp32.
absl::Status LoadFloat(const GgufFile& file, const std::string& name, int64_t rows, int64_t cols,
                       moert::model::Matrix* out) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr)
    return absl::InvalidArgumentError(StrCat(file.name(), ": no tensor '", name, "'"));
  if (t->n_elements != static_cast<uint64_t>(rows * cols)) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": tensor '", name, "' has ",
                                             t->n_elements, " values, expected ", rows * cols));
  }
  out->rows = rows;
  out->cols = cols;
  out->data.resize(static_cast<size_t>(rows * cols));
  absl::Status status = moert::format::Dequantize(t->type, file.TensorData(*t), out->data);
  if (!status.ok()) {
    return absl::Status(status.code(), StrCat(file.name(), ": tensor '", name,
                                              "': ", std::string(status.message())));
  }
  return absl::OkStatus();
}

// What the routed experts of each layer see on the calibration text: per expert, the
// sum of squares of each column of its input (what gate and up multiply) and of its
// hidden state silu(gate x) * up x (what down multiplies). The model reports each
// layer's FFN input (ModelLoadOptions::ffn_input_observer); routing and the hidden
// states are recomputed here from IN's router and expert weights, as the reference
// MoE FFN computes them.
class Calibration {
 public:
  static absl::StatusOr<std::unique_ptr<Calibration>> Create(const GgufFile& file,
                                                             const ModelSpec& spec, int threads) {
    std::unique_ptr<Calibration> c(new Calibration(spec, threads));
    const int64_t n_embd = spec.n_embd, n_ff = spec.n_ff_expert, n_expert = spec.n_expert;
    c->layers_.resize(spec.n_layer);
    for (int il = 0; il < static_cast<int>(spec.n_layer); ++il) {
      Layer& l = c->layers_[static_cast<size_t>(il)];
      using moert::format::TensorWeightName;
      MOERT_RETURN_IF_ERROR(LoadFloat(file, TensorWeightName(TensorKind::kFfnGateInp, il), n_expert,
                                      n_embd, &l.router));
      MOERT_RETURN_IF_ERROR(LoadFloat(file, TensorWeightName(TensorKind::kFfnGateExps, il),
                                      n_expert * n_ff, n_embd, &l.gate));
      MOERT_RETURN_IF_ERROR(LoadFloat(file, TensorWeightName(TensorKind::kFfnUpExps, il),
                                      n_expert * n_ff, n_embd, &l.up));
      l.x_sq.assign(static_cast<size_t>(n_expert * n_embd), 0.0);
      l.h_sq.assign(static_cast<size_t>(n_expert * n_ff), 0.0);
      l.x_sq_all.assign(static_cast<size_t>(n_embd), 0.0);
      l.count.assign(static_cast<size_t>(n_expert), 0);
    }
    return c;
  }

  void Observe(int layer, int64_t n, const float* x) {
    Layer& l = layers_[static_cast<size_t>(layer)];
    const int64_t n_embd = spec_.n_embd, n_ff = spec_.n_ff_expert;
    const int n_expert = static_cast<int>(spec_.n_expert),
              k = static_cast<int>(spec_.n_expert_used);
    std::vector<float> logits(static_cast<size_t>(n * n_expert));
    moert::model::MatMul(pool_, l.router, x, n, logits.data());
    std::vector<std::vector<int64_t>> tokens_of(static_cast<size_t>(n_expert));
    std::vector<int> chosen(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    for (int64_t t = 0; t < n; ++t) {
      moert::model::RouteToken(logits.data() + t * n_expert, n_expert, k, spec_.renormalize_topk,
                               chosen.data(), weights.data());
      for (int e : chosen) tokens_of[static_cast<size_t>(e)].push_back(t);
      for (int64_t i = 0; i < n_embd; ++i) {
        l.x_sq_all[static_cast<size_t>(i)] +=
            static_cast<double>(x[t * n_embd + i]) * x[t * n_embd + i];
      }
    }
    l.count_all += n;
    for (int e = 0; e < n_expert; ++e) {
      const std::vector<int64_t>& rows = tokens_of[static_cast<size_t>(e)];
      const int64_t m = static_cast<int64_t>(rows.size());
      if (m == 0) continue;
      std::vector<float> xs(static_cast<size_t>(m * n_embd));
      for (int64_t r = 0; r < m; ++r) {
        std::copy(x + rows[static_cast<size_t>(r)] * n_embd,
                  x + (rows[static_cast<size_t>(r)] + 1) * n_embd, xs.begin() + r * n_embd);
      }
      std::vector<float> g(static_cast<size_t>(m * n_ff)), u(g.size());
      const moert::model::MatrixView gate(l.gate.data.data() + e * n_ff * n_embd, n_ff, n_embd);
      const moert::model::MatrixView up(l.up.data.data() + e * n_ff * n_embd, n_ff, n_embd);
      moert::model::MatMul(pool_, gate, xs.data(), m, g.data());
      moert::model::MatMul(pool_, up, xs.data(), m, u.data());
      double* xsq = l.x_sq.data() + e * n_embd;
      double* hsq = l.h_sq.data() + e * n_ff;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t i = 0; i < n_embd; ++i) {
          const double v = xs[static_cast<size_t>(r * n_embd + i)];
          xsq[i] += v * v;
        }
        for (int64_t i = 0; i < n_ff; ++i) {
          const size_t j = static_cast<size_t>(r * n_ff + i);
          const double h = static_cast<double>(moert::model::Silu(g[j]) * u[j]);
          hsq[i] += h * h;
        }
      }
      l.count[static_cast<size_t>(e)] += m;
    }
  }

  // Importance of the input columns of `kind` of expert `e` of `layer`: the RMS of the
  // activations each column saw. An expert no calibration token reached falls back to
  // the RMS of the whole layer's FFN input (gate, up) or to magnitude (down: empty).
  std::vector<float> Importance(TensorKind kind, int layer, int e) const {
    const Layer& l = layers_[static_cast<size_t>(layer)];
    const int64_t count = l.count[static_cast<size_t>(e)];
    const bool down = kind == TensorKind::kFfnDownExps;
    const int64_t width = down ? spec_.n_ff_expert : spec_.n_embd;
    if (count == 0 && down) return {};
    const double* sums = count == 0 ? l.x_sq_all.data()
                         : down     ? l.h_sq.data() + e * width
                                    : l.x_sq.data() + e * width;
    const double n = static_cast<double>(count == 0 ? std::max<int64_t>(l.count_all, 1) : count);
    std::vector<float> out(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i)
      out[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(sums[i] / n));
    return out;
  }

  // Experts (over all layers) that no calibration token reached.
  int UnseenExperts() const {
    int unseen = 0;
    for (const Layer& l : layers_) {
      for (int64_t c : l.count) unseen += c == 0 ? 1 : 0;
    }
    return unseen;
  }

 private:
  struct Layer {
    moert::model::Matrix router, gate, up;
    std::vector<double> x_sq, h_sq, x_sq_all;
    std::vector<int64_t> count;
    int64_t count_all = 0;
  };

  Calibration(const ModelSpec& spec, int threads) : spec_(spec), pool_(threads) {}

  ModelSpec spec_;
  moert::model::ThreadPool pool_;
  std::vector<Layer> layers_;
};

// One tensor of the output: packed (a routed-expert tensor of whole tiles, or with
// --sparse-attn an attention projection: one "expert") or copied.
struct Plan {
  const GgufTensorInfo* tensor = nullptr;
  bool expert = false;  // a routed-expert tensor
  bool pack = false;
  WeightFormat format = WeightFormat::kW8;
  TensorKind kind = TensorKind::kFfnGateExps;
  int layer = 0;
  int64_t rows = 0;  // per expert
  int64_t cols = 0;
  int64_t n_expert = 0;
};

// Whether `t` is whole 8 x 32 tiles of a type PackRows reads; if not, a note says why.
bool Packable(const GgufTensorInfo& t, int64_t rows, int64_t cols,
              std::vector<std::string>* notes) {
  if (!moert::backend::CanPack(t.type)) {
    notes->push_back(StrCat(t.name, ": type ", moert::format::GgmlTypeName(t.type),
                            " cannot be packed, copied"));
    return false;
  }
  if (rows % 8 != 0 || cols % 32 != 0) {
    notes->push_back(StrCat(t.name, ": ", rows, " rows x ", cols,
                            " columns is not whole 8 x 32 tiles, copied"));
    return false;
  }
  return true;
}

std::vector<Plan> MakePlans(const GgufFile& file, const ModelSpec& spec, bool sparse,
                            bool sparse_attn, std::vector<std::string>* notes) {
  std::vector<Plan> plans;
  for (const GgufTensorInfo& t : file.tensors()) {
    Plan p;
    p.tensor = &t;
    for (int il = 0; il < static_cast<int>(spec.n_layer) && sparse && sparse_attn; ++il) {
      for (TensorKind kind : kAttentionKinds) {
        if (t.name != moert::format::TensorWeightName(kind, il) || t.dims.size() != 2) continue;
        p.kind = kind;
        p.layer = il;
        p.cols = static_cast<int64_t>(t.dims[0]);
        p.rows = static_cast<int64_t>(t.dims[1]);
        p.n_expert = 1;
        p.pack = Packable(t, p.rows, p.cols, notes);
        p.format = WeightFormat::kW4S24;
      }
    }
    for (int il = 0; il < static_cast<int>(spec.n_layer) && !p.expert; ++il) {
      for (TensorKind kind : kExpertKinds) {
        if (t.name != moert::format::TensorWeightName(kind, il)) continue;
        p.expert = true;
        if (t.dims.size() != 3) {
          notes->push_back(StrCat(t.name, ": not a stack of matrices, copied"));
          break;
        }
        p.kind = kind;
        p.layer = il;
        p.cols = static_cast<int64_t>(t.dims[0]);
        p.rows = static_cast<int64_t>(t.dims[1]);
        p.n_expert = static_cast<int64_t>(t.dims[2]);
        if (Packable(t, p.rows, p.cols, notes)) {
          p.pack = true;
          p.format = sparse ? WeightFormat::kW4S24 : moert::backend::NaturalFormat(t.type);
        }
        break;
      }
    }
    plans.push_back(p);
  }
  return plans;
}

// Packs one expert of a planned tensor (e = 0 for an attention projection) into `dst`.
// Calibration ranks the experts' weights; attention projections are pruned by magnitude.
absl::Status PackExpert(const GgufFile& file, const Plan& p, int64_t e,
                        const Calibration* calibration, std::vector<uint8_t>* dst) {
  const uint64_t row_bytes =
      *moert::format::GgmlRowBytes(p.tensor->type, static_cast<uint64_t>(p.cols));
  const uint64_t expert_bytes = row_bytes * static_cast<uint64_t>(p.rows);
  const std::span<const uint8_t> src =
      file.TensorData(*p.tensor).subspan(static_cast<size_t>(expert_bytes) * static_cast<size_t>(e),
                                         static_cast<size_t>(expert_bytes));
  dst->resize(moert::backend::PackedBytes(p.format, p.rows, p.cols));
  if (p.format != WeightFormat::kW4S24 || calibration == nullptr || !p.expert) {
    return moert::backend::PackRows(p.tensor->type, src, p.rows, p.cols, p.format, *dst);
  }
  std::vector<uint8_t> w4(moert::backend::PackedBytes(WeightFormat::kW4, p.rows, p.cols));
  MOERT_RETURN_IF_ERROR(
      moert::backend::PackRows(p.tensor->type, src, p.rows, p.cols, WeightFormat::kW4, w4));
  const std::vector<float> importance =
      calibration->Importance(p.kind, p.layer, static_cast<int>(e));
  return moert::backend::PruneW4ToW4S24(w4, p.rows, p.cols, importance, *dst);
}

// The moert.expert_xxh64 values (experts/expert_directory.h): per layer and expert,
// layer-major, experts::ExpertChecksum of the expert's gate, up and down bytes exactly
// as OUT will hold them (packed by PackExpert, or the expert's slice of a tensor that
// is copied); 0 for a layer without routed experts. The metadata precedes the tensor
// data, so this is a pass of its own that packs every expert once more than the write
// does, holding one expert at a time. Nullopt, with a note, when a layer's expert
// tensors are not what ExpertDirectory reads (one of the three missing, or a tensor
// that is not n_expert equal slices): the runtime refuses such a file anyway.
absl::StatusOr<std::optional<std::vector<uint64_t>>> ExpertChecksums(
    const GgufFile& file, const ModelSpec& spec, const std::vector<Plan>& plans,
    const Calibration* calibration, std::vector<std::string>* notes) {
  std::unordered_map<std::string_view, const Plan*> plan_of;
  for (const Plan& p : plans) plan_of.emplace(p.tensor->name, &p);
  const int n_layer = static_cast<int>(spec.n_layer);
  const uint64_t n_expert = spec.n_expert;
  std::vector<uint64_t> checksums(static_cast<size_t>(n_layer) * n_expert, 0);
  std::vector<uint8_t> packed[3];
  for (int il = 0; il < n_layer; ++il) {
    const Plan* parts[3];
    int present = 0;
    for (int k = 0; k < 3; ++k) {
      const auto it = plan_of.find(moert::format::TensorWeightName(kExpertKinds[k], il));
      parts[k] = it == plan_of.end() ? nullptr : it->second;
      present += parts[k] != nullptr ? 1 : 0;
    }
    if (present == 0) continue;  // a dense layer
    for (int k = 0; k < 3; ++k) {
      const Plan* p = parts[k];
      const char* why = nullptr;
      if (p == nullptr) {
        why = "a routed-expert tensor of this layer is missing";
      } else if (p->pack ? p->n_expert != static_cast<int64_t>(n_expert)
                         : p->tensor->n_bytes % n_expert != 0) {
        why = "it is not one slice per expert";
      }
      if (why != nullptr) {
        notes->push_back(StrCat("no expert checksums (", moert::experts::kChecksumKey, "): layer ",
                                il, ", ", moert::format::TensorWeightName(kExpertKinds[k], il),
                                ": ", why));
        return std::nullopt;
      }
    }
    for (uint64_t e = 0; e < n_expert; ++e) {
      std::span<const uint8_t> bytes[3];
      for (int k = 0; k < 3; ++k) {
        const Plan& p = *parts[k];
        if (!p.pack) {
          const uint64_t each = p.tensor->n_bytes / n_expert;
          bytes[k] = file.TensorData(*p.tensor).subspan(static_cast<size_t>(e * each),
                                                        static_cast<size_t>(each));
          continue;
        }
        absl::Status status = PackExpert(file, p, static_cast<int64_t>(e), calibration, &packed[k]);
        if (!status.ok()) {
          return absl::Status(status.code(), StrCat(p.tensor->name, ", expert ", e, ": ",
                                                    std::string(status.message())));
        }
        bytes[k] = packed[k];
      }
      checksums[static_cast<size_t>(il) * n_expert + e] =
          moert::experts::ExpertChecksum(bytes[0], bytes[1], bytes[2]);
    }
  }
  return checksums;
}

absl::Status WritePacked(const GgufFile& file, const ModelSpec& spec,
                         const std::vector<Plan>& plans, const Options& options,
                         const Calibration* calibration,
                         const std::vector<float>* modality_bias,
                         const moert::tools::RoutingFrequencies* frequencies,
                         const std::vector<moert::tools::FallbackTensor>* fallback,
                         const std::string& path, std::vector<std::string>* notes) {
  moert::format::GgufWriter writer;
  // IN's own checksums (if any) are of IN's bytes: OUT gets its own below; a new
  // modality bias replaces IN's.
  writer.CopyMetadata(file, [&](std::string_view key) {
    return key == moert::experts::kChecksumKey ||
           (modality_bias != nullptr && (key == moert::router::kModalityBiasKey ||
                                         key == moert::router::kLegacyModalityBiasKey)) ||
           (frequencies != nullptr && (key == moert::tools::kDenseFallbackFrequencyKey ||
                                       key == moert::tools::kDenseFallbackCalibrationKey));
  });
  if (frequencies != nullptr) {
    writer.SetFloat32Array(moert::tools::kDenseFallbackFrequencyKey, frequencies->All());
    writer.SetString(moert::tools::kDenseFallbackCalibrationKey,
                     std::filesystem::path(options.calib).filename().string());
  }
  if (modality_bias != nullptr) {
    writer.SetFloat32Array(moert::router::kModalityBiasKey, *modality_bias);
  }
  writer.SetUint32("moert.pack.version", 1);
  writer.SetString("moert.pack.sparsity", options.sparse ? "2:4" : "none");
  writer.SetString("moert.pack.sparse_tensors",
                   !options.sparse ? "" : options.sparse_attn ? "experts,attention" : "experts");
  writer.SetUint32("moert.pack.tile_rows", MOERT_NR);
  writer.SetString("moert.pack.calibration",
                   calibration != nullptr ? std::filesystem::path(options.calib).filename().string()
                                          : std::string());
  MOERT_ASSIGN_OR_RETURN(std::optional<std::vector<uint64_t>> checksums,
                         ExpertChecksums(file, spec, plans, calibration, notes));
  if (checksums) {
    std::vector<uint8_t> raw(checksums->size() * 8);
    for (size_t i = 0; i < checksums->size(); ++i) {
      for (size_t b = 0; b < 8; ++b)
        raw[i * 8 + b] = static_cast<uint8_t>((*checksums)[i] >> (8 * b));
    }
    writer.SetArray(moert::experts::kChecksumKey, GgufValueType::kUint64, checksums->size(), raw);
  }
  for (const Plan& p : plans) {
    const GgmlType type = p.pack ? moert::backend::PackedTypeOf(p.format) : p.tensor->type;
    MOERT_RETURN_IF_ERROR(writer.DeclareTensor(p.tensor->name, type, p.tensor->dims));
  }
  if (fallback != nullptr) {
    for (const moert::tools::FallbackTensor& t : *fallback) {
      MOERT_RETURN_IF_ERROR(writer.DeclareTensor(t.name, t.type, t.dims));
    }
  }
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<moert::format::GgufTensorStream> stream,
                         writer.OpenStream(path));
  std::vector<uint8_t> packed;
  for (const Plan& p : plans) {
    if (!p.pack) {
      MOERT_RETURN_IF_ERROR(stream->Write(file.TensorData(*p.tensor)));
      continue;
    }
    for (int64_t e = 0; e < p.n_expert; ++e) {
      absl::Status status = PackExpert(file, p, e, calibration, &packed);
      if (!status.ok()) {
        return absl::Status(status.code(), StrCat(p.tensor->name, ", expert ", e, ": ",
                                                  std::string(status.message())));
      }
      MOERT_RETURN_IF_ERROR(stream->Write(packed));
    }
  }
  if (fallback != nullptr) {
    for (const moert::tools::FallbackTensor& t : *fallback) {
      MOERT_RETURN_IF_ERROR(stream->Write(t.bytes));
    }
  }
  return stream->Finish();
}

// `packed` with every moert tensor turned back into the GGUF type it reads back into
// without loss (backend::UnpackToGgml) and the moert.pack keys dropped: the same
// values in a file any loader reads.
absl::Status WriteUnpacked(const GgufFile& packed, const std::string& path) {
  moert::format::GgufWriter writer;
  // The expert checksums are of the packed bytes: they do not hold for these.
  writer.CopyMetadata(packed, [](std::string_view key) {
    return key.substr(0, 11) == "moert.pack." || key == moert::experts::kChecksumKey;
  });
  for (const GgufTensorInfo& t : packed.tensors()) {
    const std::optional<WeightFormat> format = moert::backend::PackedFormatOf(t.type);
    MOERT_RETURN_IF_ERROR(writer.DeclareTensor(
        t.name, format ? moert::backend::LosslessGgmlType(*format) : t.type, t.dims));
  }
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<moert::format::GgufTensorStream> stream,
                         writer.OpenStream(path));
  std::vector<uint8_t> bytes;
  for (const GgufTensorInfo& t : packed.tensors()) {
    const std::optional<WeightFormat> format = moert::backend::PackedFormatOf(t.type);
    if (!format) {
      MOERT_RETURN_IF_ERROR(stream->Write(packed.TensorData(t)));
      continue;
    }
    const int64_t cols = static_cast<int64_t>(t.dims[0]);
    const int64_t rows = static_cast<int64_t>(t.n_elements) / cols;  // whole tiles per matrix
    bytes.resize(
        *moert::format::GgmlRowBytes(moert::backend::LosslessGgmlType(*format), t.n_elements));
    MOERT_RETURN_IF_ERROR(
        moert::backend::UnpackToGgml(*format, packed.TensorData(t), rows, cols, bytes));
    MOERT_RETURN_IF_ERROR(stream->Write(bytes));
  }
  return stream->Finish();
}

void PrintProgress(const moert::model::PerplexityProgress& p) {
  std::fprintf(stderr, "[%d/%d]%.4f%s", p.chunk, p.n_chunks, p.ppl,
               p.chunk == p.n_chunks ? "\n" : ",");
  std::fflush(stderr);
}

// Perplexity of `file`'s model over `tokens` on the fp32 reference path (so that the
// difference before/after is the packing's alone), calling `observer` with every
// layer's FFN input when given; with `dense_fallback`, of its dense fallback FFN.
absl::StatusOr<moert::model::PerplexityResult> Perplexity(
    const GgufFile& file, const std::vector<int32_t>& tokens, const Options& options, int32_t bos,
    std::function<void(int, int64_t, const float*)> observer, bool dense_fallback = false) {
  moert::model::ModelLoadOptions load;
  load.threads = options.threads;
  load.quantized_kernels = false;
  load.ffn_input_observer = std::move(observer);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<moert::model::Model> model,
                         moert::model::Model::Load(file, load));
  if (dense_fallback) MOERT_RETURN_IF_ERROR(model->SetDenseFallback(true));
  moert::model::PerplexityOptions ppl;
  ppl.n_ctx = options.n_ctx;
  ppl.n_batch = options.n_ctx;
  ppl.max_chunks = options.max_chunks;
  ppl.bos = bos;
  ppl.progress = PrintProgress;
  return moert::model::ComputePerplexity(*model, tokens, ppl);
}

void PrintPpl(const char* what, const moert::model::PerplexityResult& r, double before = 0) {
  std::printf("PPL %s = %.4f +/- %.5f", what, r.ppl, r.ppl_error);
  if (before > 0) std::printf(" (%+.2f%%)", 100.0 * (r.ppl / before - 1.0));
  std::printf("\n");
  std::fflush(stdout);
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot read '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

int Run(const Options& options) {
  auto file_or = GgufFile::Open(options.in);
  if (!file_or.ok()) return Fail(file_or.status());
  const GgufFile& file = **file_or;
  if (file.FindKey("moert.pack.version") != nullptr) {
    return Fail(StrCat("'", options.in, "' is already packed (it has moert.pack.version)"));
  }
  auto spec_or = moert::format::ReadModelSpec(file);
  if (!spec_or.ok()) return Fail(spec_or.status());
  const ModelSpec& spec = *spec_or;
  if (!spec.is_moe()) {
    return Fail(StrCat("'", options.in, "' is a dense model: it has no routed experts to pack"));
  }
  const bool by_activations = options.prune_by == PruneBy::kActivations ||
                              (options.prune_by == PruneBy::kDefault && !options.calib.empty());

  // The texts: CALIB calibrates (and is scored unless EVAL is given); EVAL is scored.
  std::vector<int32_t> tokens;  // the text scored
  int32_t bos = -1;
  std::unique_ptr<Calibration> calibration;
  std::optional<moert::model::PerplexityResult> before;
  std::optional<std::vector<float>> modality_bias;
  if (options.modality_bias) {
    auto tokenizer = moert::tokenizer::Tokenizer::FromGguf(file);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    auto text = ReadText(options.calib);
    if (!text.ok()) return Fail(text.status());
    moert::tools::ModalityCalibOptions calib;
    calib.text_tokens = tokenizer->Encode(*text, true, false);
    calib.n_ctx = options.n_ctx;
    calib.max_chunks = options.max_chunks;
    calib.mmproj = options.mmproj;
    calib.images = options.calib_images;
    calib.threads = options.threads;
    calib.clip = options.bias_clip;
    std::fprintf(stderr,
                 "moert-pack: routing %zu tokens of '%s' and %zu image(s) through %s for the "
                 "modality bias\n",
                 calib.text_tokens.size(), options.calib.c_str(), calib.images.size(),
                 options.in.c_str());
    auto result = moert::tools::ComputeModalityBias(file, calib);
    if (!result.ok()) return Fail(result.status());
    const int n_expert = static_cast<int>(spec.n_expert);
    std::printf("modality bias (%llu text and %llu image token-layers; images encoded in %.0f ms)\n",
                static_cast<unsigned long long>(result->text_token_layers),
                static_cast<unsigned long long>(result->image_token_layers), result->image_ms);
    int layer = 0;
    for (const std::vector<float>& row : moert::router::BiasRows(result->bias, n_expert)) {
      std::printf("  layer %d:", layer++);
      for (float b : row) std::printf(" %+.3f", b);
      std::printf("\n");
    }
    modality_bias = std::move(result->bias);
  }
  const bool score = !options.eval.empty() ||
                     (!options.calib.empty() &&
                      (!options.modality_bias || options.sparse || options.dense_fallback));
  std::optional<moert::tools::RoutingFrequencies> frequencies;
  if (score) {
    auto tokenizer = moert::tokenizer::Tokenizer::FromGguf(file);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    bos = tokenizer->vocab().add_bos() ? tokenizer->vocab().bos() : -1;
    auto tokenize = [&](const std::string& path) -> absl::StatusOr<std::vector<int32_t>> {
      MOERT_ASSIGN_OR_RETURN(std::string text, ReadText(path));
      std::vector<int32_t> ids = tokenizer->Encode(text, true, false);
      if (ids.size() < 2 * static_cast<size_t>(options.n_ctx)) {
        return absl::InvalidArgumentError(StrCat("'", path, "' has ", ids.size(), " tokens; -c ",
                                                 options.n_ctx, " needs at least ",
                                                 2 * int64_t{options.n_ctx}));
      }
      return ids;
    };
    if (options.sparse && by_activations) {
      auto calib_tokens = tokenize(options.calib);
      if (!calib_tokens.ok()) return Fail(calib_tokens.status());
      auto c = Calibration::Create(file, spec, options.threads);
      if (!c.ok()) return Fail(c.status());
      calibration = std::move(*c);
      std::fprintf(stderr,
                   "moert-pack: %zu tokens of '%s' through %s (collecting the experts' "
                   "activations)\n",
                   calib_tokens->size(), options.calib.c_str(), options.in.c_str());
      auto ppl = Perplexity(file, *calib_tokens, options, bos,
                            [&calibration](int layer, int64_t n, const float* x) {
                              calibration->Observe(layer, n, x);
                            });
      if (!ppl.ok()) return Fail(ppl.status());
      if (options.eval.empty()) {
        tokens = std::move(*calib_tokens);
        before = *ppl;
      }
      if (calibration->UnseenExperts() > 0) {
        std::fprintf(stderr,
                     "moert-pack: %d experts got no calibration token: their gate/up are pruned "
                     "by |w| * the layer's input RMS, their down by magnitude\n",
                     calibration->UnseenExperts());
      }
    }
    if (options.dense_fallback) {
      auto calib_tokens = tokenize(options.calib);
      if (!calib_tokens.ok()) return Fail(calib_tokens.status());
      std::fprintf(stderr,
                   "moert-pack: %zu tokens of '%s' through %s (counting the routing weight of "
                   "each expert)\n",
                   calib_tokens->size(), options.calib.c_str(), options.in.c_str());
      auto measured = moert::tools::MeasureRoutingFrequencies(
          file, *calib_tokens, options.n_ctx, options.max_chunks, bos, options.threads,
          PrintProgress);
      if (!measured.ok()) return Fail(measured.status());
      frequencies.emplace(measured->frequencies);
      std::fprintf(stderr, "moert-pack: share of the routing weight per expert:\n");
      for (int il = 0; il < frequencies->n_layer(); ++il) {
        std::fprintf(stderr, "  layer %d:", il);
        for (double f : frequencies->Of(il)) std::fprintf(stderr, " %.3f", f);
        std::fprintf(stderr, "\n");
      }
      if (!before && options.eval.empty()) {
        tokens = std::move(*calib_tokens);
        before = measured->perplexity;
      }
    }
    if (!before) {
      const std::string& path = options.eval.empty() ? options.calib : options.eval;
      auto scored = tokenize(path);
      if (!scored.ok()) return Fail(scored.status());
      tokens = std::move(*scored);
      std::fprintf(stderr, "moert-pack: %zu tokens of '%s', perplexity of %s\n", tokens.size(),
                   path.c_str(), options.in.c_str());
      auto ppl = Perplexity(file, tokens, options, bos, nullptr);
      if (!ppl.ok()) return Fail(ppl.status());
      before = *ppl;
    }
    PrintPpl("before", *before);
  }

  std::optional<std::vector<moert::tools::FallbackTensor>> fallback;
  if (frequencies) {
    auto tensors = moert::tools::DenseFallbackTensors(file, spec, *frequencies);
    if (!tensors.ok()) return Fail(tensors.status());
    fallback = std::move(*tensors);
  }
  std::vector<std::string> notes;
  std::vector<Plan> plans = MakePlans(file, spec, options.sparse, options.sparse_attn, &notes);
  if (fallback) {
    // IN's own fallback (if any) is replaced by the new one.
    std::erase_if(plans, [&](const Plan& p) {
      return std::any_of(
          fallback->begin(), fallback->end(),
          [&](const moert::tools::FallbackTensor& t) { return t.name == p.tensor->name; });
    });
  }
  for (const std::string& note : notes) std::fprintf(stderr, "moert-pack: %s\n", note.c_str());
  // Written beside OUT, then renamed: a failed run leaves no half-written OUT.
  const std::string partial = options.out + ".partial";
  std::vector<std::string> checksum_notes;
  absl::Status status =
      WritePacked(file, spec, plans, options, calibration.get(),
                  modality_bias ? &*modality_bias : nullptr, frequencies ? &*frequencies : nullptr,
                  fallback ? &*fallback : nullptr, partial, &checksum_notes);
  for (const std::string& note : checksum_notes) {
    std::fprintf(stderr, "moert-pack: %s\n", note.c_str());
  }
  if (!status.ok()) {
    std::remove(partial.c_str());
    return Fail(status);
  }
  std::error_code ec;
  std::filesystem::rename(partial, options.out, ec);
  if (ec) {
    std::remove(partial.c_str());
    return Fail(StrCat("cannot write '", options.out, "': ", ec.message()));
  }
  int packed = 0;
  int expert_tensors = 0;
  int attention_packed = 0;
  for (const Plan& p : plans) {
    packed += p.pack && p.expert ? 1 : 0;
    expert_tensors += p.expert ? 1 : 0;
    attention_packed += p.pack && !p.expert ? 1 : 0;
  }
  const std::string attention_note =
      options.sparse_attn
          ? StrCat(", ", attention_packed, " attention projections 2:4 sparse (by magnitude)")
          : "";
  const std::string fallback_note =
      fallback ? StrCat(", dense fallback FFN in ", fallback->size() / 3, " layers") : "";
  std::fprintf(stderr, "moert-pack: wrote %s: %d of %d routed-expert tensors packed (%s)%s%s%s\n",
               options.out.c_str(), packed, expert_tensors, options.sparse ? "2:4 sparse" : "dense",
               options.sparse
                   ? (calibration ? ", pruned by |w| * activation RMS" : ", pruned by magnitude")
                   : "",
               attention_note.c_str(), fallback_note.c_str());

  if (!before) return 0;
  // The perplexity after: from OUT itself when the model loader reads packed files,
  // else from a temporary copy with the packed experts read back into GGUF types
  // without loss (the same values).
  auto out_file = GgufFile::Open(options.out);
  if (!out_file.ok()) return Fail(out_file.status());
  const GgufFile* scored = out_file->get();
  std::unique_ptr<GgufFile> unpacked;
  auto after = Perplexity(*scored, tokens, options, bos, nullptr);
  if (!after.ok()) {
    std::fprintf(stderr,
                 "moert-pack: the model loader does not read %s (%s); measuring the same values "
                 "through a temporary GGUF with the packed experts as q4_0/q4_1/q8_0\n",
                 options.out.c_str(), std::string(after.status().message()).c_str());
    const std::string temp = options.out + ".unpacked.gguf";
    status = WriteUnpacked(**out_file, temp);
    if (status.ok()) {
      auto temp_file = GgufFile::Open(temp);
      if (temp_file.ok()) {
        unpacked = std::move(*temp_file);
        scored = unpacked.get();
        after = Perplexity(*scored, tokens, options, bos, nullptr);
      } else {
        status = temp_file.status();
      }
    }
    std::remove(temp.c_str());  // an open file stays readable until it is closed
    if (!status.ok()) return Fail(status);
    if (!after.ok()) return Fail(after.status());
  }
  PrintPpl("after", *after, before->ppl);
  if (!fallback) return 0;
  auto dense = Perplexity(*scored, tokens, options, bos, nullptr, /*dense_fallback=*/true);
  if (!dense.ok()) return Fail(dense.status());
  PrintPpl("dense fallback", *dense, before->ppl);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  std::vector<std::string> positional;
  std::string sparsity = "none";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto count = [&](int* out) {
      const char* v = value();
      if (v == nullptr) {
        Fail(StrCat(arg, " needs a number (see --help)"));
        return false;
      }
      if (!ParseCount(v, out)) {
        Fail(StrCat(arg, " needs a number, got '", v, "'"));
        return false;
      }
      return true;
    };
    if (arg == "--sparsity") {
      const char* v = value();
      if (v == nullptr) return Fail("--sparsity needs 2:4 or none (see --help)");
      sparsity = v;
    } else if (arg == "--sparse-attn") {
      options.sparse_attn = true;
    } else if (arg == "--dense-fallback") {
      options.dense_fallback = true;
    } else if (arg == "--calib") {
      const char* v = value();
      if (v == nullptr) return Fail("--calib needs a TEXT file (see --help)");
      options.calib = v;
    } else if (arg == "--eval") {
      const char* v = value();
      if (v == nullptr) return Fail("--eval needs a TEXT file (see --help)");
      options.eval = v;
    } else if (arg == "--prune-by") {
      const char* v = value();
      const std::string_view by = v == nullptr ? "" : v;
      if (by == "magnitude") {
        options.prune_by = PruneBy::kMagnitude;
      } else if (by == "activations") {
        options.prune_by = PruneBy::kActivations;
      } else {
        return Fail(StrCat("--prune-by needs magnitude or activations, got '", by, "'"));
      }
    } else if (arg == "-c" || arg == "--ctx-size") {
      if (!count(&options.n_ctx)) return 1;
    } else if (arg == "--chunks") {
      if (!count(&options.max_chunks)) return 1;
    } else if (arg == "--modality-bias") {
      options.modality_bias = true;
    } else if (arg == "--mmproj") {
      const char* v = value();
      if (v == nullptr) return Fail("--mmproj needs a FILE (see --help)");
      options.mmproj = v;
    } else if (arg == "--calib-image") {
      const char* v = value();
      if (v == nullptr) return Fail("--calib-image needs a FILE (see --help)");
      options.calib_images.emplace_back(v);
    } else if (arg == "--bias-clip") {
      const char* v = value();
      char* end = nullptr;
      const float clip = v != nullptr ? std::strtof(v, &end) : 0.0f;
      if (v == nullptr || end == v || *end != '\0' || !(clip > 0) || !std::isfinite(clip)) {
        return Fail("--bias-clip needs a number > 0 (see --help)");
      }
      options.bias_clip = clip;
    } else if (arg == "-t" || arg == "--threads") {
      if (!count(&options.threads)) return 1;
    } else if (arg.size() > 1 && arg[0] == '-') {
      return Fail(StrCat("unknown argument '", arg, "' (see --help)"));
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.size() != 2) {
    return Fail(StrCat("expected IN.gguf and OUT.gguf, got ", positional.size(), " file name",
                       positional.size() == 1 ? "" : "s", " (see --help)"));
  }
  options.in = positional[0];
  options.out = positional[1];
  if (sparsity == "2:4") {
    options.sparse = true;
  } else if (sparsity != "none") {
    return Fail(StrCat("--sparsity '", sparsity, "' is not supported (2:4 or none)"));
  }
  if (options.sparse_attn && !options.sparse) {
    return Fail("--sparse-attn needs --sparsity 2:4");
  }
  if (options.prune_by == PruneBy::kActivations && options.calib.empty()) {
    return Fail("--prune-by activations needs a calibration text (--calib TEXT)");
  }
  if (options.dense_fallback && options.calib.empty()) {
    return Fail("--dense-fallback needs a calibration text (--calib TEXT)");
  }
  if (options.n_ctx < 3) return Fail(StrCat("-c needs at least 3 tokens, got ", options.n_ctx));
  if (options.modality_bias &&
      (options.calib.empty() || options.mmproj.empty() || options.calib_images.empty())) {
    return Fail(
        "--modality-bias needs a calibration text (--calib TEXT), the vision projector "
        "(--mmproj FILE) and calibration images (--calib-image FILE)");
  }
  if (!options.modality_bias && (!options.mmproj.empty() || !options.calib_images.empty())) {
    return Fail("--mmproj and --calib-image are for --modality-bias");
  }
  std::error_code ec;
  if (std::filesystem::equivalent(options.in, options.out, ec)) {
    return Fail(StrCat("OUT '", options.out, "' is IN: write the packed model to another file"));
  }
  return Run(options);
}
