// The reference building blocks: portable fp32 code, vectorised through 4-lane GCC/clang
// vector types (SSE on x86-64, NEON on AArch64) rather than -ffast-math, so the order
// of every sum is the one written here.
#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/status/statusor.h"
#include "core/status.h"
#include "experts/expert_cache.h"
#include "pipeline/prefetcher.h"
#include "router/router.h"

namespace moert::model {
namespace {

// The fused op's view of packed FFN weights (empty views when not packed).
backend::FfnView PackedFfn(MatrixView gate, MatrixView up, MatrixView down) {
  return {gate.packed, up.packed, down.packed};
}

}  // namespace
MatrixView MoeWeights::Gate(int e) const {
  if (!gate_exps.packed.empty()) return gate_exps.packed.group(e);
  return MatrixView(gate_exps.data.data() + int64_t{e} * n_ff * gate_exps.cols, n_ff,
                    gate_exps.cols);
}

MatrixView MoeWeights::Up(int e) const {
  if (!up_exps.packed.empty()) return up_exps.packed.group(e);
  return MatrixView(up_exps.data.data() + int64_t{e} * n_ff * up_exps.cols, n_ff, up_exps.cols);
}

MatrixView MoeWeights::Down(int e) const {
  if (!down_exps.packed.empty()) return down_exps.packed.group(e);
  const int64_t n_embd = down_exps.rows / n_expert;
  return MatrixView(down_exps.data.data() + int64_t{e} * n_embd * n_ff, n_embd, n_ff);
}

void RouteToken(const float* router_logits, int n_expert, int n_used, bool renormalize,
                int* experts, float* weights) {
  std::vector<float> p(router_logits, router_logits + n_expert);
  float max = router_logits[0];
  for (int e = 1; e < n_expert; ++e) max = std::max(max, router_logits[e]);
  double sum = 0;
  for (float& v : p) {
    v = std::exp(v - max);
    sum += v;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (float& v : p) v *= inv;
  std::vector<int> order(static_cast<size_t>(n_expert));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n_used, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float total = 0;
  for (int i = 0; i < n_used; ++i) {
    experts[i] = order[i];
    weights[i] = p[order[i]];
    total += weights[i];
  }
  if (renormalize) {
    for (int i = 0; i < n_used; ++i) weights[i] /= total;
  }
}

namespace {

// The distinct experts of `pairs` routed slots (-1: an empty slot), resident ones
// first (hits are pinned before a miss can evict anything), then those a prefetch is
// loading, then the misses.
std::vector<int> DistinctByResidency(const experts::ExpertCache& cache, int layer,
                                     const int* chosen, int64_t pairs) {
  std::vector<int> distinct;
  for (int64_t p = 0; p < pairs; ++p) {
    if (chosen[p] >= 0) distinct.push_back(chosen[p]);
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
void CancelUnwantedPrefetches(const MoeWeights& w, const std::vector<int>& distinct) {
  std::vector<bool> wanted(static_cast<size_t>(w.n_expert), false);
  for (int e : distinct) wanted[static_cast<size_t>(e)] = true;
  for (int e = 0; e < w.n_expert; ++e) {
    if (!wanted[static_cast<size_t>(e)] && w.cache->IsLoading(w.layer, e)) {
      w.cache->CancelPrefetch(w.layer, e);
    }
  }
}

// The routed experts of a batch from the expert pool (see MoeFfn in layers.h).
absl::Status PooledExperts(ThreadPool& pool, const MoeWeights& w, const backend::cpu::A8Matrix& xq,
                           int k, const int* chosen, const float* weights, int64_t n_embd,
                           float* out) {
  // Starts the prefetch of the next slot once, before the last compute of this layer.
  const auto prefetch = [&] {
    if (w.prefetcher != nullptr) w.prefetcher->Issue(w.prefetch_layer);
  };
  experts::ExpertCache& cache = *w.cache;
  const int64_t pairs = xq.n() * k;
  const std::vector<int> distinct = DistinctByResidency(cache, w.layer, chosen, pairs);

  std::vector<backend::FfnView> views(static_cast<size_t>(w.n_expert));
  const auto view = [&](int e) { return views[static_cast<size_t>(e)]; };
  std::vector<int> subset;  // acquired (pinned) and not yet run
  const auto release = [&] {
    for (int e : subset) cache.Release(w.layer, e);
    subset.clear();
  };
  // Unweighted expert outputs of every (token, slot) pair, when the batch is split.
  std::vector<float> pair_out;
  const auto run_subset = [&] {
    std::vector<bool> in_subset(static_cast<size_t>(w.n_expert), false);
    for (int e : subset) in_subset[static_cast<size_t>(e)] = true;
    std::vector<int64_t> pair_ids, rows;
    std::vector<int> expert_of;
    for (int64_t p = 0; p < pairs; ++p) {
      if (chosen[p] < 0 || !in_subset[static_cast<size_t>(chosen[p])]) continue;
      pair_ids.push_back(p);
      rows.push_back(p / k);
      expert_of.push_back(chosen[p]);
    }
    // One row per pair, k = 1 and no weights: FusedFfn writes each pair's expert
    // output, computed exactly as within the whole batch (same rows per expert, same
    // order).
    backend::cpu::A8Matrix xg;
    xg.Gather(xq, rows);
    std::vector<float> y(pair_ids.size() * static_cast<size_t>(n_embd));
    backend::cpu::FusedFfn(pool, pool.kernels(), xg, 1, expert_of.data(), nullptr, view, n_embd,
                      y.data());
    for (size_t i = 0; i < pair_ids.size(); ++i) {
      std::copy(y.begin() + static_cast<int64_t>(i) * n_embd,
                y.begin() + static_cast<int64_t>(i + 1) * n_embd,
                pair_out.begin() + pair_ids[i] * n_embd);
    }
  };

  const auto acquire = [&](int e) -> absl::Status {
    absl::StatusOr<backend::FfnView> acquired = cache.Acquire(w.layer, e);
    if (!acquired.ok() && absl::IsResourceExhausted(acquired.status()) && !subset.empty()) {
      // The pool is full of this batch's pinned experts: run them, let them go, go on.
      pair_out.resize(static_cast<size_t>(pairs * n_embd));
      run_subset();
      release();
      acquired = cache.Acquire(w.layer, e);
    }
    if (!acquired.ok()) {
      release();
      return acquired.status();
    }
    views[static_cast<size_t>(e)] = *acquired;
    subset.push_back(e);
    return absl::OkStatus();
  };

  if (w.prefetcher != nullptr) {
    CancelUnwantedPrefetches(w, distinct);
    // The hits are pinned first; then every miss starts loading (in order, before the
    // next layer's prefetches), and each expert computes as soon as its weights are in
    // while the ones after it load: one slot computing, one filling. The outputs are
    // the ones computed in one go (run_subset computes each pair as the whole batch
    // would, and the sum below is in slot order).
    size_t first_miss = 0;
    while (first_miss < distinct.size() && cache.IsResident(w.layer, distinct[first_miss])) {
      MOERT_RETURN_IF_ERROR(acquire(distinct[first_miss++]));
    }
    if (first_miss < distinct.size()) {
      for (size_t i = first_miss; i < distinct.size(); ++i) {
        if (!cache.StartLoad(w.layer, distinct[i]) && !cache.IsResident(w.layer, distinct[i])) {
          break;  // no block without waiting: the rest load one by one below
        }
      }
      prefetch();
      pair_out.resize(static_cast<size_t>(pairs * n_embd));
      if (!subset.empty()) {
        run_subset();
        release();
      }
      for (size_t i = first_miss; i < distinct.size(); ++i) {
        MOERT_RETURN_IF_ERROR(acquire(distinct[i]));
        run_subset();
        release();
      }
    } else {
      prefetch();
    }
  } else {
    for (int e : distinct) MOERT_RETURN_IF_ERROR(acquire(e));
    prefetch();
  }
  if (pair_out.empty()) {
    // Everything fitted: the fused op over the whole batch, as for resident experts.
    backend::cpu::FusedFfn(pool, pool.kernels(), xq, k, chosen, weights, view, n_embd, out);
    release();
    return absl::OkStatus();
  }
  run_subset();
  release();
  // FusedFfn's weighted sum, in slot order.
  pool.ParallelFor(static_cast<size_t>(xq.n()), [&](size_t t) {
    float* o = out + static_cast<int64_t>(t) * n_embd;
    bool first = true;
    for (int s = 0; s < k; ++s) {
      const int64_t pair = static_cast<int64_t>(t) * k + s;
      if (chosen[pair] < 0) continue;
      const float* y = pair_out.data() + pair * n_embd;
      if (std::exchange(first, false)) {
        for (int64_t j = 0; j < n_embd; ++j) o[j] = weights[pair] * y[j];
      } else {
        for (int64_t j = 0; j < n_embd; ++j) o[j] = o[j] + weights[pair] * y[j];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

MoeRoute RouteMoe(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n) {
  std::vector<float> logits(static_cast<size_t>(n * w.n_expert));
  MatMul(pool, w.router, x, n, logits.data());
  MoeRoute route;
  const int k = w.adaptive_router != nullptr ? w.adaptive_router->slots(w.n_used) : w.n_used;
  route.k = k;
  route.chosen.resize(static_cast<size_t>(n * k));
  route.weights.resize(static_cast<size_t>(n * k));
  int* chosen = route.chosen.data();
  float* weights = route.weights.data();
  if (w.adaptive_router != nullptr) {
    std::span<const uint64_t> resident;
    if (w.cache != nullptr) resident = w.cache->residency(w.layer);
    w.adaptive_router->Route(w.layer, logits.data(), n, w.n_used, w.renormalize, resident,
                             chosen, weights);
  } else {
    for (int64_t t = 0; t < n; ++t) {
      RouteToken(logits.data() + t * w.n_expert, w.n_expert, k, w.renormalize, chosen + t * k,
                 weights + t * k);
    }
  }
  if (w.route_observer != nullptr && *w.route_observer) {
    (*w.route_observer)(w.layer, n, k, chosen, weights);
  }
  if (w.prefetcher != nullptr) {
    w.prefetcher->OnRouted(w.layer, n, k, chosen);
    if (w.prefetch_router != nullptr) {
      // Speculative routing: the later layer's router on this layer's input.
      std::vector<float> predicted(static_cast<size_t>(n * w.prefetch_router->rows));
      MatMul(pool, *w.prefetch_router, x, n, predicted.data());
      w.prefetcher->Predict(w.prefetch_layer, predicted.data(), n);
    }
  }
  return route;
}

absl::StatusOr<std::vector<int>> AcquireRouted(const MoeWeights& w, const MoeRoute& route) {
  experts::ExpertCache& cache = *w.cache;
  const std::vector<int> distinct = DistinctByResidency(
      cache, w.layer, route.chosen.data(), static_cast<int64_t>(route.chosen.size()));
  if (w.prefetcher != nullptr) CancelUnwantedPrefetches(w, distinct);
  std::vector<int> pinned;
  size_t next = 0;
  const auto acquire_next = [&]() -> absl::Status {
    const int e = distinct[next++];
    absl::StatusOr<backend::FfnView> acquired = cache.Acquire(w.layer, e);
    if (!acquired.ok()) {
      for (int p : pinned) cache.Release(w.layer, p);
      return acquired.status();
    }
    pinned.push_back(e);
    return absl::OkStatus();
  };
  // The hits are pinned first (a miss's eviction cannot take them); with a prefetcher
  // the misses then start loading together, in order, as in PooledExperts.
  while (next < distinct.size() && cache.IsResident(w.layer, distinct[next])) {
    MOERT_RETURN_IF_ERROR(acquire_next());
  }
  if (w.prefetcher != nullptr) {
    for (size_t i = next; i < distinct.size(); ++i) {
      if (!cache.StartLoad(w.layer, distinct[i]) && !cache.IsResident(w.layer, distinct[i])) {
        break;  // no block without waiting: the rest load one by one below
      }
    }
  }
  while (next < distinct.size()) MOERT_RETURN_IF_ERROR(acquire_next());
  if (w.prefetcher != nullptr) w.prefetcher->Issue(w.prefetch_layer);
  return pinned;
}

absl::Status MoeFfn(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n,
                    float* out) {
  return RunMoeExperts(pool, w, x, n, RouteMoe(pool, w, x, n), out);
}

absl::Status RunMoeExperts(ThreadPool& pool, const MoeWeights& w, const float* x, int64_t n,
                           const MoeRoute& route, float* out) {
  const int64_t n_embd = w.router.cols;
  const int k = route.k;
  const int* chosen = route.chosen.data();
  const float* weights = route.weights.data();

  if (w.cache != nullptr || backend::cpu::CanFuse(PackedFfn(w.Gate(0), w.Up(0), w.Down(0)))) {
    // The integer kernels: x quantized once, each expert's gate/up/down fused.
    backend::cpu::A8Matrix xq;
    xq.Quantize(pool.kernels(), pool, x, n, n_embd);
    if (w.cache != nullptr) {
      MOERT_RETURN_IF_ERROR(
          PooledExperts(pool, w, xq, k, chosen, weights, n_embd, out));
    } else {
      backend::cpu::FusedFfn(
          pool, pool.kernels(), xq, k, chosen, weights,
          [&](int e) { return PackedFfn(w.Gate(e), w.Up(e), w.Down(e)); }, n_embd, out);
    }
    if (!w.shared.empty()) {
      std::vector<float> shared_out(static_cast<size_t>(n * n_embd));
      std::vector<float> gate_logit(static_cast<size_t>(n));
      SwiGluFfn(pool, w.shared, x, n, shared_out.data());
      MatMul(pool, w.shared_gate, x, n, gate_logit.data());
      for (int64_t t = 0; t < n; ++t) {
        const float g = Sigmoid(gate_logit[t]);
        for (int64_t i = 0; i < n_embd; ++i) {
          out[t * n_embd + i] += shared_out[t * n_embd + i] * g;
        }
      }
    }
    return absl::OkStatus();
  }

  // The (token, slot) pairs sorted by expert: expert e's group is rows
  // [first_row[e], first_row[e + 1]) of the gathered input, and each expert runs once
  // over its group. All experts (and the shared one) go to the threads together.
  // Empty slots (expert -1) get no row.
  std::vector<int64_t> first_row(static_cast<size_t>(w.n_expert) + 1, 0);
  for (int e : route.chosen) {
    if (e >= 0) ++first_row[e + 1];
  }
  for (int e = 0; e < w.n_expert; ++e) first_row[e + 1] += first_row[e];
  const int64_t n_rows = first_row[static_cast<size_t>(w.n_expert)];
  std::vector<int64_t> slot_of_row(static_cast<size_t>(n_rows));
  std::vector<int64_t> next(first_row.begin(), first_row.end() - 1);
  for (int64_t i = 0; i < n * k; ++i) {
    if (chosen[i] >= 0) slot_of_row[next[chosen[i]]++] = i;
  }

  const int64_t ff = w.n_ff;
  std::vector<float> xs(static_cast<size_t>(n_rows * n_embd));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* src = x + (slot_of_row[r] / k) * n_embd;
    std::copy(src, src + n_embd, xs.begin() + r * n_embd);
  }
  std::vector<float> gate(static_cast<size_t>(n_rows * ff)), up(gate.size());
  std::vector<float> down(xs.size());
  const bool has_shared = !w.shared.empty();
  const int64_t shared_ff = has_shared ? w.shared.gate.rows : 0;
  std::vector<float> shared_h(static_cast<size_t>(n * shared_ff));
  std::vector<float> shared_up(shared_h.size());
  std::vector<float> shared_out(has_shared ? static_cast<size_t>(n * n_embd) : 0);
  std::vector<float> gate_logit(has_shared ? static_cast<size_t>(n) : 0);

  std::vector<MatMulJob> jobs;
  for (int e = 0; e < w.n_expert; ++e) {
    const int64_t r = first_row[e], m = first_row[e + 1] - first_row[e];
    if (m == 0) continue;
    jobs.push_back({w.Gate(e), xs.data() + r * n_embd, m, gate.data() + r * ff});
    jobs.push_back({w.Up(e), xs.data() + r * n_embd, m, up.data() + r * ff});
  }
  if (has_shared) {
    jobs.push_back({w.shared.gate, x, n, shared_h.data()});
    jobs.push_back({w.shared.up, x, n, shared_up.data()});
    jobs.push_back({w.shared_gate, x, n, gate_logit.data()});
  }
  MatMuls(pool, jobs);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
  for (size_t i = 0; i < shared_h.size(); ++i) shared_h[i] = Silu(shared_h[i]) * shared_up[i];
  jobs.clear();
  for (int e = 0; e < w.n_expert; ++e) {
    const int64_t r = first_row[e], m = first_row[e + 1] - first_row[e];
    if (m == 0) continue;
    jobs.push_back({w.Down(e), gate.data() + r * ff, m, down.data() + r * n_embd});
  }
  if (has_shared) jobs.push_back({w.shared.down, shared_h.data(), n, shared_out.data()});
  MatMuls(pool, jobs);
  std::vector<float> expert_out(static_cast<size_t>(n * k * n_embd));
  for (int64_t r = 0; r < n_rows; ++r) {
    std::copy(down.begin() + r * n_embd, down.begin() + (r + 1) * n_embd,
              expert_out.begin() + slot_of_row[r] * n_embd);
  }

  // Weighted sum in routing order: w0 * e0 + w1 * e1 + ...
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * n_embd;
    bool first = true;
    for (int s = 0; s < k; ++s) {
      if (chosen[t * k + s] < 0) continue;
      const float ws = weights[t * k + s];
      const float* e = expert_out.data() + (t * k + s) * n_embd;
      if (std::exchange(first, false)) {
        for (int64_t i = 0; i < n_embd; ++i) o[i] = ws * e[i];
      } else {
        for (int64_t i = 0; i < n_embd; ++i) o[i] += ws * e[i];
      }
    }
  }

  if (has_shared) {
    for (int64_t t = 0; t < n; ++t) {
      const float g = Sigmoid(gate_logit[t]);
      for (int64_t i = 0; i < n_embd; ++i) {
        out[t * n_embd + i] += shared_out[t * n_embd + i] * g;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moert::model
