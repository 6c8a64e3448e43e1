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
                                 static_cast<size_t>(r0), static_cast<size_t>(r1), job.x,
                                 static_cast<size_t>(job.n), job.y,
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

namespace {

// o[d] = o[d] + w * v[d] for d < n: the scalar loop's operations, element for element
// (no fused multiply-add), four lanes at a time.
void AddScaledRow(float w, const float* v, int64_t n, float* o) {
  using kernels::f32::V4;
  const V4 wv = {w, w, w, w};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4) {
    V4 acc = kernels::f32::Load4(o + d);
    acc += wv * kernels::f32::Load4(v + d);
    std::memcpy(o + d, &acc, sizeof(acc));
  }
  for (; d < n; ++d) o[d] += w * v[d];
}

// One KV head's slices of a cache's rows as floats: an fp32 cache's in place, a typed
// one's widened into the task's buffer (`slot` of up to 4 slices, so DotBlock reads
// four keys at once).
class HeadSlices {
 public:
  // The slices of `dim` values starting `offset` values into each row; `buffer` holds
  // 4 * dim floats where the cache is typed.
  HeadSlices(const KvRows& rows, int64_t offset, int64_t dim, float* buffer)
      : rows_(rows), offset_(offset), dim_(dim), buffer_(buffer) {}
  // Whether Get needs a buffer, and how many floats of it.
  static size_t BufferFloats(const KvRows& rows, int64_t dim, int slots) {
    return rows.type == KvType::kF32 ? 0 : static_cast<size_t>(dim * slots);
  }
  const float* Get(int64_t j, int slot) const {
    const uint8_t* row = rows_.data + static_cast<size_t>(j) * rows_.row_bytes;
    if (rows_.type == KvType::kF32) return reinterpret_cast<const float*>(row) + offset_;
    float* out = buffer_ + slot * dim_;
    DecodeKvValues(rows_.type, row, offset_, dim_, out);
    return out;
  }

 private:
  KvRows rows_;
  int64_t offset_, dim_;
  float* buffer_;
};

}  // namespace

KvRows F32Rows(const float* rows, int64_t width) {
  return {reinterpret_cast<const uint8_t*>(rows), KvType::kF32, static_cast<size_t>(width) * 4};
}

void Attention(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t n,
               int64_t pos0, const float* k_cache, const float* v_cache, float* out) {
  Attention(pool, shape, q, n, pos0, F32Rows(k_cache, int64_t{shape.n_head_kv} * shape.head_dim_k),
            F32Rows(v_cache, int64_t{shape.n_head_kv} * shape.head_dim_v), out);
}

