// The backend conformance suite (ggml's test-backend-ops in spirit): every op of the
// Backend interface (backend.h, kAllOps) on every backend this build registers
// (registry.h), run on the same inputs on the backend under test and on a separate
// CPU backend (the reference), and the results compared. A newly registered backend
// joins by its registry entry alone. The CPU instance runs on 2 threads against the
// 1-thread reference and, so that it is not compared only with itself, every backend
// is also checked against naive double-precision formulas written here.
//
// Bounds against the CPU reference (NMSE, as tests/backend/opencl_test.cc explains):
// matmul (packed and fp32/fp16 weights), RMSNorm, LayerNorm, RoPE, softmax,
// attention (over every KV cache type), top-k weights: 1e-10; fused MoE: 1e-6; top-k
// expert ids, gather, add, add_bias, store_half, store_kv: equal; silu_mul,
// moe_combine, gated_add: 1e-12; GELU: one half ulp.
// Against the naive formulas: relative 1e-5 of each value's error scale (for a sum,
// the sum of the magnitudes of its terms).
//
// An op (or weight type) a backend does not Support is skipped by name, and calling
// it anyway must be Unimplemented. A backend that cannot be opened skips, except
// where MOERT_REQUIRE_OPENCL=1 (the host build), where that fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/xnnpack_f32.h"
#include "backend/matrix.h"
#include "backend/packing.h"
#include "backend/registry.h"
#include "common/nmse.h"
#include "core/fp16.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/ggml_types.h"

namespace moert::backend {
namespace {

using Floats = std::vector<float>;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaiveRel = 1e-5;

bool RequireEveryBackend() {
  const char* v = std::getenv("MOERT_REQUIRE_OPENCL");
  return v != nullptr && std::string(v) == "1";
}

Floats RandomFloats(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, scale);
  Floats v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

float RoundToHalf(float x) { return core::Fp16ToFloat(core::FloatToFp16(x)); }

// --- Moving tensors in and out of a backend.

// A buffer of `v` starting `at` bytes in (the bytes before it unwritten).
template <typename T>
absl::StatusOr<std::unique_ptr<Buffer>> Put(Backend& b, const std::vector<T>& v, size_t at = 0) {
  const size_t bytes = at + v.size() * sizeof(T);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, b.Allocate(std::max<size_t>(bytes, 4)));
  if (!v.empty()) {
    MOERT_RETURN_IF_ERROR(b.Write(TensorRef(buffer, at), v.data(), v.size() * sizeof(T)));
  }
  return buffer;
}

// An output of `count` floats, NaN until an op writes it (so an unwritten value fails
// every comparison).
absl::StatusOr<std::unique_ptr<Buffer>> Output(Backend& b, size_t count, size_t at = 0) {
  return Put(b, Floats(count, kNan), at);
}

template <typename T>
absl::StatusOr<std::vector<T>> Get(Backend& b, TensorRef ref, size_t count) {
  std::vector<T> v(count);
  MOERT_RETURN_IF_ERROR(b.Read(ref, v.data(), count * sizeof(T)));
  return v;
}

// --- Comparisons.

using test_util::Nmse;  // NaN anywhere fails

::testing::AssertionResult NmseBelow(const Floats& got, const Floats& want, double bound) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) {
      return ::testing::AssertionFailure()
             << "NaN at " << i << " (got " << got[i] << ", want " << want[i] << ")";
    }
  }
  const double e = Nmse(got, want);
  if (e < bound) return ::testing::AssertionSuccess();
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > std::fabs(got[worst] - want[worst])) worst = i;
  }
  return ::testing::AssertionFailure() << "NMSE " << e << " >= " << bound << "; worst at " << worst
                                       << ": " << got[worst] << " vs " << want[worst];
}

// The same bits, value for value.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "at " << i << ": " << +got[i] << " vs " << +want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// A naive reference: each value in double and the magnitude its float computation's
// rounding error is relative to (|value| for a product, the sum of |terms| for a sum).
struct Naive {
  std::vector<double> value;
  std::vector<double> scale;

  void Push(double v, double s) {
    value.push_back(v);
    scale.push_back(s);
  }
};

::testing::AssertionResult CloseToNaive(const Floats& got, const Naive& want,
                                        double rel = kNaiveRel) {
  if (got.size() != want.value.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.value.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * want.scale[i] + 1e-30;
    if (!(std::fabs(static_cast<double>(got[i]) - want.value[i]) <= tol)) {
      return ::testing::AssertionFailure() << "at " << i << ": " << got[i] << " vs naive "
                                           << want.value[i] << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// --- Naive formulas (double precision).

Naive NaiveMatMul(const Floats& w, int64_t rows, int64_t cols, const Floats& x, int64_t n) {
  Naive out;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(w[r * cols + c]) * x[t * cols + c];
        sum += p;
        mag += std::fabs(p);
      }
      out.Push(sum, mag);
    }
  }
  return out;
}

Naive NaiveRmsNorm(const Floats& x, int64_t rows, int64_t width, const Floats& w, double eps) {
  Naive out;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < width; ++i)
      sum += static_cast<double>(x[r * width + i]) * x[r * width + i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i) {
      const double v = x[r * width + i] * inv * w[i];
      out.Push(v, std::fabs(v));
    }
  }
  return out;
}

Naive NaiveLayerNorm(const Floats& x, int64_t rows, int64_t width, const Floats& w, const Floats* b,
                     double eps) {
  Naive out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * width;
    double mean = 0;
    for (int64_t i = 0; i < width; ++i) mean += xr[i];
    mean /= static_cast<double>(width);
    double var = 0;
    for (int64_t i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(width);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < width; ++i) {
      const double bias = b != nullptr ? (*b)[i] : 0.0;
      const double v = (xr[i] - mean) * inv * w[i] + bias;
      // x - mean rounds relative to |x| + |mean|.
      out.Push(v, (std::fabs(xr[i]) + std::fabs(mean)) * inv * std::fabs(w[i]) + std::fabs(bias));
    }
  }
  return out;
}

Naive NaiveSoftmax(const Floats& x, int64_t rows, int64_t width) {
  Naive out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * width;
    double max = xr[0];
    for (int64_t i = 1; i < width; ++i) max = std::max<double>(max, xr[i]);
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += std::exp(xr[i] - max);
    for (int64_t i = 0; i < width; ++i) {
      const double v = std::exp(xr[i] - max) / sum;
      out.Push(v, v);
    }
  }
  return out;
}

// ggml's GELU: the tanh approximation of the input rounded to half, rounded to half;
// 0 at or below -10, x at or above 10.
float NaiveGelu(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const double h = RoundToHalf(x);
  const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
  const double g = 0.5 * h * (1.0 + std::tanh(sqrt_2_over_pi * h * (1.0 + 0.044715 * h * h)));
  return RoundToHalf(static_cast<float>(g));
}

struct RopeCase {
  bool neox = false;
  bool factors = false;
  int n_heads = 3;
  int head_dim = 24;
  int n_rot = 16;
  int64_t pos0 = 0;
  int64_t n = 1;
  float theta_base = 10000;
  float freq_scale = 0.5f;

  std::string Describe() const {
    return StrCat("rope ", neox ? "neox" : "normal", factors ? " freq_factors" : "", " heads ",
                  n_heads, " head_dim ", head_dim, " n_rot ", n_rot, " pos0 ", pos0, " n ", n);
  }
};

Floats FreqFactors(int n_rot) {
  Floats ff(static_cast<size_t>(n_rot / 2));
  for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.5f * static_cast<float>(i);
  return ff;
}

Naive NaiveRope(const RopeCase& c, const Floats& x) {
  const Floats ff = FreqFactors(c.n_rot);
  std::vector<double> y(x.begin(), x.end());
  std::vector<double> scale(x.size());
  for (size_t i = 0; i < x.size(); ++i) scale[i] = std::fabs(x[i]);
  const int half = c.n_rot / 2;
  for (int64_t t = 0; t < c.n; ++t) {
    const double pos = static_cast<double>(c.pos0 + t);
    for (int h = 0; h < c.n_heads; ++h) {
      const size_t base = static_cast<size_t>((t * c.n_heads + h) * c.head_dim);
      for (int i = 0; i < half; ++i) {
        const double theta = pos * std::pow(static_cast<double>(c.theta_base),
                                            -2.0 * i / static_cast<double>(c.n_rot));
        const double angle = c.freq_scale * theta / (c.factors ? ff[static_cast<size_t>(i)] : 1.0);
        const size_t i0 = base + static_cast<size_t>(c.neox ? i : 2 * i);
        const size_t i1 = base + static_cast<size_t>(c.neox ? i + half : 2 * i + 1);
        const double x0 = x[i0], x1 = x[i1];
        y[i0] = x0 * std::cos(angle) - x1 * std::sin(angle);
        y[i1] = x0 * std::sin(angle) + x1 * std::cos(angle);
        scale[i0] = scale[i1] = std::fabs(x0) + std::fabs(x1);
      }
    }
  }
  return {y, scale};
}

struct AttentionCase {
  int n_head = 4;
  int n_head_kv = 2;
  int dk = 16;
  int dv = 16;
  int64_t pos0 = 0;
  int64_t n = 1;

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(dk)); }
  int64_t n_kv() const { return pos0 + n; }
  std::string Describe() const {
    return StrCat("attention heads ", n_head, "/", n_head_kv, " dims ", dk, "/", dv, " pos0 ", pos0,
                  " n ", n);
  }
};

// Causal over the cache, or (full_kv > 0) every query over full_kv keys, no mask.
Naive NaiveAttention(const AttentionCase& c, const Floats& q, const Floats& k, const Floats& v,
                     int64_t full_kv = 0) {
  Naive out;
  const int group = c.n_head / c.n_head_kv;
  for (int64_t t = 0; t < c.n; ++t) {
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / group;
      const int64_t n_kv = full_kv > 0 ? full_kv : c.pos0 + t + 1;
      std::vector<double> p(static_cast<size_t>(n_kv));
      for (int64_t j = 0; j < n_kv; ++j) {
        double s = 0;
        for (int d = 0; d < c.dk; ++d) {
          s += static_cast<double>(q[static_cast<size_t>((t * c.n_head + h) * c.dk + d)]) *
               k[static_cast<size_t>((j * c.n_head_kv + g) * c.dk + d)];
        }
        p[static_cast<size_t>(j)] = s * c.scale();
      }
      double max = -std::numeric_limits<double>::infinity();
      for (double x : p) max = std::max(max, x);
      double sum = 0;
      for (double& x : p) sum += x = std::exp(x - max);
      for (int d = 0; d < c.dv; ++d) {
        double o = 0, mag = 0;
        for (int64_t j = 0; j < n_kv; ++j) {
          const double vj = v[static_cast<size_t>((j * c.n_head_kv + g) * c.dv + d)];
          o += p[static_cast<size_t>(j)] / sum * vj;
          mag += p[static_cast<size_t>(j)] / sum * std::fabs(vj);
        }
        out.Push(o, mag);
      }
    }
  }
  return out;
}

// The entropy of each query's unmasked attention per head: -sum p ln p.
Naive NaiveAttentionEntropy(const AttentionCase& c, const Floats& q, const Floats& k,
                            int64_t n_kv) {
  Naive out;
  const int group = c.n_head / c.n_head_kv;
  for (int64_t t = 0; t < c.n; ++t) {
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / group;
      std::vector<double> s(static_cast<size_t>(n_kv));
      for (int64_t j = 0; j < n_kv; ++j) {
        double dot = 0;
        for (int d = 0; d < c.dk; ++d) {
          dot += static_cast<double>(q[static_cast<size_t>((t * c.n_head + h) * c.dk + d)]) *
                 k[static_cast<size_t>((j * c.n_head_kv + g) * c.dk + d)];
        }
        s[static_cast<size_t>(j)] = dot * c.scale();
      }
      double max = -std::numeric_limits<double>::infinity();
      for (double x : s) max = std::max(max, x);
      double z = 0;
      for (double x : s) z += std::exp(x - max);
      double entropy = 0;
      for (double x : s) {
        const double p = std::exp(x - max) / z;
        if (p > 0) entropy -= p * std::log(p);
      }
      // The float scores' rounding moves H by about |s| * eps: scale by ln(n_kv) + 1.
      out.Push(entropy, std::log(static_cast<double>(n_kv)) + 1);
    }
  }
  return out;
}

