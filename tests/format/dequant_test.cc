// Tests of format/dequant.h: hand-built blocks of every type against values worked
// out here from the block layouts in docs/formats.md, the size checks, and the
// quantized test models against their f32 original.
//
// Every product in ggml's dequantization is exact in float, so each expected value is
// computed exactly in double and rounded once to float; outputs must match bit for
// bit (including the sign of zero).
#include "format/dequant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::format {
namespace {

// Half-precision scales used below, with their exact values.
constexpr uint16_t kHalfTenth = 0x2E66;  // 0.0999755859375, the fp16 nearest 0.1
constexpr double kTenth = 0.0999755859375;
constexpr uint16_t kHalfQuarter = 0x3400;
constexpr uint16_t kHalfHalf = 0x3800;
constexpr uint16_t kHalfOne = 0x3C00;
constexpr uint16_t kHalfThree = 0x4200;
constexpr uint16_t kHalfMinusTwo = 0xC000;
constexpr uint16_t kHalfMinusOneQuarter = 0xBD00;  // -1.25

// Builds block bytes field by field, little-endian as GGUF stores them.
class Bytes {
 public:
  Bytes& U8(uint8_t v) {
    data_.push_back(v);
    return *this;
  }
  Bytes& U16(uint16_t v) {
    U8(static_cast<uint8_t>(v & 0xFF));
    return U8(static_cast<uint8_t>(v >> 8));
  }
  Bytes& U32(uint32_t v) {
    U16(static_cast<uint16_t>(v & 0xFFFF));
    return U16(static_cast<uint16_t>(v >> 16));
  }
  Bytes& F32(float v) { return U32(std::bit_cast<uint32_t>(v)); }
  Bytes& Raw(const std::vector<uint8_t>& v) {
    data_.insert(data_.end(), v.begin(), v.end());
    return *this;
  }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

std::vector<float> DequantizeAll(GgmlType type, const std::vector<uint8_t>& src, size_t n) {
  std::vector<float> out(n, -12345.0f);
  absl::Status status = Dequantize(type, src, out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Bit equality, so that -0 differs from +0 and NaN compares.
void ExpectBitsEq(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const float w = static_cast<float>(want[i]);
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(w))
        << "value " << i << ": got " << got[i] << ", want " << w;
  }
}

// ---- Plain types ------------------------------------------------------------

TEST(DequantPlain, F32KeepsEveryBitPattern) {
  const std::vector<uint32_t> bits = {0x3F800000, 0x80000000, 0x7FC01234, 0x00000001,
                                      0xFF800000};
  Bytes b;
  for (uint32_t v : bits) b.U32(v);
  std::vector<float> out = DequantizeAll(GgmlType::kF32, b.data(), bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), bits[i]) << i;
  }
}

TEST(DequantPlain, F16) {
  Bytes b;
  b.U16(kHalfOne).U16(0x8000).U16(0x7BFF).U16(0x0001).U16(0xFC00).U16(kHalfTenth);
  ExpectBitsEq(DequantizeAll(GgmlType::kF16, b.data(), 6),
               {1.0, -0.0, 65504.0, std::ldexp(1.0, -24), -HUGE_VAL, kTenth});
}

TEST(DequantPlain, Bf16) {
  Bytes b;
  b.U16(0x3F80).U16(0xC049).U16(0x7F80).U16(0x8000).U16(0x0001);
  ExpectBitsEq(DequantizeAll(GgmlType::kBF16, b.data(), 5),
               {1.0, -3.140625, HUGE_VAL, -0.0, std::ldexp(1.0, -133)});
}

// ---- 32-value blocks ----------------------------------------------------------

// qs[j] = j | (15 - j) << 4: value j has code j, value j + 16 has code 15 - j.
std::vector<uint8_t> RampNibbles() {
  std::vector<uint8_t> qs(16);
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  return qs;
}

