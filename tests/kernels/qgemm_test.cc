// Every quantized GEMV/GEMM microkernel (every format, every ISA variant this build
// has) through QGemmTester on the edge shapes: rows below the tile, N not a multiple
// of the tile, K = 32, large K, padded strides. A variant this CPU cannot run, or a
// family without a variant for the ISA, is skipped by name.
#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/config.h"
#if defined(MOERT_AMX_EMULATED_GEMM)
#include "kernels/amx_emulated_gemm.h"
#endif
#include "kernels/qgemm_tester.h"

namespace moert::kernels::testing {
namespace {

enum class Op { kGemv, kGemm };

using Param = std::tuple<WeightFormat, Isa, Op>;

class QGemmTest : public ::testing::TestWithParam<Param> {
 protected:
  // The kernel under test and its scalar reference; false (with a skip) when there
  // is nothing to test.
  bool Kernels(moert_qgemm_ukernel_fn* kernel, moert_qgemm_ukernel_fn* reference,
               uint32_t* mr) {
    const auto [format, isa, op] = GetParam();
    auto config = KernelConfigFor(isa);
    if (!config.ok()) {
      skip_reason_ = std::string(config.status().message());
      return false;
    }
    const GemmConfig& family = FamilyOf(*config, format);
    const Isa have = op == Op::kGemv ? family.gemv_isa : family.gemm_isa;
    if (have != isa) {
      skip_reason_ = std::string("no ") + WeightFormatName(format) +
                     (op == Op::kGemv ? " GEMV" : " GEMM") + " kernel for " + IsaName(isa);
      return false;
    }
    // Held in a named variable: FamilyOf returns a reference into the config.
    const absl::StatusOr<KernelConfig> scalar_config = KernelConfigFor(Isa::kScalar);
    const GemmConfig& scalar = FamilyOf(*scalar_config, format);
    *kernel = op == Op::kGemv ? family.gemv : family.gemm;
    *reference = op == Op::kGemv ? scalar.gemv : scalar.gemm;
    *mr = op == Op::kGemv ? 1 : family.mr;
    return true;
  }