// The router: softmax, the k most probable (ties: the lower index), renormalised or not.
void NaiveTopK(const Floats& logits, int64_t n, int n_expert, int k, bool renormalize,
               std::vector<int32_t>* experts, Naive* weights) {
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits.data() + t * n_expert;
    const double max = *std::max_element(l, l + n_expert);
    std::vector<double> p(static_cast<size_t>(n_expert));
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) sum += p[static_cast<size_t>(e)] = std::exp(l[e] - max);
    for (double& x : p) x /= sum;
    std::vector<int> order(static_cast<size_t>(n_expert));
    for (int e = 0; e < n_expert; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)];
    });
    double total = 0;
    for (int s = 0; s < k; ++s) total += p[static_cast<size_t>(order[static_cast<size_t>(s)])];
    for (int s = 0; s < k; ++s) {
      const int e = order[static_cast<size_t>(s)];
      experts->push_back(e);
      const double w = p[static_cast<size_t>(e)] / (renormalize ? total : 1.0);
      weights->Push(w, w);
    }
  }
}

// out[t] = sum over non-empty slots, in order, of weights * y (float, as specified).
Floats SlotSum(const Floats& y, const std::vector<int32_t>& experts, const Floats& weights,
               int64_t n, int k, int64_t width) {
  Floats out(static_cast<size_t>(n * width), kNan);
  for (int64_t t = 0; t < n; ++t) {
    bool first = true;
    for (int s = 0; s < k; ++s) {
      const size_t p = static_cast<size_t>(t * k + s);
      if (experts[p] < 0) continue;
      for (int64_t i = 0; i < width; ++i) {
        const float term = weights[p] * y[p * static_cast<size_t>(width) + static_cast<size_t>(i)];
        float& o = out[static_cast<size_t>(t * width + i)];
        o = first ? term : o + term;
      }
      first = false;
    }
  }
  return out;
}

// --- Weights.

std::optional<WeightFormat> PackedFormatOf(WeightType type) {
  switch (type) {
    case WeightType::kW4:
      return WeightFormat::kW4;
    case WeightType::kW4M:
      return WeightFormat::kW4M;
    case WeightType::kW8:
      return WeightFormat::kW8;
    case WeightType::kW4S24:
      return WeightFormat::kW4S24;
    case WeightType::kF32:
    case WeightType::kF16:
      break;
  }
  return std::nullopt;
}

constexpr WeightType kAllWeightTypes[] = {WeightType::kF32, WeightType::kF16, WeightType::kW4,
                                          WeightType::kW4M, WeightType::kW8,  WeightType::kW4S24};
constexpr WeightType kPackedTypes[] = {WeightType::kW4, WeightType::kW4M, WeightType::kW8,
                                       WeightType::kW4S24};

// `groups` stacked rows x cols matrices of `type` from seeded random values: fp32,
// fp32 values that are all halves (kF16), or packed from GGML F32 rows by PackRows.
Matrix MakeWeight(WeightType type, int64_t groups, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m;
  m.rows = groups * rows;
  m.cols = cols;
  const std::optional<WeightFormat> format = PackedFormatOf(type);
  if (!format) {
    m.data = RandomFloats(static_cast<size_t>(m.rows * cols), seed, 0.5f);
    if (type == WeightType::kF16) {
      for (float& v : m.data) v = RoundToHalf(v);
    }
    return m;
  }
  m.packed = PackedMatrix(*format, groups, rows, cols);
  const Floats f = RandomFloats(static_cast<size_t>(groups * rows * cols), seed, 0.05f);
  for (int64_t g = 0; g < groups; ++g) {
    std::span<const uint8_t> src(reinterpret_cast<const uint8_t*>(f.data() + g * rows * cols),
                                 static_cast<size_t>(rows * cols) * sizeof(float));
    const absl::Status s = PackRows(format::GgmlType::kF32, src, rows, cols, *format,
                                    {m.packed.mutable_group(g), m.packed.group_bytes()});
    EXPECT_TRUE(s.ok()) << s;
  }
  return m;
}

// The fp32 values of group `g` of a MakeWeight matrix (what the kernels multiply by).
Floats WeightValues(const Matrix& m, int64_t groups, int64_t g) {
  const int64_t rows = m.rows / groups;
  if (m.packed.empty()) {
    return Floats(m.data.begin() + g * rows * m.cols, m.data.begin() + (g + 1) * rows * m.cols);
  }
  Floats out(static_cast<size_t>(rows * m.cols));
  const PackedView v = m.packed.group(g);
  const absl::Status s =
      UnpackRows(v.format, {v.data, m.packed.group_bytes()}, rows, m.cols, 0, rows, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// --- Ops run on one backend from host inputs to host outputs.

// Inputs and outputs sit this many bytes into their buffers where a runner says so:
// TensorRef offsets are honoured, and no kernel may assume more than float alignment
// (20 is not a multiple of 8 or 16).
constexpr size_t kAt = 20;

struct MatMulResult {
  Floats y;
  WeightType type = WeightType::kF32;
};

absl::StatusOr<MatMulResult> RunMatMul(Backend& b, const Matrix& m, int64_t groups, int64_t group,
                                       const Floats& x, int64_t n) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Weight> w, b.UploadWeight(m, groups, "conformance.w"));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  const size_t count = static_cast<size_t>(n * w->rows());
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Output(b, count, kAt));
  MOERT_RETURN_IF_ERROR(b.MatMul(*w, group, TensorRef(xb, kAt), n, TensorRef(yb, kAt)));
  MOERT_ASSIGN_OR_RETURN(Floats y, Get<float>(b, TensorRef(yb, kAt), count));
  return MatMulResult{std::move(y), w->type()};
}

absl::StatusOr<Floats> RunRmsNorm(Backend& b, const Floats& x, int64_t rows, int64_t width,
                                  const Floats& w, float eps, bool in_place) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wb, b.UploadFloats(w));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Output(b, x.size()));
  const TensorRef y = in_place ? TensorRef(xb, kAt) : TensorRef(yb);
  MOERT_RETURN_IF_ERROR(b.RmsNorm(TensorRef(xb, kAt), rows, width, wb, eps, y));
  return Get<float>(b, y, x.size());
}

absl::StatusOr<Floats> RunLayerNorm(Backend& b, const Floats& x, int64_t rows, int64_t width,
                                    const Floats& w, const Floats& bias, float eps, bool in_place) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wb, b.UploadFloats(w));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> bb, b.UploadFloats(bias));  // null when empty
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Output(b, x.size()));
  const TensorRef y = in_place ? TensorRef(xb) : TensorRef(yb);
  MOERT_RETURN_IF_ERROR(b.LayerNorm(xb, rows, width, wb, bb, eps, y));
  return Get<float>(b, y, x.size());
}

absl::StatusOr<Floats> RunRope(Backend& b, const RopeCase& c, const Floats& x) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  const Floats ff = FreqFactors(c.n_rot);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> fb, b.UploadFloats(ff));
  RopeArgs args;
  args.neox = c.neox;
  args.n_rot = c.n_rot;
  args.theta_base = c.theta_base;
  args.freq_scale = c.freq_scale;
  if (c.factors) args.freq_factors = fb;
  MOERT_RETURN_IF_ERROR(b.Rope(args, c.pos0, c.n, c.n_heads, c.head_dim, TensorRef(xb, kAt)));
  return Get<float>(b, TensorRef(xb, kAt), x.size());
}

// Attention over fp32 caches, or (kv_half) over caches this backend's StoreHalf made
// from them; `halves` (if not null) receives the k cache's halves then the v cache's.
absl::StatusOr<Floats> RunAttention(Backend& b, const AttentionCase& c, const Floats& q,
                                    const Floats& k, const Floats& v, bool kv_half,
                                    std::vector<uint16_t>* halves = nullptr) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> qb, Put(b, q, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> kb, Put(b, k));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> vb, Put(b, v));
  std::unique_ptr<Buffer> k16, v16;
  if (kv_half) {
    MOERT_ASSIGN_OR_RETURN(k16, b.Allocate(k.size() * 2));
    MOERT_ASSIGN_OR_RETURN(v16, b.Allocate(v.size() * 2));
    MOERT_RETURN_IF_ERROR(b.StoreHalf(kb, static_cast<int64_t>(k.size()), k16));
    MOERT_RETURN_IF_ERROR(b.StoreHalf(vb, static_cast<int64_t>(v.size()), v16));
    if (halves != nullptr) {
      MOERT_ASSIGN_OR_RETURN(*halves, Get<uint16_t>(b, k16, k.size()));
      MOERT_ASSIGN_OR_RETURN(std::vector<uint16_t> vh, Get<uint16_t>(b, v16, v.size()));
      halves->insert(halves->end(), vh.begin(), vh.end());
    }
  }
  const size_t count = static_cast<size_t>(c.n * c.n_head * c.dv);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count));
  const AttentionArgs args{c.n_head, c.n_head_kv, c.dk, c.dv, c.scale(), kv_half};
  MOERT_RETURN_IF_ERROR(b.Attention(args, TensorRef(qb, kAt), c.n, c.pos0,
                                    kv_half ? TensorRef(k16) : TensorRef(kb),
                                    kv_half ? TensorRef(v16) : TensorRef(vb), out));
  return Get<float>(b, out, count);
}

// Attention without a mask: c.n queries over n_kv keys.
absl::StatusOr<Floats> RunFullAttention(Backend& b, const AttentionCase& c, const Floats& q,
                                        const Floats& k, const Floats& v, int64_t n_kv) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> qb, Put(b, q, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> kb, Put(b, k, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> vb, Put(b, v));
  const size_t count = static_cast<size_t>(c.n * c.n_head * c.dv);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count));
  const AttentionArgs args{c.n_head, c.n_head_kv, c.dk, c.dv, c.scale(), false};
  MOERT_RETURN_IF_ERROR(
      b.FullAttention(args, TensorRef(qb, kAt), c.n, TensorRef(kb, kAt), vb, n_kv, out));
  return Get<float>(b, out, count);
}

absl::StatusOr<Floats> RunAttentionEntropy(Backend& b, const AttentionCase& c, const Floats& q,
                                           const Floats& k, int64_t n_kv) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> qb, Put(b, q, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> kb, Put(b, k, kAt));
  const size_t count = static_cast<size_t>(c.n * c.n_head);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count, kAt));
  const AttentionArgs args{c.n_head, c.n_head_kv, c.dk, c.dv, c.scale(), false};
  MOERT_RETURN_IF_ERROR(b.AttentionEntropy(args, TensorRef(qb, kAt), c.n, TensorRef(kb, kAt),
                                           n_kv, TensorRef(out, kAt)));
  return Get<float>(b, TensorRef(out, kAt), count);
}

absl::StatusOr<Floats> RunSoftmax(Backend& b, const Floats& x, int64_t rows, int64_t width,
                                  bool in_place) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Output(b, x.size(), kAt));
  const TensorRef y = in_place ? TensorRef(xb) : TensorRef(yb, kAt);
  MOERT_RETURN_IF_ERROR(b.Softmax(xb, rows, width, y));
  return Get<float>(b, y, x.size());
}

absl::StatusOr<Floats> RunSiluMul(Backend& b, const Floats& g, const Floats& u) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> gb, Put(b, g, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> ub, Put(b, u));
  MOERT_RETURN_IF_ERROR(b.SiluMul(TensorRef(gb, kAt), ub, static_cast<int64_t>(g.size())));
  return Get<float>(b, TensorRef(gb, kAt), g.size());
}

absl::StatusOr<Floats> RunGelu(Backend& b, const Floats& x, bool in_place) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Output(b, x.size(), kAt));
  const TensorRef y = in_place ? TensorRef(xb) : TensorRef(yb, kAt);
  MOERT_RETURN_IF_ERROR(b.Gelu(xb, static_cast<int64_t>(x.size()), y));
  return Get<float>(b, y, x.size());
}

absl::StatusOr<Floats> RunAdd(Backend& b, const Floats& x, const Floats& y) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Put(b, y));
  MOERT_RETURN_IF_ERROR(b.Add(TensorRef(xb, kAt), yb, static_cast<int64_t>(x.size())));
  return Get<float>(b, TensorRef(xb, kAt), x.size());
}

absl::StatusOr<Floats> RunAddBias(Backend& b, const Floats& y, const Floats& bias, int64_t n) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Put(b, y, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> bb, Put(b, bias));
  MOERT_RETURN_IF_ERROR(b.AddBias(TensorRef(yb, kAt), bb, n, static_cast<int64_t>(bias.size())));
  return Get<float>(b, TensorRef(yb, kAt), y.size());
}

absl::StatusOr<Floats> RunGatedAdd(Backend& b, const Floats& out, const Floats& y,
                                   const Floats& gate, int64_t n) {
  const int64_t width = static_cast<int64_t>(y.size()) / n;
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> ob, Put(b, out, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Put(b, y));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> gb, Put(b, gate, kAt));
  MOERT_RETURN_IF_ERROR(b.GatedAdd(TensorRef(ob, kAt), yb, TensorRef(gb, kAt), n, width));
  return Get<float>(b, TensorRef(ob, kAt), out.size());
}

