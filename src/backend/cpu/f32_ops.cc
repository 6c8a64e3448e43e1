// The CPU backend's fp32 ops (see f32_ops.h): portable fp32 code, vectorised through
// 4-lane GCC/clang vector types (SSE on x86-64, NEON on AArch64) rather than
// -ffast-math, so the order of every sum is the one written here; the matmuls run on
// the f32 GEMM kernels (kernels/f32-gemm/), whose order ukernel.h fixes.
#include "backend/cpu/f32_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>

#include "backend/cpu/kv_rows.h"
#include "backend/cpu/qmatmul.h"
#include "core/fp16.h"
#include "kernels/f32-gemm/f32-dot.h"

namespace moert::backend::cpu {
namespace {

// The reference dot products (their order: kernels/ukernel.h's f32 GEMM), in portable
// 4-lane vectors.
template <int R, int C>
inline void DotBlock(const float* const* w, const float* const* x, int64_t k, float* out) {
  kernels::f32::DotBlock<R, C, kernels::f32::Lanes4x2>(w, x, static_cast<size_t>(k), out);
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
    // The f32 GEMM kernel of the pool's ISA: the same bits on every ISA (ukernel.h).
    pool.kernels().f32_gemm.gemm(static_cast<size_t>(job.w.cols), job.w.data,
                                 static_cast<size_t>(job.w.cols), static_cast<size_t>(r0),
                                 static_cast<size_t>(r1), job.x, static_cast<size_t>(job.n), job.y,
                                 static_cast<size_t>(job.w.rows));
  });
}

}  // namespace

void MatMuls(ThreadPool& pool, std::span<const MatMulJob> jobs) {
  std::vector<MatMulJob> float_jobs;
  std::vector<QMatMulJob> packed_jobs;
  // One A8 copy per distinct input (q/k/v share theirs).
  std::vector<std::unique_ptr<A8Matrix>> inputs;
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
      inputs.push_back(std::make_unique<A8Matrix>());
      inputs.back()->Quantize(pool.kernels(), pool, job.x, job.n, job.w.cols);
      input_of.push_back(job.x);
    }
    packed_jobs.push_back({job.w.packed, inputs[i].get(), job.y});
  }
  if (!packed_jobs.empty()) QMatMuls(pool, pool.kernels(), packed_jobs);
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
  AddBias(b.data(), static_cast<int64_t>(b.size()), n, y);
}

void AddBias(const float* b, int64_t width, int64_t n, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < width; ++i) y[t * width + i] += b[i];
  }
}

void LayerNorm(const float* x, int64_t n_rows, int64_t width, const float* weight,
               const float* bias, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * width;
    float* yr = y + r * width;
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(width));
    double sum2 = 0;
    for (int64_t i = 0; i < width; ++i) {
      const float v = xr[i] - mean;
      yr[i] = v;
      sum2 += static_cast<double>(v * v);
    }
    const float variance = static_cast<float>(sum2 / static_cast<double>(width));
    const float scale = 1.0f / std::sqrt(variance + eps);
    for (int64_t i = 0; i < width; ++i) {
      const float v = (yr[i] * scale) * weight[i];
      yr[i] = bias != nullptr ? v + bias[i] : v;
    }
  }
}