TEST(DequantQ4_0, LowNibblesFirstThenHighMinusEight) {
  Bytes b;
  b.U16(kHalfTenth).Raw(RampNibbles());
  // Second block: every byte 0x8F, so codes 15 then 8, times -2: -14 then -0.
  b.U16(kHalfMinusTwo).Raw(std::vector<uint8_t>(16, 0x8F));
  std::vector<double> want(64);
  for (int j = 0; j < 16; ++j) {
    want[j] = (j - 8) * kTenth;
    want[j + 16] = (15 - j - 8) * kTenth;
    want[32 + j] = -14.0;
    want[48 + j] = -0.0;  // 0 * -2.0f is -0 in llama.cpp as well
  }
  std::vector<float> out = DequantizeAll(GgmlType::kQ4_0, b.data(), 64);
  ExpectBitsEq(out, want);
  EXPECT_EQ(out[0], -0.7998046875f);  // -8 * 0.0999755859375
  EXPECT_EQ(out[31], -0.7998046875f);
}

TEST(DequantQ4_1, CodeTimesScalePlusMin) {
  Bytes b;
  b.U16(kHalfHalf).U16(kHalfMinusOneQuarter).Raw(RampNibbles());
  std::vector<double> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = j * 0.5 - 1.25;
    want[j + 16] = (15 - j) * 0.5 - 1.25;
  }
  std::vector<float> out = DequantizeAll(GgmlType::kQ4_1, b.data(), 32);
  ExpectBitsEq(out, want);
  EXPECT_EQ(out[0], -1.25f);
  EXPECT_EQ(out[16], 6.25f);
}

TEST(DequantQ5_0, FifthBitFromQhMinusSixteen) {
  const uint32_t qh = 0xA5C3F00F;  // bit i is the fifth bit of value i
  Bytes b;
  b.U16(kHalfQuarter).U32(qh).Raw(RampNibbles());
  std::vector<double> want(32);
  for (int j = 0; j < 16; ++j) {
    const int hi0 = ((qh >> j) & 1) * 16;
    const int hi1 = ((qh >> (j + 16)) & 1) * 16;
    want[j] = (j + hi0 - 16) * 0.25;
    want[j + 16] = (15 - j + hi1 - 16) * 0.25;
  }
  std::vector<float> out = DequantizeAll(GgmlType::kQ5_0, b.data(), 32);
  ExpectBitsEq(out, want);
  EXPECT_EQ(out[0], 0.0f);     // code 0 + 16 (bit 0 set) - 16
  EXPECT_EQ(out[4], -3.0f);    // code 4, bit 4 clear: (4 - 16) / 4
  EXPECT_EQ(out[16], 3.75f);   // code 15 + 16 (bit 16 set) - 16
  EXPECT_EQ(out[31], 0.0f);    // code 0 + 16 (bit 31 set) - 16
}

TEST(DequantQ5_1, FifthBitFromQhTimesScalePlusMin) {
  Bytes b;
  b.U16(kHalfHalf).U16(kHalfThree).U32(0x0000FFFF).Raw(RampNibbles());
  std::vector<double> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = (j + 16) * 0.5 + 3.0;
    want[j + 16] = (15 - j) * 0.5 + 3.0;
  }
  ExpectBitsEq(DequantizeAll(GgmlType::kQ5_1, b.data(), 32), want);
}

TEST(DequantQ8_0, SignedBytesTimesScale) {
  std::vector<uint8_t> qs(32);
  for (int j = 0; j < 32; ++j) qs[j] = static_cast<uint8_t>(j * 8 - 128);  // -128..120
  Bytes b;
  b.U16(kHalfTenth).Raw(qs);
  std::vector<double> want(32);
  for (int j = 0; j < 32; ++j) want[j] = (j * 8 - 128) * kTenth;
  std::vector<float> out = DequantizeAll(GgmlType::kQ8_0, b.data(), 32);
  ExpectBitsEq(out, want);
  EXPECT_EQ(out[0], -12.796875f);  // -128 * 0.0999755859375
}

TEST(DequantQ8_1, IgnoresTheSumField) {
  std::vector<uint8_t> qs(32);
  for (int j = 0; j < 32; ++j) qs[j] = static_cast<uint8_t>(j - 16);
  Bytes b;
  b.U16(kHalfHalf).U16(0x7C00).Raw(qs);  // s = inf must not leak into the values
  std::vector<double> want(32);
  for (int j = 0; j < 32; ++j) want[j] = (j - 16) * 0.5;
  ExpectBitsEq(DequantizeAll(GgmlType::kQ8_1, b.data(), 32), want);
}

// ---- 256-value super-blocks ----------------------------------------------------