struct TopKResult {
  std::vector<int32_t> experts;
  Floats weights;
};

absl::StatusOr<TopKResult> RunTopK(Backend& b, const Floats& logits, int64_t n, int n_expert, int k,
                                   bool renormalize) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> lb, Put(b, logits));
  const size_t count = static_cast<size_t>(n * k);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> eb, Put(b, std::vector<int32_t>(count, -7)));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wb, Output(b, count, kAt));
  MOERT_RETURN_IF_ERROR(b.TopK(lb, n, n_expert, k, renormalize, eb, TensorRef(wb, kAt)));
  TopKResult r;
  MOERT_ASSIGN_OR_RETURN(r.experts, Get<int32_t>(b, eb, count));
  MOERT_ASSIGN_OR_RETURN(r.weights, Get<float>(b, TensorRef(wb, kAt), count));
  return r;
}

absl::StatusOr<Floats> RunGatherRows(Backend& b, const Floats& src, int64_t src_rows,
                                     const std::vector<int32_t>& idx, int64_t width) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> sb, Put(b, src, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> ib, Put(b, idx));
  const size_t count = idx.size() * static_cast<size_t>(width);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> db, Output(b, count));
  MOERT_RETURN_IF_ERROR(
      b.GatherRows(TensorRef(sb, kAt), src_rows, ib, static_cast<int64_t>(idx.size()), width, db));
  return Get<float>(b, db, count);
}

absl::StatusOr<Floats> RunMoeCombine(Backend& b, const Floats& y,
                                     const std::vector<int32_t>& experts, const Floats& weights,
                                     int64_t n, int k, int64_t width) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Put(b, y));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> eb, Put(b, experts));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wb, Put(b, weights, kAt));
  const size_t count = static_cast<size_t>(n * width);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count, kAt));
  MOERT_RETURN_IF_ERROR(b.MoeCombine(yb, eb, TensorRef(wb, kAt), n, k, width, TensorRef(out, kAt)));
  return Get<float>(b, TensorRef(out, kAt), count);
}

absl::StatusOr<std::vector<uint16_t>> RunStoreHalf(Backend& b, const Floats& x) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb,
                         Put(b, std::vector<uint16_t>(x.size(), 0xFFFF), kAt));
  MOERT_RETURN_IF_ERROR(
      b.StoreHalf(TensorRef(xb, kAt), static_cast<int64_t>(x.size()), TensorRef(yb, kAt)));
  return Get<uint16_t>(b, TensorRef(yb, kAt), x.size());
}

// n_rows rows of `width` floats through StoreKv into a cache of `type` kAt bytes into
// its buffer: the cache's bytes.
absl::StatusOr<std::vector<uint8_t>> RunStoreKv(Backend& b, KvType type, const Floats& x,
                                                int64_t n_rows, int64_t width) {
  MOERT_ASSIGN_OR_RETURN(const size_t row_bytes, KvRowBytes(type, width));
  const size_t bytes = row_bytes * static_cast<size_t>(n_rows);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb,
                         Put(b, std::vector<uint8_t>(bytes, 0xA5), kAt));
  MOERT_RETURN_IF_ERROR(b.StoreKv(type, TensorRef(xb, kAt), n_rows, width, TensorRef(yb, kAt)));
  return Get<uint8_t>(b, TensorRef(yb, kAt), bytes);
}

// A typed KV cache's bytes (k, v) and what the attention ops read them as.
struct TypedCaches {
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  std::vector<uint8_t> k, v;
};

// The attention ops over typed caches: causal Attention (n_kv 0), FullAttention over
// n_kv keys, or (entropy) AttentionEntropy over n_kv keys.
absl::StatusOr<Floats> RunTypedAttention(Backend& b, const AttentionCase& c, const Floats& q,
                                         const TypedCaches& caches, int64_t n_kv = 0,
                                         bool entropy = false) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> qb, Put(b, q, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> kb, Put(b, caches.k, kAt));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> vb, Put(b, caches.v));
  const size_t count = static_cast<size_t>(c.n * c.n_head * (entropy ? 1 : c.dv));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count));
  AttentionArgs args{c.n_head, c.n_head_kv, c.dk, c.dv, c.scale(), false};
  args.k_type = caches.k_type;
  args.v_type = caches.v_type;
  const TensorRef qr(qb, kAt), kr(kb, kAt);
  if (entropy) {
    MOERT_RETURN_IF_ERROR(b.AttentionEntropy(args, qr, c.n, kr, n_kv, out));
  } else if (n_kv > 0) {
    MOERT_RETURN_IF_ERROR(b.FullAttention(args, qr, c.n, kr, vb, n_kv, out));
  } else {
    MOERT_RETURN_IF_ERROR(b.Attention(args, qr, c.n, c.pos0, kr, vb, out));
  }
  return Get<float>(b, out, count);
}

// One MoE layer's stacked experts on a backend (its weights borrow `m`).
struct StackedExperts {
  std::unique_ptr<Weight> gate, up, down;
  Experts experts() const {
    Experts e;
    e.gate = gate.get();
    e.up = up.get();
    e.down = down.get();
    return e;
  }
};

struct MoeWeights {
  Matrix gate, up, down;  // stacked: groups n_expert
  int n_expert = 0;
  int64_t n_embd = 0, n_ff = 0;
};

MoeWeights MakeMoeWeights(WeightType type, int n_expert, int64_t n_embd, int64_t n_ff,
                          uint32_t seed) {
  MoeWeights w;
  w.gate = MakeWeight(type, n_expert, n_ff, n_embd, seed);
  w.up = MakeWeight(type, n_expert, n_ff, n_embd, seed + 1);
  w.down = MakeWeight(type, n_expert, n_embd, n_ff, seed + 2);
  w.n_expert = n_expert;
  w.n_embd = n_embd;
  w.n_ff = n_ff;
  return w;
}

absl::StatusOr<StackedExperts> UploadExperts(Backend& b, const MoeWeights& w) {
  StackedExperts s;
  MOERT_ASSIGN_OR_RETURN(s.gate, b.UploadWeight(w.gate, w.n_expert, "conformance.gate"));
  MOERT_ASSIGN_OR_RETURN(s.up, b.UploadWeight(w.up, w.n_expert, "conformance.up"));
  MOERT_ASSIGN_OR_RETURN(s.down, b.UploadWeight(w.down, w.n_expert, "conformance.down"));
  return s;
}

// FusedMoe over `experts` with the routing (empty experts / weights: the dense form).
absl::StatusOr<Floats> RunFusedMoe(Backend& b, const Experts& experts, int64_t n_embd,
                                   const Floats& x, int64_t n, int k,
                                   const std::vector<int32_t>& ids, const Floats& weights) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x, kAt));
  std::unique_ptr<Buffer> eb, wb;
  if (!ids.empty()) {
    MOERT_ASSIGN_OR_RETURN(eb, Put(b, ids));
  }
  if (!weights.empty()) {
    MOERT_ASSIGN_OR_RETURN(wb, Put(b, weights, kAt));
  }
  const size_t count = static_cast<size_t>(n * n_embd);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count, kAt));
  MOERT_RETURN_IF_ERROR(b.FusedMoe(experts, TensorRef(xb, kAt), n, k, TensorRef(eb),
                                   wb ? TensorRef(wb, kAt) : TensorRef(), TensorRef(out, kAt)));
  return Get<float>(b, TensorRef(out, kAt), count);
}

// The same MoE layer from the unfused ops on `b`: per (token, slot) the gate and up
// matmuls, SiluMul, the down matmul, then MoeCombine.
absl::StatusOr<Floats> RunUnfusedMoe(Backend& b, const StackedExperts& s, const MoeWeights& w,
                                     const Floats& x, int64_t n, int k,
                                     const std::vector<int32_t>& ids, const Floats& weights) {
  const size_t row = static_cast<size_t>(w.n_embd) * 4, ff = static_cast<size_t>(w.n_ff) * 4;
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> gb, b.Allocate(ff));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> ub, b.Allocate(ff));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb,
                         Put(b, Floats(static_cast<size_t>(n * k * w.n_embd), 0.0f)));
  for (int64_t p = 0; p < n * k; ++p) {
    const int e = ids[static_cast<size_t>(p)];
    if (e < 0) continue;
    const TensorRef xt(xb, static_cast<size_t>(p / k) * row);
    const MatMulArgs gate_up[2] = {{s.gate.get(), e, xt, 1, gb}, {s.up.get(), e, xt, 1, ub}};
    MOERT_RETURN_IF_ERROR(b.MatMuls(gate_up));
    MOERT_RETURN_IF_ERROR(b.SiluMul(gb, ub, w.n_ff));
    MOERT_RETURN_IF_ERROR(b.MatMul(*s.down, e, gb, 1, TensorRef(yb, static_cast<size_t>(p) * row)));
  }
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> eb, Put(b, ids));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wb, Put(b, weights));
  const size_t count = static_cast<size_t>(n * w.n_embd);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, count));
  MOERT_RETURN_IF_ERROR(b.MoeCombine(yb, eb, wb, n, k, w.n_embd, out));
  return Get<float>(b, out, count);
}

// Routing of n tokens to k of n_expert experts (distinct per token while 2k <=
// n_expert; with 6 experts and k 2, token 0 takes 2 and 4, and experts 0 and 3 are
// never taken), weights in (0.1, 0.9); `empty` (token, slot) pairs (slot > 0) are -1.
void MakeRouting(int64_t n, int k, int n_expert, uint32_t seed,
                 std::initializer_list<std::pair<int64_t, int>> empty, std::vector<int32_t>* ids,
                 Floats* weights) {
  std::mt19937 rng(seed);
  ids->assign(static_cast<size_t>(n * k), 0);
  weights->assign(static_cast<size_t>(n * k), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int s = 0; s < k; ++s) {
      const size_t p = static_cast<size_t>(t * k + s);
      (*ids)[p] = static_cast<int32_t>((t * 3 + 2 * s + 2) % n_expert);
      (*weights)[p] = 0.1f + 0.8f * static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
  for (const auto& [t, s] : empty) (*ids)[static_cast<size_t>(t * k + s)] = -1;
}

// --- The suite.

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  struct Opened {
    std::unique_ptr<Backend> backend;
    std::string error;
  };

  static void SetUpTestSuite() {
    reference_ = new cpu::CpuBackend(1);
    opened_ = new std::map<std::string, Opened>();
  }
  static void TearDownTestSuite() {
    delete opened_;
    opened_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }

  void SetUp() override {
    auto it = opened_->find(GetParam());
    if (it == opened_->end()) {
      BackendOptions options;
      options.threads = 2;              // the CPU: against the 1-thread reference
      options.allow_cpu_device = true;  // PoCL
      absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(GetParam(), options);
      Opened o;
      if (b.ok()) {
        o.backend = std::move(b).value();
      } else {
        o.error = std::string(b.status().message());
      }
      it = opened_->emplace(GetParam(), std::move(o)).first;
    }
    backend_ = it->second.backend.get();
    if (backend_ == nullptr) {
      if (RequireEveryBackend()) {
        FAIL() << "MOERT_REQUIRE_OPENCL=1 but backend '" << GetParam()
               << "' cannot be opened: " << it->second.error;
      }
      GTEST_SKIP() << "backend '" << GetParam() << "' cannot be opened: " << it->second.error;
    }
  }

  Backend& backend() { return *backend_; }
  Backend& reference() { return *reference_; }
  // What failure messages start with: the backend, then the op and shape.
  std::string On() const { return StrCat("[", GetParam(), "] "); }

  void CheckMatMul(WeightType type);
  void CheckFusedMoe(WeightType type);
  void CheckFusedMoePlaced(WeightType type);
  // A small valid call of `op` (weights of `type` for matmul and fused MoE): the op's
  // status, or the status of whatever failed before it (UploadWeight for a type the
  // backend has no kernels for).
  absl::Status CallOnce(Op op, WeightType type);

  static cpu::CpuBackend* reference_;
  static std::map<std::string, Opened>* opened_;
  Backend* backend_ = nullptr;
};

cpu::CpuBackend* BackendConformanceTest::reference_ = nullptr;
std::map<std::string, BackendConformanceTest::Opened>* BackendConformanceTest::opened_ = nullptr;

// Skips the test (naming the op and the weight type) when the backend lacks them.
#define SKIP_UNLESS_SUPPORTED(op, type)                                              \
  do {                                                                               \
    if (!backend().Supports(op, type)) {                                             \
      GTEST_SKIP() << backend().name() << " does not support " << OpName(op) << " (" \
                   << WeightTypeName(type) << ")";                                   \
    }                                                                                \
  } while (0)

