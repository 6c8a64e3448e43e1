// The A8 activation quantizers: every ISA variant gives the scalar reference's bytes,
// and the reference meets the definition in kernels/ukernel.h (scale amax / 127,
// round half to even, the sum of the values).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::kernels {
namespace {

std::vector<float> Inputs(size_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(k);
  for (float& v : x) v = normal(rng);
  if (k >= 64) {
    // A zero block, a block of one value, exact .5 ties, and huge / tiny magnitudes.
    for (size_t j = 0; j < 32; ++j) x[j] = 0.0f;
    for (size_t j = 32; j < 64; ++j) x[j] = -2.5f;
  }
  if (k >= 128) {
    for (size_t j = 64; j < 96; ++j) x[j] = 127.0f * 0.5f * static_cast<float>(j % 5) - 100.0f;
    for (size_t j = 96; j < 128; ++j) x[j] = (j % 2 ? 1e30f : -1e-30f);
  }
  return x;
}

// kernels/ukernel.h's definition of A8 quantization, written out here (not the scalar
// kernel): amax, d = amax / 127, id = 1 / d (0 for d 0), q = round-half-even(x * id)
// saturated to [-127, 127], 0 for a NaN x * id.
std::vector<moert_a8_block> NaiveQuant(const std::vector<float>& x) {
  std::vector<moert_a8_block> out(x.size() / 32);
  for (size_t b = 0; b < out.size(); ++b) {
    float amax = 0.0f;
    for (size_t j = 0; j < 32; ++j) {
      const float m = std::fabs(x[b * 32 + j]);
      if (!std::isnan(m)) amax = std::max(amax, m);
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (size_t j = 0; j < 32; ++j) {
      float v = x[b * 32 + j] * id;
      v = std::isnan(v) ? 0.0f : std::clamp(v, -127.0f, 127.0f);
      float r = std::floor(v);
      const float frac = v - r;
      if (frac > 0.5f || (frac == 0.5f && std::fmod(r, 2.0f) != 0.0f)) r += 1.0f;
      out[b].qs[j] = static_cast<int8_t>(r);
      s += static_cast<int32_t>(r);
    }
    out[b].d = d;
    out[b].s = s;
  }
  return out;
}

TEST(Q8QuantReferenceTest, MatchesDefinition) {
  const std::vector<float> x = Inputs(256, 5);
  std::vector<moert_a8_block> a(x.size() / 32);
  moert_q8_quant_ukernel__scalar(x.size(), x.data(), a.data());
  for (size_t b = 0; b < a.size(); ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(a[b].d, amax / 127.0f) << "block " << b;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
      const float v = x[b * 32 + j];
      EXPECT_LE(std::abs(a[b].qs[j]), 127);
      // Within half a step of the input.
      EXPECT_LE(std::fabs(a[b].d * a[b].qs[j] - v), a[b].d * 0.5f * 1.0001f + 1e-37f)
          << "block " << b << " value " << j;
      s += a[b].qs[j];
    }
    EXPECT_EQ(a[b].s, s) << "block " << b;
  }
  EXPECT_EQ(a[0].d, 0.0f);
  EXPECT_EQ(a[1].qs[0], -127);
}

TEST(Q8QuantReferenceTest, TiesRoundToEven) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // scale 1
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  moert_a8_block a;
  moert_q8_quant_ukernel__scalar(32, x.data(), &a);
  ASSERT_EQ(a.d, 1.0f);
  EXPECT_EQ(a.qs[1], 2);
  EXPECT_EQ(a.qs[2], 4);
  EXPECT_EQ(a.qs[3], -2);
}

class Q8QuantTest : public ::testing::TestWithParam<Isa> {};