// A byte pattern that exercises all bits without being regular.
std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed;
  for (uint8_t& byte : v) {
    x = x * 1103515245u + 12345u;
    byte = static_cast<uint8_t>(x >> 16);
  }
  return v;
}

TEST(DequantQ8_K, Float32ScaleAndBsumsIgnored) {
  std::vector<uint8_t> qs(256);
  for (int j = 0; j < 256; ++j) qs[j] = static_cast<uint8_t>(j - 128);
  Bytes b;
  b.F32(0.1f).Raw(qs);
  for (int i = 0; i < 16; ++i) b.U16(0x7FFF);  // bsums, unused by dequantization
  ASSERT_EQ(b.data().size(), 292u);
  std::vector<double> want(256);
  // A float32 scale times an int8 can round: the product is rounded once.
  for (int j = 0; j < 256; ++j) want[j] = static_cast<double>(0.1f) * (j - 128);
  std::vector<float> out = DequantizeAll(GgmlType::kQ8_K, b.data(), 256);
  ExpectBitsEq(out, want);
  EXPECT_EQ(out[128], 0.0f);
  EXPECT_EQ(out[129], 0.1f);
  EXPECT_EQ(out[0], -12.8f);
}

// Packs eight 6-bit (scale, min) pairs the way get_scale_min_k4 unpacks them:
// pairs 0..3 in the low 6 bits of bytes 0..3 (scale) and 4..7 (min); pairs 4..7 as
// nibbles in bytes 8..11 (scale low, min high) with their top two bits in the top
// bits of bytes 0..3 (scale) and 4..7 (min).
std::vector<uint8_t> PackScaleMinK4(const int (&sc)[8], const int (&m)[8]) {
  std::vector<uint8_t> out(12);
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    out[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4);
  }
  return out;
}

TEST(DequantQ4_K, SixBitScalesAndMins) {
  const int sc[8] = {1, 2, 3, 63, 17, 5, 33, 62};
  const int m[8] = {0, 7, 63, 1, 10, 48, 31, 50};
  std::vector<uint8_t> qs = Pattern(128, 1);
  qs[0] = 0x8B;
  Bytes b;
  b.U16(kHalfTenth).U16(kHalfHalf).Raw(PackScaleMinK4(sc, m)).Raw(qs);
  ASSERT_EQ(b.data().size(), 144u);
  // Values 64g..64g+31 are the low nibbles of qs[32g..32g+31] with pair 2g, the
  // next 32 their high nibbles with pair 2g+1.
  std::vector<double> want(256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q = qs[32 * g + l];
      want[64 * g + l] = kTenth * sc[2 * g] * (q & 0x0F) - 0.5 * m[2 * g];
      want[64 * g + 32 + l] = kTenth * sc[2 * g + 1] * (q >> 4) - 0.5 * m[2 * g + 1];
    }
  }
  std::vector<float> out = DequantizeAll(GgmlType::kQ4_K, b.data(), 256);
  ExpectBitsEq(out, want);
  // Worked by hand: qs[0] = 0x8B; value 0 = 0.0999755859375 * 1 * 11 - 0.5 * 0,
  // value 32 = 0.0999755859375 * 2 * 8 - 0.5 * 7.
  EXPECT_EQ(out[0], 1.0997314453125f);
  EXPECT_EQ(out[32], -1.900390625f);
}

TEST(DequantQ5_K, FifthBitsFromQh) {
  const int sc[8] = {63, 1, 40, 2, 9, 16, 0, 37};
  const int m[8] = {5, 0, 62, 33, 1, 2, 60, 15};
  const std::vector<uint8_t> qh = Pattern(32, 2);
  const std::vector<uint8_t> qs = Pattern(128, 3);
  Bytes b;
  b.U16(kHalfTenth).U16(kHalfQuarter).Raw(PackScaleMinK4(sc, m)).Raw(qh).Raw(qs);
  ASSERT_EQ(b.data().size(), 176u);
  // Group g of 64 values: the low-nibble half takes bit 2g of qh[l], the high-nibble
  // half bit 2g+1.
  std::vector<double> want(256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[32 * g + l] & 0x0F) + ((qh[l] >> (2 * g)) & 1) * 16;
      const int hi = (qs[32 * g + l] >> 4) + ((qh[l] >> (2 * g + 1)) & 1) * 16;
      want[64 * g + l] = kTenth * sc[2 * g] * lo - 0.25 * m[2 * g];
      want[64 * g + 32 + l] = kTenth * sc[2 * g + 1] * hi - 0.25 * m[2 * g + 1];
    }
  }
  ExpectBitsEq(DequantizeAll(GgmlType::kQ5_K, b.data(), 256), want);
}

