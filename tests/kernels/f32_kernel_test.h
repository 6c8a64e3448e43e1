// What the f32 kernel tests (f32_gemm_test.cc, f32_wsum_test.cc) share: the bit-for-bit
// comparison, the special values they feed, and the ISAs they run over.
#ifndef MOERT_TESTS_KERNELS_F32_KERNEL_TEST_H_
#define MOERT_TESTS_KERNELS_F32_KERNEL_TEST_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "kernels/config.h"

namespace moert::kernels::testing {

// The same bits, or both NaN.
inline bool SameValue(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// What an output the kernel must not write holds before and after.
inline constexpr float kUntouched = -12345.5f;

inline constexpr float kSpecialFloats[] = {std::numeric_limits<float>::infinity(),
                                           -std::numeric_limits<float>::infinity(),
                                           std::numeric_limits<float>::quiet_NaN(),
                                           std::numeric_limits<float>::denorm_min(),
                                           -1e-40f,
                                           std::numeric_limits<float>::max(),
                                           0.0f,
                                           -0.0f,
                                           1.0f};

// The ISAs an f32 family may have a variant for (the others keep the one below them).
inline auto F32KernelIsas() {
  return ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kNeonDot, Isa::kNeonI8mm, Isa::kSme2);
}

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return std::string(IsaName(info.param));
}

// A test over one family's kernel of the ISA in the parameter (fn_: `Family::*kFn` of
// the config's `KernelConfig::*kFamily`); skipped, saying why, where the build or the
// CPU lacks that ISA or the family has no variant for it.
template <typename Family, Family KernelConfig::*kFamily, typename Fn, Fn Family::*kFn>
class F32KernelTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    auto config = KernelConfigFor(GetParam());
    if (!config.ok()) GTEST_SKIP() << config.status().message();
    const Family& family = (*config).*kFamily;
    if (family.isa != GetParam()) {
      GTEST_SKIP() << "this family has no kernel for " << IsaName(GetParam());
    }
    fn_ = family.*kFn;
  }
  Fn fn_ = nullptr;
};

}  // namespace moert::kernels::testing

#endif  // MOERT_TESTS_KERNELS_F32_KERNEL_TEST_H_
