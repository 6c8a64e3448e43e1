// Tests of format/quantize.h: hand-worked blocks whose bytes are written out here,
// the size and value checks, round trips through format/dequant.h within each
// format's error bound, and bit-exactness with llama-quantize on the test models
// (their q8_0 and q4_0 files were made from the f32 one by llama-quantize without an
// importance matrix, the f16 one by gguf-py, so quantizing the f32 tensors must give
// the files' bytes).
#include "format/quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "format/dequant.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::format {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<uint8_t> QuantizeOrDie(GgmlType type, const std::vector<float>& x) {
  std::vector<uint8_t> out(*GgmlRowBytes(type, x.size()));
  absl::Status status = Quantize(type, x, out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<float> DequantizeOrDie(GgmlType type, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> out(n);
  absl::Status status = Dequantize(type, q, out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// --- Hand-worked blocks -----------------------------------------------------------

TEST(QuantizePlain, F32F16Bf16) {
  std::vector<float> x = {1.0f, -2.0f, 65520.0f, 0.1f};
  EXPECT_THAT(QuantizeOrDie(GgmlType::kF16, x),
              ElementsAreArray<uint8_t>({0x00, 0x3C, 0x00, 0xC0, 0x00, 0x7C, 0x66, 0x2E}));
  EXPECT_THAT(QuantizeOrDie(GgmlType::kBF16, x),
              ElementsAreArray<uint8_t>({0x80, 0x3F, 0x00, 0xC0, 0x80, 0x47, 0xCD, 0x3D}));
  std::vector<uint8_t> f32 = QuantizeOrDie(GgmlType::kF32, x);
  ASSERT_EQ(f32.size(), 16u);
  EXPECT_THAT(std::vector<uint8_t>(f32.begin(), f32.begin() + 4),
              ElementsAreArray<uint8_t>({0x00, 0x00, 0x80, 0x3F}));
}

// amax 127 gives d = 1 exactly: the codes are roundf(x), halves away from zero.
TEST(QuantizeQ8_0, RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = -127.0f;
  x[2] = 2.5f;
  x[3] = -2.5f;
  x[4] = 0.49f;
  x[5] = 1.5f;
  x[6] = -100.4f;
  std::vector<uint8_t> expected = {0x00, 0x3C,  // d = 1
                                   0x7F, 0x81, 0x03, 0xFD, 0x00, 0x02, 0x9C};
  expected.resize(34, 0x00);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ8_0, x), ElementsAreArray(expected));
}

// The codes use the unrounded scale, the block stores it as fp16: amax 1 gives
// d = 1/127, stored as 0x2008 (0.00787353...), and codes round(x * 127).
TEST(QuantizeQ8_0, CodesUseTheUnroundedScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[1] = 0.25f;
  std::vector<uint8_t> expected = {0x08, 0x20, 0x7F, 0x20};  // 0.25 * 127 = 31.75 -> 32
  expected.resize(34, 0x00);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ8_0, x), ElementsAreArray(expected));
}

TEST(QuantizeQ8_0, AllZeroBlock) {
  std::vector<float> x(32, 0.0f);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ8_0, x), ElementsAreArray(std::vector<uint8_t>(34, 0)));
}

// The value of largest magnitude, -8, gives d = 1 and code 0; codes are
// min(15, trunc(x / d + 8.5)): value j in the low nibble, value j + 16 in the high.
TEST(QuantizeQ4_0, NegativeMaximumGivesPositiveScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;   // 0
  x[16] = 7.0f;   // 15
  x[1] = 0.5f;    // trunc(9.0) = 9
  x[17] = -0.5f;  // trunc(8.0) = 8
  x[2] = 7.6f;    // trunc(16.1) = 16, clamped to 15
  x[18] = 3.0f;   // 11
  x[3] = 0.49f;   // trunc(8.99) = 8
  x[19] = -7.6f;  // trunc(0.9) = 0
  std::vector<uint8_t> expected = {0x00, 0x3C, 0xF0, 0x89, 0xBF, 0x08};
  expected.resize(18, 0x88);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ4_0, x), ElementsAreArray(expected));
}

// A positive maximum gives a negative scale: 8 -> d = -1, code 0.
TEST(QuantizeQ4_0, PositiveMaximumGivesNegativeScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = 8.0f;    // -8 + 8.5 -> 0
  x[16] = -3.0f;  // 3 + 8.5 -> 11
  std::vector<uint8_t> expected = {0x00, 0xBC, 0xB0};
  expected.resize(18, 0x88);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ4_0, x), ElementsAreArray(expected));
}