TEST(DequantQ6_K, SixBitCodesMinusThirtyTwoWithSignedScales) {
  std::vector<uint8_t> ql = Pattern(128, 4);
  std::vector<uint8_t> qh = Pattern(64, 5);
  ql[0] = 0x5A;
  qh[0] = 0xC2;
  const int8_t scales[16] = {1, -1, 127, -128, 2, 3, -7, 64, 0, 5, -32, 100, 11, -100, 9, 1};
  Bytes b;
  b.Raw(ql).Raw(qh);
  for (int8_t s : scales) b.U8(static_cast<uint8_t>(s));
  b.U16(kHalfTenth);
  ASSERT_EQ(b.data().size(), 210u);
  // Value i: half n = i / 128; within it, quarter k = (i % 128) / 32 and l = i % 32.
  // Low 4 bits: quarters 0 and 2 from ql[64n + l], 1 and 3 from ql[64n + 32 + l]
  // (low nibble for 0 and 1, high for 2 and 3); top 2 bits: bits 2k of qh[32n + l].
  // Scale: scales[8n + 2k + l / 16].
  std::vector<double> want(256);
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128;
    const int k = (i % 128) / 32;
    const int l = i % 32;
    const uint8_t low_byte = ql[64 * n + (k % 2) * 32 + l];
    const int low = k < 2 ? (low_byte & 0x0F) : (low_byte >> 4);
    const int high = (qh[32 * n + l] >> (2 * k)) & 3;
    const int scale = scales[8 * n + 2 * k + l / 16];
    want[i] = kTenth * scale * ((low | high << 4) - 32);
  }
  std::vector<float> out = DequantizeAll(GgmlType::kQ6_K, b.data(), 256);
  ExpectBitsEq(out, want);
  // Worked by hand from ql[0] = 0x5A, qh[0] = 0b11000010: value 0 has code
  // 0xA | 2 << 4 = 42 and scale 1: 0.0999755859375 * (42 - 32); value 64 has code
  // 0x5 | 0 << 4 and scale 2 (scales[4]); value 96 takes ql[32]'s high nibble and
  // qh[0] bits 6-7 (3) with scale -7 (scales[6]).
  EXPECT_EQ(out[0], 0.999755859375f);
  EXPECT_EQ(out[64], -5.398681640625f);
  EXPECT_EQ(out[96], static_cast<float>(kTenth * -7 * (((ql[32] >> 4) | 3 << 4) - 32)));
}

TEST(DequantQ6_K, ExtremeCodes) {
  // All codes 0 (value -32) with scale -128, then all 63 (value 31) with scale 127.
  Bytes b;
  b.Raw(std::vector<uint8_t>(64, 0x00)).Raw(std::vector<uint8_t>(64, 0xFF));
  b.Raw(std::vector<uint8_t>(32, 0x00)).Raw(std::vector<uint8_t>(32, 0xFF));
  for (int i = 0; i < 8; ++i) b.U8(0x80);  // -128
  for (int i = 0; i < 8; ++i) b.U8(0x7F);  // 127
  b.U16(kHalfOne);
  std::vector<double> want(256);
  for (int i = 0; i < 128; ++i) want[i] = -128.0 * -32;
  for (int i = 128; i < 256; ++i) want[i] = 127.0 * 31;
  ExpectBitsEq(DequantizeAll(GgmlType::kQ6_K, b.data(), 256), want);
}