  std::string skip_reason_;
};

// The checks, for a kernel of `format` taking up to `mr` rows, against its reference.
void EdgeShapes(WeightFormat format, moert_qgemm_ukernel_fn kernel,
                moert_qgemm_ukernel_fn reference, uint32_t mr) {
  uint32_t seed = 1;
  for (size_t m = 1; m <= mr; ++m) {
    for (size_t n : {1, 3, 7, 8, 9, 15, 16, 17, 24, 33, 64, 100}) {
      for (size_t kb : {1, 2, 3, 4, 7, 8, 33}) {
        QGemmTester().format(format).m(m).n(n).kb(kb).seed(seed++).Test(kernel, reference);
      }
    }
  }
}

void LargeK(WeightFormat format, moert_qgemm_ukernel_fn kernel, moert_qgemm_ukernel_fn reference,
            uint32_t mr) {
  // Expert shapes' K: 1024, 1408, 2048, 14336 (the last with few rows).
  for (size_t kb : {32, 44, 64}) {
    QGemmTester().format(format).m(mr).n(40).kb(kb).seed(static_cast<uint32_t>(kb)).Test(
        kernel, reference);
  }
  QGemmTester().format(format).m(1).n(9).kb(448).seed(7).Test(kernel, reference);
}

void Strides(WeightFormat format, moert_qgemm_ukernel_fn kernel, moert_qgemm_ukernel_fn reference,
             uint32_t mr) {
  for (size_t m = 1; m <= mr; ++m) {
    QGemmTester().format(format).m(m).n(19).kb(5).a_pad_blocks(3).c_pad(5).seed(11).Test(
        kernel, reference);
  }
}

void ExtremeValues(WeightFormat format, moert_qgemm_ukernel_fn kernel,
                   moert_qgemm_ukernel_fn reference, uint32_t mr) {
  QGemmTester().format(format).m(mr).n(16).kb(8).extreme(true).seed(3).Test(kernel, reference);
}

// Weights at the ends of their range times activation blocks of +-127: the largest
// partial sums any kernel forms (maddubs pairs, int16 reduction trees) must stay exact.
void ExtremeWeights(WeightFormat format, moert_qgemm_ukernel_fn kernel,
                    moert_qgemm_ukernel_fn reference, uint32_t mr) {
  for (size_t m = 1; m <= mr; ++m) {
    QGemmTester().format(format).m(m).n(24).kb(4).extreme_weights(true).seed(5).Test(
        kernel, reference);
  }
}

#define MOERT_QGEMM_TEST(check)                                           \
  TEST_P(QGemmTest, check) {                                              \
    moert_qgemm_ukernel_fn kernel, reference;                             \
    uint32_t mr;                                                          \
    if (!Kernels(&kernel, &reference, &mr)) GTEST_SKIP() << skip_reason_; \
    check(std::get<0>(GetParam()), kernel, reference, mr);                \
  }
MOERT_QGEMM_TEST(EdgeShapes)
MOERT_QGEMM_TEST(LargeK)
MOERT_QGEMM_TEST(Strides)
MOERT_QGEMM_TEST(ExtremeValues)
MOERT_QGEMM_TEST(ExtremeWeights)

#if defined(MOERT_AMX_EMULATED_GEMM)
// The AMX GEMM's loop over the scalar model of the tile instructions (see
// amx_emulated_gemm.h): every check above, on any machine with AVX512-VNNI, whether or
// not it has AMX. (The real instructions run above as *_gemm_amx where the CPU has them.)
class AmxEmulatedGemmTest : public ::testing::TestWithParam<WeightFormat> {
 protected:
  // False (with a skip) where the CPU cannot run the AVX-512 packing.
  bool Kernels(moert_qgemm_ukernel_fn* kernel, moert_qgemm_ukernel_fn* reference) {
    if (!IsaAvailable(Isa::kAvx512Vnni)) {
      skip_reason_ = "the emulated AMX GEMM packs with AVX-512, which this CPU lacks";
      return false;
    }
    const absl::StatusOr<KernelConfig> scalar_config = KernelConfigFor(Isa::kScalar);
    *reference = FamilyOf(*scalar_config, GetParam()).gemm;
    switch (GetParam()) {
      case WeightFormat::kW4:
        *kernel = moert_q4_gemm_ukernel_16x8__amx_emulated;
        break;
      case WeightFormat::kW4M:
        *kernel = moert_q4m_gemm_ukernel_16x8__amx_emulated;
        break;
      case WeightFormat::kW8:
        *kernel = moert_q8_gemm_ukernel_16x8__amx_emulated;
        break;
      case WeightFormat::kW4S24:
        skip_reason_ = "no AMX W4S24 GEMM";
        return false;
    }
    return true;
  }
  std::string skip_reason_;
};

#define MOERT_AMX_EMULATED_TEST(check)                               \
  TEST_P(AmxEmulatedGemmTest, check) {                               \
    moert_qgemm_ukernel_fn kernel, reference;                        \
    if (!Kernels(&kernel, &reference)) GTEST_SKIP() << skip_reason_; \
    check(GetParam(), kernel, reference, 16);                        \
  }
MOERT_AMX_EMULATED_TEST(EdgeShapes)
MOERT_AMX_EMULATED_TEST(LargeK)
MOERT_AMX_EMULATED_TEST(Strides)
MOERT_AMX_EMULATED_TEST(ExtremeValues)
MOERT_AMX_EMULATED_TEST(ExtremeWeights)

std::string FormatName(const ::testing::TestParamInfo<WeightFormat>& param_info) {
  return WeightFormatName(param_info.param);
}

INSTANTIATE_TEST_SUITE_P(Formats, AmxEmulatedGemmTest,
                         ::testing::Values(WeightFormat::kW4, WeightFormat::kW4M,
                                           WeightFormat::kW8),
                         FormatName);
#endif

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [format, isa, op] = info.param;
  return std::string(WeightFormatName(format)) + "_" + (op == Op::kGemv ? "gemv" : "gemm") +
         "_" + IsaName(isa);
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, QGemmTest,
    ::testing::Combine(::testing::Values(WeightFormat::kW4, WeightFormat::kW4M, WeightFormat::kW8,
                                         WeightFormat::kW4S24),
                       ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512Vnni,
                                         Isa::kAvx512Vbmi, Isa::kAmx, Isa::kNeonDot, Isa::kNeonI8mm,
                                         Isa::kSme2),
                       ::testing::Values(Op::kGemv, Op::kGemm)),
    ParamName);

}  // namespace
}  // namespace moert::kernels::testing