TEST_P(BackendConformanceTest, DescribesItsDeviceAndRoundTripsBuffers) {
  EXPECT_FALSE(backend().name().empty());
  const DeviceDescription d = backend().device();
  EXPECT_FALSE(d.name.empty());
  EXPECT_FALSE(d.type.empty());
  std::cout << "[ backend ] " << GetParam() << ": " << backend().name() << " on " << d.name << " ("
            << d.type << (d.driver.empty() ? "" : ", driver " + d.driver) << ")\n";
  const Floats v = RandomFloats(37, 1);
  absl::StatusOr<std::unique_ptr<Buffer>> b = backend().Allocate(v.size() * 4 + kAt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->owner(), &backend());
  EXPECT_EQ((*b)->size(), v.size() * 4 + kAt);
  if (backend().host_memory()) {
    EXPECT_NE((*b)->host(), nullptr);
  }
  ASSERT_TRUE(backend().Write(TensorRef(*b, kAt), v.data(), v.size() * 4).ok());
  absl::StatusOr<Floats> got = Get<float>(backend(), TensorRef(*b, kAt), v.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBits(*got, v));
  EXPECT_FALSE(backend().Write(TensorRef(*b, kAt + 4), v.data(), v.size() * 4).ok());
  EXPECT_FALSE(backend().Read(TensorRef(*b, kAt + 4), got->data(), v.size() * 4).ok());
  EXPECT_FALSE(backend().Allocate(0).ok());
  EXPECT_TRUE(backend().Finish().ok());
}

void BackendConformanceTest::CheckMatMul(WeightType type) {
  SKIP_UNLESS_SUPPORTED(Op::kMatMul, type);
  const bool packed = PackedFormatOf(type).has_value();
  // Rows below the 8-row tile and not a multiple of it; fp32 K tails (cols not a
  // multiple of 8 or of 4); packed cols are multiples of 32.
  const std::vector<int64_t> all_rows = {1, 5, 8, 13, 40, 300};
  const std::vector<int64_t> all_cols =
      packed ? std::vector<int64_t>{32, 96, 256} : std::vector<int64_t>{7, 8, 44, 256};
  for (int64_t rows : all_rows) {
    for (int64_t cols : all_cols) {
      // 13 rows: a stacked weight of 3 groups, multiplied by its last group.
      const int64_t groups = rows == 13 ? 3 : 1;
      const int64_t group = groups - 1;
      const Matrix m =
          MakeWeight(type, groups, rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
      const Floats w = WeightValues(m, groups, group);
      for (int64_t n : {1, 3, 8}) {
        const std::string what = StrCat(On(), "matmul ", WeightTypeName(type), " ", rows, "x", cols,
                                        " group ", group, "/", groups, " n ", n);
        const Floats x =
            RandomFloats(static_cast<size_t>(n * cols), static_cast<uint32_t>(n + cols));
        absl::StatusOr<MatMulResult> got = RunMatMul(backend(), m, groups, group, x, n);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<MatMulResult> want = RunMatMul(reference(), m, groups, group, x, n);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(NmseBelow(got->y, want->y, 1e-10)) << what;
        if (packed) {
          EXPECT_EQ(got->type, type) << what;
          // A8 activations: a quantization step off the fp32 product, NMSE ~1e-5.
          Floats naive(got->y.size());
          const Naive exact = NaiveMatMul(w, rows, cols, x, n);
          for (size_t i = 0; i < naive.size(); ++i) naive[i] = static_cast<float>(exact.value[i]);
          EXPECT_TRUE(NmseBelow(got->y, naive, 1e-3)) << what << " (vs the dequantized weights)";
        } else {
          // fp32 stays fp32; a device keeps weights that are all halves as halves.
          if (type == WeightType::kF32) {
            EXPECT_EQ(got->type, WeightType::kF32) << what;
          }
          if (type == WeightType::kF16 && !backend().host_memory()) {
            EXPECT_EQ(got->type, WeightType::kF16) << what;
          }
          EXPECT_TRUE(CloseToNaive(got->y, NaiveMatMul(w, rows, cols, x, n))) << what;
        }
      }
    }
  }
}

TEST_P(BackendConformanceTest, MatMulF32) { CheckMatMul(WeightType::kF32); }
TEST_P(BackendConformanceTest, MatMulF16) { CheckMatMul(WeightType::kF16); }
TEST_P(BackendConformanceTest, MatMulW4) { CheckMatMul(WeightType::kW4); }
TEST_P(BackendConformanceTest, MatMulW4M) { CheckMatMul(WeightType::kW4M); }
TEST_P(BackendConformanceTest, MatMulW8) { CheckMatMul(WeightType::kW8); }
TEST_P(BackendConformanceTest, MatMulW4S24) { CheckMatMul(WeightType::kW4S24); }

// Several jobs in one MatMuls call: q/k/v-like jobs sharing one input (quantized once
// where the backend does that), one on another input between them, and an fp32 job.
TEST_P(BackendConformanceTest, MatMulsRunsIndependentJobsInOneCall) {
  SKIP_UNLESS_SUPPORTED(Op::kMatMul, WeightType::kF32);
  std::vector<WeightType> types = {WeightType::kF32};
  for (WeightType t : kPackedTypes) {
    if (backend().Supports(Op::kMatMul, t)) types.push_back(t);
  }
  const int64_t cols = 64;
  const std::vector<int64_t> rows = {13, 8, 40, 5};
  for (WeightType type : types) {
    for (int64_t n : {1, 4}) {
      const std::string what =
          StrCat(On(), "matmuls ", WeightTypeName(type), " + f32, 5 jobs, n ", n);
      std::vector<Matrix> ms;
      for (size_t j = 0; j < rows.size(); ++j) {
        ms.push_back(MakeWeight(type, 1, rows[j], cols, static_cast<uint32_t>(50 + j)));
      }
      ms.push_back(MakeWeight(WeightType::kF32, 1, 9, cols, 60));
      const Floats x0 = RandomFloats(static_cast<size_t>(n * cols), 61);
      const Floats x1 = RandomFloats(static_cast<size_t>(n * cols), 62);
      const auto run = [&](Backend& b) -> absl::StatusOr<std::vector<Floats>> {
        std::vector<std::unique_ptr<Weight>> ws;
        for (const Matrix& m : ms) {
          MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Weight> w, b.UploadWeight(m, 1, "w"));
          ws.push_back(std::move(w));
        }
        MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb0, Put(b, x0));
        MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb1, Put(b, x1));
        std::vector<std::unique_ptr<Buffer>> ys;
        std::vector<MatMulArgs> jobs;
        for (size_t j = 0; j < ws.size(); ++j) {
          MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> y,
                                 Output(b, static_cast<size_t>(n * ws[j]->rows())));
          // Job 2 reads x1, the others x0 (so x0 is needed again after x1).
          jobs.push_back({ws[j].get(), 0, j == 2 ? TensorRef(xb1) : TensorRef(xb0), n, y});
          ys.push_back(std::move(y));
        }
        MOERT_RETURN_IF_ERROR(b.MatMuls(jobs));
        std::vector<Floats> out;
        for (size_t j = 0; j < ws.size(); ++j) {
          MOERT_ASSIGN_OR_RETURN(Floats y,
                                 Get<float>(b, ys[j], static_cast<size_t>(n * ws[j]->rows())));
          out.push_back(std::move(y));
        }
        return out;
      };
      absl::StatusOr<std::vector<Floats>> got = run(backend());
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<std::vector<Floats>> want = run(reference());
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      for (size_t j = 0; j < got->size(); ++j) {
        EXPECT_TRUE(NmseBelow((*got)[j], (*want)[j], 1e-10)) << what << ", job " << j;
      }
    }
  }
}

TEST_P(BackendConformanceTest, RmsNorm) {
  SKIP_UNLESS_SUPPORTED(Op::kRmsNorm, WeightType::kF32);
  for (int64_t rows : {1, 3, 13}) {
    for (int64_t width : {1, 7, 37, 256, 1000, 4099}) {
      for (bool in_place : {false, true}) {
        const std::string what =
            StrCat(On(), "rms_norm ", rows, "x", width, in_place ? " in place" : "");
        const Floats x =
            RandomFloats(static_cast<size_t>(rows * width), static_cast<uint32_t>(width), 3.0f);
        const Floats w = RandomFloats(static_cast<size_t>(width), 2);
        absl::StatusOr<Floats> got = RunRmsNorm(backend(), x, rows, width, w, 1e-5f, in_place);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<Floats> want = RunRmsNorm(reference(), x, rows, width, w, 1e-5f, false);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
        EXPECT_TRUE(CloseToNaive(*got, NaiveRmsNorm(x, rows, width, w, 1e-5))) << what;
      }
    }
  }
}

TEST_P(BackendConformanceTest, LayerNorm) {
  SKIP_UNLESS_SUPPORTED(Op::kLayerNorm, WeightType::kF32);
  for (int64_t rows : {1, 3, 13}) {
    for (int64_t width : {1, 7, 37, 256, 1000}) {
      for (bool with_bias : {false, true}) {
        const bool in_place = rows == 3;
        const std::string what =
            StrCat(On(), "layer_norm ", rows, "x", width, with_bias ? " bias" : " no bias",
                   in_place ? " in place" : "");
        // A mean away from 0, so that subtracting it matters.
        const Floats x = RandomFloats(static_cast<size_t>(rows * width),
                                      static_cast<uint32_t>(width + 7), 2.0f, 3.0f);
        const Floats w = RandomFloats(static_cast<size_t>(width), 3);
        const Floats bias = with_bias ? RandomFloats(static_cast<size_t>(width), 4) : Floats();
        absl::StatusOr<Floats> got =
            RunLayerNorm(backend(), x, rows, width, w, bias, 1e-5f, in_place);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<Floats> want =
            RunLayerNorm(reference(), x, rows, width, w, bias, 1e-5f, false);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
        EXPECT_TRUE(CloseToNaive(
            *got, NaiveLayerNorm(x, rows, width, w, with_bias ? &bias : nullptr, 1e-5)))
            << what;
      }
    }
  }
}

TEST_P(BackendConformanceTest, Rope) {
  SKIP_UNLESS_SUPPORTED(Op::kRope, WeightType::kF32);
  for (bool neox : {false, true}) {
    for (bool factors : {false, true}) {
      // n_rot below head_dim (the rest passes through), equal to it, and 2.
      for (const auto& [head_dim, n_rot] : {std::pair{24, 16}, {32, 32}, {6, 2}}) {
        for (const auto& [pos0, n] : {std::pair<int64_t, int64_t>{0, 1}, {0, 4}, {5, 1}, {7, 3}}) {
          RopeCase c;
          c.neox = neox;
          c.factors = factors;
          c.head_dim = head_dim;
          c.n_rot = n_rot;
          c.pos0 = pos0;
          c.n = n;
          const std::string what = On() + c.Describe();
          const Floats x = RandomFloats(static_cast<size_t>(n * c.n_heads * head_dim),
                                        static_cast<uint32_t>(head_dim + pos0));
          absl::StatusOr<Floats> got = RunRope(backend(), c, x);
          ASSERT_TRUE(got.ok()) << what << ": " << got.status();
          absl::StatusOr<Floats> want = RunRope(reference(), c, x);
          ASSERT_TRUE(want.ok()) << what << ": " << want.status();
          EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
          EXPECT_TRUE(CloseToNaive(*got, NaiveRope(c, x))) << what;
        }
      }
    }
  }
}

const AttentionCase kAttentionCases[] = {
    {4, 2, 16, 16, 0, 1},      // GQA, the first token
    {4, 2, 16, 16, 0, 5},      // GQA prefill
    {4, 2, 32, 24, 7, 1},      // decode, dk != dv
    {4, 2, 16, 16, 6, 3},      // a chunk after a cache
    {4, 4, 8, 8, 3, 2},        // MHA
    {4, 1, 12, 20, 9, 4},      // MQA, dims not multiples of 8
    {4, 2, 128, 128, 300, 2},  // a longer cache than a work-group
};

TEST_P(BackendConformanceTest, Attention) {
  SKIP_UNLESS_SUPPORTED(Op::kAttention, WeightType::kF32);
  for (const AttentionCase& c : kAttentionCases) {
    const std::string what = StrCat(On(), c.Describe(), " fp32 caches");
    const Floats q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 1);
    const Floats k = RandomFloats(static_cast<size_t>(c.n_kv() * c.n_head_kv * c.dk), 2);
    const Floats v = RandomFloats(static_cast<size_t>(c.n_kv() * c.n_head_kv * c.dv), 3);
    absl::StatusOr<Floats> got = RunAttention(backend(), c, q, k, v, false);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunAttention(reference(), c, q, k, v, false);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
    EXPECT_TRUE(CloseToNaive(*got, NaiveAttention(c, q, k, v))) << what;
  }
}