namespace {

// Queries per task of a prefill: their scores against a head's keys are one f32 GEMM
// over a contiguous copy of those keys, which each task makes once.
constexpr int64_t kAttentionQueryBlock = 16;

// out = sum_i w[i] * v(i) over i in [0, n) for dv values, where v(i) points at value
// row i's slice: each output element summed in the order of i from 0.0f, a float
// multiply then an add (AddScaledRow's operations, so the bits of a zero-filled out
// with AddScaledRow over the rows), 32 elements at a time held in registers.
template <typename ValueRow>
void WeightedValueSum(const float* w, int64_t n, int64_t dv, const ValueRow& v, float* out) {
  using kernels::f32::V4;
  constexpr int64_t kChunk = 32;
  int64_t d = 0;
  for (; d + kChunk <= dv; d += kChunk) {
    V4 acc[kChunk / 4];
    for (V4& a : acc) a = V4{0, 0, 0, 0};
    for (int64_t i = 0; i < n; ++i) {
      const V4 wv = {w[i], w[i], w[i], w[i]};
      const float* row = v(i) + d;
#pragma GCC unroll 8
      for (int64_t c = 0; c < kChunk / 4; ++c) acc[c] += wv * kernels::f32::Load4(row + 4 * c);
    }
    std::memcpy(out + d, acc, sizeof(acc));
  }
  if (d < dv) {
    std::fill(out + d, out + dv, 0.0f);
    for (int64_t i = 0; i < n; ++i) AddScaledRow(w[i], v(i) + d, dv - d, out + d);
  }
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
  if (n == 1) {
    // Decode: one task per head, scores against the keys in place, four at a time.
    const size_t k_floats = HeadSlices::BufferFloats(k_cache, dk, 4);
    const size_t v_floats = HeadSlices::BufferFloats(v_cache, dv, 1);
    pool.ParallelFor(static_cast<size_t>(shape.n_head), [&](size_t task) {
      const int h = static_cast<int>(task);
      const int g = h / group;
      const int64_t n_kv = keys_of(0);
      const float* qh = q + h * dk;
      // The task's scratch, kept per thread: a decode step runs n_head tasks per layer.
      thread_local std::vector<float> p, widened;
      p.resize(static_cast<size_t>(n_kv));
      widened.resize(k_floats + v_floats);
      const HeadSlices keys(k_cache, g * dk, dk, widened.data());
      const HeadSlices values(v_cache, g * dv, dv, widened.data() + k_floats);
      const float* xs[1] = {qh};
      int64_t j = 0;
      float s4[4];
      for (; j + 4 <= n_kv; j += 4) {
        const float* ws[4] = {keys.Get(j, 0), keys.Get(j + 1, 1), keys.Get(j + 2, 2),
                              keys.Get(j + 3, 3)};
        DotBlock<4, 1>(ws, xs, dk, s4);
        for (int i = 0; i < 4; ++i) p[j + i] = s4[i] * shape.scale;
      }
      for (; j < n_kv; ++j) p[j] = Dot(keys.Get(j, 0), qh, dk) * shape.scale;
      SoftmaxInPlace(p.data(), n_kv);
      float* o = out + h * dv;
      if (v_cache.type == KvType::kF32) {
        WeightedValueSum(p.data(), n_kv, dv, [&](int64_t i) { return values.Get(i, 0); }, o);
      } else {
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < n_kv; ++i) AddScaledRow(p[i], values.Get(i, 0), dv, o);
      }
    });
    return;
  }
  // Prefill (or an unmasked attention): one task per (head, block of queries). The
  // block's keys are copied (widened) into contiguous rows and its scores are one f32
  // GEMM, whose dot products have DotBlock's bits (kernels/ukernel.h), so a query's
  // output is the decode path's to the bit.
  const int64_t blocks = (n + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  const kernels::KernelConfig& kernels = pool.kernels();
  pool.ParallelFor(static_cast<size_t>(blocks * shape.n_head), [&](size_t task) {
    const int h = static_cast<int>(static_cast<int64_t>(task) % shape.n_head);
    const int64_t t0 = static_cast<int64_t>(task) / shape.n_head * kAttentionQueryBlock;
    const int64_t t1 = std::min(n, t0 + kAttentionQueryBlock);
    const int g = h / group;
    const int64_t n_keys = keys_of(t1 - 1);  // the most any query of the block reads
    thread_local std::vector<float> keys, values, queries, scores;
    keys.resize(static_cast<size_t>(n_keys * dk));
    queries.resize(static_cast<size_t>((t1 - t0) * dk));
    scores.resize(static_cast<size_t>((t1 - t0) * n_keys));
    for (int64_t j = 0; j < n_keys; ++j) {
      const uint8_t* row = k_cache.data + static_cast<size_t>(j) * k_cache.row_bytes;
      float* dst = keys.data() + j * dk;
      if (k_cache.type == KvType::kF32) {
        std::memcpy(dst, reinterpret_cast<const float*>(row) + g * dk,
                    static_cast<size_t>(dk) * sizeof(float));
      } else {
        DecodeKvValues(k_cache.type, row, g * dk, dk, dst);
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      std::memcpy(queries.data() + (t - t0) * dk, q + (t * shape.n_head + h) * dk,
                  static_cast<size_t>(dk) * sizeof(float));
    }
    kernels.f32_gemm.gemm(static_cast<size_t>(dk), keys.data(), 0, static_cast<size_t>(n_keys),
                          queries.data(), static_cast<size_t>(t1 - t0), scores.data(),
                          static_cast<size_t>(n_keys));
    // Values in place (fp32) or widened once for the block.
    const float* value_rows = nullptr;
    size_t value_stride = 0;
    if (v_cache.type == KvType::kF32) {
      value_rows = reinterpret_cast<const float*>(v_cache.data) + g * dv;
      value_stride = v_cache.row_bytes / sizeof(float);
    } else {
      values.resize(static_cast<size_t>(n_keys * dv));
      for (int64_t j = 0; j < n_keys; ++j) {
        DecodeKvValues(v_cache.type, v_cache.data + static_cast<size_t>(j) * v_cache.row_bytes,
                       g * dv, dv, values.data() + j * dv);
      }
      value_rows = values.data();
      value_stride = static_cast<size_t>(dv);
    }
    const auto value = [&](int64_t i) { return value_rows + static_cast<size_t>(i) * value_stride; };
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_kv = keys_of(t);
      float* p = scores.data() + (t - t0) * n_keys;
      for (int64_t j = 0; j < n_kv; ++j) p[j] *= shape.scale;
      SoftmaxInPlace(p, n_kv);
      WeightedValueSum(p, n_kv, dv, value, out + (t * shape.n_head + h) * dv);
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
  const size_t k_floats = HeadSlices::BufferFloats(k, dk, 1);
  pool.ParallelFor(static_cast<size_t>(n * shape.n_head), [&](size_t task) {
    const int64_t t = static_cast<int64_t>(task) / shape.n_head;
    const int h = static_cast<int>(static_cast<int64_t>(task) % shape.n_head);
    const float* qh = q + (t * shape.n_head + h) * dk;
    std::vector<float> widened(k_floats);
    const HeadSlices keys(k, (h / group) * dk, dk, widened.data());
    std::vector<float> s(static_cast<size_t>(n_kv));
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_kv; ++j) {
      s[j] = Dot(keys.Get(j, 0), qh, dk) * shape.scale;
      max = std::max(max, s[j]);
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