TEST(DequantQ2_K, TwoBitCodesWithNibbleScalesAndMins) {
  const std::vector<uint8_t> scales = Pattern(16, 6);
  const std::vector<uint8_t> qs = Pattern(64, 7);
  Bytes b;
  b.Raw(scales).Raw(qs).U16(kHalfTenth).U16(kHalfHalf);
  ASSERT_EQ(b.data().size(), 84u);
  // Value i: half n = i / 128; shift 2j with j = (i % 128) / 32; byte
  // qs[32n + (i % 32)]; scale byte scales[8n + 2j + (i % 32) / 16].
  std::vector<double> want(256);
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128;
    const int j = (i % 128) / 32;
    const int q = (qs[32 * n + i % 32] >> (2 * j)) & 3;
    const uint8_t s = scales[8 * n + 2 * j + (i % 32) / 16];
    want[i] = kTenth * (s & 0x0F) * q - 0.5 * (s >> 4);
  }
  ExpectBitsEq(DequantizeAll(GgmlType::kQ2_K, b.data(), 256), want);
}

TEST(DequantQ2_K, HandWorkedValues) {
  // Scale byte 0x53 for the first 16 values: scale 3, min 5. qs[0] = 0b11100100:
  // value 0 has code 0 (bits 0-1), value 32 code 1, 64 code 2, 96 code 3.
  std::vector<uint8_t> scales(16, 0x00);
  scales[0] = 0x53;
  scales[2] = 0x21;
  scales[4] = 0x10;
  scales[6] = 0x01;
  std::vector<uint8_t> qs(64, 0x00);
  qs[0] = 0xE4;
  Bytes b;
  b.Raw(scales).Raw(qs).U16(kHalfHalf).U16(kHalfOne);
  std::vector<float> out = DequantizeAll(GgmlType::kQ2_K, b.data(), 256);
  EXPECT_EQ(out[0], 0.5f * 3 * 0 - 1.0f * 5);   // -5
  EXPECT_EQ(out[1], -5.0f);                     // code 0 too
  EXPECT_EQ(out[32], 0.5f * 1 * 1 - 1.0f * 2);  // scales[2] = 0x21
  EXPECT_EQ(out[64], 0.5f * 0 * 2 - 1.0f * 1);  // scales[4] = 0x10
  EXPECT_EQ(out[96], 0.5f * 1 * 3 - 0.0f);      // scales[6] = 0x01
  EXPECT_EQ(out[16], 0.0f);                     // scales[1] = 0
}

// Packs sixteen 6-bit Q3_K scales: low nibbles in bytes 0..7 (scale s < 8 in the low
// nibble of byte s, s >= 8 in the high nibble of byte s - 8), top two bits in bytes
// 8..11 (scale s at bits 2 * (s / 4) of byte 8 + s % 4).
std::vector<uint8_t> PackQ3KScales(const int (&s)[16]) {
  std::vector<uint8_t> out(12, 0);
  for (int i = 0; i < 16; ++i) {
    const int low = s[i] & 0x0F;
    out[i % 8] = static_cast<uint8_t>(out[i % 8] | (i < 8 ? low : low << 4));
    out[8 + i % 4] = static_cast<uint8_t>(out[8 + i % 4] | ((s[i] >> 4) << (2 * (i / 4))));
  }
  return out;
}

TEST(DequantQ3_K, ThreeBitCodesWithSixBitScales) {
  // Stored scales (0..63); the value uses scale - 32.
  const int s[16] = {0, 63, 32, 31, 33, 1, 62, 17, 48, 15, 40, 8, 50, 2, 60, 36};
  const std::vector<uint8_t> hmask = Pattern(32, 8);
  const std::vector<uint8_t> qs = Pattern(64, 9);
  Bytes b;
  b.Raw(hmask).Raw(qs).Raw(PackQ3KScales(s)).U16(kHalfTenth);
  ASSERT_EQ(b.data().size(), 110u);
  // Value i: n = i / 128, j = (i % 128) / 32, r = i % 32. Low 2 bits from
  // qs[32n + r] >> 2j; hmask[r] bit 4n + j set adds nothing, clear subtracts 4;
  // scale index 8n + 2j + r / 16.
  std::vector<double> want(256);
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128;
    const int j = (i % 128) / 32;
    const int r = i % 32;
    const int low = (qs[32 * n + r] >> (2 * j)) & 3;
    const bool high = ((hmask[r] >> (4 * n + j)) & 1) != 0;
    const int scale = s[8 * n + 2 * j + r / 16] - 32;
    want[i] = kTenth * scale * (low - (high ? 0 : 4));
  }
  ExpectBitsEq(DequantizeAll(GgmlType::kQ3_K, b.data(), 256), want);
}

