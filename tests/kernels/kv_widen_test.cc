// The KV widening microkernels (every ISA variant this build has, the scalar reference
// included) against core::Fp16ToFloat and ggml's dequantize_row_q8_0 written out here:
// every one of the 65,536 halves (subnormals, infinities, signalling and quiet NaNs with
// their payloads), lengths below, at and past each vector width, unaligned sources, and
// q8_0 blocks with every int8 value and scales that are subnormal, huge, infinite or
// NaN. Nothing past the end is written.
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/strings.h"
#include "gtest/gtest.h"
#include "kernels/config.h"
#include "kernels/f32_kernel_test.h"
#include "kernels/ukernel.h"

namespace moert::kernels::testing {
namespace {

class F16WidenTest : public F32KernelTest<KvWidenConfig, &KernelConfig::kv_widen,
                                          moert_f16_widen_ukernel_fn, &KvWidenConfig::f16> {};
class Q8_0WidenTest : public F32KernelTest<KvWidenConfig, &KernelConfig::kv_widen,
                                           moert_q8_0_widen_ukernel_fn, &KvWidenConfig::q8_0> {};

// The same bits exactly (NaNs included: the payload and the quiet bit are specified).
void ExpectSameBits(float got, float want, const std::string& what) {
  ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
      << what << ": " << got << " vs " << want;
}

TEST_P(F16WidenTest, EveryHalfBitForBit) {
  // One byte of offset: the source need not be aligned.
  std::vector<uint8_t> src(1 + 2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(src.data() + 1 + 2 * h, &v, 2);
  }
  std::vector<float> dst(65536 + 1, kUntouched);
  fn_(65536, src.data() + 1, dst.data());
  for (uint32_t h = 0; h < 65536; ++h) {
    ExpectSameBits(dst[h], core::Fp16ToFloat(static_cast<uint16_t>(h)),
                   StrCat(IsaName(GetParam()), " half ", h));
  }
  EXPECT_EQ(dst[65536], kUntouched) << "wrote past n";
}

TEST_P(F16WidenTest, EveryLengthUpTo40) {
  std::mt19937 rng(3);
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<uint8_t> src(2 * n + 3);
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
    std::vector<float> dst(n + 2, kUntouched);
    fn_(n, src.data() + 3, dst.data());
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src.data() + 3 + 2 * i, 2);
      ExpectSameBits(dst[i], core::Fp16ToFloat(h), StrCat(IsaName(GetParam()), " n ", n, " i ", i));
    }
    EXPECT_EQ(dst[n], kUntouched) << "n " << n << ": wrote past n";
    EXPECT_EQ(dst[n + 1], kUntouched) << "n " << n << ": wrote past n";
  }
}

TEST_P(Q8_0WidenTest, BlocksBitForBit) {
  std::mt19937 rng(11);
  // Scales: ordinary, subnormal, the largest, infinities, a quiet and a signalling NaN,
  // zeros of both signs.
  const uint16_t scales[] = {0x3C00, 0x2E66, 0x0001, 0x03FF, 0x7BFF, 0x7C00,
                             0xFC00, 0x7E01, 0x7C01, 0x0000, 0x8000, 0xB555};
  for (size_t blocks : {1, 2, 3, 7}) {
    for (uint16_t first_scale : scales) {
      std::vector<uint8_t> src(34 * blocks + 1);
      uint8_t* at = src.data() + 1;
      for (size_t b = 0; b < blocks; ++b) {
        const uint16_t d = b == 0 ? first_scale : scales[rng() % std::size(scales)];
        std::memcpy(at + 34 * b, &d, 2);
        // Every int8 value turns up across the blocks: -128 and 127 in every block.
        for (size_t j = 0; j < 32; ++j) at[34 * b + 2 + j] = static_cast<uint8_t>(rng());
        at[34 * b + 2] = 0x80;
        at[34 * b + 33] = 0x7F;
      }
      std::vector<float> dst(32 * blocks + 1, kUntouched);
      fn_(blocks, at, dst.data());
      for (size_t b = 0; b < blocks; ++b) {
        uint16_t d;
        std::memcpy(&d, at + 34 * b, 2);
        for (size_t j = 0; j < 32; ++j) {
          const int8_t q = static_cast<int8_t>(at[34 * b + 2 + j]);
          ExpectSameBits(dst[32 * b + j], static_cast<float>(q) * core::Fp16ToFloat(d),
                         StrCat(IsaName(GetParam()), " blocks ", blocks, " block ", b, " value ", j,
                                " q ", int{q}, " d ", d));
        }
      }
      EXPECT_EQ(dst[32 * blocks], kUntouched) << "wrote past the blocks";
    }
  }
  float none = kUntouched;
  fn_(0, nullptr, &none);
  EXPECT_EQ(none, kUntouched);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, F16WidenTest, F32KernelIsas(), IsaParamName);
INSTANTIATE_TEST_SUITE_P(AllIsas, Q8_0WidenTest, F32KernelIsas(), IsaParamName);

}  // namespace
}  // namespace moert::kernels::testing
