// The MoE scheduler (see moe_scheduler.h).
#include "pipeline/moe_scheduler.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "backend/cpu/f32_ops.h"
#include "backend/expert_groups.h"
#include "core/status.h"
#include "core/strings.h"
#include "telemetry/trace.h"
#include "telemetry/platform.h"

namespace moert::pipeline {

using backend::Backend;
using backend::Op;
using backend::TensorRef;
using backend::Weight;
using backend::WeightType;

namespace {

static_assert(sizeof(int) == sizeof(int32_t), "expert ids are int32 in buffers");

// Scratch slots (each grown on demand; a slot is fetched once per use).
enum Slot {
  kLogits, kPredicted, kExperts, kWeights, kIdxToken, kIdxPair, kXs, kGate, kUp, kDown,
  kPairOut, kPairRows, kSubsetX, kSubsetExperts, kSharedOut, kSharedUp, kSharedGate,
  kHostX, kHostOut, kSlotCount
};

bool Fusable(const Backend& b, const Weight& gate, const Weight& up, const Weight& down) {
  return gate.type() == up.type() && gate.type() == down.type() &&
         b.Supports(Op::kFusedMoe, gate.type());
}

// The distinct experts of `chosen` (-1: an empty slot), resident ones first (hits are
// pinned before a miss can evict anything), then those a prefetch is loading, then
// the misses.
std::vector<int> DistinctByResidency(const experts::ExpertCache& cache, int layer,
                                     std::span<const int> chosen) {
  std::vector<int> distinct;
  for (int e : chosen) {
    if (e >= 0) distinct.push_back(e);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::stable_partition(distinct.begin(), distinct.end(),
                        [&](int e) { return cache.IsResident(layer, e); });
  std::stable_partition(
      std::find_if(distinct.begin(), distinct.end(),
                   [&](int e) { return !cache.IsResident(layer, e); }),
      distinct.end(), [&](int e) { return cache.IsLoading(layer, e); });
  return distinct;
}

// The pipeline: prefetches of this layer the router did not choose and whose read has
// not started are dropped (the loader's time goes to the misses instead).
void CancelUnwantedPrefetches(experts::ExpertCache& cache, int layer, int n_expert,
                              const std::vector<int>& distinct) {
  std::vector<bool> wanted(static_cast<size_t>(n_expert), false);
  for (int e : distinct) wanted[static_cast<size_t>(e)] = true;
  for (int e = 0; e < n_expert; ++e) {
    if (!wanted[static_cast<size_t>(e)] && cache.IsLoading(layer, e)) cache.CancelPrefetch(layer, e);
  }
}

// Starts the loads of the misses distinct[first..] together, in order (before the next
// layer's prefetches), up to the first that cannot start without waiting.
void StartMisses(experts::ExpertCache& cache, int layer, const std::vector<int>& distinct,
                 size_t first) {
  for (size_t i = first; i < distinct.size(); ++i) {
    if (!cache.StartLoad(layer, distinct[i]) && !cache.IsResident(layer, distinct[i])) break;
  }
}

}  // namespace

struct MoeScheduler::Layer {
  std::unique_ptr<Weight> router;
  std::unique_ptr<Weight> gate, up, down;  // resident experts, stacked
  std::unique_ptr<Weight> shared_gate_proj, shared_up, shared_down, shared_gate;
  bool pooled = false;     // the experts are in the expert pool
  bool on_device = false;  // pooled, and the backend runs them from its region
};

// A device's view of the expert pool's memory.
struct MoeScheduler::Region {
  std::unique_ptr<backend::Buffer> buffer;
  bool copy = false;     // a device copy, written per load (else zero-copy)
  bool checked = false;  // the zero-copy view was checked against the host's bytes
  std::vector<uint64_t> published;  // per (layer, expert): the generation the device has
};

MoeScheduler::MoeScheduler(Backend& backend, std::vector<const MoeWeights*> layers,
                           const MoeServices* services, MoeScheduler* host,
                           PooledPlacement placement)
    : b_(backend),
      host_layers_(std::move(layers)),
      services_(services),
      host_(host),
      placement_(placement),
      scratch_(backend, kSlotCount) {}

MoeScheduler::~MoeScheduler() = default;

absl::StatusOr<TensorRef> MoeScheduler::Scratch(int slot, size_t bytes) {
  return scratch_.Get(slot, bytes);
}

absl::Status MoeScheduler::Init() {
  experts::ExpertCache* cache = services_->cache;
  layers_.clear();
  layers_.resize(host_layers_.size());
  weight_bytes_ = 0;
  const auto upload = [&](const backend::Matrix& m, int64_t groups, const std::string& name,
                          std::unique_ptr<Weight>* out) -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(*out, b_.UploadWeight(m, groups, name));
    weight_bytes_ += (*out)->device_bytes();
    return absl::OkStatus();
  };
  for (size_t il = 0; il < host_layers_.size(); ++il) {
    const MoeWeights* w = host_layers_[il];
    if (w == nullptr) continue;
    Layer& l = layers_[il];
    const std::string blk = StrCat("blk.", il, ".");
    MOERT_RETURN_IF_ERROR(upload(w->router, 1, blk + "ffn_gate_inp.weight", &l.router));
    l.pooled = cache != nullptr && cache->directory().has_layer(static_cast<int>(il));
    if (!l.pooled) {
      MOERT_RETURN_IF_ERROR(upload(w->gate_exps, w->n_expert, blk + "ffn_gate_exps", &l.gate));
      MOERT_RETURN_IF_ERROR(upload(w->up_exps, w->n_expert, blk + "ffn_up_exps", &l.up));
      MOERT_RETURN_IF_ERROR(upload(w->down_exps, w->n_expert, blk + "ffn_down_exps", &l.down));
    }
    if (!w->shared.empty()) {
      MOERT_RETURN_IF_ERROR(upload(w->shared.gate, 1, blk + "ffn_gate_shexp.weight", &l.shared_gate_proj));
      MOERT_RETURN_IF_ERROR(upload(w->shared.up, 1, blk + "ffn_up_shexp.weight", &l.shared_up));
      MOERT_RETURN_IF_ERROR(upload(w->shared.down, 1, blk + "ffn_down_shexp.weight", &l.shared_down));
      MOERT_RETURN_IF_ERROR(upload(w->shared_gate, 1, blk + "ffn_gate_inp_shexp.weight", &l.shared_gate));
    }
  }
  if (cache != nullptr) SetUpRegion();
  return absl::OkStatus();
}

void MoeScheduler::SetUpRegion() {
  const experts::ExpertCache& cache = *services_->cache;
  region_ = std::make_unique<Region>();
  if (b_.host_memory()) {
    // The backend reads the pool where it is.
    absl::StatusOr<std::unique_ptr<backend::Buffer>> view =
        b_.WrapHost(cache.expert_region(), cache.expert_region_bytes());
    if (view.ok()) region_->buffer = std::move(*view);
    for (Layer& l : layers_) l.on_device = l.pooled && region_->buffer != nullptr;
    return;
  }
  const auto host = [&](std::string why) {
    pooled_.placement = StrCat("host: ", why);
    for (Layer& l : layers_) l.on_device = false;
    region_->buffer.reset();
  };
  if (placement_ == PooledPlacement::kHost) return host("PooledExperts::kHost");
  // Every pooled layer whose parts the backend's fused op runs (a layer's experts
  // share one layout: ExpertDirectory).
  const experts::ExpertDirectory& dir = cache.directory();
  int device_layers = 0;
  std::string why_not;
  for (size_t il = 0; il < layers_.size(); ++il) {
    Layer& l = layers_[il];
    if (!l.pooled) continue;
    bool ok = true;
    for (const experts::ExpertPart& p : dir.info(static_cast<int>(il), 0).parts) {
      if (ok && !b_.Supports(Op::kFusedMoe, backend::WeightTypeOf(p.format))) {
        ok = false;
        why_not = StrCat("layer ", il, "'s experts are packed as ",
                         backend::WeightFormatName(p.format), " (no ", b_.name(), " kernels)");
      }
    }
    l.on_device = ok;
    if (ok) ++device_layers;
  }
  if (device_layers == 0) return host(why_not.empty() ? "no pooled layer" : why_not);
  region_->copy = placement_ == PooledPlacement::kDeviceCopy || !b_.device().unified_memory;
  absl::StatusOr<std::unique_ptr<backend::Buffer>> region =
      region_->copy ? b_.Allocate(cache.expert_region_bytes())
                    : b_.WrapHost(cache.expert_region(), cache.expert_region_bytes());
  if (!region.ok()) return host(std::string(region.status().message()));
  region_->buffer = std::move(*region);
  region_->published.assign(layers_.size() * static_cast<size_t>(dir.n_expert()), 0);
  pooled_.placement = region_->copy ? "device (copied per load)" : "device (zero-copy)";
  if (!why_not.empty()) StrAppend(&pooled_.placement, "; host for ", why_not);
}

absl::Status MoeScheduler::Run(int layer, TensorRef x, int64_t n, TensorRef out) {
  MOERT_TRACE_SCOPE("moe");
  if (layer < 0 || layer >= static_cast<int>(layers_.size()) || host_layers_[layer] == nullptr) {
    return absl::InvalidArgumentError(StrCat("layer ", layer, " has no MoE block"));
  }
  // Routing on the host where it costs no copies or needs the host's state (the
  // pool's residency, the prefetcher, the uniform draw's stream); else the backend's
  // top-k.
  const bool uniform = services_->router != nullptr &&
                       services_->router->options().routing == router::RoutingOverride::kUniform;
  const bool on_host = b_.host_memory() || services_->cache != nullptr ||
                       !b_.Supports(Op::kTopK) || uniform;
  Route route;
  TensorRef experts, weights;
  MOERT_RETURN_IF_ERROR(RouteBatch(layer, x, n, on_host, &route, &experts, &weights));
  const OpObserver* observer = services_->op_observer;
  if (observer != nullptr && *observer && observer->experts && b_.host_memory() &&
      !layers_[layer].pooled) {
    MOERT_RETURN_IF_ERROR(RunObserved(layer, x, n, route, out));
  } else {
    MOERT_RETURN_IF_ERROR(RunRouted(layer, x, n, route, experts, weights, out));
  }
  if (host_layers_[layer]->shared.empty()) return absl::OkStatus();
  return RunShared(layer, x, n, out);
}

absl::Status MoeScheduler::RouteBatch(int layer, TensorRef x, int64_t n, bool on_host,
                                      Route* route, TensorRef* experts, TensorRef* weights) {
  MOERT_TRACE_SCOPE("router");
  const MoeWeights& w = *host_layers_[layer];
  const Layer& l = layers_[layer];
  const int n_expert = w.n_expert;
  MOERT_ASSIGN_OR_RETURN(TensorRef logits, Scratch(kLogits, static_cast<size_t>(n * n_expert) * 4));
  MOERT_RETURN_IF_ERROR(b_.MatMul(*l.router, 0, x, n, logits));
  if (!on_host) {
    const int k = w.n_used;
    route->k = k;
    MOERT_ASSIGN_OR_RETURN(*experts, Scratch(kExperts, static_cast<size_t>(n * k) * 4));
    MOERT_ASSIGN_OR_RETURN(*weights, Scratch(kWeights, static_cast<size_t>(n * k) * 4));
    return b_.TopK(logits, n, n_expert, k, w.renormalize, *experts, *weights);
  }
  // The logits on the host: in place, or read back.
  std::vector<float> read_back;
  const auto host_floats = [&](TensorRef t, size_t count) -> absl::StatusOr<const float*> {
    if (b_.host_memory()) return reinterpret_cast<const float*>(t.buffer->host() + t.offset);
    read_back.resize(count);
    MOERT_RETURN_IF_ERROR(b_.Read(t, read_back.data(), count * 4));
    return read_back.data();
  };
  MOERT_ASSIGN_OR_RETURN(const float* lp, host_floats(logits, static_cast<size_t>(n * n_expert)));
  if (services_->last_router_logits != nullptr &&
      static_cast<size_t>(layer) < services_->last_router_logits->size()) {
    (*services_->last_router_logits)[static_cast<size_t>(layer)].assign(
        lp + (n - 1) * n_expert, lp + n * n_expert);
  }
  if (const OpObserver* observer = services_->op_observer;
      observer != nullptr && *observer && b_.host_memory()) {
    // Host memory: lp is the logits' own buffer, so a change is routed on.
    observer->fn({layer, ObservedOp::kRouter, -1, -1, n, n_expert, const_cast<float*>(lp)});
  }
  router::Router* router = services_->router;
  const int k = router != nullptr ? router->slots(w.n_used) : w.n_used;
  route->k = k;
  route->chosen.resize(static_cast<size_t>(n * k));
  route->weights.resize(static_cast<size_t>(n * k));
  int* chosen = route->chosen.data();
  float* ws = route->weights.data();
  const uint64_t route_start = telemetry::NowNs();
  if (router != nullptr) {
    std::span<const uint64_t> resident;
    if (services_->cache != nullptr) resident = services_->cache->residency(layer);
    router->Route(layer, lp, n, w.n_used, w.renormalize, resident, chosen, ws);
  } else {
    for (int64_t t = 0; t < n; ++t) {
      backend::cpu::RouteToken(lp + t * n_expert, n_expert, k, w.renormalize, chosen + t * k,
                               ws + t * k);
    }
  }
  if (static_cast<size_t>(layer) < services_->router_latency.size()) {
    if (telemetry::Histogram* latency = services_->router_latency[static_cast<size_t>(layer)]) {
      latency->Observe(static_cast<double>(telemetry::NowNs() - route_start) / 1e9);
    }
  }
  if (services_->route_observer != nullptr && *services_->route_observer) {
    (*services_->route_observer)(layer, n, k, chosen, ws);
  }
  if (Prefetcher* prefetcher = services_->prefetcher; prefetcher != nullptr) {
    prefetcher->OnRouted(layer, n, k, chosen);
    const int later = layer + services_->prefetch_depth;
    if (later < static_cast<int>(layers_.size()) && layers_[later].router != nullptr) {
      // Speculative routing: the later layer's router on this layer's input.
      const int later_experts = host_layers_[later]->n_expert;
      MOERT_ASSIGN_OR_RETURN(TensorRef predicted,
                             Scratch(kPredicted, static_cast<size_t>(n * later_experts) * 4));
      MOERT_RETURN_IF_ERROR(b_.MatMul(*layers_[later].router, 0, x, n, predicted));
      MOERT_ASSIGN_OR_RETURN(const float* pp,
                             host_floats(predicted, static_cast<size_t>(n * later_experts)));
      prefetcher->Predict(later, pp, n);
    }
  }
  MOERT_ASSIGN_OR_RETURN(*experts, Scratch(kExperts, route->chosen.size() * 4));
  MOERT_ASSIGN_OR_RETURN(*weights, Scratch(kWeights, route->weights.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(*experts, route->chosen.data(), route->chosen.size() * 4));
  return b_.Write(*weights, route->weights.data(), route->weights.size() * 4);
}

absl::Status MoeScheduler::RunRouted(int layer, TensorRef x, int64_t n, const Route& route,
                                     TensorRef experts, TensorRef weights, TensorRef out) {
  const Layer& l = layers_[layer];
  if (!l.pooled) return RunResident(layer, x, n, route, !route.chosen.empty(), experts, weights, out);
  if (b_.host_memory() && l.on_device) {
    return RunPooledHost(layer, x, n, route, experts, weights, out);
  }
  bool ran = false;
  if (l.on_device) {
    MOERT_RETURN_IF_ERROR(RunPooledDevice(layer, x, n, route, experts, weights, out, &ran));
  }
  if (ran) {
    ++pooled_.device_batches;
    return absl::OkStatus();
  }
  ++pooled_.host_batches;
  return RunOnHost(layer, x, n, route, out);
}

absl::Status MoeScheduler::RunResident(int layer, TensorRef x, int64_t n, const Route& route,
                                       bool routed_on_host, TensorRef experts, TensorRef weights,
                                       TensorRef out) {
  const Layer& l = layers_[layer];
  const int k = route.k;
  if (Fusable(b_, *l.gate, *l.up, *l.down)) {
    backend::Experts e;
    e.gate = l.gate.get();
    e.up = l.up.get();
    e.down = l.down.get();
    e.n_expert = host_layers_[layer]->n_expert;
    return b_.FusedMoe(e, x, n, k, experts, weights, out);
  }
  // Tokens grouped by expert on the host: the routing read back when the backend chose.
  std::vector<int> chosen;
  if (!routed_on_host) {
    chosen.resize(static_cast<size_t>(n * k));
    MOERT_RETURN_IF_ERROR(b_.Read(experts, chosen.data(), chosen.size() * 4));
    for (int e : chosen) {
      if (e >= host_layers_[layer]->n_expert) {
        return absl::InternalError(StrCat(b_.name(), " routing chose expert ", e));
      }
    }
  }
  return RunGrouped(layer, x, n, routed_on_host ? std::span<const int>(route.chosen) : chosen, k,
                    experts, weights, out);
}

absl::Status MoeScheduler::RunGrouped(int layer, TensorRef x, int64_t n,
                                      std::span<const int> chosen, int k, TensorRef experts,
                                      TensorRef weights, TensorRef out) {
  const MoeWeights& w = *host_layers_[layer];
  const Layer& l = layers_[layer];
  const backend::ExpertGroups groups = backend::GroupByExpert(chosen, w.n_expert);
  const int64_t rows = groups.rows(), pairs = n * k;
  const int64_t n_embd = l.gate->cols(), ff = l.gate->rows();
  if (rows == 0) return absl::InternalError("the routing chose no expert");
  std::vector<int32_t> token_of_row(static_cast<size_t>(rows)), row_of_pair(static_cast<size_t>(pairs));
  for (int64_t r = 0; r < rows; ++r) {
    token_of_row[static_cast<size_t>(r)] = static_cast<int32_t>(groups.pair_of_row[static_cast<size_t>(r)] / k);
  }
  for (int64_t p = 0; p < pairs; ++p) {
    // An empty slot reads row 0; the merge skips it.
    row_of_pair[static_cast<size_t>(p)] =
        static_cast<int32_t>(std::max<int64_t>(groups.row_of_pair[static_cast<size_t>(p)], 0));
  }
  MOERT_ASSIGN_OR_RETURN(TensorRef idx_tok, Scratch(kIdxToken, token_of_row.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef idx_pair, Scratch(kIdxPair, row_of_pair.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef xs, Scratch(kXs, static_cast<size_t>(rows * n_embd) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef g, Scratch(kGate, static_cast<size_t>(rows * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef u, Scratch(kUp, static_cast<size_t>(rows * ff) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef dn, Scratch(kDown, static_cast<size_t>(rows * n_embd) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef po, Scratch(kPairOut, static_cast<size_t>(pairs * n_embd) * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(idx_tok, token_of_row.data(), token_of_row.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(idx_pair, row_of_pair.data(), row_of_pair.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.GatherRows(x, n, idx_tok, rows, n_embd, xs));
  std::vector<backend::MatMulArgs> jobs;
  for (size_t gi = 0; gi < groups.groups(); ++gi) {
    const int64_t r = groups.first[gi], m = groups.size(gi);
    const int e = groups.expert[gi];
    const TensorRef xe = xs.At(static_cast<size_t>(r * n_embd) * 4);
    jobs.push_back({l.gate.get(), e, xe, m, g.At(static_cast<size_t>(r * ff) * 4)});
    jobs.push_back({l.up.get(), e, xe, m, u.At(static_cast<size_t>(r * ff) * 4)});
  }
  MOERT_RETURN_IF_ERROR(b_.MatMuls(jobs));
  MOERT_RETURN_IF_ERROR(b_.SiluMul(g, u, rows * ff));
  jobs.clear();
  for (size_t gi = 0; gi < groups.groups(); ++gi) {
    const int64_t r = groups.first[gi], m = groups.size(gi);
    jobs.push_back({l.down.get(), groups.expert[gi], g.At(static_cast<size_t>(r * ff) * 4), m,
                    dn.At(static_cast<size_t>(r * n_embd) * 4)});
  }
  MOERT_RETURN_IF_ERROR(b_.MatMuls(jobs));
  MOERT_RETURN_IF_ERROR(b_.GatherRows(dn, rows, idx_pair, pairs, n_embd, po));
  return b_.MoeCombine(po, experts, weights, n, k, n_embd, out);
}

backend::Experts MoeScheduler::PlacedExperts(int layer, std::span<const uint64_t> offsets) const {
  const experts::ExpertInfo& info = services_->cache->directory().info(layer, 0);
  backend::Experts e;
  e.region = region_->buffer.get();
  e.n_expert = host_layers_[layer]->n_expert;
  e.offsets = offsets;
  for (int p = 0; p < 3; ++p) {
    const experts::ExpertPart& part = info.parts[static_cast<size_t>(p)];
    e.parts[p] = {part.format, part.rows, part.cols, part.block_offset};
  }
  return e;
}

absl::Status MoeScheduler::RunSubset(int layer, TensorRef x, std::span<const int> subset,
                                     const Route& route, TensorRef pair_rows, int64_t* rows_used,
                                     std::vector<int>* row_of_pair) {
  // One row per pair of the subset's experts, k = 1 and no weights: each pair's expert
  // output, computed exactly as within the whole batch (same rows per expert, same
  // order).
  const int n_expert = host_layers_[layer]->n_expert;
  const int k = route.k;
  const int64_t n_embd = services_->cache->directory().info(layer, 0).parts[0].cols;
  std::vector<bool> in_subset(static_cast<size_t>(n_expert), false);
  for (int e : subset) in_subset[static_cast<size_t>(e)] = true;
  std::vector<int32_t> tokens;
  std::vector<int> expert_of;
  const int64_t first_row = *rows_used;
  for (size_t p = 0; p < route.chosen.size(); ++p) {
    const int e = route.chosen[p];
    if (e < 0 || !in_subset[static_cast<size_t>(e)]) continue;
    (*row_of_pair)[p] = static_cast<int>(first_row + static_cast<int64_t>(tokens.size()));
    tokens.push_back(static_cast<int32_t>(static_cast<int64_t>(p) / k));
    expert_of.push_back(e);
  }
  if (tokens.empty()) return absl::OkStatus();
  const int64_t m = static_cast<int64_t>(tokens.size());
  std::vector<uint64_t> offsets(static_cast<size_t>(n_expert), 0);
  for (int e : subset) offsets[static_cast<size_t>(e)] = services_->cache->PlacementOf(layer, e)->offset;
  MOERT_ASSIGN_OR_RETURN(TensorRef idx, Scratch(kIdxToken, tokens.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef xg, Scratch(kSubsetX, static_cast<size_t>(m * n_embd) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef eg, Scratch(kSubsetExperts, expert_of.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(idx, tokens.data(), tokens.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(eg, expert_of.data(), expert_of.size() * 4));
  const int64_t n = static_cast<int64_t>(route.chosen.size()) / k;
  MOERT_RETURN_IF_ERROR(b_.GatherRows(x, n, idx, m, n_embd, xg));
  MOERT_RETURN_IF_ERROR(b_.FusedMoe(PlacedExperts(layer, offsets), xg, m, 1, eg, TensorRef(),
                                    pair_rows.At(static_cast<size_t>(first_row * n_embd) * 4)));
  *rows_used += m;
  return absl::OkStatus();
}

absl::Status MoeScheduler::RunPooledHost(int layer, TensorRef x, int64_t n, const Route& route,
                                         TensorRef experts, TensorRef weights, TensorRef out) {
  experts::ExpertCache& cache = *services_->cache;
  Prefetcher* prefetcher = services_->prefetcher;
  const int n_expert = host_layers_[layer]->n_expert;
  const int k = route.k;
  const int64_t pairs = n * k;
  const int64_t n_embd = cache.directory().info(layer, 0).parts[0].cols;
  // Starts the prefetch of the next slot once, before the last compute of this layer.
  const auto prefetch = [&] {
    if (prefetcher != nullptr) prefetcher->Issue(layer + services_->prefetch_depth);
  };
  const std::vector<int> distinct = DistinctByResidency(cache, layer, route.chosen);

  std::vector<int> subset;  // acquired (pinned) and not yet run
  const auto release = [&] {
    for (int e : subset) cache.Release(layer, e);
    subset.clear();
  };
  // With the batch split: every pair's expert output, rows in the order the subsets ran
  // (row_of_pair says where), then gathered into pair order and merged.
  TensorRef pair_rows;
  int64_t rows_used = 0;
  std::vector<int> row_of_pair(static_cast<size_t>(pairs), 0);
  const auto split = [&]() -> absl::Status {
    if (pair_rows.empty()) {
      MOERT_ASSIGN_OR_RETURN(pair_rows, Scratch(kPairRows, static_cast<size_t>(pairs * n_embd) * 4));
    }
    return absl::OkStatus();
  };
  const auto run_subset = [&]() -> absl::Status {
    absl::Status s = RunSubset(layer, x, subset, route, pair_rows, &rows_used, &row_of_pair);
    release();
    return s;
  };
  const auto acquire = [&](int e) -> absl::Status {
    absl::StatusOr<backend::FfnView> acquired = cache.Acquire(layer, e);
    if (!acquired.ok() && absl::IsResourceExhausted(acquired.status()) && !subset.empty()) {
      // The pool is full of this batch's pinned experts: run them, let them go, go on.
      MOERT_RETURN_IF_ERROR(split());
      MOERT_RETURN_IF_ERROR(run_subset());
      acquired = cache.Acquire(layer, e);
    }
    if (!acquired.ok()) {
      release();
      return acquired.status();
    }
    subset.push_back(e);
    return absl::OkStatus();
  };

  if (prefetcher != nullptr) {
    CancelUnwantedPrefetches(cache, layer, n_expert, distinct);
    // The hits are pinned first; then every miss starts loading, and each expert
    // computes as soon as its weights are in while the ones after it load: one slot
    // computing, one filling.
    size_t first_miss = 0;
    while (first_miss < distinct.size() && cache.IsResident(layer, distinct[first_miss])) {
      MOERT_RETURN_IF_ERROR(acquire(distinct[first_miss++]));
    }
    if (first_miss < distinct.size()) {
      StartMisses(cache, layer, distinct, first_miss);
      prefetch();
      MOERT_RETURN_IF_ERROR(split());
      if (!subset.empty()) MOERT_RETURN_IF_ERROR(run_subset());
      for (size_t i = first_miss; i < distinct.size(); ++i) {
        MOERT_RETURN_IF_ERROR(acquire(distinct[i]));
        MOERT_RETURN_IF_ERROR(run_subset());
      }
    } else {
      prefetch();
    }
  } else {
    for (int e : distinct) MOERT_RETURN_IF_ERROR(acquire(e));
    prefetch();
  }
  if (pair_rows.empty()) {
    // Everything fitted: the fused op over the whole batch, as for resident experts.
    std::vector<uint64_t> offsets(static_cast<size_t>(n_expert), 0);
    for (int e : subset) offsets[static_cast<size_t>(e)] = cache.PlacementOf(layer, e)->offset;
    const absl::Status s = b_.FusedMoe(PlacedExperts(layer, offsets), x, n, k, experts, weights, out);
    release();
    return s;
  }
  MOERT_RETURN_IF_ERROR(run_subset());
  // The pairs' outputs in pair order, then the weighted sum in slot order.
  std::vector<int32_t> idx(row_of_pair.begin(), row_of_pair.end());
  MOERT_ASSIGN_OR_RETURN(TensorRef idx_pair, Scratch(kIdxPair, idx.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef po, Scratch(kPairOut, static_cast<size_t>(pairs * n_embd) * 4));
  MOERT_RETURN_IF_ERROR(b_.Write(idx_pair, idx.data(), idx.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.GatherRows(pair_rows, std::max<int64_t>(rows_used, 1), idx_pair, pairs,
                                      n_embd, po));
  return b_.MoeCombine(po, experts, weights, n, k, n_embd, out);
}

absl::Status MoeScheduler::RunPooledDevice(int layer, TensorRef x, int64_t n, const Route& route,
                                           TensorRef experts, TensorRef weights, TensorRef out,
                                           bool* ran) {
  experts::ExpertCache& cache = *services_->cache;
  Prefetcher* prefetcher = services_->prefetcher;
  const std::vector<int> distinct = DistinctByResidency(cache, layer, route.chosen);
  if (prefetcher != nullptr) {
    CancelUnwantedPrefetches(cache, layer, host_layers_[layer]->n_expert, distinct);
  }
  // Every distinct expert pinned (hits first: a miss's eviction cannot take them; with
  // a prefetcher the misses start loading together), then the next layer's prefetch,
  // which overlaps the device's compute.
  std::vector<int> pinned;
  const auto release = [&] {
    for (int e : pinned) cache.Release(layer, e);
    pinned.clear();
  };
  size_t next = 0;
  const auto acquire_next = [&]() -> absl::Status {
    absl::StatusOr<backend::FfnView> acquired = cache.Acquire(layer, distinct[next]);
    if (!acquired.ok()) {
      release();
      return acquired.status();
    }
    pinned.push_back(distinct[next++]);
    return absl::OkStatus();
  };
  absl::Status acquired = absl::OkStatus();
  while (acquired.ok() && next < distinct.size() && cache.IsResident(layer, distinct[next])) {
    acquired = acquire_next();
  }
  if (acquired.ok() && prefetcher != nullptr) StartMisses(cache, layer, distinct, next);
  while (acquired.ok() && next < distinct.size()) acquired = acquire_next();
  if (!acquired.ok()) {
    // The batch's experts do not fit the pool together: the CPU runs them in subsets.
    if (absl::IsResourceExhausted(acquired)) return absl::OkStatus();
    return acquired;
  }
  if (prefetcher != nullptr) prefetcher->Issue(layer + services_->prefetch_depth);
  absl::Status status = [&]() -> absl::Status {
    std::vector<uint64_t> offsets(static_cast<size_t>(host_layers_[layer]->n_expert), 0);
    // Twice when the zero-copy check turned the region into a copy part-way: the
    // experts published before it go into the copy too.
    for (int pass = 0; pass < 2; ++pass) {
      const bool was_copy = region_->copy;
      for (int e : pinned) {
        MOERT_ASSIGN_OR_RETURN(offsets[static_cast<size_t>(e)], PublishExpert(layer, e));
      }
      if (region_->copy == was_copy) break;
    }
    MOERT_RETURN_IF_ERROR(b_.FusedMoe(PlacedExperts(layer, offsets), x, n, route.k, experts,
                                      weights, out));
    // The kernels read the pinned blocks: they may go only once the device is done.
    return b_.Finish();
  }();
  release();
  if (status.ok()) *ran = true;
  return status;
}

absl::StatusOr<uint64_t> MoeScheduler::PublishExpert(int layer, int expert) {
  const experts::ExpertCache& cache = *services_->cache;
  const std::optional<experts::ExpertCache::Placement> at = cache.PlacementOf(layer, expert);
  if (!at) {
    return absl::InternalError(
        StrCat(b_.name(), ": pinned expert ", expert, " of layer ", layer, " is not resident"));
  }
  uint64_t& seen = region_->published[static_cast<size_t>(layer) *
                                          static_cast<size_t>(cache.directory().n_expert()) +
                                      static_cast<size_t>(expert)];
  if (seen != at->generation) {
    const uint64_t bytes = cache.directory().info(layer, expert).runtime_bytes;
    if (!region_->copy) {
      MOERT_RETURN_IF_ERROR(b_.Publish(*region_->buffer, at->offset, bytes));
      if (!region_->checked) MOERT_RETURN_IF_ERROR(CheckZeroCopy(at->offset, bytes));
    }
    if (region_->copy) {
      MOERT_RETURN_IF_ERROR(b_.Write(TensorRef(region_->buffer.get(), at->offset),
                                     cache.expert_region() + at->offset, bytes));
    }
    seen = at->generation;
    pooled_.published_bytes += bytes;
  }
  return at->offset;
}

absl::Status MoeScheduler::CheckZeroCopy(uint64_t offset, uint64_t bytes) {
  // The first expert published: does the device read what the host wrote? A driver
  // that copied or pinned the region's pages when it was wrapped (most of them were
  // not yet committed) would show stale bytes; then a device copy takes over.
  region_->checked = true;
  const experts::ExpertCache& cache = *services_->cache;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, 256));
  std::vector<uint8_t> seen(n);
  MOERT_RETURN_IF_ERROR(b_.Read(TensorRef(region_->buffer.get(), offset), seen.data(), n));
  if (std::memcmp(seen.data(), cache.expert_region() + offset, n) == 0) return absl::OkStatus();
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<backend::Buffer> copy,
                         b_.Allocate(cache.expert_region_bytes()));
  region_->buffer = std::move(copy);
  region_->copy = true;
  std::fill(region_->published.begin(), region_->published.end(), 0);  // all again, into the copy
  pooled_.placement =
      StrCat("device (copied per load: the zero-copy view read stale bytes)",
             pooled_.placement.substr(std::string_view("device (zero-copy)").size()));
  return absl::OkStatus();
}

absl::Status MoeScheduler::RunOnHost(int layer, TensorRef x, int64_t n, const Route& route,
                                     TensorRef out) {
  if (host_ == nullptr) {
    return absl::FailedPreconditionError(
        StrCat("layer ", layer, "'s experts cannot run on the ", b_.name(), " backend"));
  }
  const int64_t n_embd = host_->layers_[layer].router->cols();
  const size_t bytes = static_cast<size_t>(n * n_embd) * 4;
  MOERT_ASSIGN_OR_RETURN(TensorRef hx, host_->Scratch(kHostX, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef hout, host_->Scratch(kHostOut, bytes));
  MOERT_RETURN_IF_ERROR(b_.Read(x, hx.buffer->host() + hx.offset, bytes));
  MOERT_ASSIGN_OR_RETURN(TensorRef he, host_->Scratch(kExperts, route.chosen.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef hw, host_->Scratch(kWeights, route.weights.size() * 4));
  MOERT_RETURN_IF_ERROR(host_->b_.Write(he, route.chosen.data(), route.chosen.size() * 4));
  MOERT_RETURN_IF_ERROR(host_->b_.Write(hw, route.weights.data(), route.weights.size() * 4));
  MOERT_RETURN_IF_ERROR(host_->RunRouted(layer, hx, n, route, he, hw, hout));
  return b_.Write(out, hout.buffer->host() + hout.offset, bytes);
}

absl::Status MoeScheduler::RunObserved(int layer, TensorRef x, int64_t n, const Route& route,
                                       TensorRef out) {
  const Layer& l = layers_[layer];
  const OpObserver& observer = *services_->op_observer;
  const int64_t n_embd = l.gate->cols(), ff = l.gate->rows();
  MOERT_ASSIGN_OR_RETURN(TensorRef g, Scratch(kGate, static_cast<size_t>(ff) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef u, Scratch(kUp, static_cast<size_t>(ff) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef dn, Scratch(kDown, static_cast<size_t>(n_embd) * 4));
  const auto host = [](TensorRef t) { return reinterpret_cast<float*>(t.buffer->host() + t.offset); };
  float* o = host(out);
  std::fill(o, o + n * n_embd, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const TensorRef xt = x.At(static_cast<size_t>(t * n_embd) * 4);
    for (int s = 0; s < route.k; ++s) {
      const size_t pair = static_cast<size_t>(t * route.k + s);
      const int e = route.chosen[pair];
      if (e < 0) continue;
      const backend::MatMulArgs jobs[2] = {{l.gate.get(), e, xt, 1, g}, {l.up.get(), e, xt, 1, u}};
      MOERT_RETURN_IF_ERROR(b_.MatMuls(jobs));
      MOERT_RETURN_IF_ERROR(b_.Finish());
      observer.fn({layer, ObservedOp::kExpertGate, e, t, 1, ff, host(g)});
      observer.fn({layer, ObservedOp::kExpertUp, e, t, 1, ff, host(u)});
      MOERT_RETURN_IF_ERROR(b_.SiluMul(g, u, ff));
      MOERT_RETURN_IF_ERROR(b_.MatMul(*l.down, e, g, 1, dn));
      MOERT_RETURN_IF_ERROR(b_.Finish());
      float* d = host(dn);
      observer.fn({layer, ObservedOp::kExpertDown, e, t, 1, n_embd, d});
      const float w = route.weights[pair];
      for (int64_t i = 0; i < n_embd; ++i) o[t * n_embd + i] += w * d[i];
    }
  }
  return absl::OkStatus();
}

const char* ObservedOpName(ObservedOp op) {
  switch (op) {
    case ObservedOp::kAttention:
      return "attention";
    case ObservedOp::kRouter:
      return "router";
    case ObservedOp::kExpertGate:
      return "gate";
    case ObservedOp::kExpertUp:
      return "up";
    case ObservedOp::kExpertDown:
      return "down";
    case ObservedOp::kFfn:
      return "ffn";
  }
  return "?";
}

absl::Status MoeScheduler::AddSharedExpert(int layer, TensorRef x, int64_t n, TensorRef out) {
  if (layer < 0 || layer >= static_cast<int>(layers_.size()) || host_layers_[layer] == nullptr) {
    return absl::InvalidArgumentError(StrCat("layer ", layer, " has no MoE block"));
  }
  if (host_layers_[layer]->shared.empty()) return absl::OkStatus();
  return RunShared(layer, x, n, out);
}

absl::Status MoeScheduler::RunShared(int layer, TensorRef x, int64_t n, TensorRef out) {
  const Layer& l = layers_[layer];
  const int64_t n_embd = l.shared_down->rows(), ff = l.shared_gate_proj->rows();
  MOERT_ASSIGN_OR_RETURN(TensorRef y, Scratch(kSharedOut, static_cast<size_t>(n * n_embd) * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef gate, Scratch(kSharedGate, static_cast<size_t>(n) * 4));
  if (Fusable(b_, *l.shared_gate_proj, *l.shared_up, *l.shared_down)) {
    backend::Experts e;
    e.gate = l.shared_gate_proj.get();
    e.up = l.shared_up.get();
    e.down = l.shared_down.get();
    e.n_expert = 1;
    MOERT_RETURN_IF_ERROR(b_.FusedMoe(e, x, n, 1, TensorRef(), TensorRef(), y));
  } else {
    MOERT_ASSIGN_OR_RETURN(TensorRef h, Scratch(kGate, static_cast<size_t>(n * ff) * 4));
    MOERT_ASSIGN_OR_RETURN(TensorRef u, Scratch(kSharedUp, static_cast<size_t>(n * ff) * 4));
    const backend::MatMulArgs jobs[2] = {{l.shared_gate_proj.get(), 0, x, n, h},
                                         {l.shared_up.get(), 0, x, n, u}};
    MOERT_RETURN_IF_ERROR(b_.MatMuls(jobs));
    MOERT_RETURN_IF_ERROR(b_.SiluMul(h, u, n * ff));
    MOERT_RETURN_IF_ERROR(b_.MatMul(*l.shared_down, 0, h, n, y));
  }
  MOERT_RETURN_IF_ERROR(b_.MatMul(*l.shared_gate, 0, x, n, gate));
  return b_.GatedAdd(out, y, gate, n, n_embd);
}

}  // namespace moert::pipeline