TEST(DequantQ3_K, HandWorkedValues) {
  // Scale 0 stored as 63 (value 31): byte 0 low nibble 0xF, byte 8 bits 0-1 = 3.
  // Scale 8 stored as 0 (value -32). qs[0] = 0b00000011 and hmask[0] = 0x01: value 0
  // has code 3 with the high bit set (3); value 1 has code 0 with it clear (-4).
  std::vector<uint8_t> hmask(32, 0x00);
  hmask[0] = 0x01;
  std::vector<uint8_t> qs(64, 0x00);
  qs[0] = 0x03;
  std::vector<uint8_t> scales(12, 0x00);
  scales[0] = 0x0F;
  scales[8] = 0x03;
  Bytes b;
  b.Raw(hmask).Raw(qs).Raw(scales).U16(kHalfHalf);
  std::vector<float> out = DequantizeAll(GgmlType::kQ3_K, b.data(), 256);
  EXPECT_EQ(out[0], 0.5f * 31 * 3);    // 46.5
  EXPECT_EQ(out[1], 0.5f * 31 * -4);   // code 0, high bit clear
  EXPECT_EQ(out[128], 0.5f * -32 * -4);  // scale 8 is 0 - 32
}

// ---- Shapes and errors ----------------------------------------------------------

TEST(DequantShapes, SeveralBlocksAndUnalignedSource) {
  // Two Q8_K blocks placed one byte into a buffer, so the float scale is unaligned.
  Bytes b;
  b.U8(0xEE);
  for (int block = 0; block < 2; ++block) {
    b.F32(block == 0 ? 0.5f : -2.0f);
    for (int j = 0; j < 256; ++j) b.U8(static_cast<uint8_t>(j % 7));
    for (int i = 0; i < 16; ++i) b.U16(0);
  }
  std::vector<float> out(512);
  std::span<const uint8_t> src(b.data());
  ASSERT_TRUE(Dequantize(GgmlType::kQ8_K, src.subspan(1), out).ok());
  for (int j = 0; j < 256; ++j) {
    EXPECT_EQ(out[j], 0.5f * static_cast<float>(j % 7)) << j;
    EXPECT_EQ(out[256 + j], -2.0f * static_cast<float>(j % 7)) << j;
  }
}

TEST(DequantShapes, EmptyIsFine) {
  std::vector<float> out;
  EXPECT_TRUE(Dequantize(GgmlType::kQ4_K, {}, out).ok());
  EXPECT_TRUE(Dequantize(GgmlType::kF16, {}, out).ok());
}

TEST(DequantErrors, PartialBlockIsInvalidArgument) {
  std::vector<uint8_t> src(36);
  std::vector<float> out(33);
  absl::Status status = Dequantize(GgmlType::kQ4_0, src, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("q4_0"), std::string::npos) << status;
  EXPECT_NE(status.message().find("33"), std::string::npos) << status;
  EXPECT_NE(status.message().find("32"), std::string::npos) << status;

  std::vector<float> k_out(300);
  status = Dequantize(GgmlType::kQ6_K, std::vector<uint8_t>(420), k_out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("q6_K"), std::string::npos) << status;
}

