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

typedef float V4 __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// R weight rows times C input vectors: R * C dot products of length k. Each one keeps
// its own two partial sums and reduces them like Dot(), so a value is the same
// whichever block shape computed it. out is [R][C].
template <int R, int C>
inline void DotBlock(const float* const* w, const float* const* x, int64_t k, float* out) {
  V4 acc0[R][C];
  V4 acc1[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      acc0[r][c] = V4{0, 0, 0, 0};
      acc1[r][c] = V4{0, 0, 0, 0};
    }
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    V4 xa[C];
    V4 xb[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      xa[c] = Load4(x[c] + i);
      xb[c] = Load4(x[c] + i + 4);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const V4 wa = Load4(w[r] + i);
      const V4 wb = Load4(w[r] + i + 4);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        acc0[r][c] += wa * xa[c];
        acc1[r][c] += wb * xb[c];
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const V4 s = acc0[r][c] + acc1[r][c];
      float v = (s[0] + s[1]) + (s[2] + s[3]);
      for (int64_t j = i; j < k; ++j) v += w[r][j] * x[c][j];
      out[r * C + c] = v;
    }
  }
}

// Rows [r0, r1) of w against tokens [t0, t1) of x, in blocks of R rows by C tokens
// where they fit and single dot products at the edges. y is [n][ldy].
template <int R, int C>
void MatMulTile(MatrixView w, const float* x, int64_t t0, int64_t t1, int64_t r0, int64_t r1,
                float* y, int64_t ldy) {
  const int64_t k = w.cols;
  float out[R * C];
  int64_t t = t0;
  for (; t + C <= t1; t += C) {
    const float* xs[C];
    for (int c = 0; c < C; ++c) xs[c] = x + (t + c) * k;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
      const float* ws[R];
      for (int i = 0; i < R; ++i) ws[i] = w.data + (r + i) * k;
      DotBlock<R, C>(ws, xs, k, out);
      for (int i = 0; i < R; ++i) {
        for (int c = 0; c < C; ++c) y[(t + c) * ldy + r + i] = out[i * C + c];
      }
    }
    for (; r < r1; ++r) {
      const float* ws[1] = {w.data + r * k};
      DotBlock<1, C>(ws, xs, k, out);
      for (int c = 0; c < C; ++c) y[(t + c) * ldy + r] = out[c];
    }
  }
  for (; t < t1; ++t) {
    const float* xs[1] = {x + t * k};
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      const float* ws[4] = {w.data + r * k, w.data + (r + 1) * k, w.data + (r + 2) * k,
                            w.data + (r + 3) * k};
      DotBlock<4, 1>(ws, xs, k, out);
      for (int i = 0; i < 4; ++i) y[t * ldy + r + i] = out[i];
    }
    for (; r < r1; ++r) {
      const float* ws[1] = {w.data + r * k};
      DotBlock<1, 1>(ws, xs, k, out);
      y[t * ldy + r] = out[0];
    }
  }
}

// Enough rows per task to amortise the dispatch, few enough to spread a decode step
// over the threads.
constexpr int64_t kRowsPerTask = 16;

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  const float* as[1] = {a};
  const float* bs[1] = {b};
  float out;
  DotBlock<1, 1>(as, bs, n, &out);
  return out;
}

void MatMul(ThreadPool& pool, MatrixView w, const float* x, int64_t n, float* y) {
  const MatMulJob job{w, x, n, y};
  MatMuls(pool, {&job, 1});
}

namespace {

void FloatMatMuls(ThreadPool& pool, std::span<const MatMulJob> jobs) {
  // Task i of the dispatch is row tile i - first_task[j] of job j.
  std::vector<size_t> first_task(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t tiles = jobs[j].n > 0 ? (jobs[j].w.rows + kRowsPerTask - 1) / kRowsPerTask : 0;
    first_task[j + 1] = first_task[j] + static_cast<size_t>(tiles);
  }
  pool.ParallelFor(first_task.back(), [&](size_t task) {
    const size_t j =
        static_cast<size_t>(std::upper_bound(first_task.begin(), first_task.end(), task) -
                            first_task.begin()) -
        1;
    const MatMulJob& job = jobs[j];
    const int64_t r0 = static_cast<int64_t>(task - first_task[j]) * kRowsPerTask;
    const int64_t r1 = std::min(job.w.rows, r0 + kRowsPerTask);
    // 2 rows x 2 tokens reuses each load twice and keeps 8 accumulators in registers.
    MatMulTile<2, 2>(job.w, job.x, 0, job.n, r0, r1, job.y, job.w.rows);
  });
}

}  // namespace

