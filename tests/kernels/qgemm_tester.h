// The one tester every quantized matmul microkernel goes through (after XNNPACK's
// gemm-microkernel-tester): fluent setters for the shape, random packed weights and
// activations, and two checks: the kernel against the scalar reference of its family
// bit for bit (the numerics are defined exactly in kernels/ukernel.h), and the scalar
// reference against a naive double-precision sum over dequantized values.
#ifndef MOERT_TESTS_KERNELS_QGEMM_TESTER_H_
#define MOERT_TESTS_KERNELS_QGEMM_TESTER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::kernels::testing {

enum class WeightFormat { kW4, kW4M, kW8, kW4S24 };
const char* WeightFormatName(WeightFormat f);

// The family's config for a format: config.q4, .q4m, .q8 or .q4s24.
const GemmConfig& FamilyOf(const KernelConfig& config, WeightFormat f);

class QGemmTester {
 public:
  QGemmTester& format(WeightFormat f) { format_ = f; return *this; }
  QGemmTester& m(size_t v) { m_ = v; return *this; }
  QGemmTester& n(size_t v) { n_ = v; return *this; }
  QGemmTester& kb(size_t v) { kb_ = v; return *this; }  // K = 32 * kb
  // Extra activation blocks / output floats between rows (0: dense).
  QGemmTester& a_pad_blocks(size_t v) { a_pad_blocks_ = v; return *this; }
  QGemmTester& c_pad(size_t v) { c_pad_ = v; return *this; }
  QGemmTester& seed(uint32_t v) { seed_ = v; return *this; }
  // Activations drawn from a wider range, so that int16 intermediate sums saturate in a
  // kernel that gets its overflow handling wrong.
  QGemmTester& extreme(bool v) { extreme_ = v; return *this; }
  // Every weight at the end of its range (W4/W4S24 nibble 0 or 15, W4M 15, W8 -128 or
  // 127, alternating by row) against activation blocks of one value, +127 or -127
  // (alternating by block): drives the byte products and the int16 partial sums of the
  // kernels to their largest magnitudes (e.g. a maddubs pair of 2 * 128 * 127 for W8).
  QGemmTester& extreme_weights(bool v) { extreme_weights_ = v; return *this; }

  // Runs `kernel` and `reference` (the family's scalar kernel) on the same inputs and
  // checks them with gtest EXPECT_*, naming the shape on failure.
  void Test(moert_qgemm_ukernel_fn kernel, moert_qgemm_ukernel_fn reference) const;

  std::string Describe() const;

 private:
  WeightFormat format_ = WeightFormat::kW4;
  size_t m_ = 1;
  size_t n_ = 8;
  size_t kb_ = 1;
  size_t a_pad_blocks_ = 0;
  size_t c_pad_ = 0;
  uint32_t seed_ = 1;
  bool extreme_ = false;
  bool extreme_weights_ = false;
};

}  // namespace moert::kernels::testing

#endif  // MOERT_TESTS_KERNELS_QGEMM_TESTER_H_