// ggml's scale of a zero block is 0 / -8 = -0 (0x8000), whatever the zeros' signs;
// every code is 8, the zero point.
TEST(QuantizeQ4_0, ZeroBlockHasNegativeZeroScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = -0.0f;
  std::vector<uint8_t> expected = {0x00, 0x80};
  expected.resize(18, 0x88);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ4_0, x), ElementsAreArray(expected));
  // Q5_0 alike: code 16 is a zero nibble with the fifth bit set.
  std::vector<uint8_t> expected5 = {0x00, 0x80, 0xFF, 0xFF, 0xFF, 0xFF};
  expected5.resize(22, 0x00);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ5_0, x), ElementsAreArray(expected5));
}

// min -1, max 14: d = 1, m = -1, codes min(15, trunc(x - m + 0.5)).
TEST(QuantizeQ4_1, ScaleAndMinFromTheRange) {
  std::vector<float> x(32, 0.0f);  // 0 -> code 1
  x[0] = -1.0f;                    // 0
  x[16] = 14.0f;                   // 15
  x[1] = 2.4f;                     // trunc(3.9) = 3
  x[17] = 2.6f;                    // trunc(4.1) = 4
  std::vector<uint8_t> expected = {0x00, 0x3C, 0x00, 0xBC, 0xF0, 0x43};
  expected.resize(20, 0x11);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ4_1, x), ElementsAreArray(expected));
}

// -16 gives d = 1; codes min(31, trunc(x + 16.5)), fifth bits in qh (value j: bit j).
TEST(QuantizeQ5_0, FifthBitsGoToQh) {
  std::vector<float> x(32, -16.0f);  // code 0
  x[0] = 15.0f;                      // 31: nibble 0xF, qh bit 0
  x[1] = 0.0f;                       // 16: nibble 0x0, qh bit 1
  x[17] = 15.6f;                     // trunc(32.1) clamped to 31: nibble 0xF, qh bit 17
  x[20] = -0.6f;                     // trunc(15.9) = 15: nibble 0xF, no fifth bit
  const uint32_t qh = (1u << 0) | (1u << 1) | (1u << 17);
  std::vector<uint8_t> expected = {0x00,
                                   0x3C,
                                   static_cast<uint8_t>(qh),
                                   static_cast<uint8_t>(qh >> 8),
                                   static_cast<uint8_t>(qh >> 16),
                                   static_cast<uint8_t>(qh >> 24),
                                   0x0F,
                                   0xF0,
                                   0x00,
                                   0x00,
                                   0xF0};
  expected.resize(22, 0x00);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ5_0, x), ElementsAreArray(expected));
}

// min 0, max 31: d = 1, m = 0, codes trunc(x + 0.5).
TEST(QuantizeQ5_1, ScaleAndMinFromTheRange) {
  std::vector<float> x(32, 0.0f);
  x[0] = 31.0f;   // 31
  x[16] = 16.4f;  // 16
  const uint32_t qh = (1u << 0) | (1u << 16);
  std::vector<uint8_t> expected = {0x00,
                                   0x3C,
                                   0x00,
                                   0x00,
                                   static_cast<uint8_t>(qh),
                                   static_cast<uint8_t>(qh >> 8),
                                   static_cast<uint8_t>(qh >> 16),
                                   static_cast<uint8_t>(qh >> 24),
                                   0x0F};
  expected.resize(24, 0x00);
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ5_1, x), ElementsAreArray(expected));
}

TEST(QuantizeK, AllZeroSuperBlocks) {
  std::vector<float> x(256, 0.0f);
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> q = QuantizeOrDie(type, x);
    EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](uint8_t b) { return b == 0; }))
        << GgmlTypeName(type);
  }
}

// Values so small that a block's d is subnormal: 1 / d overflows to infinity, so the
// codes of x * (1 / d) are out of any range (x86 gives ggml's bits by accident, and
// UBSan reports the conversion). Every format still quantizes them without undefined
// behaviour, and as its fp16 scale underflows to 0 they all dequantize to 0.
TEST(QuantizeSubnormalBlocks, QuantizeToZeroWithoutOverflow) {
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 ? 1e-39f : -2e-39f);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(GgmlTypeName(type));
    const std::vector<uint8_t> q = QuantizeOrDie(type, x);
    for (float v : DequantizeOrDie(type, q, x.size())) ASSERT_EQ(v, 0.0f);
  }
  // Q8_0's codes are 0 too: nothing of the block survives its scale.
  EXPECT_THAT(QuantizeOrDie(GgmlType::kQ8_0, std::vector<float>(x.begin(), x.begin() + 32)),
              ElementsAreArray(std::vector<uint8_t>(34, 0)));
}

// --- Sizes and values ---------------------------------------------------------------