void MatMuls(ThreadPool& pool, std::span<const MatMulJob> jobs) {
  std::vector<MatMulJob> float_jobs;
  std::vector<backend::QMatMulJob> packed_jobs;
  // One A8 copy per distinct input (q/k/v share theirs).
  std::vector<std::unique_ptr<backend::A8Matrix>> inputs;
  std::vector<const float*> input_of;
  for (const MatMulJob& job : jobs) {
    if (job.n == 0) continue;
    if (job.w.data != nullptr || job.w.packed.empty()) {
      float_jobs.push_back(job);
      continue;
    }
    size_t i = 0;
    while (i < input_of.size() && !(input_of[i] == job.x && inputs[i]->n() == job.n &&
                                     inputs[i]->k() == job.w.cols)) {
      ++i;
    }
    if (i == input_of.size()) {
      inputs.push_back(std::make_unique<backend::A8Matrix>());
      inputs.back()->Quantize(pool.kernels(), pool, job.x, job.n, job.w.cols);
      input_of.push_back(job.x);
    }
    packed_jobs.push_back({job.w.packed, inputs[i].get(), job.y});
  }
  if (!packed_jobs.empty()) backend::QMatMuls(pool, pool.kernels(), packed_jobs);
  if (!float_jobs.empty()) FloatMatMuls(pool, float_jobs);
}

void RmsNorm(const float* x, int64_t n_rows, int64_t width, const float* weight, float eps,
             float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * width;
    float* yr = y + r * width;
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(width));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < width; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

void AddBias(const std::vector<float>& b, int64_t n, float* y) {
  const int64_t width = static_cast<int64_t>(b.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < width; ++i) y[t * width + i] += b[i];
  }
}

void ApplyRope(const RopeParams& rope, int64_t pos0, int64_t n, int n_heads, int head_dim,
               float* x) {
  const int half = rope.n_rot / 2;
  // Frequencies as a running product in float, the way ggml computes them, so the
  // angles agree with llama.cpp's to the last bit.
  const float theta_scale = std::pow(rope.theta_base, -2.0f / static_cast<float>(rope.n_rot));
  std::vector<float> cos_theta(half), sin_theta(half);
  for (int64_t t = 0; t < n; ++t) {
    float theta = static_cast<float>(pos0 + t);
    for (int i = 0; i < half; ++i) {
      const float ff = rope.freq_factors != nullptr ? rope.freq_factors[i] : 1.0f;
      const float angle = rope.freq_scale * (theta / ff);
      cos_theta[i] = std::cos(angle);
      sin_theta[i] = std::sin(angle);
      theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int i0 = rope.layout == format::RopeLayout::kNormal ? 2 * i : i;
        const int i1 = rope.layout == format::RopeLayout::kNormal ? 2 * i + 1 : i + half;
        const float x0 = v[i0];
        const float x1 = v[i1];
        v[i0] = x0 * cos_theta[i] - x1 * sin_theta[i];
        v[i1] = x0 * sin_theta[i] + x1 * cos_theta[i];
      }
    }
  }
}