// Attention without a mask: a vision tower's self-attention (as many keys as queries)
// and a resampler's cross-attention (few queries over many keys).
TEST_P(BackendConformanceTest, FullAttention) {
  SKIP_UNLESS_SUPPORTED(Op::kFullAttention, WeightType::kF32);
  struct FullCase {
    AttentionCase c;
    int64_t n_kv;
  };
  const FullCase cases[] = {
      {{2, 2, 32, 32, 0, 10}, 10},    // ViT self-attention
      {{4, 4, 16, 16, 0, 3}, 13},     // cross-attention: 3 queries over 13 keys
      {{4, 2, 16, 24, 0, 5}, 7},      // grouped heads, dk != dv
      {{2, 2, 128, 128, 0, 4}, 300},  // many keys
      {{1, 1, 8, 8, 0, 1}, 1},        // one key
  };
  for (const FullCase& f : cases) {
    const AttentionCase& c = f.c;
    const std::string what = StrCat(On(), "full ", c.Describe(), " over ", f.n_kv, " keys");
    const Floats q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 4);
    const Floats k = RandomFloats(static_cast<size_t>(f.n_kv * c.n_head_kv * c.dk), 5);
    const Floats v = RandomFloats(static_cast<size_t>(f.n_kv * c.n_head_kv * c.dv), 6);
    absl::StatusOr<Floats> got = RunFullAttention(backend(), c, q, k, v, f.n_kv);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunFullAttention(reference(), c, q, k, v, f.n_kv);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
    EXPECT_TRUE(CloseToNaive(*got, NaiveAttention(c, q, k, v, f.n_kv))) << what;
  }
}

// The entropy of FullAttention's distributions (visual-token pruning ranks by it):
// against the naive formula, and its bounds (0 for one key, ln n_kv for equal scores).
TEST_P(BackendConformanceTest, AttentionEntropy) {
  SKIP_UNLESS_SUPPORTED(Op::kAttentionEntropy, WeightType::kF32);
  struct EntropyCase {
    AttentionCase c;
    int64_t n_kv;
  };
  const EntropyCase cases[] = {
      {{4, 4, 16, 16, 0, 3}, 13},     // cross-attention: 3 queries over 13 keys
      {{4, 2, 16, 24, 0, 5}, 7},      // grouped heads
      {{2, 2, 128, 128, 0, 4}, 300},  // many keys
      {{1, 1, 8, 8, 0, 2}, 1},        // one key: 0
  };
  for (const EntropyCase& f : cases) {
    const AttentionCase& c = f.c;
    const std::string what = StrCat(On(), "entropy ", c.Describe(), " over ", f.n_kv, " keys");
    const Floats q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 14);
    const Floats k = RandomFloats(static_cast<size_t>(f.n_kv * c.n_head_kv * c.dk), 15);
    absl::StatusOr<Floats> got = RunAttentionEntropy(backend(), c, q, k, f.n_kv);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunAttentionEntropy(reference(), c, q, k, f.n_kv);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
    EXPECT_TRUE(CloseToNaive(*got, NaiveAttentionEntropy(c, q, k, f.n_kv))) << what;
    for (float e : *got) {
      EXPECT_GE(e, -1e-5f) << what;
      EXPECT_LE(e, std::log(static_cast<float>(f.n_kv)) + 1e-4f) << what;
    }
  }
  // Zero queries: every score equal, the entropy is ln n_kv.
  const AttentionCase c{2, 2, 16, 16, 0, 2};
  const Floats q(static_cast<size_t>(c.n * c.n_head * c.dk), 0.0f);
  const Floats k = RandomFloats(static_cast<size_t>(9 * c.n_head_kv * c.dk), 16);
  absl::StatusOr<Floats> got = RunAttentionEntropy(backend(), c, q, k, 9);
  ASSERT_TRUE(got.ok()) << got.status();
  for (float e : *got) EXPECT_NEAR(e, std::log(9.0f), 1e-5f);
}

// Half KV caches written by the backend's own StoreHalf; the CPU reference attends
// over the same halves widened back to floats.
TEST_P(BackendConformanceTest, AttentionOverHalfCaches) {
  SKIP_UNLESS_SUPPORTED(Op::kAttention, WeightType::kF32);
  SKIP_UNLESS_SUPPORTED(Op::kStoreHalf, WeightType::kF32);
  for (const AttentionCase& c : kAttentionCases) {
    const std::string what = StrCat(On(), c.Describe(), " half caches");
    const Floats q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 4);
    const Floats k = RandomFloats(static_cast<size_t>(c.n_kv() * c.n_head_kv * c.dk), 5);
    const Floats v = RandomFloats(static_cast<size_t>(c.n_kv() * c.n_head_kv * c.dv), 6);
    std::vector<uint16_t> halves;
    absl::StatusOr<Floats> got = RunAttention(backend(), c, q, k, v, true, &halves);
    if (got.status().code() == absl::StatusCode::kUnimplemented) {
      GTEST_SKIP() << backend().name()
                   << " does not run attention over half caches: " << got.status();
    }
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    Floats k16(k.size()), v16(v.size());
    std::vector<uint16_t> want_halves;
    for (size_t i = 0; i < k.size(); ++i) want_halves.push_back(core::FloatToFp16(k[i]));
    for (size_t i = 0; i < v.size(); ++i) want_halves.push_back(core::FloatToFp16(v[i]));
    ASSERT_TRUE(SameBits(halves, want_halves)) << what << ": the caches StoreHalf wrote";
    for (size_t i = 0; i < k.size(); ++i) k16[i] = RoundToHalf(k[i]);
    for (size_t i = 0; i < v.size(); ++i) v16[i] = RoundToHalf(v[i]);
    absl::StatusOr<Floats> want = RunAttention(reference(), c, q, k16, v16, false);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
    EXPECT_TRUE(CloseToNaive(*got, NaiveAttention(c, q, k16, v16))) << what;
  }
}

TEST_P(BackendConformanceTest, Softmax) {
  SKIP_UNLESS_SUPPORTED(Op::kSoftmax, WeightType::kF32);
  for (int64_t rows : {1, 3}) {
    for (int64_t width : {1, 7, 37, 256, 1000}) {
      for (bool in_place : {false, true}) {
        const std::string what =
            StrCat(On(), "softmax ", rows, "x", width, in_place ? " in place" : "");
        const Floats x =
            RandomFloats(static_cast<size_t>(rows * width), static_cast<uint32_t>(width), 4.0f);
        absl::StatusOr<Floats> got = RunSoftmax(backend(), x, rows, width, in_place);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<Floats> want = RunSoftmax(reference(), x, rows, width, false);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
        EXPECT_TRUE(CloseToNaive(*got, NaiveSoftmax(x, rows, width))) << what;
      }
    }
  }
}

TEST_P(BackendConformanceTest, SiluMul) {
  SKIP_UNLESS_SUPPORTED(Op::kSiluMul, WeightType::kF32);
  for (int64_t count : {1, 7, 100, 1003}) {
    const std::string what = StrCat(On(), "silu_mul ", count);
    const Floats g = RandomFloats(static_cast<size_t>(count), 7, 3.0f);
    const Floats u = RandomFloats(static_cast<size_t>(count), 8);
    absl::StatusOr<Floats> got = RunSiluMul(backend(), g, u);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunSiluMul(reference(), g, u);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-12)) << what;
    Naive naive;
    for (size_t i = 0; i < g.size(); ++i) {
      const double v = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      naive.Push(v, std::fabs(v));
    }
    EXPECT_TRUE(CloseToNaive(*got, naive)) << what;
  }
}

// Within one half ulp of `want` (GELU's outputs are halves); exact outside (-10, 10).
::testing::AssertionResult GeluClose(const Floats& x, const Floats& got, const Floats& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t exact = 0, inside = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool tails = x[i] <= -10.0f || x[i] >= 10.0f;
    const double tol = tails ? 0.0 : std::fabs(want[i]) / 1024.0 + 1e-6;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << "gelu(" << x[i] << ") = " << got[i] << ", want " << want[i] << " (at " << i << ")";
    }
    if (!tails) {
      ++inside;
      exact += got[i] == want[i];
      if (got[i] != RoundToHalf(got[i])) {
        return ::testing::AssertionFailure()
               << "gelu(" << x[i] << ") = " << got[i] << " is not a half value";
      }
    }
  }
  if (inside >= 100 && exact * 10 < inside * 9) {
    return ::testing::AssertionFailure() << "only " << exact << " of " << inside << " exact";
  }
  return ::testing::AssertionSuccess();
}

TEST_P(BackendConformanceTest, Gelu) {
  SKIP_UNLESS_SUPPORTED(Op::kGelu, WeightType::kF32);
  for (int64_t count : {1, 7, 1003}) {
    for (bool in_place : {false, true}) {
      const std::string what = StrCat(On(), "gelu ", count, in_place ? " in place" : "");
      std::mt19937 rng(static_cast<uint32_t>(count));
      std::uniform_real_distribution<float> dist(-12.0f, 12.0f);
      Floats x(static_cast<size_t>(count));
      for (float& v : x) v = dist(rng);
      const float edges[] = {-10.0f, 10.0f, -10.001f, 9.999f, 0.0f,
                             -0.0f,  1e-8f, -3.0f,    3.0f,   50.0f};
      for (size_t i = 0; i < x.size() && i < std::size(edges); ++i) {
        if (count > 7) x[i] = edges[i];
      }
      absl::StatusOr<Floats> got = RunGelu(backend(), x, in_place);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<Floats> want = RunGelu(reference(), x, false);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(GeluClose(x, *got, *want)) << what << " vs the CPU";
      Floats naive(x.size());
      for (size_t i = 0; i < x.size(); ++i) naive[i] = NaiveGelu(x[i]);
      EXPECT_TRUE(GeluClose(x, *got, naive)) << what << " vs the formula";
    }
  }
}

TEST_P(BackendConformanceTest, Add) {
  SKIP_UNLESS_SUPPORTED(Op::kAdd, WeightType::kF32);
  for (int64_t count : {1, 7, 1003}) {
    const std::string what = StrCat(On(), "add ", count);
    const Floats x = RandomFloats(static_cast<size_t>(count), 9);
    const Floats y = RandomFloats(static_cast<size_t>(count), 10);
    absl::StatusOr<Floats> got = RunAdd(backend(), x, y);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunAdd(reference(), x, y);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(SameBits(*got, *want)) << what;
    Floats naive(x.size());
    for (size_t i = 0; i < x.size(); ++i) naive[i] = x[i] + y[i];
    EXPECT_TRUE(SameBits(*got, naive)) << what << " vs x + y";
  }
}

TEST_P(BackendConformanceTest, AddBias) {
  SKIP_UNLESS_SUPPORTED(Op::kAddBias, WeightType::kF32);
  for (int64_t n : {1, 3, 13}) {
    for (int64_t width : {1, 7, 40}) {
      const std::string what = StrCat(On(), "add_bias ", n, "x", width);
      const Floats y = RandomFloats(static_cast<size_t>(n * width), 11);
      const Floats bias = RandomFloats(static_cast<size_t>(width), 12);
      absl::StatusOr<Floats> got = RunAddBias(backend(), y, bias, n);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<Floats> want = RunAddBias(reference(), y, bias, n);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(SameBits(*got, *want)) << what;
      Floats naive = y;
      for (size_t i = 0; i < naive.size(); ++i) naive[i] += bias[i % bias.size()];
      EXPECT_TRUE(SameBits(*got, naive)) << what << " vs y + b";
    }
  }
}

TEST_P(BackendConformanceTest, GatedAdd) {
  SKIP_UNLESS_SUPPORTED(Op::kGatedAdd, WeightType::kF32);
  for (int64_t n : {1, 3, 13}) {
    for (int64_t width : {1, 7, 40}) {
      const std::string what = StrCat(On(), "gated_add ", n, "x", width);
      const Floats out = RandomFloats(static_cast<size_t>(n * width), 13);
      const Floats y = RandomFloats(static_cast<size_t>(n * width), 14);
      const Floats gate = RandomFloats(static_cast<size_t>(n), 15, 3.0f);
      absl::StatusOr<Floats> got = RunGatedAdd(backend(), out, y, gate, n);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<Floats> want = RunGatedAdd(reference(), out, y, gate, n);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(NmseBelow(*got, *want, 1e-12)) << what;
      Naive naive;
      for (size_t i = 0; i < out.size(); ++i) {
        const double g =
            1.0 / (1.0 + std::exp(-static_cast<double>(gate[i / static_cast<size_t>(width)])));
        const double term = static_cast<double>(y[i]) * g;
        naive.Push(out[i] + term, std::fabs(out[i]) + std::fabs(term));
      }
      EXPECT_TRUE(CloseToNaive(*got, naive)) << what << " vs the formula";
    }
  }
}