namespace {

// p[0, n) = softmax(p) in place, max-subtracted, the sum in double (the reference
// path's steps), then scaled by the inverse of the sum.
void SoftmaxInPlace(float* p, int64_t n) {
  float max = p[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, p[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - max);
    sum += p[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

}  // namespace

void Softmax(const float* x, int64_t n_rows, int64_t width, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* yr = y + r * width;
    if (yr != x + r * width) std::copy(x + r * width, x + (r + 1) * width, yr);
    SoftmaxInPlace(yr, width);
  }
}

float Gelu(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  // ggml's table: its entry for half(x) is half(gelu(half(x))).
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefA = 0.044715f;
  const float h = core::Fp16ToFloat(core::FloatToFp16(x));
  const float g = 0.5f * h * (1.0f + std::tanh(kSqrt2OverPi * h * (1.0f + kCoefA * h * h)));
  return core::Fp16ToFloat(core::FloatToFp16(g));
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

KvRows F32Rows(const float* rows, int64_t width) {
  return {reinterpret_cast<const uint8_t*>(rows), KvType::kF32, static_cast<size_t>(width) * 4};
}

void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const float* k_cache, const float* v_cache, float* out) {
  Attention(pool, shape, q, n, pos0, F32Rows(k_cache, int64_t{shape.n_head_kv} * shape.head_dim_k),
            F32Rows(v_cache, int64_t{shape.n_head_kv} * shape.head_dim_v), out);
}

namespace {

// Queries per task of a prefill: one f32 GEMM scores them all against the head's keys.
constexpr int64_t kAttentionQueryBlock = 16;
// Rows of a typed cache widened at a time: a task's buffer stays this many rows long
// however long the context.
constexpr int64_t kWidenRows = 128;

// Rows [j0, j1) of one KV head's slice of a cache as fp32 rows `stride` floats apart: an
// fp32 cache's in place, a typed one's widened into `buffer`.
const float* HeadRows(const kernels::KvWidenConfig& widen, const KvRows& rows, int64_t offset,
                      int64_t dim, int64_t j0, int64_t j1, std::vector<float>& buffer,
                      size_t* stride) {
  if (rows.type == KvType::kF32) {
    *stride = rows.row_bytes / sizeof(float);
    return reinterpret_cast<const float*>(rows.data + static_cast<size_t>(j0) * rows.row_bytes) +
           offset;
  }
  buffer.resize(static_cast<size_t>((j1 - j0) * dim));
  for (int64_t j = j0; j < j1; ++j) {
    DecodeKvValues(widen, rows.type, rows.data + static_cast<size_t>(j) * rows.row_bytes, offset,
                   dim, buffer.data() + (j - j0) * dim);
  }
  *stride = static_cast<size_t>(dim);
  return buffer.data();
}

// How many rows a pass over a cache's rows takes: all of an fp32 cache's (read in
// place), kWidenRows of a typed one's.
int64_t RowsPerPass(const KvRows& rows, int64_t n) {
  return rows.type == KvType::kF32 ? std::max<int64_t>(n, 1) : kWidenRows;
}

}  // namespace

void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const KvRows& k_cache, const KvRows& v_cache, float* out) {
  const int64_t dk = shape.head_dim_k;
  const int64_t dv = shape.head_dim_v;
  const int group = shape.n_head / shape.n_head_kv;
  const bool causal = shape.n_kv <= 0;
  // Keys query t reads: positions 0 .. pos0 + t (causal) or every key.
  const auto keys_of = [&](int64_t t) { return causal ? pos0 + t + 1 : shape.n_kv; };
  // One task per (head, block of queries): a decode step's n_head tasks of one query.
  // The block's scores are f32 GEMMs over the head's key rows (ukernel.h: each dot
  // product's bits do not depend on the block), its outputs the weighted sums of the
  // value rows (f32 wsum: each element adds the rows in order, whatever the passes), so
  // a query's output has the same bits whatever block, thread count or ISA computed it.
  const int64_t blocks = (n + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  const kernels::KernelConfig& kernels = pool.kernels();
  pool.ParallelFor(static_cast<size_t>(blocks * shape.n_head), [&](size_t task) {
    const int h = static_cast<int>(static_cast<int64_t>(task) % shape.n_head);
    const int64_t t0 = static_cast<int64_t>(task) / shape.n_head * kAttentionQueryBlock;
    const int64_t t1 = std::min(n, t0 + kAttentionQueryBlock);
    const int g = h / group;
    const int64_t n_keys = keys_of(t1 - 1);  // the most any query of the block reads
    // The task's scratch, kept per thread: a decode step runs n_head tasks per layer.
    thread_local std::vector<float> widened, queries, scores;
    // The GEMM reads the queries as rows of dk floats: one in place, more copied.
    const float* x = q + (t0 * shape.n_head + h) * dk;
    if (t1 - t0 > 1) {
      queries.resize(static_cast<size_t>((t1 - t0) * dk));
      for (int64_t t = t0; t < t1; ++t) {
        std::memcpy(queries.data() + (t - t0) * dk, q + (t * shape.n_head + h) * dk,
                    static_cast<size_t>(dk) * sizeof(float));
      }
      x = queries.data();
    }
    scores.resize(static_cast<size_t>((t1 - t0) * n_keys));
    const int64_t k_pass = RowsPerPass(k_cache, n_keys);
    for (int64_t j0 = 0; j0 < n_keys; j0 += k_pass) {
      const int64_t j1 = std::min(n_keys, j0 + k_pass);
      size_t stride = 0;
      const float* keys = HeadRows(kernels.kv_widen, k_cache, g * dk, dk, j0, j1, widened, &stride);
      kernels.f32_gemm.gemm(static_cast<size_t>(dk), keys, stride, 0, static_cast<size_t>(j1 - j0),
                            x, static_cast<size_t>(t1 - t0), scores.data() + j0,
                            static_cast<size_t>(n_keys));
    }
    for (int64_t t = t0; t < t1; ++t) {
      float* p = scores.data() + (t - t0) * n_keys;
      const int64_t n_kv = keys_of(t);
      for (int64_t j = 0; j < n_kv; ++j) p[j] *= shape.scale;
      SoftmaxInPlace(p, n_kv);
      float* o = out + (t * shape.n_head + h) * dv;
      std::fill(o, o + dv, 0.0f);
    }
    const int64_t v_pass = RowsPerPass(v_cache, n_keys);
    for (int64_t j0 = 0; j0 < n_keys; j0 += v_pass) {
      const int64_t j1 = std::min(n_keys, j0 + v_pass);
      size_t stride = 0;
      const float* values =
          HeadRows(kernels.kv_widen, v_cache, g * dv, dv, j0, j1, widened, &stride);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rows = std::min(keys_of(t), j1) - j0;  // this query's keys in the pass
        if (rows <= 0) continue;
        kernels.f32_wsum.wsum(static_cast<size_t>(rows), scores.data() + (t - t0) * n_keys + j0,
                              values, stride, static_cast<size_t>(dv),
                              out + (t * shape.n_head + h) * dv);
      }
    }
  });
}

void AttentionEntropy(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
                      const float* k, float* entropy) {
  AttentionEntropy(pool, shape, q, n, F32Rows(k, int64_t{shape.n_head_kv} * shape.head_dim_k),
                   entropy);
}

void AttentionEntropy(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
                      const KvRows& k, float* entropy) {
  const int64_t dk = shape.head_dim_k;
  const int group = shape.n_head / shape.n_head_kv;
  const int64_t n_kv = shape.n_kv;
  pool.ParallelFor(static_cast<size_t>(n * shape.n_head), [&](size_t task) {
    const int64_t t = static_cast<int64_t>(task) / shape.n_head;
    const int h = static_cast<int>(static_cast<int64_t>(task) % shape.n_head);
    const float* qh = q + (t * shape.n_head + h) * dk;
    thread_local std::vector<float> widened;
    std::vector<float> s(static_cast<size_t>(n_kv));
    float max = -std::numeric_limits<float>::infinity();
    const int64_t pass = RowsPerPass(k, n_kv);
    for (int64_t j0 = 0; j0 < n_kv; j0 += pass) {
      const int64_t j1 = std::min(n_kv, j0 + pass);
      size_t stride = 0;
      const float* keys =
          HeadRows(pool.kernels().kv_widen, k, (h / group) * dk, dk, j0, j1, widened, &stride);
      for (int64_t j = j0; j < j1; ++j) {
        s[j] = Dot(keys + static_cast<size_t>(j - j0) * stride, qh, dk) * shape.scale;
        max = std::max(max, s[j]);
      }
    }
    // H = ln Z - sum_j p_j (s_j - max), Z = sum_j exp(s_j - max).
    double z = 0, weighted = 0;
    for (int64_t j = 0; j < n_kv; ++j) {
      const double d = static_cast<double>(s[j]) - max;
      const double e = std::exp(d);
      z += e;
      weighted += e * d;
    }
    entropy[task] = static_cast<float>(std::log(z) - weighted / z);
  });
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

namespace {

// The fused op's view of packed FFN weights (empty views when not packed).
FfnView PackedFfn(MatrixView gate, MatrixView up, MatrixView down) {
  return {gate.packed, up.packed, down.packed};
}

}  // namespace

void SwiGluFfn(ThreadPool& pool, const FfnWeights& w, const float* x, int64_t n, float* out) {
  const FfnView fused = PackedFfn(w.gate, w.up, w.down);
  if (CanFuse(fused)) {
    A8Matrix xq;
    xq.Quantize(pool.kernels(), pool, x, n, w.gate.cols);
    FusedFfn(pool, pool.kernels(), xq, 1, nullptr, nullptr,
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


void RouteToken(const float* router_logits, int n_expert, int n_used, bool renormalize,
                int* experts, float* weights) {
  std::vector<float> p(static_cast<size_t>(n_expert));
  Softmax(router_logits, 1, n_expert, p.data());
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

}  // namespace moert::backend::cpu