void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const float* k_cache, const float* v_cache, float* out) {
  const int64_t dk = shape.head_dim_k;
  const int64_t dv = shape.head_dim_v;
  const int64_t k_row = int64_t{shape.n_head_kv} * dk;
  const int64_t v_row = int64_t{shape.n_head_kv} * dv;
  const int group = shape.n_head / shape.n_head_kv;
  pool.ParallelFor(static_cast<size_t>(n * shape.n_head), [&](size_t task) {
    const int64_t t = static_cast<int64_t>(task) / shape.n_head;
    const int h = static_cast<int>(static_cast<int64_t>(task) % shape.n_head);
    const int g = h / group;
    const int64_t n_kv = pos0 + t + 1;  // causal: positions 0 .. pos0 + t
    const float* qh = q + (t * shape.n_head + h) * dk;
    std::vector<float> p(static_cast<size_t>(n_kv));
    // Scores against keys k_row apart, four at a time like a matmul's rows.
    const float* keys = k_cache + g * dk;
    const float* xs[1] = {qh};
    int64_t j = 0;
    float s4[4];
    for (; j + 4 <= n_kv; j += 4) {
      const float* ws[4] = {keys + j * k_row, keys + (j + 1) * k_row, keys + (j + 2) * k_row,
                            keys + (j + 3) * k_row};
      DotBlock<4, 1>(ws, xs, dk, s4);
      for (int i = 0; i < 4; ++i) p[j + i] = s4[i] * shape.scale;
    }
    for (; j < n_kv; ++j) p[j] = Dot(keys + j * k_row, qh, dk) * shape.scale;
    float max = p[0];
    for (int64_t i = 1; i < n_kv; ++i) max = std::max(max, p[i]);
    double sum = 0;
    for (int64_t i = 0; i < n_kv; ++i) {
      p[i] = std::exp(p[i] - max);
      sum += p[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* o = out + (t * shape.n_head + h) * dv;
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < n_kv; ++i) {
      const float w = p[i] * inv;
      const float* vr = v_cache + i * v_row + g * dv;
      for (int64_t d = 0; d < dv; ++d) o[d] += w * vr[d];
    }
  });
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

namespace {

// The fused op's view of packed FFN weights (empty views when not packed).
backend::FfnView PackedFfn(MatrixView gate, MatrixView up, MatrixView down) {
  return {gate.packed, up.packed, down.packed};
}

}  // namespace

void SwiGluFfn(ThreadPool& pool, const FfnWeights& w, const float* x, int64_t n, float* out) {
  const backend::FfnView fused = PackedFfn(w.gate, w.up, w.down);
  if (backend::CanFuse(fused)) {
    backend::A8Matrix xq;
    xq.Quantize(pool.kernels(), pool, x, n, w.gate.cols);
    backend::FusedFfn(pool, pool.kernels(), xq, 1, nullptr, nullptr,
                      [&](int) { return fused; }, w.down.rows, out);
    return;
  }
  const int64_t ff = w.gate.rows;
  std::vector<float> gate(static_cast<size_t>(n * ff)), up(static_cast<size_t>(n * ff));
  const MatMulJob jobs[2] = {{w.gate, x, n, gate.data()}, {w.up, x, n, up.data()}};
  MatMuls(pool, jobs);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = Silu(gate[i]) * up[i];
  MatMul(pool, w.down, gate.data(), n, out);
}

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
absl::Status PooledExperts(ThreadPool& pool, const MoeWeights& w, const backend::A8Matrix& xq,
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
    backend::A8Matrix xg;
    xg.Gather(xq, rows);
    std::vector<float> y(pair_ids.size() * static_cast<size_t>(n_embd));
    backend::FusedFfn(pool, pool.kernels(), xg, 1, expert_of.data(), nullptr, view, n_embd,
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
    backend::FusedFfn(pool, pool.kernels(), xq, k, chosen, weights, view, n_embd, out);
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

  if (w.cache != nullptr || backend::CanFuse(PackedFfn(w.Gate(0), w.Up(0), w.Down(0)))) {
    // The integer kernels: x quantized once, each expert's gate/up/down fused.
    backend::A8Matrix xq;
    xq.Quantize(pool.kernels(), pool, x, n, n_embd);
    if (w.cache != nullptr) {
      MOERT_RETURN_IF_ERROR(
          PooledExperts(pool, w, xq, k, chosen, weights, n_embd, out));
    } else {
      backend::FusedFfn(
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