TEST_P(BackendConformanceTest, TopK) {
  SKIP_UNLESS_SUPPORTED(Op::kTopK, WeightType::kF32);
  for (const auto& [n_expert, k] : {std::pair{8, 1}, {8, 2}, {64, 4}, {256, 8}}) {
    for (bool renormalize : {false, true}) {
      for (int64_t n : {1, 5}) {
        const std::string what = StrCat(On(), "top_k ", k, " of ", n_expert, " n ", n,
                                        renormalize ? " renormalized" : "");
        Floats logits = RandomFloats(static_cast<size_t>(n * n_expert),
                                     static_cast<uint32_t>(n_expert + k), 2.0f);
        if (n == 5) {
          // Token 3: all equal; token 4: two equal maxima (ties: the lower index).
          for (int e = 0; e < n_expert; ++e) logits[static_cast<size_t>(3 * n_expert + e)] = 0.5f;
          logits[static_cast<size_t>(4 * n_expert + 1)] = 9.0f;
          logits[static_cast<size_t>(4 * n_expert + 6)] = 9.0f;
        }
        absl::StatusOr<TopKResult> got = RunTopK(backend(), logits, n, n_expert, k, renormalize);
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<TopKResult> want = RunTopK(reference(), logits, n, n_expert, k, renormalize);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_EQ(got->experts, want->experts) << what;
        EXPECT_TRUE(NmseBelow(got->weights, want->weights, 1e-10)) << what;
        std::vector<int32_t> naive_experts;
        Naive naive_weights;
        NaiveTopK(logits, n, n_expert, k, renormalize, &naive_experts, &naive_weights);
        EXPECT_EQ(got->experts, naive_experts) << what << " vs the formula";
        EXPECT_TRUE(CloseToNaive(got->weights, naive_weights)) << what << " vs the formula";
      }
    }
  }
}

void BackendConformanceTest::CheckFusedMoe(WeightType type) {
  SKIP_UNLESS_SUPPORTED(Op::kFusedMoe, type);
  const MoeWeights w = MakeMoeWeights(type, 6, 64, 96, 21);
  absl::StatusOr<StackedExperts> got_w = UploadExperts(backend(), w);
  ASSERT_TRUE(got_w.ok()) << got_w.status();
  absl::StatusOr<StackedExperts> want_w = UploadExperts(reference(), w);
  ASSERT_TRUE(want_w.ok()) << want_w.status();
  const bool unfused = backend().Supports(Op::kMatMul, type) && backend().Supports(Op::kSiluMul) &&
                       backend().Supports(Op::kMoeCombine);
  // Routed: k = 2, decode and a batch, an empty slot in slot 1; and k = 3.
  for (const auto& [n, k] : {std::pair<int64_t, int>{1, 2}, {5, 2}, {4, 3}}) {
    const std::string what = StrCat(On(), "fused_moe ", WeightTypeName(type), " stacked 6 x ",
                                    w.n_ff, "x", w.n_embd, " k ", k, " n ", n);
    std::vector<int32_t> ids;
    Floats weights;
    MakeRouting(n, k, w.n_expert, 22, {{n - 1, 1}}, &ids, &weights);
    const Floats x = RandomFloats(static_cast<size_t>(n * w.n_embd), 23);
    absl::StatusOr<Floats> got =
        RunFusedMoe(backend(), got_w->experts(), w.n_embd, x, n, k, ids, weights);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want =
        RunFusedMoe(reference(), want_w->experts(), w.n_embd, x, n, k, ids, weights);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-6)) << what;
    if (unfused) {
      absl::StatusOr<Floats> parts = RunUnfusedMoe(backend(), *got_w, w, x, n, k, ids, weights);
      ASSERT_TRUE(parts.ok()) << what << ": " << parts.status();
      EXPECT_TRUE(NmseBelow(*got, *parts, 1e-6)) << what << " vs matmuls + silu_mul + combine";
    }
  }
  // Dense: one expert, no experts or weights buffers, k = 1.
  const MoeWeights dense = MakeMoeWeights(type, 1, 64, 96, 24);
  absl::StatusOr<StackedExperts> got_d = UploadExperts(backend(), dense);
  ASSERT_TRUE(got_d.ok()) << got_d.status();
  absl::StatusOr<StackedExperts> want_d = UploadExperts(reference(), dense);
  ASSERT_TRUE(want_d.ok()) << want_d.status();
  for (int64_t n : {1, 3}) {
    const std::string what = StrCat(On(), "fused_moe ", WeightTypeName(type), " dense 96x64 n ", n);
    const Floats x = RandomFloats(static_cast<size_t>(n * dense.n_embd), 25);
    absl::StatusOr<Floats> got = RunFusedMoe(backend(), got_d->experts(), 64, x, n, 1, {}, {});
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<Floats> want = RunFusedMoe(reference(), want_d->experts(), 64, x, n, 1, {}, {});
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(*got, *want, 1e-6)) << what;
    if (unfused) {
      const std::vector<int32_t> zeros(static_cast<size_t>(n), 0);
      const Floats ones(static_cast<size_t>(n), 1.0f);
      absl::StatusOr<Floats> parts = RunUnfusedMoe(backend(), *got_d, dense, x, n, 1, zeros, ones);
      ASSERT_TRUE(parts.ok()) << what << ": " << parts.status();
      EXPECT_TRUE(NmseBelow(*got, *parts, 1e-6)) << what << " vs matmuls + silu_mul";
    }
  }
}

TEST_P(BackendConformanceTest, FusedMoeW4) { CheckFusedMoe(WeightType::kW4); }
TEST_P(BackendConformanceTest, FusedMoeW4M) { CheckFusedMoe(WeightType::kW4M); }
TEST_P(BackendConformanceTest, FusedMoeW8) { CheckFusedMoe(WeightType::kW8); }
TEST_P(BackendConformanceTest, FusedMoeW4S24) { CheckFusedMoe(WeightType::kW4S24); }

// Experts in an expert pool: blocks [gate | up | down] at scattered offsets of one
// host region, wrapped (WrapHost) and published; the host then rewrites one block and
// publishes it again.
void BackendConformanceTest::CheckFusedMoePlaced(WeightType type) {
  SKIP_UNLESS_SUPPORTED(Op::kFusedMoe, type);
  const WeightFormat format = *PackedFormatOf(type);
  const MoeWeights w = MakeMoeWeights(type, 6, 64, 96, 31);
  const size_t gb = w.gate.packed.group_bytes(), db = w.down.packed.group_bytes();
  const size_t block = 4096 * ((2 * gb + db + 4095) / 4096);
  const std::vector<size_t> slot_of = {3, 0, 6, 2, 5, 1};  // of 7 slots; slot 4 is free
  const size_t region_bytes = 7 * block;
  std::unique_ptr<uint8_t, decltype(&std::free)> region(
      static_cast<uint8_t*>(std::aligned_alloc(4096, region_bytes)), &std::free);
  ASSERT_NE(region, nullptr);
  std::memset(region.get(), 0xEE, region_bytes);
  std::vector<uint64_t> offsets(static_cast<size_t>(w.n_expert));
  const auto place = [&](int e, int as) {  // expert `as`'s weights into e's block
    uint8_t* b = region.get() + offsets[static_cast<size_t>(e)];
    std::memcpy(b, w.gate.packed.group(as).data, gb);
    std::memcpy(b + gb, w.up.packed.group(as).data, gb);
    std::memcpy(b + 2 * gb, w.down.packed.group(as).data, db);
  };
  for (int e = 0; e < w.n_expert; ++e) {
    offsets[static_cast<size_t>(e)] = slot_of[static_cast<size_t>(e)] * block;
    place(e, e);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> wrapped = backend().WrapHost(region.get(), region_bytes);
  if (wrapped.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << backend().name() << " cannot wrap host memory: " << wrapped.status();
  }
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  ASSERT_TRUE(backend().Publish(**wrapped, 0, region_bytes).ok());
  absl::StatusOr<std::unique_ptr<Buffer>> ref_region =
      reference().WrapHost(region.get(), region_bytes);
  ASSERT_TRUE(ref_region.ok()) << ref_region.status();
  const auto placed = [&](Buffer* r, std::span<const uint64_t> at) {
    Experts e;
    e.region = r;
    e.parts[0] = {format, w.n_ff, w.n_embd, 0};
    e.parts[1] = {format, w.n_ff, w.n_embd, gb};
    e.parts[2] = {format, w.n_embd, w.n_ff, 2 * gb};
    e.n_expert = w.n_expert;
    e.offsets = at;
    return e;
  };
  absl::StatusOr<StackedExperts> stacked = UploadExperts(reference(), w);
  ASSERT_TRUE(stacked.ok()) << stacked.status();

  const int k = 2;
  const int64_t n = 5;
  std::vector<int32_t> ids;
  Floats weights;
  MakeRouting(n, k, w.n_expert, 32, {{1, 1}}, &ids, &weights);  // 2 is routed to; 0, 3 not
  const Floats x = RandomFloats(static_cast<size_t>(n * w.n_embd), 33);
  const std::string what = StrCat(On(), "fused_moe ", WeightTypeName(type), " placed 6 x ", w.n_ff,
                                  "x", w.n_embd, " k ", k, " n ", n);
  const auto run = [&](Backend& b, Buffer* r, std::span<const uint64_t> at) {
    return RunFusedMoe(b, placed(r, at), w.n_embd, x, n, k, ids, weights);
  };
  absl::StatusOr<Floats> got = run(backend(), wrapped->get(), offsets);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  absl::StatusOr<Floats> want = run(reference(), ref_region->get(), offsets);
  ASSERT_TRUE(want.ok()) << what << ": " << want.status();
  EXPECT_TRUE(NmseBelow(*got, *want, 1e-6)) << what;
  absl::StatusOr<Floats> want_stacked =
      RunFusedMoe(reference(), stacked->experts(), w.n_embd, x, n, k, ids, weights);
  ASSERT_TRUE(want_stacked.ok()) << what << ": " << want_stacked.status();
  EXPECT_TRUE(SameBits(*want, *want_stacked)) << what << ": placed vs stacked on the CPU";
  // Experts no token is routed to need no real place (the scheduler passes 0).
  std::vector<uint64_t> routed_only = offsets;
  routed_only[0] = routed_only[3] = 0;
  absl::StatusOr<Floats> got_routed = run(backend(), wrapped->get(), routed_only);
  ASSERT_TRUE(got_routed.ok()) << what << ", unrouted experts at offset 0: " << got_routed.status();
  EXPECT_TRUE(SameBits(*got_routed, *got)) << what << ", unrouted experts at offset 0";

  // Expert 2's block rewritten with expert 0's weights (a new load into a reused
  // block): once published, the op reads the new bytes.
  place(2, 0);
  ASSERT_TRUE(backend().Publish(**wrapped, offsets[2], block).ok());
  got = run(backend(), wrapped->get(), offsets);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  absl::StatusOr<Floats> want2 = run(reference(), ref_region->get(), offsets);
  ASSERT_TRUE(want2.ok()) << what << ": " << want2.status();
  EXPECT_TRUE(NmseBelow(*got, *want2, 1e-6)) << what << " after a block is rewritten";
  EXPECT_FALSE(NmseBelow(*want2, *want, 1e-3)) << what << ": the rewrite is visible";

  // A routed expert placed past the region is refused, and the op still runs after.
  std::vector<uint64_t> bad = offsets;
  bad[2] = region_bytes - block / 2;
  absl::StatusOr<Floats> refused = run(backend(), wrapped->get(), bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange)
      << what << ": " << refused.status();
  // Fewer offsets than experts.
  refused = run(backend(), wrapped->get(), std::span<const uint64_t>(offsets).first(3));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
      << what << ": " << refused.status();
  got = run(backend(), wrapped->get(), offsets);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  EXPECT_TRUE(NmseBelow(*got, *want2, 1e-6)) << what << " after refused calls";
}

TEST_P(BackendConformanceTest, FusedMoePlacedW4) { CheckFusedMoePlaced(WeightType::kW4); }
TEST_P(BackendConformanceTest, FusedMoePlacedW4M) { CheckFusedMoePlaced(WeightType::kW4M); }
TEST_P(BackendConformanceTest, FusedMoePlacedW8) { CheckFusedMoePlaced(WeightType::kW8); }
TEST_P(BackendConformanceTest, FusedMoePlacedW4S24) { CheckFusedMoePlaced(WeightType::kW4S24); }

TEST_P(BackendConformanceTest, GatherRows) {
  SKIP_UNLESS_SUPPORTED(Op::kGatherRows, WeightType::kF32);
  const std::vector<int32_t> idx = {4, 0, 4, 2, 1, 3, 0};
  for (int64_t width : {1, 7, 40}) {
    for (size_t n : {size_t{1}, idx.size()}) {
      const std::string what = StrCat(On(), "gather_rows ", n, " of 5 rows of ", width);
      const Floats src = RandomFloats(static_cast<size_t>(5 * width), 41);
      const std::vector<int32_t> rows(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n));
      absl::StatusOr<Floats> got = RunGatherRows(backend(), src, 5, rows, width);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<Floats> want = RunGatherRows(reference(), src, 5, rows, width);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(SameBits(*got, *want)) << what;
      Floats naive;
      for (int32_t r : rows) {
        naive.insert(naive.end(), src.begin() + r * width, src.begin() + (r + 1) * width);
      }
      EXPECT_TRUE(SameBits(*got, naive)) << what << " vs the rows";
    }
  }
  // A row index outside the source (5 rows; -1 and 5) is refused, or on a device gives
  // that row as NaN and the others as they are: never a read outside the source.
  const Floats src = RandomFloats(5 * 8, 43);
  for (int32_t bad : {-1, 5}) {
    absl::StatusOr<Floats> got = RunGatherRows(backend(), src, 5, {1, bad, 3}, 8);
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
      continue;
    }
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ((*got)[i], src[8 + i]) << On() << "row 0, index " << bad;
      EXPECT_TRUE(std::isnan((*got)[8 + i])) << On() << "row 1, index " << bad;
      EXPECT_EQ((*got)[16 + i], src[24 + i]) << On() << "row 2, index " << bad;
    }
  }
}