TEST(DequantErrors, WrongSourceSizeIsInvalidArgument) {
  std::vector<float> out(64);
  for (size_t bytes : {35u, 37u, 0u, 18u}) {
    absl::Status status = Dequantize(GgmlType::kQ4_0, std::vector<uint8_t>(bytes), out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_NE(status.message().find("q4_0"), std::string::npos) << status;
    EXPECT_NE(status.message().find("36"), std::string::npos) << status;
    EXPECT_NE(status.message().find(std::to_string(bytes)), std::string::npos) << status;
  }
  std::vector<float> f32_out(2);
  absl::Status status = Dequantize(GgmlType::kF32, std::vector<uint8_t>(7), f32_out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("f32"), std::string::npos) << status;
  std::vector<float> k_out(256);
  status = Dequantize(GgmlType::kQ8_K, std::vector<uint8_t>(291), k_out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("q8_K"), std::string::npos) << status;
}

TEST(DequantErrors, UnhandledTypesAreUnimplemented) {
  std::vector<float> out(256);
  for (GgmlType type : {GgmlType::kIQ2_XXS, GgmlType::kIQ4_NL, GgmlType::kTQ1_0,
                        GgmlType::kMXFP4, GgmlType::kI8, GgmlType::kF64}) {
    EXPECT_FALSE(CanDequantize(type)) << GgmlTypeName(type);
    const auto bytes = GgmlRowBytes(type, out.size());
    ASSERT_TRUE(bytes.has_value());
    absl::Status status = Dequantize(type, std::vector<uint8_t>(*bytes), out);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << GgmlTypeName(type);
    EXPECT_NE(status.message().find(std::string(GgmlTypeName(type))), std::string::npos)
        << status;
  }
  // An id that is not a ggml type at all, as a corrupt file could carry.
  const GgmlType bogus = static_cast<GgmlType>(99);
  EXPECT_FALSE(CanDequantize(bogus));
  absl::Status status = Dequantize(bogus, {}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("99"), std::string::npos) << status;
}

TEST(DequantErrors, HandledTypesAreListed) {
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
        GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ2_K,
        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
        GgmlType::kQ8_K}) {
    EXPECT_TRUE(CanDequantize(type)) << GgmlTypeName(type);
    // And each accepts exactly its row size.
    const uint64_t n = 512;
    const auto bytes = GgmlRowBytes(type, n);
    ASSERT_TRUE(bytes.has_value());
    std::vector<float> out(n);
    EXPECT_TRUE(Dequantize(type, std::vector<uint8_t>(*bytes), out).ok())
        << GgmlTypeName(type);
  }
}

// ---- The test models --------------------------------------------------------------

std::string ModelPath(const std::string& variant) {
  return std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-" + variant + ".gguf";
}

std::vector<float> DequantizeTensor(const GgufFile& file, const GgufTensorInfo& tensor) {
  std::vector<float> out(tensor.n_elements);
  absl::Status status = Dequantize(tensor.type, file.TensorData(tensor), out);
  EXPECT_TRUE(status.ok()) << tensor.name << ": " << status;
  return out;
}

uint16_t ReadU16(std::span<const uint8_t> bytes, size_t offset) {
  return static_cast<uint16_t>(bytes[offset] | bytes[offset + 1] << 8);
}

// Bounds on |dequantized - original| for one block, from how llama-quantize builds
// each format; `block` is the block's bytes and `index` the value within the block.
// Q8_0: d = amax / 127, q = round(x / d), so the error is at most d / 2, plus
// |q| <= 127 times the rounding of d to fp16 (2^-11 relative): 0.5 + 127 / 2048.
// Q4_0: d = max / -8, q = min(15, trunc(x / d + 8.5)); the same d / 2 plus 8 / 2048,
// except the one value with x / d = +8, clamped from code 16 to 15 (error d).
// Q6_K: codes are round(x / (d * scale)) clamped to -32..31, but the group scale is
// a least-squares fit that may clip its largest values, and rounds to an integer
// times d: the bound is one step (d * |scale|) plus d. (This model's worst is 0.76
// of a step.)
// kSubnormalSlack: an fp16 d below 2^-14 is rounded to a multiple of 2^-24, not
// to 11 bits; 128 codes times half of that.
double ErrorBound(GgmlType type, std::span<const uint8_t> block, size_t index) {
  constexpr double kSubnormalSlack = 128 * 0x1p-25;
  switch (type) {
    case GgmlType::kQ8_0:
      return std::fabs(core::Fp16ToFloat(ReadU16(block, 0))) * (0.5 + 128.0 / 2048) +
             kSubnormalSlack;
    case GgmlType::kQ4_0: {
      const double d = std::fabs(core::Fp16ToFloat(ReadU16(block, 0)));
      const uint8_t byte = block[2 + index % 16];
      const int code = index < 16 ? (byte & 0x0F) : (byte >> 4);
      return d * ((code == 15 ? 1.0 : 0.5) + 9.0 / 2048) + kSubnormalSlack;
    }
    case GgmlType::kQ6_K: {
      const double d = std::fabs(core::Fp16ToFloat(ReadU16(block, 208)));
      const int8_t scale = static_cast<int8_t>(block[192 + index / 16]);
      return d * (std::abs(scale) + 1);
    }
    default:
      return 0;  // types stored unquantized must match exactly
  }
}

struct ErrorStats {
  double max_abs = 0;
  double sum_sq_err = 0;
  double sum_sq_ref = 0;
};

