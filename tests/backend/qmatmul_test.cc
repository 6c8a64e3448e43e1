// The CPU operators over the microkernels: QMatMuls against an fp32 matmul over the
// unpacked weights and dequantized activations, and FusedFfn (the MoE expert op)
// against an fp32 SwiGLU; GEMV vs GEMM, one token vs a batch and 1 vs 2 threads all
// give the same bits.
#include "backend/cpu/qmatmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/packing.h"
#include "core/thread_pool.h"
#include "format/ggml_types.h"
#include "kernels/config.h"

namespace moert::backend::cpu {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// An f32 matrix packed into `format` (groups of `rows` rows), and its unpacked values.
struct TestMatrix {
  PackedMatrix packed;
  std::vector<float> values;  // what the kernels multiply by, [groups * rows][cols]
};

TestMatrix MakeMatrix(WeightFormat format, int64_t groups, int64_t rows, int64_t cols,
                      uint32_t seed) {
  TestMatrix m;
  m.packed = PackedMatrix(format, groups, rows, cols);
  const std::vector<float> f = RandomFloats(static_cast<size_t>(groups * rows * cols), seed, 0.05f);
  m.values.resize(f.size());
  for (int64_t g = 0; g < groups; ++g) {
    std::span<const uint8_t> src(reinterpret_cast<const uint8_t*>(f.data() + g * rows * cols),
                                 static_cast<size_t>(rows * cols) * sizeof(float));
    EXPECT_TRUE(PackRows(format::GgmlType::kF32, src, rows, cols, format,
                         {m.packed.mutable_group(g), m.packed.group_bytes()})
                    .ok());
    EXPECT_TRUE(UnpackRows(format, {m.packed.group(g).data, m.packed.group_bytes()}, rows, cols,
                           0, rows, {m.values.data() + g * rows * cols,
                                     static_cast<size_t>(rows * cols)})
                    .ok());
  }
  return m;
}

// The activations the kernels see: x quantized to A8 and back.
std::vector<float> Dequantized(const A8Matrix& a) {
  std::vector<float> out(static_cast<size_t>(a.n() * a.k()));
  for (int64_t i = 0; i < a.n(); ++i) {
    for (int64_t b = 0; b < a.k() / 32; ++b) {
      const moert_a8_block& blk = a.row(i)[b];
      for (int j = 0; j < 32; ++j) out[static_cast<size_t>(i * a.k() + b * 32 + j)] = blk.d * blk.qs[j];
    }
  }
  return out;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

class QMatMulTest : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(QMatMulTest, MatchesFloatMatMulAndIsDeterministic) {
  const WeightFormat format = GetParam();
  const kernels::KernelConfig& config = kernels::GetKernelConfig();
  core::ThreadPool one(1), two(2);
  for (int64_t rows : {8, 13, 100}) {
    for (int64_t cols : {32, 96, 256}) {
      TestMatrix w = MakeMatrix(format, 1, rows, cols, static_cast<uint32_t>(rows * cols));
      const int64_t n = 5;
      const std::vector<float> x = RandomFloats(static_cast<size_t>(n * cols), 9);
      A8Matrix a;
      a.Quantize(config, one, x.data(), n, cols);
      const std::vector<float> xd = Dequantized(a);
      std::vector<float> y(static_cast<size_t>(n * rows)), y2(y.size());
      const QMatMulJob job{w.packed.group(0), &a, y.data()};
      QMatMuls(one, config, {&job, 1});
      const QMatMulJob job2{w.packed.group(0), &a, y2.data()};
      QMatMuls(two, config, {&job2, 1});
      EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0) << "1 vs 2 threads";
      for (int64_t t = 0; t < n; ++t) {
        // One row alone (the GEMV) gives the batch's (GEMM) bits.
        A8Matrix single;
        single.Quantize(config, one, x.data() + t * cols, 1, cols);
        std::vector<float> ys(static_cast<size_t>(rows));
        const QMatMulJob js{w.packed.group(0), &single, ys.data()};
        QMatMuls(two, config, {&js, 1});
        EXPECT_EQ(std::memcmp(ys.data(), y.data() + t * rows, ys.size() * 4), 0)
            << "token " << t << " alone vs in a batch, rows " << rows << " cols " << cols;
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = double{w.values[static_cast<size_t>(r * cols + c)]} *
                             xd[static_cast<size_t>(t * cols + c)];
            want += p;
            mag += std::fabs(p);
          }
          EXPECT_NEAR(y[static_cast<size_t>(t * rows + r)], want, 1e-5 * mag + 1e-6)
              << "rows " << rows << " cols " << cols << " at " << t << "," << r;
        }
      }
    }
  }
}