TEST_P(BackendConformanceTest, MoeCombine) {
  SKIP_UNLESS_SUPPORTED(Op::kMoeCombine, WeightType::kF32);
  const int k = 2;
  for (int64_t n : {1, 3}) {
    for (int64_t width : {7, 40}) {
      const std::string what = StrCat(On(), "moe_combine n ", n, " k ", k, " width ", width,
                                      n > 1 ? " (an empty slot)" : "");
      // Token 1's second slot is empty (-1): its first term alone.
      const std::vector<int32_t> all_experts = {0, 3, 5, -1, 2, 1};
      const Floats all_weights = {0.75f, 0.25f, 0.5f, 0.5f, 0.125f, 0.875f};
      const std::vector<int32_t> experts(all_experts.begin(), all_experts.begin() + n * k);
      const Floats weights(all_weights.begin(), all_weights.begin() + n * k);
      const Floats y = RandomFloats(static_cast<size_t>(n * k * width), 42);
      absl::StatusOr<Floats> got = RunMoeCombine(backend(), y, experts, weights, n, k, width);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<Floats> want = RunMoeCombine(reference(), y, experts, weights, n, k, width);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(NmseBelow(*got, *want, 1e-12)) << what;
      EXPECT_TRUE(NmseBelow(*got, SlotSum(y, experts, weights, n, k, width), 1e-12))
          << what << " vs the slot sum";
    }
  }
}

TEST_P(BackendConformanceTest, StoreHalf) {
  SKIP_UNLESS_SUPPORTED(Op::kStoreHalf, WeightType::kF32);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1013}}) {
    const std::string what = StrCat(On(), "store_half ", count);
    Floats x = RandomFloats(count, 51, 8.0f);
    // Ties to even, overflow to infinity, subnormals, signed zero, infinities.
    const float edges[] = {0.0f,
                           -0.0f,
                           1.0f,
                           65504.0f,
                           65520.0f,
                           1e6f,
                           -1e6f,
                           6e-8f,
                           3e-5f,
                           1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048,
                           2049.0f,
                           2051.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i < std::size(edges) && count > 7 && i < count; ++i) x[i] = edges[i];
    absl::StatusOr<std::vector<uint16_t>> got = RunStoreHalf(backend(), x);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<std::vector<uint16_t>> want = RunStoreHalf(reference(), x);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(SameBits(*got, *want)) << what;
    std::vector<uint16_t> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = core::FloatToFp16(x[i]);
    EXPECT_TRUE(SameBits(*got, host)) << what << " vs core::FloatToFp16";
  }
}

// StoreKv's rows of every KV cache type, bit for bit the CPU's (whose rows
// tests/backend/kv_cache_test.cc checks against ggml's formulas); widths of one and
// several q8_0 blocks, and enough rows to spread over threads.
TEST_P(BackendConformanceTest, StoreKv) {
  SKIP_UNLESS_SUPPORTED(Op::kStoreKv, WeightType::kF32);
  for (KvType type : kAllKvTypes) {
    for (const auto& [rows, width] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {3, 96}, {300, 128}}) {
      const std::string what = StrCat(On(), "store_kv ", KvTypeName(type), " ", rows, "x", width);
      Floats x = RandomFloats(static_cast<size_t>(rows * width), 52, 3.0f);
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero q8_0 block
      absl::StatusOr<std::vector<uint8_t>> got = RunStoreKv(backend(), type, x, rows, width);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      absl::StatusOr<std::vector<uint8_t>> want = RunStoreKv(reference(), type, x, rows, width);
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      EXPECT_TRUE(SameBits(*got, *want)) << what;
    }
  }
}

// Attention, FullAttention and AttentionEntropy over caches of every pair of KV cache
// types (StoreKv's rows, made by the reference): a backend that reads both types
// (SupportsKv) agrees with the CPU; one that does not refuses, Unimplemented.
TEST_P(BackendConformanceTest, AttentionOverTypedCaches) {
  struct TypedCase {
    AttentionCase c;
    int64_t n_kv;  // 0: causal Attention over c.n_kv() positions
    bool entropy;
  };
  const TypedCase cases[] = {
      {{4, 2, 16, 16, 0, 5}, 0, false},       // prefill; q8_0 blocks hold two heads
      {{4, 2, 32, 16, 6, 3}, 0, false},       // a chunk after a cache, dk != dv
      {{4, 2, 128, 128, 300, 2}, 0, false},   // a long cache
      {{2, 2, 32, 32, 0, 10}, 10, false},     // full attention
      {{4, 2, 16, 32, 0, 3}, 13, true},       // entropy
  };
  for (KvType kt : kAllKvTypes) {
    for (KvType vt : kAllKvTypes) {
      if (kt == KvType::kF32 && vt == KvType::kF32) continue;  // the tests above
      const bool reads = backend().SupportsKv(kt) && backend().SupportsKv(vt);
      for (const TypedCase& tc : cases) {
        const AttentionCase& c = tc.c;
        const Op op = tc.entropy ? Op::kAttentionEntropy
                                 : tc.n_kv > 0 ? Op::kFullAttention : Op::kAttention;
        if (!backend().Supports(op)) continue;
        const std::string what = StrCat(On(), OpName(op), " ", c.Describe(), " over ",
                                        KvTypeName(kt), " keys, ", KvTypeName(vt), " values");
        const int64_t n_kv = tc.n_kv > 0 ? tc.n_kv : c.n_kv();
        const int64_t kw = c.n_head_kv * c.dk, vw = c.n_head_kv * c.dv;
        const Floats q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 61);
        const Floats k = RandomFloats(static_cast<size_t>(n_kv * kw), 62);
        const Floats v = RandomFloats(static_cast<size_t>(n_kv * vw), 63);
        TypedCaches caches{kt, vt, {}, {}};
        absl::StatusOr<std::vector<uint8_t>> kc = RunStoreKv(reference(), kt, k, n_kv, kw);
        absl::StatusOr<std::vector<uint8_t>> vc = RunStoreKv(reference(), vt, v, n_kv, vw);
        ASSERT_TRUE(kc.ok() && vc.ok()) << what << ": " << kc.status() << vc.status();
        caches.k = std::move(*kc);
        caches.v = std::move(*vc);
        absl::StatusOr<Floats> got =
            RunTypedAttention(backend(), c, q, caches, tc.n_kv, tc.entropy);
        if (!reads) {
          EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << what << ": "
                                                                           << got.status();
          continue;
        }
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        absl::StatusOr<Floats> want =
            RunTypedAttention(reference(), c, q, caches, tc.n_kv, tc.entropy);
        ASSERT_TRUE(want.ok()) << what << ": " << want.status();
        EXPECT_TRUE(NmseBelow(*got, *want, 1e-10)) << what;
      }
    }
  }
}

absl::Status BackendConformanceTest::CallOnce(Op op, WeightType type) {
  Backend& b = backend();
  const Floats x = RandomFloats(64, 71);  // 2 rows of 32
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> xb, Put(b, x));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> yb, Put(b, RandomFloats(64, 72)));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> out, Output(b, 64));
  // Expert ids / row indices (top-k writes 2 x 2 of them).
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> ib, Put(b, std::vector<int32_t>{1, 0, 1, 0}));
  absl::Status s;
  switch (op) {
    case Op::kMatMul: {
      const Matrix m = MakeWeight(type, 1, 8, 32, 73);
      MOERT_ASSIGN_OR_RETURN(std::unique_ptr<Weight> w, b.UploadWeight(m, 1, "conformance.w"));
      s = b.MatMul(*w, 0, xb, 2, out);
      break;
    }
    case Op::kRmsNorm:
      s = b.RmsNorm(xb, 2, 32, yb, 1e-5f, out);
      break;
    case Op::kLayerNorm:
      s = b.LayerNorm(xb, 2, 32, yb, yb, 1e-5f, out);
      break;
    case Op::kRope: {
      RopeArgs rope;
      rope.n_rot = 8;
      s = b.Rope(rope, 1, 2, 2, 16, xb);
      break;
    }
    case Op::kAttention: {
      const AttentionArgs a{2, 1, 8, 8, 0.35f, false};
      s = b.Attention(a, xb, 2, 1, yb, yb, out);  // q 2x16, caches 3 rows of 8
      break;
    }
    case Op::kAttentionEntropy: {
      const AttentionArgs a{2, 1, 8, 8, 0.35f, false};
      s = b.AttentionEntropy(a, xb, 2, yb, 3, out);  // q 2x16, keys 3 rows of 8
      break;
    }
    case Op::kFullAttention: {
      const AttentionArgs a{2, 1, 8, 8, 0.35f, false};
      s = b.FullAttention(a, xb, 2, yb, yb, 3, out);  // q 2x16, keys 3 rows of 8
      break;
    }
    case Op::kSoftmax:
      s = b.Softmax(xb, 2, 32, out);
      break;
    case Op::kSiluMul:
      s = b.SiluMul(xb, yb, 64);
      break;
    case Op::kGelu:
      s = b.Gelu(xb, 64, out);
      break;
    case Op::kAdd:
      s = b.Add(xb, yb, 64);
      break;
    case Op::kAddBias:
      s = b.AddBias(xb, yb, 2, 32);
      break;
    case Op::kTopK:
      s = b.TopK(xb, 2, 8, 2, true, ib, out);
      break;
    case Op::kFusedMoe: {
      const MoeWeights w = MakeMoeWeights(type, 2, 32, 32, 74);
      MOERT_ASSIGN_OR_RETURN(StackedExperts e, UploadExperts(b, w));
      s = b.FusedMoe(e.experts(), xb, 2, 1, ib, yb, out);
      break;
    }
    case Op::kGatherRows:
      s = b.GatherRows(xb, 2, ib, 2, 32, out);
      break;
    case Op::kMoeCombine:
      s = b.MoeCombine(xb, ib, yb, 1, 2, 32, out);
      break;
    case Op::kStoreHalf:
      s = b.StoreHalf(xb, 64, out);
      break;
    case Op::kGatedAdd:
      s = b.GatedAdd(out, xb, yb, 2, 32);
      break;
    case Op::kStoreKv:
      s = b.StoreKv(KvType::kQ8_0, xb, 2, 32, out);  // 68 bytes
      break;
  }
  MOERT_RETURN_IF_ERROR(s);
  return b.Finish();
}

bool Typed(Op op) { return op == Op::kMatMul || op == Op::kFusedMoe; }

TEST_P(BackendConformanceTest, SupportedOpsRunOnSmallInputs) {
  for (Op op : kAllOps) {
    for (WeightType type : kAllWeightTypes) {
      if (!Typed(op) && type != WeightType::kF32) continue;
      if (!backend().Supports(op, type)) continue;
      const absl::Status s = CallOnce(op, type);
      EXPECT_TRUE(s.ok()) << On() << OpName(op) << " (" << WeightTypeName(type) << "): " << s;
    }
  }
}