// Each tensor of a quantized variant, dequantized, stays within its format's error
// bound of the f32 original; unquantized (F32) tensors match exactly.
void CompareWithF32(const std::string& variant) {
  auto f32 = GgufFile::Open(ModelPath("f32"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto quantized = GgufFile::Open(ModelPath(variant));
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  size_t checked = 0;
  for (const GgufTensorInfo& tensor : (*quantized)->tensors()) {
    SCOPED_TRACE(std::string(tensor.name));
    const GgufTensorInfo* reference = (*f32)->FindTensor(tensor.name);
    ASSERT_NE(reference, nullptr);
    ASSERT_EQ(reference->type, GgmlType::kF32);
    ASSERT_EQ(reference->n_elements, tensor.n_elements);
    ASSERT_TRUE(CanDequantize(tensor.type)) << GgmlTypeName(tensor.type);
    const std::vector<float> want = DequantizeTensor(**f32, *reference);
    const std::vector<float> got = DequantizeTensor(**quantized, tensor);
    const GgmlTypeTraits& traits = TraitsOf(tensor.type);
    const std::span<const uint8_t> data = (*quantized)->TensorData(tensor);
    ErrorStats stats;
    size_t failures = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const size_t block = i / traits.block_elements;
      const double bound =
          ErrorBound(tensor.type, data.subspan(block * traits.block_bytes, traits.block_bytes),
                     i % traits.block_elements);
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      stats.max_abs = std::max(stats.max_abs, err);
      stats.sum_sq_err += err * err;
      stats.sum_sq_ref += static_cast<double>(want[i]) * want[i];
      if (!(err <= bound) && failures++ < 5) {
        ADD_FAILURE() << GgmlTypeName(tensor.type) << " value " << i << ": got " << got[i]
                      << ", f32 " << want[i] << ", bound " << bound;
      }
    }
    EXPECT_EQ(failures, 0u);
    // Relative RMS error, a whole-tensor sanity check: 8-bit formats lose well under
    // 1%, 6-bit about 2%, 4-bit under 15%.
    if (tensor.type != GgmlType::kF32) {
      const double relative = std::sqrt(stats.sum_sq_err / stats.sum_sq_ref);
      const double limit = tensor.type == GgmlType::kQ4_0 ? 0.15
                           : tensor.type == GgmlType::kQ6_K ? 0.03
                                                            : 0.01;
      EXPECT_LT(relative, limit) << GgmlTypeName(tensor.type);
    }
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

TEST(DequantModel, Q8_0CloseToF32) { CompareWithF32("q8_0"); }

// Q4_0 file: experts, attention q/o and embeddings in Q4_0, attention k/v in Q8_0,
// output.weight in Q6_K, norms and router in F32.
TEST(DequantModel, Q4_0AndQ6_KCloseToF32) { CompareWithF32("q4_0"); }

// The f16 variant was converted from the same weights with round-to-nearest-even,
// so each F16 value is exactly FloatToFp16 of the f32 one, read back exactly.
TEST(DequantModel, F16IsTheRoundedF32) {
  auto f32 = GgufFile::Open(ModelPath("f32"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto f16 = GgufFile::Open(ModelPath("f16"));
  ASSERT_TRUE(f16.ok()) << f16.status();
  size_t halves = 0;
  for (const GgufTensorInfo& tensor : (*f16)->tensors()) {
    SCOPED_TRACE(std::string(tensor.name));
    const GgufTensorInfo* reference = (*f32)->FindTensor(tensor.name);
    ASSERT_NE(reference, nullptr);
    const std::vector<float> want = DequantizeTensor(**f32, *reference);
    const std::vector<float> got = DequantizeTensor(**f16, tensor);
    ASSERT_EQ(got.size(), want.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float rounded = tensor.type == GgmlType::kF16
                                ? core::Fp16ToFloat(core::FloatToFp16(want[i]))
                                : want[i];
      if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(rounded) &&
          mismatches++ < 5) {
        ADD_FAILURE() << "value " << i << ": got " << got[i] << ", want " << rounded;
      }
    }
    EXPECT_EQ(mismatches, 0u);
    if (tensor.type == GgmlType::kF16) halves += got.size();
  }
  EXPECT_GT(halves, 0u);
}

}  // namespace
}  // namespace moert::format