TEST_P(QMatMulTest, FusedExpertsMatchFloatSwiGlu) {
  const WeightFormat format = GetParam();
  const kernels::KernelConfig& config = kernels::GetKernelConfig();
  core::ThreadPool one(1), two(2);
  const int64_t n_embd = 64, n_ff = 96, n_expert = 4, n = 6;
  const int k = 2;
  TestMatrix gate = MakeMatrix(format, n_expert, n_ff, n_embd, 1);
  TestMatrix up = MakeMatrix(format, n_expert, n_ff, n_embd, 2);
  TestMatrix down = MakeMatrix(format, n_expert, n_embd, n_ff, 3);
  const auto expert = [&](int e) {
    return FfnView{gate.packed.group(e), up.packed.group(e), down.packed.group(e)};
  };
  ASSERT_TRUE(CanFuse(expert(0)));
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * n_embd), 4, 2.0f);
  // Token t uses experts (t % 4, (t + 1 + t / 4) % 4) with weights 0.7 / 0.3.
  std::vector<int> experts;
  std::vector<float> weights;
  for (int64_t t = 0; t < n; ++t) {
    experts.push_back(static_cast<int>(t % n_expert));
    experts.push_back(static_cast<int>((t + 1 + t / 4) % n_expert));
    weights.push_back(0.7f);
    weights.push_back(0.3f);
  }
  A8Matrix a;
  a.Quantize(config, two, x.data(), n, n_embd);
  std::vector<float> batch(static_cast<size_t>(n * n_embd));
  FusedFfn(two, config, a, k, experts.data(), weights.data(), expert, n_embd, batch.data());

  const std::vector<float> xd = Dequantized(a);
  for (int64_t t = 0; t < n; ++t) {
    // Alone, on one thread: the batch's bits.
    A8Matrix single;
    single.Quantize(config, one, x.data() + t * n_embd, 1, n_embd);
    std::vector<float> alone(static_cast<size_t>(n_embd));
    FusedFfn(one, config, single, k, experts.data() + t * k, weights.data() + t * k, expert,
             n_embd, alone.data());
    EXPECT_EQ(std::memcmp(alone.data(), batch.data() + t * n_embd, alone.size() * 4), 0)
        << "token " << t;
    // Against fp32 SwiGLU over the unpacked weights (the kernels also quantize h, so
    // compare with a relative RMS tolerance).
    std::vector<float> want(static_cast<size_t>(n_embd), 0.0f);
    for (int s = 0; s < k; ++s) {
      const int e = experts[static_cast<size_t>(t * k + s)];
      std::vector<float> h(static_cast<size_t>(n_ff));
      for (int64_t r = 0; r < n_ff; ++r) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < n_embd; ++c) {
          const float xv = xd[static_cast<size_t>(t * n_embd + c)];
          g += double{gate.values[static_cast<size_t>((e * n_ff + r) * n_embd + c)]} * xv;
          u += double{up.values[static_cast<size_t>((e * n_ff + r) * n_embd + c)]} * xv;
        }
        h[static_cast<size_t>(r)] = Silu(static_cast<float>(g)) * static_cast<float>(u);
      }
      for (int64_t r = 0; r < n_embd; ++r) {
        double y = 0;
        for (int64_t c = 0; c < n_ff; ++c) {
          y += double{down.values[static_cast<size_t>((e * n_embd + r) * n_ff + c)]} *
               h[static_cast<size_t>(c)];
        }
        want[static_cast<size_t>(r)] += weights[static_cast<size_t>(t * k + s)] * static_cast<float>(y);
      }
    }
    double err = 0, norm = 0;
    for (int64_t r = 0; r < n_embd; ++r) {
      const double d = double{batch[static_cast<size_t>(t * n_embd + r)]} - want[static_cast<size_t>(r)];
      err += d * d;
      norm += double{want[static_cast<size_t>(r)]} * want[static_cast<size_t>(r)];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.02) << "token " << t;
  }

  // A dense FFN (no routing): out = ffn(x).
  std::vector<float> dense(static_cast<size_t>(n * n_embd));
  FusedFfn(two, config, a, 1, nullptr, nullptr, expert, n_embd, dense.data());
  std::vector<int> zero(static_cast<size_t>(n), 0);
  std::vector<float> unit(static_cast<size_t>(n), 1.0f);
  std::vector<float> routed(dense.size());
  FusedFfn(two, config, a, 1, zero.data(), unit.data(), expert, n_embd, routed.data());
  EXPECT_EQ(dense, routed);

  // Empty slots (expert -1, as the router leaves them under dynamic or thermal k): a
  // token with its second slot empty gives exactly its first expert's weighted output,
  // in a batch and alone; the other tokens are untouched.
  std::vector<int> sparse = experts;
  std::vector<float> sparse_w = weights;
  for (int64_t t = 1; t < n; t += 2) {
    sparse[static_cast<size_t>(t * k + 1)] = -1;
    sparse_w[static_cast<size_t>(t * k + 1)] = 0;
  }
  std::vector<float> with_empty(batch.size());
  FusedFfn(two, config, a, k, sparse.data(), sparse_w.data(), expert, n_embd, with_empty.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> want(static_cast<size_t>(n_embd));
    if (t % 2 == 0) {
      std::copy(batch.begin() + t * n_embd, batch.begin() + (t + 1) * n_embd, want.begin());
    } else {
      A8Matrix single;
      single.Quantize(config, one, x.data() + t * n_embd, 1, n_embd);
      FusedFfn(one, config, single, 1, sparse.data() + t * k, sparse_w.data() + t * k, expert,
               n_embd, want.data());
      std::vector<float> alone(want.size());
      FusedFfn(one, config, single, k, sparse.data() + t * k, sparse_w.data() + t * k, expert,
               n_embd, alone.data());
      EXPECT_EQ(alone, want) << "token " << t << " alone";
    }
    EXPECT_EQ(std::memcmp(want.data(), with_empty.data() + t * n_embd, want.size() * 4), 0)
        << "token " << t;
  }
}