TEST_P(Q8QuantTest, MatchesScalarBitForBit) {
  auto config = KernelConfigFor(GetParam());
  if (!config.ok()) GTEST_SKIP() << config.status().message();
  if (config->q8_quant.isa != GetParam()) {
    GTEST_SKIP() << "no q8-quant kernel for " << IsaName(GetParam());
  }
  for (size_t k : {32, 64, 96, 128, 256, 1024, 1408, 2048}) {
    const std::vector<float> x = Inputs(k, static_cast<uint32_t>(k));
    std::vector<moert_a8_block> got(k / 32), want(k / 32);
    config->q8_quant.quant(k, x.data(), got.data());
    moert_q8_quant_ukernel__scalar(k, x.data(), want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(moert_a8_block)), 0)
        << IsaName(GetParam()) << " k=" << k;
    // And the definition, so that the scalar variant is not only compared with itself.
    const std::vector<moert_a8_block> naive = NaiveQuant(x);
    for (size_t b = 0; b < naive.size(); ++b) {
      EXPECT_EQ(got[b].d, naive[b].d) << IsaName(GetParam()) << " k=" << k << " block " << b;
      EXPECT_EQ(got[b].s, naive[b].s) << IsaName(GetParam()) << " k=" << k << " block " << b;
      EXPECT_EQ(std::memcmp(got[b].qs, naive[b].qs, 32), 0)
          << IsaName(GetParam()) << " k=" << k << " block " << b;
    }
  }
}

// Exact ties after scaling, which random inputs never produce: every variant must round
// them half to even, as the reference does.
TEST_P(Q8QuantTest, TiesMatchScalar) {
  auto config = KernelConfigFor(GetParam());
  if (!config.ok()) GTEST_SKIP() << config.status().message();
  if (config->q8_quant.isa != GetParam()) {
    GTEST_SKIP() << "no q8-quant kernel for " << IsaName(GetParam());
  }
  std::vector<float> x(64);
  // Scale 1 (amax 127): 0.5, -1, 1.5, -2, ... (odd j are ties).
  x[0] = 127.0f;
  for (int j = 1; j < 32; ++j) x[j] = (j % 2 ? 0.5f : -0.5f) * static_cast<float>(j);
  // Scale 0.5 (amax 63.5): x * 2 = (j - 48) / 2, a tie for every odd j.
  x[32] = -63.5f;
  for (int j = 33; j < 64; ++j) x[j] = 0.25f * static_cast<float>(j - 48);
  std::vector<moert_a8_block> got(2), want(2);
  config->q8_quant.quant(x.size(), x.data(), got.data());
  moert_q8_quant_ukernel__scalar(x.size(), x.data(), want.data());
  ASSERT_EQ(want[0].d, 1.0f);
  ASSERT_EQ(want[1].d, 0.5f);
  EXPECT_EQ(want[0].qs[1], 0);  // 0.5 rounds to 0, 1.5 to 2
  EXPECT_EQ(want[0].qs[3], 2);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(moert_a8_block)), 0)
      << IsaName(GetParam());
  const std::vector<moert_a8_block> naive = NaiveQuant(x);
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_EQ(std::memcmp(got[b].qs, naive[b].qs, 32), 0) << IsaName(GetParam()) << " block " << b;
  }
}

// Inputs no finite activation of a healthy model gives, which a bad model file can
// (the model fuzzer found the scalar kernel converting NaN to int): NaN and infinite
// values, and blocks so small that d is subnormal and 1 / d overflows to infinity.
// Every variant gives the definition's bytes: NaN products 0, the rest saturated.
std::vector<float> NonFiniteInputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(6 * 32, 1.0f);
  for (size_t j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 16.0f;
  x[3] = nan;                                                  // block 0: one NaN
  for (size_t j = 32; j < 64; ++j) x[j] = nan;                 // block 1: all NaN
  x[64] = inf;                                                 // block 2: inf and finite
  x[65] = -inf;
  x[66] = -3.0f;
  // Block 3: d subnormal, 1 / d infinite; block 4: d rounds to 0.
  for (size_t j = 96; j < 128; ++j) x[j] = (j % 3 ? 1e-39f : -2e-39f);
  x[128] = 5e-44f;
  for (size_t j = 129; j < 160; ++j) x[j] = -1e-45f;
  for (size_t j = 160; j < 192; ++j) x[j] = j % 2 ? inf : -inf;  // block 5: all infinite
  return x;
}