TEST(QuantizeErrors, PartialBlockNamesTypeAndSize) {
  std::vector<float> x(48, 1.0f);
  std::vector<uint8_t> out(100);
  absl::Status status = Quantize(GgmlType::kQ4_0, x, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("q4_0"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("48"));
}

TEST(QuantizeErrors, WrongDestinationSizeNamesBoth) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> out(35);
  absl::Status status = Quantize(GgmlType::kQ8_0, x, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("q8_0"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("68 bytes, got 35"));
}

TEST(QuantizeErrors, NonFiniteValueIsNamed) {
  std::vector<float> x(32, 1.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> out(34);
  absl::Status status = Quantize(GgmlType::kQ8_0, x, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("value 5"));
  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Quantize(GgmlType::kQ8_0, x, out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantizeErrors, UnsupportedTypesAreUnimplemented) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> out(*GgmlRowBytes(GgmlType::kQ2_K, 256));
  EXPECT_FALSE(CanQuantize(GgmlType::kQ2_K));
  absl::Status status = Quantize(GgmlType::kQ2_K, x, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("q2_K"));
}

TEST(QuantizeErrors, EmptyIsFine) { EXPECT_TRUE(Quantize(GgmlType::kQ4_0, {}, {}).ok()); }

// --- Round trips --------------------------------------------------------------------

constexpr GgmlType kQuantizable[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
    GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K};

TEST(QuantizeRoundTrip, EveryListedTypeIsDequantizable) {
  for (GgmlType type : kQuantizable) {
    EXPECT_TRUE(CanQuantize(type)) << GgmlTypeName(type);
    EXPECT_TRUE(CanDequantize(type)) << GgmlTypeName(type);
  }
}

std::vector<float> RandomValues(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  // Blocks of very different magnitudes, one offset block and one constant block.
  for (size_t i = 0; i < n; ++i) {
    const size_t block = i / 256;
    if (block % 4 == 1) x[i] *= 1e-3f;
    if (block % 4 == 2) x[i] = x[i] * 10.0f + 25.0f;
    if (block % 8 == 3) x[i] = 0.75f;
  }
  return x;
}

// Largest error a block of each legacy format allows, from its scale: half a step
// (plus the fp16 rounding of the scale and min), a whole step where the code clamps.
double BlockErrorBound(GgmlType type, const float* x, size_t n) {
  float amax = 0.0f;
  float min = x[0];
  float max = x[0];
  for (size_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  const double range = static_cast<double>(max) - min;
  const double fp16_slack = amax * 2e-3;
  switch (type) {
    case GgmlType::kF32:
      return 0.0;
    case GgmlType::kF16:
      return amax * 0x1p-11 + 0x1p-25;
    case GgmlType::kBF16:
      return amax * 0x1p-8;
    case GgmlType::kQ8_0:
      return amax / 127.0 * 0.5 + fp16_slack;
    case GgmlType::kQ4_0:
      return amax / 8.0 + fp16_slack;
    case GgmlType::kQ5_0:
      return amax / 16.0 + fp16_slack;
    case GgmlType::kQ4_1:
      return range / 15.0 * 0.5 + fp16_slack;
    case GgmlType::kQ5_1:
      return range / 31.0 * 0.5 + fp16_slack;
    // K formats: a loose bound, the 6-bit sub-block scales and mins add error.
    case GgmlType::kQ4_K:
      return range / 15.0 * 1.5 + fp16_slack;
    case GgmlType::kQ6_K:
      return amax / 32.0 * 1.5 + fp16_slack;
    default:
      return 0.0;
  }
}

TEST(QuantizeRoundTrip, ErrorWithinEachFormatsBound) {
  const std::vector<float> x = RandomValues(256 * 16, 42);
  for (GgmlType type : kQuantizable) {
    std::vector<float> y = DequantizeOrDie(type, QuantizeOrDie(type, x), x.size());
    const size_t block = std::max<uint32_t>(32, TraitsOf(type).block_elements);
    double sum_err2 = 0;
    double sum_x2 = 0;
    for (size_t b = 0; b < x.size(); b += block) {
      const double bound = BlockErrorBound(type, &x[b], block);
      for (size_t i = b; i < b + block; ++i) {
        const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
        ASSERT_LE(err, bound) << GgmlTypeName(type) << " value " << i << ": " << x[i] << " -> "
                              << y[i];
        sum_err2 += err * err;
        sum_x2 += static_cast<double>(x[i]) * x[i];
      }
    }
    // And on average well inside: relative RMS error per format.
    const double rel_rms = std::sqrt(sum_err2 / sum_x2);
    const double max_rel_rms =
        type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K ? 0.15 : 0.05;
    EXPECT_LE(rel_rms, max_rel_rms) << GgmlTypeName(type);
  }
}

// A constant block comes back exactly when its scale is an fp16 value: -0.75 / -8
// and / -16 are, and the min formats store the value itself as the min. (Q8_0's
// 0.75 / 127 is not.)
TEST(QuantizeRoundTrip, ConstantBlocksWithAnFp16ScaleAreExact) {
  std::vector<float> x(64, -0.75f);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1}) {
    EXPECT_THAT(DequantizeOrDie(type, QuantizeOrDie(type, x), x.size()), ElementsAreArray(x))
        << GgmlTypeName(type);
  }
}

// Quantizing dequantized values gives the same bytes back: ggml's legacy formats
// are idempotent (the extreme values map to the end codes, so the scale and min
// are found again exactly). The K formats search their scales and are not (about
// a fifth of Q6_K blocks change on normal data), so a K-quantized file can only be
// reproduced from its source, as QuantizeModel does below.
TEST(QuantizeRoundTrip, LegacyFormatsAreIdempotent) {
  const std::vector<float> x = RandomValues(256 * 16, 7);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kF16, GgmlType::kBF16}) {
    const std::vector<uint8_t> q = QuantizeOrDie(type, x);
    const std::vector<uint8_t> again = QuantizeOrDie(type, DequantizeOrDie(type, q, x.size()));
    EXPECT_EQ(again, q) << GgmlTypeName(type);
  }
}