TEST_P(BackendConformanceTest, UnsupportedOpsAreUnimplemented) {
  int unsupported = 0;
  for (Op op : kAllOps) {
    for (WeightType type : kAllWeightTypes) {
      if (!Typed(op) && type != WeightType::kF32) continue;
      if (backend().Supports(op, type)) continue;
      ++unsupported;
      const absl::Status s = CallOnce(op, type);
      EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented)
          << On() << OpName(op) << " (" << WeightTypeName(type) << "): " << s;
      const std::string message(s.message());
      EXPECT_TRUE(message.find(OpName(op)) != std::string::npos ||
                  message.find(WeightTypeName(type)) != std::string::npos)
          << On() << OpName(op) << " (" << WeightTypeName(type) << "): " << message;
    }
  }
  // And the backend still works.
  EXPECT_TRUE(CallOnce(Op::kRmsNorm, WeightType::kF32).ok());
  if (unsupported == 0) std::cout << "[ backend ] " << GetParam() << " supports every op\n";
}

// Arguments that do not fit their buffers are statuses (OutOfRange or
// InvalidArgument), never a crash, and the backend computes correctly afterwards.
TEST_P(BackendConformanceTest, BadArgumentsAreStatusesAndTheBackendKeepsWorking) {
  Backend& b = backend();
  const int64_t rows = 3, width = 32;
  const Floats x = RandomFloats(static_cast<size_t>(rows * width), 81);
  const Floats w = RandomFloats(static_cast<size_t>(width), 82);
  absl::StatusOr<Floats> good = RunRmsNorm(reference(), x, rows, width, w, 1e-5f, false);
  ASSERT_TRUE(good.ok()) << good.status();
  auto xb = Put(b, x);
  auto wb = Put(b, w);
  auto yb = Output(b, x.size());
  auto ib = Put(b, std::vector<int32_t>{0, 1, 2});
  auto small = Output(b, 8);
  ASSERT_TRUE(xb.ok() && wb.ok() && yb.ok() && ib.ok() && small.ok());
  const TensorRef xr(*xb), wr(*wb), yr(*yb), ir(*ib), sr(*small);
  const auto still_works = [&](const std::string& after) {
    SCOPED_TRACE(after);
    ASSERT_TRUE(b.RmsNorm(xr, rows, width, wr, 1e-5f, yr).ok());
    absl::StatusOr<Floats> got = Get<float>(b, yr, x.size());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(NmseBelow(*got, *good, 1e-10)) << On() << "rms_norm 3x32 after " << after;
  };
  const auto refused = [&](Op op, const std::string& what, const absl::Status& s) {
    if (!b.Supports(op)) return;
    EXPECT_TRUE(s.code() == absl::StatusCode::kOutOfRange ||
                s.code() == absl::StatusCode::kInvalidArgument)
        << On() << OpName(op) << " with " << what << ": " << s;
    EXPECT_TRUE(b.Finish().ok()) << On() << "after " << OpName(op) << " with " << what;
    still_works(StrCat(OpName(op), " with ", what));
  };
  refused(Op::kRmsNorm, "4 rows in buffers of 3", b.RmsNorm(xr, rows + 1, width, wr, 1e-5f, yr));
  refused(Op::kRmsNorm, "a weight of 8 for width 32", b.RmsNorm(xr, rows, width, sr, 1e-5f, yr));
  refused(Op::kRmsNorm, "x past the end of its buffer",
          b.RmsNorm(xr.At(x.size() * 4), 1, width, wr, 1e-5f, yr));
  refused(Op::kRmsNorm, "no weight", b.RmsNorm(xr, rows, width, TensorRef(), 1e-5f, yr));
  refused(Op::kLayerNorm, "4 rows in buffers of 3",
          b.LayerNorm(xr, rows + 1, width, wr, TensorRef(), 1e-5f, yr));
  refused(Op::kSoftmax, "an output of 8", b.Softmax(xr, rows, width, sr));
  refused(Op::kSiluMul, "u of 8", b.SiluMul(xr, sr, rows * width));
  refused(Op::kGelu, "an output of 8", b.Gelu(xr, rows * width, sr));
  refused(Op::kAdd, "one value too many", b.Add(xr, yr, rows * width + 1));
  refused(Op::kAdd, "a negative count", b.Add(xr, yr, -1));
  refused(Op::kAddBias, "a bias of 8 for width 32", b.AddBias(yr, sr, rows, width));
  refused(Op::kStoreHalf, "halves of 32 bytes for 96 values", b.StoreHalf(xr, rows * width, sr));
  refused(Op::kGatedAdd, "a gate of 8 for 13 rows", b.GatedAdd(xr, yr, sr, 13, 4));
  refused(Op::kStoreKv, "q8_0 rows of 48 values", b.StoreKv(KvType::kQ8_0, xr, 2, 48, yr));
  refused(Op::kStoreKv, "a cache of 32 bytes for 3 f16 rows of 32",
          b.StoreKv(KvType::kF16, xr, rows, width, sr));
  refused(Op::kTopK, "k above n_expert", b.TopK(xr, 1, 4, 5, true, ir, yr));
  refused(Op::kTopK, "logits of 8 for 3 x 8", b.TopK(sr, 3, 8, 1, true, ir, yr));
  refused(Op::kGatherRows, "a destination of 8 for 3 rows of 32",
          b.GatherRows(xr, rows, ir, 3, width, sr));
  refused(Op::kMoeCombine, "experts and weights of 3 for 2 x 2 slots",
          b.MoeCombine(xr, ir, ir, 2, 2, 16, yr));
  {
    RopeArgs rope;
    rope.n_rot = 8;
    refused(Op::kRope, "x of 8 for 2 heads of 16", b.Rope(rope, 0, 1, 2, 16, sr));
    rope.n_rot = 18;
    refused(Op::kRope, "n_rot above head_dim", b.Rope(rope, 0, 1, 2, 16, xr));
  }
  {
    const AttentionArgs a{2, 1, 8, 8, 0.35f, false};
    refused(Op::kAttention, "caches of 8 for 6 positions", b.Attention(a, xr, 2, 4, sr, sr, yr));
    const AttentionArgs gqa{3, 2, 8, 8, 0.35f, false};
    refused(Op::kAttention, "3 heads over 2 KV heads", b.Attention(gqa, xr, 1, 0, xr, xr, yr));
    if (b.SupportsKv(KvType::kQ8_0)) {
      AttentionArgs q8 = a;  // one KV head of 8: q8_0 rows of 8 values
      q8.k_type = KvType::kQ8_0;
      refused(Op::kAttention, "q8_0 keys of 8 values a row", b.Attention(q8, xr, 2, 1, xr, xr, yr));
    }
  }
  if (b.Supports(Op::kMatMul, WeightType::kF32)) {
    const Matrix m = MakeWeight(WeightType::kF32, 1, 8, 32, 83);
    absl::StatusOr<std::unique_ptr<Weight>> wt = b.UploadWeight(m, 1, "conformance.w");
    ASSERT_TRUE(wt.ok()) << wt.status();
    refused(Op::kMatMul, "f32 weights, an output of 8 for 3 x 8", b.MatMul(**wt, 0, xr, 3, sr));
    refused(Op::kMatMul, "f32 weights, group 1 of 1", b.MatMul(**wt, 1, xr, 1, yr));
  }
  for (WeightType type : kPackedTypes) {
    if (!b.Supports(Op::kMatMul, type)) continue;
    const Matrix m = MakeWeight(type, 1, 8, 32, 84);
    absl::StatusOr<std::unique_ptr<Weight>> wt = b.UploadWeight(m, 1, "conformance.w");
    ASSERT_TRUE(wt.ok()) << wt.status();
    refused(Op::kMatMul, StrCat(WeightTypeName(type), " weights, x of 8 for 1 x 32"),
            b.MatMul(**wt, 0, sr, 1, yr));
    break;
  }
  for (WeightType type : kPackedTypes) {
    if (!b.Supports(Op::kFusedMoe, type)) continue;
    const MoeWeights mw = MakeMoeWeights(type, 2, 32, 32, 85);
    absl::StatusOr<StackedExperts> e = UploadExperts(b, mw);
    ASSERT_TRUE(e.ok()) << e.status();
    refused(Op::kFusedMoe, StrCat(WeightTypeName(type), " experts, an output of 8 for 2 x 32"),
            b.FusedMoe(e->experts(), xr, 2, 1, ir, wr, sr));
    refused(Op::kFusedMoe, StrCat(WeightTypeName(type), " experts, k 2 without weights"),
            b.FusedMoe(e->experts(), xr, 1, 2, ir, TensorRef(), yr));
    // An expert id past the experts lives in backend memory, where a device cannot
    // check it before running: refused, or that token's output is NaN (ops.h); never a
    // read outside the weights, and the other token is right.
    const std::vector<int32_t> bad_ids = {1, 7};
    const Floats ones = {1.0f, 1.0f};
    const Floats x2(x.begin(), x.begin() + 2 * 32);
    absl::StatusOr<Floats> bad = RunFusedMoe(b, e->experts(), 32, x2, 2, 1, bad_ids, ones);
    const std::string what = StrCat(WeightTypeName(type), " experts, expert 7 of 2");
    if (bad.ok()) {
      absl::StatusOr<StackedExperts> ref_e = UploadExperts(reference(), mw);
      ASSERT_TRUE(ref_e.ok()) << ref_e.status();
      absl::StatusOr<Floats> want =
          RunFusedMoe(reference(), ref_e->experts(), 32, Floats(x2.begin(), x2.begin() + 32), 1, 1,
                      {1}, {1.0f});
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(NmseBelow(Floats(bad->begin(), bad->begin() + 32), *want, 1e-6))
          << On() << "fused_moe with " << what << ": token 0";
      for (size_t i = 32; i < bad->size(); ++i) {
        ASSERT_TRUE(std::isnan((*bad)[i])) << On() << "fused_moe with " << what << ": token 1";
      }
      still_works(StrCat("fused_moe with ", what));
    } else {
      refused(Op::kFusedMoe, what, bad.status());
    }
    break;
  }
}

TEST(BackendRegistryTest, ListsTheCpuFirstAndCreatesByName) {
  ASSERT_FALSE(RegisteredBackends().empty());
  EXPECT_EQ(RegisteredBackends()[0].name, "cpu");
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend("cpu", BackendOptions());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE((*cpu)->host_memory());
  absl::StatusOr<std::unique_ptr<Backend>> none = CreateBackend("no-such-backend", {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(none.status().message()).find("cpu"), std::string::npos) << none.status();
}

// The CPU backend's XNNPACK path for large fp32 batches (the vision encoder's): within
// float rounding of the naive product and of cpu::MatMul; small batches and quantized
// weights stay on moert's kernels, bit for bit.
TEST(CpuXnnpackF32Test, LargeBatchesMatchTheReferenceSmallOnesAreItsBits) {
  cpu::CpuBackend fast(2);
  fast.set_xnnpack_f32(true);
  cpu::CpuBackend plain(2);
  for (const auto& [rows, cols, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {40, 64, 8}, {96, 200, 33}, {257, 96, 128}, {24, 72, 7}, {24, 72, 1}}) {
    const std::string what = StrCat(rows, "x", cols, " n ", n);
    const Matrix m = MakeWeight(WeightType::kF32, 1, rows, cols, 91);
    const Floats x = RandomFloats(static_cast<size_t>(n * cols), 92);
    absl::StatusOr<MatMulResult> got = RunMatMul(fast, m, 1, 0, x, n);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    absl::StatusOr<MatMulResult> want = RunMatMul(plain, m, 1, 0, x, n);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status();
    EXPECT_TRUE(NmseBelow(got->y, want->y, 1e-10)) << what;
    EXPECT_TRUE(CloseToNaive(got->y, NaiveMatMul(m.data, rows, cols, x, n))) << what;
    if (n < cpu::XnnpackF32Gemm::kMinRows) {
      EXPECT_EQ(got->y, want->y) << what;
    }
  }
  const Matrix q = MakeWeight(WeightType::kW8, 1, 64, 64, 93);
  const Floats x = RandomFloats(64 * 16, 94);
  absl::StatusOr<MatMulResult> got = RunMatMul(fast, q, 1, 0, x, 16);
  absl::StatusOr<MatMulResult> want = RunMatMul(plain, q, 1, 0, x, 16);
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ(got->y, want->y);
}

std::vector<std::string> RegisteredNames() {
  std::vector<std::string> names;
  for (const BackendEntry& entry : RegisteredBackends()) names.emplace_back(entry.name);
  return names;
}

// Test names end in the backend's registry name ("cpu", "opencl").
std::string BackendTestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendConformanceTest, ::testing::ValuesIn(RegisteredNames()),
                         BackendTestName);

}  // namespace
}  // namespace moert::backend