TEST(Q8QuantReferenceTest, NonFiniteInputsAndSubnormalScalesAreDefined) {
  const std::vector<float> x = NonFiniteInputs();
  std::vector<moert_a8_block> a(x.size() / 32);
  moert_q8_quant_ukernel__scalar(x.size(), x.data(), a.data());
  EXPECT_EQ(a[0].qs[3], 0);  // NaN
  EXPECT_EQ(a[0].qs[0], -127);
  EXPECT_EQ(a[1].d, 0.0f);  // NaN never wins amax
  for (int j = 0; j < 32; ++j) EXPECT_EQ(a[1].qs[j], 0);
  EXPECT_EQ(a[2].qs[0], 0);  // inf * (1 / inf) = inf * 0: NaN
  EXPECT_EQ(a[2].qs[2], 0);  // finite * 0
  EXPECT_EQ(a[3].qs[1], 127);  // 1 / d overflowed: saturated
  EXPECT_EQ(a[3].qs[0], -127);
  EXPECT_EQ(a[4].d, 0.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(a[4].qs[j], 0);
  const std::vector<moert_a8_block> naive = NaiveQuant(x);
  for (size_t b = 0; b < a.size(); ++b) {
    EXPECT_EQ(std::memcmp(a[b].qs, naive[b].qs, 32), 0) << "block " << b;
    EXPECT_EQ(a[b].s, naive[b].s) << "block " << b;
  }
}

TEST_P(Q8QuantTest, NonFiniteInputsAndSubnormalScalesMatchScalar) {
  auto config = KernelConfigFor(GetParam());
  if (!config.ok()) GTEST_SKIP() << config.status().message();
  if (config->q8_quant.isa != GetParam()) {
    GTEST_SKIP() << "no q8-quant kernel for " << IsaName(GetParam());
  }
  const std::vector<float> x = NonFiniteInputs();
  std::vector<moert_a8_block> got(x.size() / 32), want(x.size() / 32);
  config->q8_quant.quant(x.size(), x.data(), got.data());
  moert_q8_quant_ukernel__scalar(x.size(), x.data(), want.data());
  for (size_t b = 0; b < got.size(); ++b) {
    EXPECT_EQ(std::memcmp(got[b].qs, want[b].qs, 32), 0) << IsaName(GetParam()) << " block " << b;
    EXPECT_EQ(got[b].s, want[b].s) << IsaName(GetParam()) << " block " << b;
    EXPECT_EQ(std::memcmp(&got[b].d, &want[b].d, sizeof(float)), 0)
        << IsaName(GetParam()) << " block " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q8QuantTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kNeonDot,
                                           Isa::kNeonI8mm, Isa::kSme2),
                         [](const ::testing::TestParamInfo<Isa>& param_info) {
                           return std::string(IsaName(param_info.param));
                         });

TEST(KernelConfigTest, ParsesIsaNames) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512Vnni, Isa::kAvx512Vbmi,
                  Isa::kAmx, Isa::kNeonDot, Isa::kNeonI8mm, Isa::kSme2}) {
    auto parsed = ParseIsa(IsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_FALSE(ParseIsa("avx512").ok());
  EXPECT_EQ(AvailableIsas().front(), Isa::kScalar);
  EXPECT_TRUE(KernelConfigFor(Isa::kScalar).ok());
}

// The scalar config is what every variant is checked against, on every machine: it
// must not pick up a faster ISA's kernels.
TEST(KernelConfigTest, ScalarConfigHoldsOnlyScalarKernels) {
  auto config = KernelConfigFor(Isa::kScalar);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->q8_quant.quant, &moert_q8_quant_ukernel__scalar);
  EXPECT_EQ(config->q8_quant.isa, Isa::kScalar);
  const struct {
    const GemmConfig& family;
    moert_qgemm_ukernel_fn gemv, gemm;
  } kFamilies[] = {
      {config->q4, moert_q4_gemv_ukernel_1x8__scalar, moert_q4_gemm_ukernel_4x8__scalar},
      {config->q4m, moert_q4m_gemv_ukernel_1x8__scalar, moert_q4m_gemm_ukernel_4x8__scalar},
      {config->q8, moert_q8_gemv_ukernel_1x8__scalar, moert_q8_gemm_ukernel_4x8__scalar},
      {config->q4s24, moert_q4s24_gemv_ukernel_1x8__scalar, moert_q4s24_gemm_ukernel_4x8__scalar},
  };
  for (const auto& f : kFamilies) {
    EXPECT_EQ(f.family.gemv, f.gemv);
    EXPECT_EQ(f.family.gemm, f.gemm);
    EXPECT_EQ(f.family.gemv_isa, Isa::kScalar);
    EXPECT_EQ(f.family.gemm_isa, Isa::kScalar);
  }
}

