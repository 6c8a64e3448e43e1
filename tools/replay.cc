// moert-replay's comparison of two runs, op by op (see replay.h).
#include "replay.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/kv_type.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/repro.h"
#include "telemetry/repro_bundle.h"

namespace moert::tools {

namespace {

using pipeline::ObservedOp;

constexpr ObservedOp kOps[] = {ObservedOp::kAttention,  ObservedOp::kRouter,
                               ObservedOp::kExpertGate, ObservedOp::kExpertUp,
                               ObservedOp::kExpertDown, ObservedOp::kFfn};

bool IsExpertOp(ObservedOp op) {
  return op == ObservedOp::kExpertGate || op == ObservedOp::kExpertUp ||
         op == ObservedOp::kExpertDown;
}

// One op's output in one step, in the order the model computed it.
struct Record {
  int layer;
  ObservedOp op;
  int expert;
  std::vector<float> data;
};

// A model run token by token, recording its ops.
struct Run {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::KvCache> cache;
  std::vector<Record> step;  // the current token's ops
};

absl::Status Load(const format::GgufFile& file, const ReplayOptions& options, bool quantized,
                  backend::KvType k, backend::KvType v, const std::optional<ReplayFault>& fault,
                  int n_ctx, Run* run) {
  model::ModelLoadOptions load;
  load.threads = options.threads;
  load.quantized_kernels = quantized;
  load.kv_type_k = k;
  load.kv_type_v = v;
  load.op_observer.experts = true;
  load.op_observer.fn = [run, fault](const pipeline::OpEvent& e) {
    if (fault && e.layer == fault->layer && e.op == fault->op &&
        (fault->expert < 0 || e.expert == fault->expert)) {
      for (int64_t i = 0; i < e.rows * e.width; ++i) e.data[i] += fault->delta;
    }
    run->step.push_back({e.layer, e.op, e.expert,
                         std::vector<float>(e.data, e.data + e.rows * e.width)});
  };
  MOERT_ASSIGN_OR_RETURN(run->model, model::Model::Load(file, load));
  MOERT_ASSIGN_OR_RETURN(run->cache, run->model->NewKvCache(n_ctx));
  return absl::OkStatus();
}

// The first op past the bound between the two runs' records of one step.
std::optional<ReplayDiff> Compare(const std::vector<Record>& ref, const std::vector<Record>& test,
                                  double tolerance, int64_t token, ReplayReport* report) {
  std::map<std::tuple<int, ObservedOp, int>, const Record*> by_key;
  for (const Record& r : test) by_key[{r.layer, r.op, r.expert}] = &r;
  double router_diff = 0;
  for (const Record& r : ref) {
    const auto it = by_key.find({r.layer, r.op, r.expert});
    if (it == by_key.end() || it->second->data.size() != r.data.size()) {
      // The backend run did not choose this expert: its routing differs here.
      ReplayDiff d;
      d.layer = r.layer;
      d.op = ObservedOp::kRouter;
      d.token = token;
      d.max_abs_diff = router_diff;
      d.routing_differs = true;
      return d;
    }
    double diff = 0, scale = 1;
    for (size_t i = 0; i < r.data.size(); ++i) {
      diff = std::max(diff, std::fabs(double{r.data[i]} - double{it->second->data[i]}));
      scale = std::max(scale, std::fabs(double{r.data[i]}));
    }
    if (std::isnan(diff)) diff = INFINITY;
    if (r.op == ObservedOp::kRouter) router_diff = diff;
    ++report->ops;
    const double bound = tolerance * scale;
    report->largest_ratio = std::max(report->largest_ratio, diff / bound);
    if (!(diff <= bound)) {
      ReplayDiff d;
      d.layer = r.layer;
      d.op = r.op;
      d.expert = r.expert;
      d.token = token;
      d.max_abs_diff = diff;
      d.bound = bound;
      return d;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ReplayFault> ParseReplayFault(std::string_view text) {
  ReplayFault f;
  std::string spec(text);
  if (const size_t eq = spec.find('='); eq != std::string::npos) {
    char* end = nullptr;
    const std::string delta = spec.substr(eq + 1);
    f.delta = std::strtof(delta.c_str(), &end);
    if (delta.empty() || *end != '\0' || !std::isfinite(f.delta)) {
      return absl::InvalidArgumentError(StrCat("fault '", text, "': bad delta '", delta, "'"));
    }
    spec.resize(eq);
  }
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const auto number = [&](const std::string& s, int* out) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0 || v > 1 << 20) return false;
    *out = static_cast<int>(v);
    return true;
  };
  if (parts.size() < 2 || parts.size() > 3 || !number(parts[0], &f.layer)) {
    return absl::InvalidArgumentError(
        StrCat("fault '", text, "': expected LAYER:OP[:EXPERT][=DELTA]"));
  }
  bool known = false;
  for (ObservedOp op : kOps) {
    if (parts[1] == pipeline::ObservedOpName(op)) {
      f.op = op;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(StrCat("fault '", text, "': unknown op '", parts[1],
                                             "' (attention, router, gate, up, down, ffn)"));
  }
  if (parts.size() == 3 && (!IsExpertOp(f.op) || !number(parts[2], &f.expert))) {
    return absl::InvalidArgumentError(
        StrCat("fault '", text, "': an expert number goes with gate, up or down only"));
  }
  return f;
}

std::string FormatReplayDiff(const ReplayDiff& d) {
  char diff[32];
  std::snprintf(diff, sizeof(diff), "%.3g", d.max_abs_diff);
  const std::string expert = IsExpertOp(d.op) ? StrCat(" expert ", d.expert) : std::string();
  return StrCat("layer ", d.layer, expert, " ", pipeline::ObservedOpName(d.op),
                ": max abs diff ", diff);
}

absl::StatusOr<ReplayReport> Replay(const ReplayOptions& options) {
  if (!(options.tolerance > 0) || !std::isfinite(options.tolerance)) {
    return absl::InvalidArgumentError(
        StrCat("--tolerance must be a positive number, got ", options.tolerance));
  }
  if (options.max_tokens < 1) {
    return absl::InvalidArgumentError(StrCat("--max-tokens must be >= 1, got ", options.max_tokens));
  }
  MOERT_ASSIGN_OR_RETURN(const telemetry::ReproBundle bundle,
                         telemetry::ReadReproBundle(options.bundle));
  const std::string want = telemetry::ReproValue(bundle.model, "hash");
  const std::string have = runtime::ModelHash(options.model);
  if (!options.ignore_hash && want != have) {
    return absl::FailedPreconditionError(
        StrCat(options.model, " is not the bundle's model: its hash is ", have, ", the bundle's ",
               want.empty() ? std::string("(none)") : want, " (", telemetry::ReproValue(bundle.model, "path"),
               "); --ignore-hash replays anyway"));
  }
  ReplayReport report;
  const std::string backend = telemetry::ReproValue(bundle.options, "backend");
  const std::string ran = telemetry::ReproValue(bundle.model, "backend");
  report.backend = StrCat(ran.empty() ? backend : ran, " (replayed on the CPU kernels)");
  if (ran == "OpenCL" || backend == "opencl") {
    report.note =
        "the bundle ran on OpenCL; replay observes ops on the CPU only, so the quantized "
        "CPU kernels stand in for the device";
  }
  const auto kv_type = [&](const char* key) -> absl::StatusOr<backend::KvType> {
    const std::string name = telemetry::ReproValue(bundle.options, key);
    return backend::ParseKvType(name.empty() ? "f32" : name);
  };
  MOERT_ASSIGN_OR_RETURN(const backend::KvType k, kv_type("cache_type_k"));
  MOERT_ASSIGN_OR_RETURN(const backend::KvType v, kv_type("cache_type_v"));

  std::vector<int32_t> tokens = bundle.tokens;
  if (tokens.size() > static_cast<size_t>(options.max_tokens)) {
    tokens.resize(static_cast<size_t>(options.max_tokens));
  }
  if (tokens.empty()) return absl::InvalidArgumentError(StrCat(options.bundle, ": no tokens to replay"));
  for (int32_t t : tokens) {
    if (t == model::kEmbeddingToken) {
      return absl::UnimplementedError(
          StrCat(options.bundle, ": image positions cannot be replayed (the bundle holds no embeddings)"));
    }
  }
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<format::GgufFile> file, format::GgufFile::Open(options.model));
  const int n_ctx = static_cast<int>(tokens.size());
  Run ref, test;
  MOERT_RETURN_IF_ERROR(Load(*file, options, false, backend::KvType::kF32, backend::KvType::kF32,
                             std::nullopt, n_ctx, &ref));
  MOERT_RETURN_IF_ERROR(Load(*file, options, true, k, v, options.fault, n_ctx, &test));
  std::vector<float> logits;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::span<const int32_t> one(&tokens[t], 1);
    for (Run* run : {&ref, &test}) {
      run->step.clear();
      absl::Status s = run->model->Forward(one, run->cache.get(), model::LogitsFor::kLast, &logits);
      if (!s.ok()) {
        return absl::Status(s.code(), StrCat("token ", t, " (id ", tokens[t], "): ", s.message()));
      }
    }
    report.tokens = static_cast<int>(t) + 1;
    report.first = Compare(ref.step, test.step, options.tolerance, static_cast<int64_t>(t), &report);
    if (report.first) break;
  }
  return report;
}

}  // namespace moert::tools
