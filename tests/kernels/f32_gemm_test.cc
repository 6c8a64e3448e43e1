// The f32 GEMM microkernels (every ISA variant this build has, the scalar reference
// included) against the definition written out here, one multiply and one add at a
// time in kernels/ukernel.h's order: the same bits, on shapes that leave every tile
// edge (rows and tokens below and past each tile, row ranges that start mid-matrix, k
// below one block of 8 and with tails, rows further apart than k), with y's other
// entries untouched, and on infinities, NaNs and denormals (NaN for NaN). Built with
// -ffp-contract=off, so that the definition here is not fused either.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/config.h"
#include "kernels/f32_kernel_test.h"
#include "kernels/ukernel.h"

namespace moert::kernels::testing {
namespace {

float Definition(const float* w, const float* x, size_t k) {
  float first[4] = {0, 0, 0, 0}, second[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (size_t j = 0; j < 4; ++j) {
      const float p = w[i + j] * x[i + j];
      first[j] = first[j] + p;
      const float q = w[i + 4 + j] * x[i + 4 + j];
      second[j] = second[j] + q;
    }
  }
  float s[4];
  for (size_t j = 0; j < 4; ++j) s[j] = first[j] + second[j];
  float v = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < k; ++i) {
    const float p = w[i] * x[i];
    v = v + p;
  }
  return v;
}

// Runs `fn` on rows [r0, rows) of w (ldw floats apart, k used of each) and `n` tokens of
// k values and checks every output against the definition and every other entry of y
// against kUntouched.
void Check(moert_f32_gemm_ukernel_fn fn, const std::vector<float>& w, size_t ldw,
           const std::vector<float>& x, size_t rows, size_t r0, size_t n, size_t k,
           const std::string& what) {
  const size_t ldy = rows + 3;
  std::vector<float> y(n * ldy, kUntouched);
  fn(k, w.data(), ldw, r0, rows, x.data(), n, y.data(), ldy);
  for (size_t t = 0; t < n; ++t) {
    for (size_t r = 0; r < ldy; ++r) {
      const float got = y[t * ldy + r];
      const float want =
          r >= r0 && r < rows ? Definition(w.data() + r * ldw, x.data() + t * k, k) : kUntouched;
      ASSERT_TRUE(SameValue(got, want))
          << what << ": token " << t << " row " << r << ": " << got << " vs " << want;
    }
  }
}

class F32GemmTest : public F32KernelTest<F32GemmConfig, &KernelConfig::f32_gemm,
                                         moert_f32_gemm_ukernel_fn, &F32GemmConfig::gemm> {};

TEST_P(F32GemmTest, MatchesTheDefinitionBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t rows : {1, 2, 3, 4, 5, 7, 8, 13}) {
    for (size_t n : {1, 2, 3, 4, 5, 7}) {
      for (size_t k : {1, 7, 8, 9, 16, 31, 64, 100}) {
        // Rows k apart (a matrix) and k + 5 apart (a head's slice of wider rows).
        for (size_t ldw : {k, k + 5}) {
          std::vector<float> w(rows * ldw), x(n * k);
          for (float& v : w) v = normal(rng);
          for (float& v : x) v = normal(rng);
          for (size_t r0 : {size_t{0}, rows / 2}) {
            Check(fn_, w, ldw, x, rows, r0, n, k,
                  std::string(IsaName(GetParam())) + " rows " + std::to_string(r0) + ".." +
                      std::to_string(rows) + " tokens " + std::to_string(n) + " k " +
                      std::to_string(k) + " ldw " + std::to_string(ldw));
          }
        }
      }
    }
  }
}

TEST_P(F32GemmTest, InfinitiesNansAndDenormalsMatchTheDefinition) {
  std::mt19937 rng(11);
  for (size_t k : {8, 20, 67}) {
    const size_t rows = 9, n = 5;
    std::vector<float> w(rows * k), x(n * k);
    for (float& v : w) v = kSpecialFloats[rng() % std::size(kSpecialFloats)];
    for (float& v : x) v = kSpecialFloats[rng() % std::size(kSpecialFloats)];
    Check(fn_, w, k, x, rows, 0, n, k,
          std::string(IsaName(GetParam())) + " k " + std::to_string(k));
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, F32GemmTest, F32KernelIsas(), IsaParamName);

}  // namespace
}  // namespace moert::kernels::testing