// A VNNI config layers its kernels over AVX2's: the families without a VNNI variant
// keep the AVX2 kernels, never the scalar ones.
TEST(KernelConfigTest, VnniConfigsKeepAvx2WhereTheyHaveNoVariant) {
  std::string skipped;
  int checked = 0;
  for (Isa isa : {Isa::kAvxVnni, Isa::kAvx512Vnni, Isa::kAvx512Vbmi}) {
    auto config = KernelConfigFor(isa);
    if (!config.ok()) {
      skipped += std::string(IsaName(isa)) + ": " + std::string(config.status().message()) + "; ";
      continue;
    }
    EXPECT_EQ(config->q8_quant.isa, Isa::kAvx2) << IsaName(isa);
    EXPECT_EQ(config->topk.isa, Isa::kAvx2) << IsaName(isa);
    // AVX512-VBMI has a W4S24 variant only: W4 and W8 keep AVX512-VNNI's.
    const Isa dense = isa == Isa::kAvx512Vbmi ? Isa::kAvx512Vnni : isa;
    EXPECT_EQ(config->q4.gemv_isa, dense);
    EXPECT_EQ(config->q4.gemm_isa, dense);
    EXPECT_EQ(config->q8.gemv_isa, dense);
    EXPECT_EQ(config->q4s24.gemv_isa, isa);
    EXPECT_EQ(config->q4s24.gemm_isa, isa);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << skipped;  // no VNNI ISA runs here
  if (!skipped.empty()) std::printf("skipped %s\n", skipped.c_str());
}

// The AMX config layers its GEMMs (W4, W4M, W8; 16 rows a call) over the best AVX-512
// config: the GEMVs (decode) and W4S24 keep the AVX-512 kernels.
TEST(KernelConfigTest, AmxConfigHasItsGemmsOverAvx512) {
  auto config = KernelConfigFor(Isa::kAmx);
  if (!config.ok()) GTEST_SKIP() << config.status().message();
  auto below =
      KernelConfigFor(IsaAvailable(Isa::kAvx512Vbmi) ? Isa::kAvx512Vbmi : Isa::kAvx512Vnni);
  ASSERT_TRUE(below.ok()) << below.status();
  for (auto family : {&KernelConfig::q4, &KernelConfig::q4m, &KernelConfig::q8}) {
    EXPECT_EQ(((*config).*family).gemm_isa, Isa::kAmx);
    EXPECT_EQ(((*config).*family).mr, 16u);
    EXPECT_EQ(((*config).*family).gemv, ((*below).*family).gemv);
  }
  EXPECT_EQ(config->q4s24.gemm, below->q4s24.gemm);
  EXPECT_EQ(config->q8_quant.quant, below->q8_quant.quant);
}

}  // namespace
}  // namespace moert::kernels
