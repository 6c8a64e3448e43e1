// The f32 weighted row sum microkernels (every ISA variant this build has, the scalar
// reference included) against the definition written out here (each element adds the
// rows' products to its value in the order of the rows, one multiply and one add at a
// time): the same bits onto zeros and onto other values, for widths below, at and past
// every vector and chunk edge, row strides wider than the width, no rows at all, and
// infinities, NaNs and denormals (NaN for NaN).
// Built with -ffp-contract=off, so that the definition is not fused either.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/strings.h"
#include "gtest/gtest.h"
#include "kernels/config.h"
#include "kernels/f32_kernel_test.h"
#include "kernels/ukernel.h"

namespace moert::kernels::testing {
namespace {

// Runs `fn` over out = `start` (dv values, then two that must stay kUntouched) and
// checks each element against the definition from its start value.
void Check(moert_f32_wsum_ukernel_fn fn, const std::vector<float>& w, const std::vector<float>& v,
           size_t n, size_t stride, const std::vector<float>& start, const std::string& what) {
  const size_t dv = start.size();
  std::vector<float> out(start);
  out.push_back(kUntouched);
  out.push_back(kUntouched);
  fn(n, w.data(), v.data(), stride, dv, out.data());
  for (size_t d = 0; d < dv; ++d) {
    float want = start[d];
    for (size_t i = 0; i < n; ++i) {
      const float p = w[i] * v[i * stride + d];
      want = want + p;
    }
    ASSERT_TRUE(SameValue(out[d], want))
        << what << ": element " << d << ": " << out[d] << " vs " << want;
  }
  EXPECT_EQ(out[dv], kUntouched) << what << ": wrote past dv";
  EXPECT_EQ(out[dv + 1], kUntouched) << what << ": wrote past dv";
}

class F32WsumTest : public F32KernelTest<F32WsumConfig, &KernelConfig::f32_wsum,
                                         moert_f32_wsum_ukernel_fn, &F32WsumConfig::wsum> {};

TEST_P(F32WsumTest, MatchesTheDefinitionBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {0, 1, 2, 7, 33}) {
    for (size_t dv : {1, 3, 4, 7, 8, 9, 16, 31, 32, 33, 64, 65, 100, 128}) {
      for (size_t stride : {dv, dv + 3}) {
        std::vector<float> w(n + 1), v(n * stride + 1), start(dv);
        for (float& x : w) x = normal(rng);
        for (float& x : v) x = normal(rng);
        for (float& x : start) x = normal(rng);
        // Onto zeros (a sum from 0.0f) and onto earlier rows' sums.
        Check(fn_, w, v, n, stride, std::vector<float>(dv, 0.0f),
              StrCat(IsaName(GetParam()), " n ", n, " dv ", dv, " stride ", stride));
        Check(
            fn_, w, v, n, stride, start,
            StrCat(IsaName(GetParam()), " n ", n, " dv ", dv, " stride ", stride, " onto values"));
      }
    }
  }
}

TEST_P(F32WsumTest, InfinitiesNansAndDenormalsMatchTheDefinition) {
  std::mt19937 rng(13);
  for (size_t dv : {8, 40, 67}) {
    const size_t n = 9;
    std::vector<float> w(n), v(n * dv);
    for (float& x : w) x = kSpecialFloats[rng() % std::size(kSpecialFloats)];
    for (float& x : v) x = kSpecialFloats[rng() % std::size(kSpecialFloats)];
    std::vector<float> start(dv);
    for (float& x : start) x = kSpecialFloats[rng() % std::size(kSpecialFloats)];
    Check(fn_, w, v, n, dv, start, StrCat(IsaName(GetParam()), " dv ", dv));
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, F32WsumTest, F32KernelIsas(), IsaParamName);

}  // namespace
}  // namespace moert::kernels::testing
