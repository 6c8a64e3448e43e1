// Tests of the fp16 and bf16 conversions in core/fp16.h: every half value against
// an ldexp reference, every rounding boundary, and the special values.
#include "core/fp16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace moert::core {
namespace {

// The functions are usable in constant expressions (tables built at compile time).
static_assert(Fp16ToFloat(0x3C00) == 1.0f);
static_assert(FloatToFp16(-2.0f) == 0xC000);
static_assert(Bf16ToFloat(0x3F80) == 1.0f);
static_assert(FloatToBf16(1.0f) == 0x3F80);

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

bool IsHalfNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }

// The value of a half, from the IEEE definition.
double HalfValue(uint16_t h) {
  const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0x1F) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(Fp16ToFloat, EveryHalfMatchesItsIeeeValue) {
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = Fp16ToFloat(h);
    if (IsHalfNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      continue;
    }
    // Compared as bits so that -0 and +0 are told apart.
    EXPECT_EQ(Bits(f), Bits(static_cast<float>(HalfValue(h)))) << std::hex << i;
  }
}

TEST(Fp16ToFloat, SpecialValues) {
  EXPECT_EQ(Bits(Fp16ToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(Bits(Fp16ToFloat(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(Fp16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(Fp16ToFloat(0x7BFF), 65504.0f);              // largest finite
  EXPECT_EQ(Fp16ToFloat(0x0400), 6.103515625e-05f);      // smallest normal, 2^-14
  EXPECT_EQ(Fp16ToFloat(0x03FF), 6.097555160522461e-05f);  // largest subnormal
  EXPECT_EQ(Fp16ToFloat(0x0001), 5.9604644775390625e-08f);  // smallest subnormal, 2^-24
  EXPECT_EQ(Fp16ToFloat(0x8001), -5.9604644775390625e-08f);
  EXPECT_EQ(Fp16ToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16ToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  // NaNs come back quiet with the payload in the top fraction bits, as F16C does.
  EXPECT_EQ(Bits(Fp16ToFloat(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(Bits(Fp16ToFloat(0xFE00)), 0xFFC00000u);
  EXPECT_EQ(Bits(Fp16ToFloat(0x7C01)), 0x7FC02000u);  // signalling -> quiet
  EXPECT_EQ(Bits(Fp16ToFloat(0x7FFF)), 0x7FFFE000u);
}

TEST(Fp16FromFloat, RoundTripsEveryHalf) {
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (IsHalfNan(h)) continue;
    EXPECT_EQ(FloatToFp16(Fp16ToFloat(h)), h) << std::hex << i;
  }
}

// Between every two adjacent positive halves (and beyond the largest, towards the
// next power of two, which is infinity): just below the midpoint rounds down, just
// above rounds up, the midpoint itself (always a float) goes to the even one.
TEST(Fp16FromFloat, RoundsToNearestEvenAtEveryBoundary) {
  for (uint32_t lo = 0; lo <= 0x7BFF; ++lo) {
    const uint32_t hi = lo + 1;  // 0x7C00 (infinity) after the largest finite
    const double lo_value = HalfValue(static_cast<uint16_t>(lo));
    const double hi_value = lo == 0x7BFF ? 65536.0 : HalfValue(static_cast<uint16_t>(hi));
    const float mid = static_cast<float>((lo_value + hi_value) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo_value + hi_value) / 2) << lo;
    const float below = std::nextafter(mid, 0.0f);
    const float above = std::nextafter(mid, std::numeric_limits<float>::infinity());
    const uint32_t even = (lo & 1) == 0 ? lo : hi;
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const float s = sign != 0 ? -1.0f : 1.0f;
      EXPECT_EQ(FloatToFp16(s * below), sign | lo) << std::hex << lo;
      EXPECT_EQ(FloatToFp16(s * mid), sign | even) << std::hex << lo;
      EXPECT_EQ(FloatToFp16(s * above), sign | hi) << std::hex << lo;
    }
  }
}

TEST(Fp16FromFloat, SpecialValuesAndTies) {
  EXPECT_EQ(FloatToFp16(0.0f), 0x0000);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);  // tie between 65504 (odd) and 2^16
  EXPECT_EQ(FloatToFp16(1e10f), 0x7C00);
  EXPECT_EQ(FloatToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  // 1 + 2^-11 lies halfway between 1 (even) and 1 + 2^-10; 1 + 3 * 2^-11 halfway
  // between 1 + 2^-10 (odd) and 1 + 2^-9.
  EXPECT_EQ(FloatToFp16(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(FloatToFp16(1.0f + 0x1p-11f + 0x1p-23f), 0x3C01);
  EXPECT_EQ(FloatToFp16(1.0f + 0x3p-11f), 0x3C02);
  // Subnormal results, in units of 2^-24.
  EXPECT_EQ(FloatToFp16(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToFp16(0x1p-25f), 0x0000);   // half a unit: ties to 0
  EXPECT_EQ(FloatToFp16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToFp16(0x3p-25f), 0x0002);   // 1.5 units: ties to 2
  EXPECT_EQ(FloatToFp16(0x5p-25f), 0x0002);   // 2.5 units: ties to 2
  EXPECT_EQ(FloatToFp16(-0x3p-25f), 0x8002);
  EXPECT_EQ(FloatToFp16(0x7FFp-25f), 0x0400);  // 1023.5 units: up to the smallest normal
  EXPECT_EQ(FloatToFp16(0x1p-26f), 0x0000);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  // NaN: quiet, sign kept, top payload bits kept (vcvtps2ph).
  EXPECT_EQ(FloatToFp16(FromBits(0x7FC00000)), 0x7E00);
  EXPECT_EQ(FloatToFp16(FromBits(0xFFC00000)), 0xFE00);
  EXPECT_EQ(FloatToFp16(FromBits(0x7FC02000)), 0x7E01);
  EXPECT_EQ(FloatToFp16(FromBits(0x7F800001)), 0x7E00);  // signalling -> quiet
}

TEST(Fp16Bf16ToFloat, IsTheTopHalfOfAFloat) {
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xC049), -3.140625f);
  EXPECT_EQ(Bits(Bf16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(Bits(Bf16ToFloat(0x0001)), 0x00010000u);  // subnormal kept
  EXPECT_EQ(Bf16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(Bf16ToFloat(0x7F81)), 0x7F810000u);  // NaN bits untouched
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    EXPECT_EQ(Bits(Bf16ToFloat(static_cast<uint16_t>(i))), i << 16);
  }
}

TEST(Fp16Bf16FromFloat, RoundsToNearestEvenAndQuietsNan) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000)), 0x3F80);  // tie, 0x3F80 even
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000)), 0x3F82);  // tie, 0x3F81 odd
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001)), 0x3F81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Subnormals round like any other value (current ggml no longer flushes them).
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000)), 0x0000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008001)), 0x0001);
  EXPECT_EQ(FloatToBf16(FromBits(0x7FC00000)), 0x7FC0);
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001)), 0x7FC0);  // signalling -> quiet
  EXPECT_EQ(FloatToBf16(FromBits(0xFF812345)), 0xFFC1);  // truncated, not rounded
  // Every bf16 survives the round trip.
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const bool nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    EXPECT_EQ(FloatToBf16(Bf16ToFloat(h)), nan ? (h | 0x40) : h) << std::hex << i;
  }
}

}  // namespace
}  // namespace moert::core