// --- The test models ----------------------------------------------------------------

std::unique_ptr<GgufFile> OpenModel(const std::string& variant) {
  auto file = GgufFile::Open(std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-" +
                             variant + ".gguf");
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

std::vector<float> TensorValues(const GgufFile& file, const GgufTensorInfo& t) {
  std::vector<float> out(t.n_elements);
  absl::Status status = Dequantize(t.type, file.TensorData(t), out);
  EXPECT_TRUE(status.ok()) << t.name << ": " << status;
  return out;
}

// Number of blocks of `type` that differ between two encodings.
size_t DifferingBlocks(GgmlType type, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  const size_t block = TraitsOf(type).block_bytes;
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); i += block) {
    if (!std::equal(a.begin() + i, a.begin() + i + block, b.begin() + i)) ++differing;
  }
  return differing;
}

// Every quantized tensor of `variant` equals Quantize of the f32 model's tensor.
void ExpectSameAsLlamaQuantize(const std::string& variant) {
  std::unique_ptr<GgufFile> f32 = OpenModel("f32");
  std::unique_ptr<GgufFile> quantized = OpenModel(variant);
  ASSERT_TRUE(f32 && quantized);
  size_t checked = 0;
  for (const GgufTensorInfo& t : quantized->tensors()) {
    if (t.type == GgmlType::kF32) continue;
    const GgufTensorInfo* source = f32->FindTensor(t.name);
    ASSERT_NE(source, nullptr) << t.name;
    ASSERT_EQ(source->type, GgmlType::kF32) << t.name;
    ASSERT_TRUE(CanQuantize(t.type)) << t.name << " " << GgmlTypeName(t.type);
    std::vector<uint8_t> ours(t.n_bytes);
    ASSERT_TRUE(Quantize(t.type, TensorValues(*f32, *source), ours).ok()) << t.name;
    const std::span<const uint8_t> theirs = quantized->TensorData(t);
    EXPECT_EQ(DifferingBlocks(t.type, ours, theirs), 0u)
        << variant << " " << t.name << " (" << GgmlTypeName(t.type) << ")";
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

TEST(QuantizeModel, Q8_0FileIsQuantizeOfF32) { ExpectSameAsLlamaQuantize("q8_0"); }

// q4_0 tensors, the q8_0 attn_k/attn_v llama-quantize picks for 8-expert models and
// the q6_K output.
TEST(QuantizeModel, Q4_0FileIsQuantizeOfF32) { ExpectSameAsLlamaQuantize("q4_0"); }

// gguf-py's f16 conversion (numpy's round to nearest even) is FloatToFp16's.
TEST(QuantizeModel, F16FileIsQuantizeOfF32) { ExpectSameAsLlamaQuantize("f16"); }

// Re-quantizing a file's dequantized legacy tensors reproduces its bytes.
TEST(QuantizeModel, RequantizingDequantizedTensorsReproducesTheFile) {
  for (const char* variant : {"q8_0", "q4_0"}) {
    std::unique_ptr<GgufFile> file = OpenModel(variant);
    ASSERT_TRUE(file);
    for (const GgufTensorInfo& t : file->tensors()) {
      if (t.type != GgmlType::kQ8_0 && t.type != GgmlType::kQ4_0) continue;
      std::vector<uint8_t> again(t.n_bytes);
      ASSERT_TRUE(Quantize(t.type, TensorValues(*file, t), again).ok()) << t.name;
      EXPECT_EQ(DifferingBlocks(t.type, again, file->TensorData(t)), 0u)
          << variant << " " << t.name;
    }
  }
}

}  // namespace
}  // namespace moert::format