// GEMM kernels of any row count per call (4 here; 16 for SME2 and AMX): the operator
// splits a batch into calls of `mr` rows, and the bits do not depend on the split.
// The scalar GEMM loops over whatever m it gets, so it stands in for a 16-row kernel.
TEST_P(QMatMulTest, TheRowsPerGemmCallDoNotChangeTheBits) {
  const WeightFormat format = GetParam();
  absl::StatusOr<kernels::KernelConfig> four = kernels::KernelConfigFor(kernels::Isa::kScalar);
  ASSERT_TRUE(four.ok());
  kernels::KernelConfig sixteen = *four;
  for (auto family : {&kernels::KernelConfig::q4, &kernels::KernelConfig::q4m,
                      &kernels::KernelConfig::q8, &kernels::KernelConfig::q4s24}) {
    ASSERT_EQ(((*four).*family).mr, 4u);
    (sixteen.*family).mr = 16;
  }
  core::ThreadPool two(2);
  const int64_t rows = 40, cols = 96;
  TestMatrix w = MakeMatrix(format, 1, rows, cols, 17);
  for (int64_t n : {2, 15, 16, 17, 33, 40}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n * cols), 23);
    A8Matrix a;
    a.Quantize(*four, two, x.data(), n, cols);
    std::vector<float> y4(static_cast<size_t>(n * rows)), y16(y4.size());
    const QMatMulJob job4{w.packed.group(0), &a, y4.data()};
    QMatMuls(two, *four, {&job4, 1});
    const QMatMulJob job16{w.packed.group(0), &a, y16.data()};
    QMatMuls(two, sixteen, {&job16, 1});
    EXPECT_EQ(std::memcmp(y4.data(), y16.data(), y4.size() * 4), 0) << n << " rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QMatMulTest,
                         ::testing::Values(WeightFormat::kW4, WeightFormat::kW4M,
                                           WeightFormat::kW8, WeightFormat::kW4S24),
                         [](const ::testing::TestParamInfo<WeightFormat>& param_info) {
                           return std::string(WeightFormatName(param_info.param));
                         });

}  // namespace
}  // namespace moert::backend::cpu
