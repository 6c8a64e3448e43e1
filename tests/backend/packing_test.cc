// Tests of weight packing (backend/packing.h): the lossless conversions read back bit
// for bit, the tile layout is what kernels/ukernel.h says (checked byte by byte and
// through the kernels themselves), padding rows are zero, requantization matches
// llama.cpp's quantizers, Q4_K -> W4M stays within fp16 rounding of the scales, 2:4
// pruning keeps the right two of every four, and bad sizes are errors.
#include "backend/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "format/dequant.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/quantize.h"
#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::backend {
namespace {

using format::GgmlType;

// Weights as trained matrices look: mostly small normal values, a few outliers.
std::vector<float> RandomWeights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) {
    v = normal(rng);
    if (uniform(rng) < 0.01f) v *= 8.0f;
  }
  return w;
}

std::vector<uint8_t> QuantizeAs(GgmlType type, const std::vector<float>& values) {
  std::vector<uint8_t> out(*format::GgmlRowBytes(type, values.size()));
  EXPECT_TRUE(format::Quantize(type, values, out).ok());
  return out;
}

std::vector<float> DequantizeAs(GgmlType type, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(format::Dequantize(type, bytes, out).ok());
  return out;
}

std::vector<uint8_t> Pack(GgmlType type, const std::vector<uint8_t>& src, int64_t rows,
                          int64_t cols, WeightFormat target) {
  std::vector<uint8_t> packed(PackedBytes(target, rows, cols));
  absl::Status status = PackRows(type, src, rows, cols, target, packed);
  EXPECT_TRUE(status.ok()) << status;
  return packed;
}

std::vector<float> Unpack(WeightFormat format, const std::vector<uint8_t>& packed, int64_t rows,
                          int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  absl::Status status = UnpackRows(format, packed, rows, cols, 0, rows, out);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

template <typename Block>
Block BlockOf(const std::vector<uint8_t>& packed, int64_t kb, int64_t tile, int64_t b) {
  Block block;
  std::memcpy(&block, packed.data() + static_cast<size_t>(tile * kb + b) * sizeof(Block),
              sizeof(Block));
  return block;
}

TEST(Packing, NamesSizesAndTypes) {
  EXPECT_EQ(WeightFormatName(WeightFormat::kW4), "w4");
  EXPECT_EQ(WeightFormatName(WeightFormat::kW4M), "w4m");
  EXPECT_EQ(WeightFormatName(WeightFormat::kW8), "w8");
  EXPECT_EQ(WeightFormatName(WeightFormat::kW4S24), "w4s24");
  // 13 rows -> 2 tiles; 64 columns -> 2 blocks per tile.
  EXPECT_EQ(PackedBytes(WeightFormat::kW4, 13, 64), 2u * 2u * 144u);
  EXPECT_EQ(PackedBytes(WeightFormat::kW4M, 13, 64), 2u * 2u * 160u);
  EXPECT_EQ(PackedBytes(WeightFormat::kW8, 8, 32), 272u);
  EXPECT_EQ(PackedBytes(WeightFormat::kW4S24, 1, 32), 104u);
  EXPECT_EQ(PackedBytes(WeightFormat::kW4, 0, 32), 0u);

  EXPECT_EQ(NaturalFormat(GgmlType::kQ4_0), WeightFormat::kW4);
  EXPECT_EQ(NaturalFormat(GgmlType::kQ4_1), WeightFormat::kW4M);
  EXPECT_EQ(NaturalFormat(GgmlType::kQ4_K), WeightFormat::kW4M);
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ5_0, GgmlType::kQ6_K}) {
    EXPECT_EQ(NaturalFormat(t), WeightFormat::kW8) << format::GgmlTypeName(t);
  }
  EXPECT_TRUE(CanPack(GgmlType::kQ4_K));
  EXPECT_TRUE(CanPack(GgmlType::kF32));
  EXPECT_FALSE(CanPack(GgmlType::kIQ2_XXS));
  EXPECT_FALSE(CanPack(GgmlType::kMoertW4));

  // The GGUF types: per-row shares of a tile block, so that a tensor of whole tiles
  // has the packed matrix's size.
  struct Case {
    WeightFormat format;
    GgmlType type;
    uint32_t id;
    const char* name;
  };
  for (const Case& c : {Case{WeightFormat::kW4, GgmlType::kMoertW4, 0x4D0, "moert_w4"},
                        Case{WeightFormat::kW4M, GgmlType::kMoertW4M, 0x4D1, "moert_w4m"},
                        Case{WeightFormat::kW8, GgmlType::kMoertW8, 0x4D2, "moert_w8"},
                        Case{WeightFormat::kW4S24, GgmlType::kMoertW4S24, 0x4D4, "moert_w4s24"}}) {
    EXPECT_EQ(PackedTypeOf(c.format), c.type);
    EXPECT_EQ(PackedFormatOf(c.type), c.format);
    auto traits = format::LookupGgmlType(c.id);
    ASSERT_TRUE(traits.has_value()) << c.name;
    EXPECT_EQ(traits->type, c.type);
    EXPECT_EQ(traits->name, c.name);
    EXPECT_EQ(traits->block_elements, 32u);
    EXPECT_TRUE(format::IsMoertPackedType(c.type));
    EXPECT_FALSE(format::CanDequantize(c.type)) << "needs the row count: DequantizePackedTensor";
    EXPECT_EQ(format::GgmlRowBytes(c.type, 3 * 8 * 96), PackedBytes(c.format, 24, 96)) << c.name;
  }
  EXPECT_FALSE(PackedFormatOf(GgmlType::kQ4_0).has_value());
  EXPECT_FALSE(format::IsMoertPackedType(GgmlType::kQ4_0));
}

struct LosslessCase {
  GgmlType type;
  WeightFormat format;
};

class LosslessTest : public ::testing::TestWithParam<LosslessCase> {};

// Rows below a tile, exactly one, not a multiple of 8; one and several blocks.
TEST_P(LosslessTest, UnpackEqualsDequantizeBitForBit) {
  const LosslessCase& p = GetParam();
  for (int64_t rows : {1, 7, 8, 13, 24}) {
    for (int64_t cols : {32, 96, 256}) {
      const std::vector<float> w =
          RandomWeights(rows * cols, static_cast<uint32_t>(rows * 1000 + cols));
      const std::vector<uint8_t> src = QuantizeAs(p.type, w);
      const std::vector<float> expected = DequantizeAs(p.type, src, w.size());
      const std::vector<uint8_t> packed = Pack(p.type, src, rows, cols, p.format);
      const std::vector<float> got = Unpack(p.format, packed, rows, cols);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(SameBits(got[i], expected[i]))
            << rows << "x" << cols << " value " << i << ": " << got[i] << " vs " << expected[i];
      }
      // A slice of rows reads the same values.
      if (rows > 3) {
        std::vector<float> slice(static_cast<size_t>(2 * cols));
        ASSERT_TRUE(UnpackRows(p.format, packed, rows, cols, rows - 3, 2, slice).ok());
        for (size_t i = 0; i < slice.size(); ++i) {
          ASSERT_TRUE(SameBits(slice[i], expected[static_cast<size_t>((rows - 3) * cols) + i]));
        }
      }
      // And back to the GGUF rows it came from, byte for byte.
      EXPECT_EQ(LosslessGgmlType(p.format), p.type);
      std::vector<uint8_t> back(src.size());
      ASSERT_TRUE(UnpackToGgml(p.format, packed, rows, cols, back).ok());
      EXPECT_EQ(back, src) << rows << "x" << cols;
      // The stored form too: a GGUF tensor of the packed type reads back the same.
      if (rows % 8 == 0) {
        std::vector<float> tensor(w.size());
        ASSERT_TRUE(
            DequantizePackedTensor(PackedTypeOf(p.format), packed, rows, cols, tensor).ok());
        EXPECT_EQ(std::memcmp(tensor.data(), got.data(), got.size() * sizeof(float)), 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, LosslessTest,
                         ::testing::Values(LosslessCase{GgmlType::kQ4_0, WeightFormat::kW4},
                                           LosslessCase{GgmlType::kQ4_1, WeightFormat::kW4M},
                                           LosslessCase{GgmlType::kQ8_0, WeightFormat::kW8}),
                         [](const ::testing::TestParamInfo<LosslessCase>& param_info) {
                           return std::string(WeightFormatName(param_info.param.format));
                         });

// The layout, byte by byte, independently of UnpackRows: row r of tile t, block b
// holds the source row's block b in the fields ukernel.h names; padding rows are zero.
TEST(Packing, TileLayoutMatchesUkernelStructs) {
  const int64_t rows = 13, cols = 64, kb = 2;
  const std::vector<float> w = RandomWeights(rows * cols, 7);
  {
    const std::vector<uint8_t> q = QuantizeAs(GgmlType::kQ4_0, w);
    const std::vector<uint8_t> packed = Pack(GgmlType::kQ4_0, q, rows, cols, WeightFormat::kW4);
    for (int64_t row = 0; row < 16; ++row) {
      for (int64_t b = 0; b < kb; ++b) {
        const auto blk = BlockOf<moert_w4_block>(packed, kb, row / 8, b);
        const size_t r = static_cast<size_t>(row % 8);
        if (row >= rows) {
          EXPECT_EQ(blk.d[r], 0);
          for (uint8_t v : blk.qs[r]) EXPECT_EQ(v, 0);
          continue;
        }
        const uint8_t* src = q.data() + static_cast<size_t>(row * kb + b) * 18;
        EXPECT_EQ(std::memcmp(&blk.d[r], src, 2), 0);
        EXPECT_EQ(std::memcmp(blk.qs[r], src + 2, 16), 0);
      }
    }
  }
  {
    const std::vector<uint8_t> q = QuantizeAs(GgmlType::kQ4_1, w);
    const std::vector<uint8_t> packed = Pack(GgmlType::kQ4_1, q, rows, cols, WeightFormat::kW4M);
    for (int64_t row = 0; row < 16; ++row) {
      for (int64_t b = 0; b < kb; ++b) {
        const auto blk = BlockOf<moert_w4m_block>(packed, kb, row / 8, b);
        const size_t r = static_cast<size_t>(row % 8);
        if (row >= rows) {
          EXPECT_EQ(blk.d[r], 0);
          EXPECT_EQ(blk.m[r], 0);
          for (uint8_t v : blk.qs[r]) EXPECT_EQ(v, 0);
          continue;
        }
        const uint8_t* src = q.data() + static_cast<size_t>(row * kb + b) * 20;
        EXPECT_EQ(std::memcmp(&blk.d[r], src, 2), 0);
        EXPECT_EQ(std::memcmp(&blk.m[r], src + 2, 2), 0);
        EXPECT_EQ(std::memcmp(blk.qs[r], src + 4, 16), 0);
      }
    }
  }
  {
    const std::vector<uint8_t> q = QuantizeAs(GgmlType::kQ8_0, w);
    const std::vector<uint8_t> packed = Pack(GgmlType::kQ8_0, q, rows, cols, WeightFormat::kW8);
    for (int64_t row = 0; row < 16; ++row) {
      for (int64_t b = 0; b < kb; ++b) {
        const auto blk = BlockOf<moert_w8_block>(packed, kb, row / 8, b);
        const size_t r = static_cast<size_t>(row % 8);
        if (row >= rows) {
          EXPECT_EQ(blk.d[r], 0);
          for (int8_t v : blk.qs[r]) EXPECT_EQ(v, 0);
          continue;
        }
        const uint8_t* src = q.data() + static_cast<size_t>(row * kb + b) * 34;
        EXPECT_EQ(std::memcmp(&blk.d[r], src, 2), 0);
        EXPECT_EQ(std::memcmp(blk.qs[r], src + 2, 32), 0);
      }
    }
  }
  {
    const std::vector<uint8_t> q = QuantizeAs(GgmlType::kQ4_0, w);
    const std::vector<uint8_t> packed = Pack(GgmlType::kQ4_0, q, rows, cols, WeightFormat::kW4S24);
    for (int64_t b = 0; b < kb; ++b) {
      const auto blk = BlockOf<moert_w4s24_block>(packed, kb, 1, b);
      for (size_t r = 5; r < 8; ++r) {  // rows 13..15: padding
        EXPECT_EQ(blk.d[r], 0);
        for (uint8_t v : blk.qs[r]) EXPECT_EQ(v, 0);
        for (uint8_t v : blk.pc[r]) EXPECT_EQ(v, 0);
      }
    }
  }
}

// Other sources are dequantized and quantized like llama.cpp's reference quantizers:
// the result is what packing that quantizer's output losslessly gives.
// PackRows writes every byte of its destination: packing into a buffer full of other
// bytes (an expert pool's reused block) gives what packing into zeros gives.
TEST(Packing, WritesEveryByteOfTheDestination) {
  const int64_t cols = 96;
  struct Case {
    GgmlType source;
    WeightFormat target;
  };
  for (const Case& c :
       {Case{GgmlType::kQ4_0, WeightFormat::kW4}, Case{GgmlType::kQ4_1, WeightFormat::kW4M},
        Case{GgmlType::kQ8_0, WeightFormat::kW8}, Case{GgmlType::kF32, WeightFormat::kW4},
        Case{GgmlType::kQ4_K, WeightFormat::kW4M}, Case{GgmlType::kQ4_0, WeightFormat::kW4S24}}) {
    for (int64_t rows : {8, 16, 5, 13}) {
      const int64_t k = c.source == GgmlType::kQ4_K ? 256 : cols;
      SCOPED_TRACE(std::string(format::GgmlTypeName(c.source)) + " -> " +
                   std::string(WeightFormatName(c.target)) + ", rows " + std::to_string(rows));
      const std::vector<uint8_t> src = QuantizeAs(c.source, RandomWeights(rows * k, 5));
      std::vector<uint8_t> zeros(PackedBytes(c.target, rows, k), 0x00);
      std::vector<uint8_t> stale(zeros.size(), 0xA5);
      ASSERT_TRUE(PackRows(c.source, src, rows, k, c.target, zeros).ok());
      ASSERT_TRUE(PackRows(c.source, src, rows, k, c.target, stale).ok());
      EXPECT_EQ(zeros, stale);
    }
  }
}

TEST(Packing, RequantizesLikeTheReferenceQuantizers) {
  const int64_t rows = 9, cols = 256;
  const std::vector<float> w = RandomWeights(rows * cols, 11);
  struct Case {
    GgmlType source;
    WeightFormat target;
    GgmlType like;
  };
  for (const Case& c : {Case{GgmlType::kF32, WeightFormat::kW8, GgmlType::kQ8_0},
                        Case{GgmlType::kF32, WeightFormat::kW4, GgmlType::kQ4_0},
                        Case{GgmlType::kF32, WeightFormat::kW4M, GgmlType::kQ4_1},
                        Case{GgmlType::kF16, WeightFormat::kW8, GgmlType::kQ8_0},
                        Case{GgmlType::kQ6_K, WeightFormat::kW8, GgmlType::kQ8_0},
                        Case{GgmlType::kQ4_K, WeightFormat::kW4, GgmlType::kQ4_0},
                        Case{GgmlType::kQ8_0, WeightFormat::kW4, GgmlType::kQ4_0}}) {
    SCOPED_TRACE(std::string(format::GgmlTypeName(c.source)) + " -> " +
                 std::string(WeightFormatName(c.target)));
    const std::vector<uint8_t> src = QuantizeAs(c.source, w);
    const std::vector<float> values = DequantizeAs(c.source, src, w.size());
    const std::vector<uint8_t> like = QuantizeAs(c.like, values);
    EXPECT_EQ(Pack(c.source, src, rows, cols, c.target), Pack(c.like, like, rows, cols, c.target));
  }
}

// Q4_K -> W4M keeps each 32-value sub-block's nibbles and rounds its scale (d * sc)
// and min (dmin * m) to fp16, so a value moves by at most 15 half-ulps of the scale
// plus a half-ulp of the min (relative 2^-11 each).
TEST(Packing, Q4KToW4MIsWithinFp16RoundingOfScaleAndMin) {
  const int64_t rows = 16, cols = 512;
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<float> w = RandomWeights(rows * cols, seed);
    if (seed == 3) {
      for (float& v : w) v = std::fabs(v) + 0.01f;  // all positive: non-zero mins
    }
    const std::vector<uint8_t> src = QuantizeAs(GgmlType::kQ4_K, w);
    const std::vector<float> expected = DequantizeAs(GgmlType::kQ4_K, src, w.size());
    const std::vector<uint8_t> packed = Pack(GgmlType::kQ4_K, src, rows, cols, WeightFormat::kW4M);
    const std::vector<float> got = Unpack(WeightFormat::kW4M, packed, rows, cols);
    double max_err = 0;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t sb = 0; sb < cols / 256; ++sb) {
        const uint8_t* block = src.data() + static_cast<size_t>((row * (cols / 256) + sb) * 144);
        for (size_t j = 0; j < 8; ++j) {
          const format::KSubBlockScaleMin sm = format::QKSubBlockScaleMin(block, j);
          const double bound =
              (15.0 * std::fabs(sm.scale) + std::fabs(sm.min)) * std::ldexp(1.0, -11) + 1e-12;
          for (int64_t l = 0; l < 32; ++l) {
            const size_t i =
                static_cast<size_t>(row * cols + sb * 256 + static_cast<int64_t>(j) * 32 + l);
            const double err = std::fabs(static_cast<double>(got[i]) - expected[i]);
            max_err = std::max(max_err, err);
            ASSERT_LE(err, bound) << "row " << row << " value " << i;
          }
        }
      }
    }
    EXPECT_GT(max_err, 0.0) << "fp16 rounding of d * sc should show somewhere";
  }
}

// What the kernels compute from packed weights: the dot with the unpacked fp32 weights
// and the A8-quantized activations, within float rounding of the accumulation.
TEST(Packing, KernelsOnPackedWeightsMatchUnpackedDot) {
  const kernels::KernelConfig& config = kernels::GetKernelConfig();
  struct Case {
    GgmlType source;
    WeightFormat format;
    const kernels::GemmConfig* family;
  };
  const int64_t rows = 21, cols = 160;  // a partial last tile
  const std::vector<float> w = RandomWeights(rows * cols, 5);
  for (const Case& c : {Case{GgmlType::kQ4_0, WeightFormat::kW4, &config.q4},
                        Case{GgmlType::kQ4_1, WeightFormat::kW4M, &config.q4m},
                        Case{GgmlType::kQ4_K, WeightFormat::kW4M, &config.q4m},
                        Case{GgmlType::kQ8_0, WeightFormat::kW8, &config.q8},
                        Case{GgmlType::kF32, WeightFormat::kW4S24, &config.q4s24}}) {
    SCOPED_TRACE(std::string(format::GgmlTypeName(c.source)) + " -> " +
                 std::string(WeightFormatName(c.format)));
    const std::vector<uint8_t> src = c.source == GgmlType::kQ4_K
                                         ? QuantizeAs(c.source, RandomWeights(rows * 256, 6))
                                         : QuantizeAs(c.source, w);
    const int64_t k = c.source == GgmlType::kQ4_K ? 256 : cols;
    const std::vector<uint8_t> packed = Pack(c.source, src, rows, k, c.format);
    const std::vector<float> unpacked = Unpack(c.format, packed, rows, k);
    ASSERT_NE(c.family->gemv, nullptr);
    ASSERT_NE(c.family->gemm, nullptr);

    const size_t m = std::max<size_t>(1, c.family->mr);
    std::vector<float> x = RandomWeights(static_cast<int64_t>(m) * k, 9);
    for (float& v : x) v *= 50.0f;
    std::vector<moert_a8_block> a(m * static_cast<size_t>(k / 32));
    for (size_t i = 0; i < m; ++i) {
      moert_q8_quant_ukernel__scalar(static_cast<size_t>(k), x.data() + i * static_cast<size_t>(k),
                                     a.data() + i * static_cast<size_t>(k / 32));
    }
    const size_t a_stride = static_cast<size_t>(k / 32) * sizeof(moert_a8_block);
    std::vector<float> gemv(static_cast<size_t>(rows), -1.0f);
    c.family->gemv(1, static_cast<size_t>(rows), static_cast<size_t>(k / 32), a.data(), a_stride,
                   packed.data(), gemv.data(), static_cast<size_t>(rows));
    std::vector<float> gemm(m * static_cast<size_t>(rows), -1.0f);
    c.family->gemm(m, static_cast<size_t>(rows), static_cast<size_t>(k / 32), a.data(), a_stride,
                   packed.data(), gemm.data(), static_cast<size_t>(rows));
    for (size_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < rows; ++n) {
        double dot = 0, mag = 0;
        for (int64_t j = 0; j < k; ++j) {
          const moert_a8_block& blk =
              a[i * static_cast<size_t>(k / 32) + static_cast<size_t>(j / 32)];
          const double xa = static_cast<double>(blk.d) * blk.qs[j % 32];
          const double wv = unpacked[static_cast<size_t>(n * k + j)];
          dot += wv * xa;
          mag += std::fabs(wv * xa);
        }
        const double tol = 1e-5 * mag + 1e-7;
        if (i == 0) {
          EXPECT_NEAR(gemv[static_cast<size_t>(n)], dot, tol) << "gemv row " << n;
        }
        EXPECT_NEAR(gemm[i * static_cast<size_t>(rows) + static_cast<size_t>(n)], dot, tol)
            << "gemm activation row " << i << ", weight row " << n;
      }
    }
  }
}

// A W4 matrix of chosen nibbles (d = 1, so value = nibble - 8).
std::vector<uint8_t> W4FromValues(const std::vector<int>& values, int64_t rows, int64_t cols) {
  std::vector<float> f(values.begin(), values.end());
  std::vector<uint8_t> q(*format::GgmlRowBytes(GgmlType::kQ4_0, f.size()));
  // Q4_0 rows with d = 1 (fp16 0x3C00) and the nibbles value + 8.
  for (size_t blk = 0; blk < f.size() / 32; ++blk) {
    uint8_t* y = q.data() + blk * 18;
    const uint16_t one = core::FloatToFp16(1.0f);
    std::memcpy(y, &one, 2);
    for (size_t j = 0; j < 16; ++j) {
      y[2 + j] =
          static_cast<uint8_t>((values[blk * 32 + j] + 8) | ((values[blk * 32 + j + 16] + 8) << 4));
    }
  }
  return Pack(GgmlType::kQ4_0, q, rows, cols, WeightFormat::kW4);
}

// Naive reference of the pruning rule: per group of 4, the two largest
// |w| * importance, ties to the lower column.
std::vector<float> PruneReference(const std::vector<float>& w, int64_t rows, int64_t cols,
                                  const std::vector<float>& importance) {
  std::vector<float> out(w.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / 4; ++g) {
      int order[4] = {0, 1, 2, 3};
      auto score = [&](int t) {
        const size_t c = static_cast<size_t>(4 * g + t);
        return std::fabs(w[static_cast<size_t>(r * cols) + c]) *
               (importance.empty() ? 1.0f : importance[c]);
      };
      std::stable_sort(order, order + 4, [&](int a, int b) { return score(a) > score(b); });
      for (int s = 0; s < 2; ++s) {
        const size_t i = static_cast<size_t>(r * cols + 4 * g + order[s]);
        out[i] = w[i];
      }
    }
  }
  return out;
}

TEST(Pruning, KeepsTheTwoLargestOfFourTiesToTheLowerColumn) {
  const int64_t rows = 2, cols = 32;
  std::vector<int> v(static_cast<size_t>(rows * cols), 0);
  // Row 0, groups: {1, -5, 3, 2} keeps -5 and 3; {4, 4, 4, 4} keeps columns 0 and 1;
  // {0, 0, 0, 7} keeps 0 (column 0) and 7; {-8, 7, -8, 1} keeps both -8.
  const int row0[16] = {1, -5, 3, 2, 4, 4, 4, 4, 0, 0, 0, 7, -8, 7, -8, 1};
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = row0[i];
  // Row 1: random in [-8, 7].
  std::mt19937 rng(3);
  for (int64_t i = cols; i < rows * cols; ++i)
    v[static_cast<size_t>(i)] = static_cast<int>(rng() % 16) - 8;
  const std::vector<uint8_t> w4 = W4FromValues(v, rows, cols);
  std::vector<uint8_t> s24(PackedBytes(WeightFormat::kW4S24, rows, cols));
  ASSERT_TRUE(PruneW4ToW4S24(w4, rows, cols, {}, s24).ok());
  const std::vector<float> got = Unpack(WeightFormat::kW4S24, s24, rows, cols);
  const float expect_row0[16] = {0, -5, 3, 0, 4, 4, 0, 0, 0, 0, 0, 7, -8, 0, -8, 0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], expect_row0[i]) << i;
  const std::vector<float> w(v.begin(), v.end());
  EXPECT_EQ(got, PruneReference(w, rows, cols, {}));
  // The bytes (kernels/ukernel.h): row 0's groups keep columns {1, 2}, {0, 1}, {0, 3},
  // {0, 2}, then {0, 1} (all zeros) four times: pair codes 3, 0, 2, 1, 0, 0, 0, 0 at
  // bits 3g, i.e. 3 | 2 << 6 | 1 << 9 = 0x283; the kept values -5, 3, 4, 4, 0, 7, -8,
  // -8 are nibbles 3, 11, 12, 12, 8, 15, 0, 0 (low), the zeros of groups 4-7 nibble 8
  // (high).
  const auto blk = BlockOf<moert_w4s24_block>(s24, 1, 0, 0);
  EXPECT_EQ(blk.pc[0][0], 0x83);
  EXPECT_EQ(blk.pc[0][1], 0x02);
  EXPECT_EQ(blk.pc[0][2], 0x00);
  const uint8_t expect_qs[8] = {0x83, 0x8B, 0x8C, 0x8C, 0x88, 0x8F, 0x80, 0x80};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(blk.qs[0][j], expect_qs[j]) << j;

  // Importance turns the choice: column 0 of the first group weighted 10x wins over 3.
  std::vector<float> importance(static_cast<size_t>(cols), 1.0f);
  importance[0] = 10.0f;
  importance[5] = 0.0f;  // zero importance: a column never beats a non-zero score
  ASSERT_TRUE(PruneW4ToW4S24(w4, rows, cols, importance, s24).ok());
  const std::vector<float> weighted = Unpack(WeightFormat::kW4S24, s24, rows, cols);
  EXPECT_EQ(weighted[0], 1.0f);
  EXPECT_EQ(weighted[1], -5.0f);
  EXPECT_EQ(weighted[2], 0.0f);
  EXPECT_EQ(weighted[4], 4.0f);
  EXPECT_EQ(weighted[5], 0.0f);
  EXPECT_EQ(weighted[6], 4.0f);
  EXPECT_EQ(weighted, PruneReference(w, rows, cols, importance));
}

TEST(Pruning, MatchesTheReferenceOnRandomMatricesAndKeepsScales) {
  const int64_t rows = 19, cols = 128;
  const std::vector<float> f = RandomWeights(rows * cols, 21);
  const std::vector<uint8_t> q = QuantizeAs(GgmlType::kQ4_0, f);
  const std::vector<uint8_t> w4 = Pack(GgmlType::kQ4_0, q, rows, cols, WeightFormat::kW4);
  const std::vector<float> dense = Unpack(WeightFormat::kW4, w4, rows, cols);
  std::vector<float> importance(static_cast<size_t>(cols));
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(0.0f, 2.0f);
  for (float& v : importance) v = u(rng);
  for (bool weighted : {false, true}) {
    const std::vector<float> imp = weighted ? importance : std::vector<float>{};
    std::vector<uint8_t> s24(PackedBytes(WeightFormat::kW4S24, rows, cols));
    ASSERT_TRUE(PruneW4ToW4S24(w4, rows, cols, imp, s24).ok());
    const std::vector<float> got = Unpack(WeightFormat::kW4S24, s24, rows, cols);
    const std::vector<float> expected = PruneReference(dense, rows, cols, imp);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], expected[i]) || (got[i] == 0 && expected[i] == 0))
          << "weighted " << weighted << " value " << i;
    }
    // Only the six pair codes are written (6 and 7 are reserved).
    const int64_t kb = cols / 32;
    for (int64_t tile = 0; tile < (rows + 7) / 8; ++tile) {
      for (int64_t b = 0; b < kb; ++b) {
        const auto blk = BlockOf<moert_w4s24_block>(s24, kb, tile, b);
        for (int r = 0; r < 8; ++r) {
          for (int g = 0; g < 8; ++g) ASSERT_LT(moert_w4s24_code(blk.pc[r], g), 6);
        }
      }
    }
  }
  // A W4S24 matrix reads back as Q4_0 of the same values: pruned weights are zeros.
  {
    std::vector<uint8_t> s24(PackedBytes(WeightFormat::kW4S24, rows, cols));
    ASSERT_TRUE(PruneW4ToW4S24(w4, rows, cols, importance, s24).ok());
    EXPECT_EQ(LosslessGgmlType(WeightFormat::kW4S24), GgmlType::kQ4_0);
    std::vector<uint8_t> q4(q.size());
    ASSERT_TRUE(UnpackToGgml(WeightFormat::kW4S24, s24, rows, cols, q4).ok());
    const std::vector<float> from_q4 = DequantizeAs(GgmlType::kQ4_0, q4, f.size());
    const std::vector<float> sparse = Unpack(WeightFormat::kW4S24, s24, rows, cols);
    int zeros = 0;
    for (size_t i = 0; i < sparse.size(); ++i) {
      ASSERT_EQ(from_q4[i], sparse[i]) << i;  // == : a pruned 0 may come back as -0
      zeros += sparse[i] == 0.0f ? 1 : 0;
    }
    EXPECT_GE(zeros, static_cast<int>(sparse.size() / 2));
  }
  // PackRows to W4S24 is W4 pruned by magnitude.
  std::vector<uint8_t> by_magnitude(PackedBytes(WeightFormat::kW4S24, rows, cols));
  ASSERT_TRUE(PruneW4ToW4S24(w4, rows, cols, {}, by_magnitude).ok());
  EXPECT_EQ(Pack(GgmlType::kQ4_0, q, rows, cols, WeightFormat::kW4S24), by_magnitude);
}

TEST(Packing, BadSizesAndTypesAreErrors) {
  const std::vector<float> w = RandomWeights(8 * 64, 1);
  const std::vector<uint8_t> q4 = QuantizeAs(GgmlType::kQ4_0, w);
  std::vector<uint8_t> dst(PackedBytes(WeightFormat::kW4, 8, 64));
  auto is_invalid = [](const absl::Status& s, const std::string& needle) {
    return s.code() == absl::StatusCode::kInvalidArgument &&
           std::string(s.message()).find(needle) != std::string::npos;
  };
  EXPECT_TRUE(PackRows(GgmlType::kQ4_0, q4, 8, 64, WeightFormat::kW4, dst).ok());
  // cols not a multiple of 32.
  EXPECT_TRUE(is_invalid(
      PackRows(GgmlType::kF32, std::vector<uint8_t>(8 * 40 * 4), 8, 40, WeightFormat::kW8, dst),
      "multiple of 32"));
  // cols not a multiple of the type's block (Q4_K: 256).
  const std::vector<uint8_t> q4k = QuantizeAs(GgmlType::kQ4_K, RandomWeights(256, 2));
  std::vector<uint8_t> dst_k(PackedBytes(WeightFormat::kW4M, 2, 128));
  EXPECT_TRUE(is_invalid(PackRows(GgmlType::kQ4_K, q4k, 2, 128, WeightFormat::kW4M, dst_k),
                         "256-value blocks"));
  // Source and destination sizes.
  EXPECT_TRUE(is_invalid(
      PackRows(GgmlType::kQ4_0, std::span(q4).first(q4.size() - 1), 8, 64, WeightFormat::kW4, dst),
      "source has"));
  EXPECT_TRUE(is_invalid(
      PackRows(GgmlType::kQ4_0, q4, 8, 64, WeightFormat::kW4, std::span(dst).first(dst.size() - 1)),
      "destination has"));
  EXPECT_TRUE(
      is_invalid(PackRows(GgmlType::kQ4_0, q4, -1, 64, WeightFormat::kW4, dst), "bad shape"));
  // A type that cannot be packed.
  EXPECT_TRUE(is_invalid(PackRows(GgmlType::kIQ2_XXS, q4, 8, 64, WeightFormat::kW4, dst),
                         "cannot pack type iq2_xxs"));
  // A non-finite value cannot be quantized.
  std::vector<float> bad = w;
  bad[70] = std::nanf("");
  std::vector<uint8_t> bad_bytes(bad.size() * 4);
  std::memcpy(bad_bytes.data(), bad.data(), bad_bytes.size());
  EXPECT_TRUE(
      is_invalid(PackRows(GgmlType::kF32, bad_bytes, 8, 64, WeightFormat::kW4, dst), "row 1"));

  // Pruning.
  std::vector<uint8_t> s24(PackedBytes(WeightFormat::kW4S24, 8, 64));
  EXPECT_TRUE(is_invalid(PruneW4ToW4S24(std::span(dst).first(100), 8, 64, {}, s24), "W4 matrix"));
  EXPECT_TRUE(
      is_invalid(PruneW4ToW4S24(dst, 8, 64, {}, std::span(s24).first(10)), "destination has"));
  EXPECT_TRUE(is_invalid(PruneW4ToW4S24(dst, 8, 64, std::vector<float>(63, 1.0f), s24),
                         "63 importance values for 64 columns"));
  std::vector<float> importance(64, 1.0f);
  importance[3] = -1.0f;
  EXPECT_TRUE(is_invalid(PruneW4ToW4S24(dst, 8, 64, importance, s24), "column 3"));
  importance[3] = std::nanf("");
  EXPECT_TRUE(is_invalid(PruneW4ToW4S24(dst, 8, 64, importance, s24), "column 3"));
  EXPECT_TRUE(is_invalid(PruneW4ToW4S24(dst, 8, 48, {}, s24), "bad shape"));

  // Unpacking.
  std::vector<float> out(64);
  EXPECT_TRUE(UnpackRows(WeightFormat::kW4, dst, 8, 64, 7, 1, out).ok());
  EXPECT_TRUE(is_invalid(UnpackRows(WeightFormat::kW4, dst, 8, 64, 8, 1, out), "not inside"));
  EXPECT_TRUE(is_invalid(UnpackRows(WeightFormat::kW4, dst, 8, 64, -1, 1, out), "not inside"));
  EXPECT_TRUE(is_invalid(UnpackRows(WeightFormat::kW4, dst, 8, 64, 0, 2, out), "destination"));
  EXPECT_TRUE(is_invalid(UnpackRows(WeightFormat::kW8, dst, 8, 64, 0, 1, out), "bytes"));
  std::vector<uint8_t> ggml(8 * 2 * 18);
  EXPECT_TRUE(UnpackToGgml(WeightFormat::kW4, dst, 8, 64, ggml).ok());
  EXPECT_TRUE(is_invalid(UnpackToGgml(WeightFormat::kW4, dst, 8, 64, std::span(ggml).first(10)),
                         "destination has"));
  EXPECT_TRUE(is_invalid(UnpackToGgml(WeightFormat::kW4M, dst, 8, 64, ggml), "bytes"));
  std::vector<float> all(8 * 64);
  EXPECT_TRUE(is_invalid(DequantizePackedTensor(GgmlType::kQ4_0, dst, 8, 64, all),
                         "not one of moert's packed types"));
  EXPECT_TRUE(DequantizePackedTensor(GgmlType::kMoertW4, dst, 8, 64, all).ok());
}

// The GGUF reader takes moert's types, and only tensors of whole 8-row tiles.
TEST(Packing, GgufReaderAcceptsPackedTypesOfWholeTiles) {
  const std::vector<float> w = RandomWeights(2 * 16 * 64, 3);
  const std::vector<uint8_t> q4 = QuantizeAs(GgmlType::kQ4_0, w);
  const std::vector<uint8_t> packed = Pack(GgmlType::kQ4_0, q4, 32, 64, WeightFormat::kW4);
  format::GgufWriter writer;
  writer.SetString("general.architecture", "llama");
  ASSERT_TRUE(writer.AddTensor("experts", GgmlType::kMoertW4, {64, 16, 2}, packed).ok());
  const std::vector<uint8_t> bytes = writer.Serialize();
  auto file = format::GgufFile::FromBuffer(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const format::GgufTensorInfo* t = (*file)->FindTensor("experts");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kMoertW4);
  EXPECT_EQ(t->n_bytes, packed.size());
  std::vector<float> values(w.size());
  ASSERT_TRUE(DequantizePackedTensor(t->type, (*file)->TensorData(*t), 32, 64, values).ok());
  EXPECT_EQ(values, DequantizeAs(GgmlType::kQ4_0, q4, w.size()));

  // 12 rows per expert (two experts: 24 in all) is not whole tiles of each matrix.
  format::GgufWriter bad;
  ASSERT_TRUE(bad.AddTensor("experts", GgmlType::kMoertW4S24, {64, 12, 2},
                            std::vector<uint8_t>(24 * 2 * 13))
                  .ok());
  const std::vector<uint8_t> bad_bytes = bad.Serialize();
  auto bad_file = format::GgufFile::FromBuffer(bad_bytes);
  ASSERT_FALSE(bad_file.ok());
  EXPECT_NE(std::string(bad_file.status().message())
                .find("moert_w4s24 tensor needs a multiple of 8 rows"),
            std::string::npos)
      << bad_file.status();

  // A file of W4S24's first layout (type id 0x4D3, 14 bytes a row-block) is refused by
  // name, with what to do about it.
  format::GgufWriter old_layout;
  ASSERT_TRUE(old_layout.AddTensor("experts", GgmlType::kMoertW4S24, {64, 8, 1},
                                   std::vector<uint8_t>(8 * 2 * 13))
                  .ok());
  std::vector<uint8_t> old_bytes = old_layout.Serialize();
  const uint8_t new_id[4] = {0xD4, 0x04, 0x00, 0x00};
  auto at = std::search(old_bytes.begin(), old_bytes.end(), new_id, new_id + 4);
  ASSERT_NE(at, old_bytes.end());
  *at = 0xD3;
  auto old_file = format::GgufFile::FromBuffer(old_bytes);
  ASSERT_FALSE(old_file.ok());
  EXPECT_NE(std::string(old_file.status().message())
                .find("moert_w4s24 in its first layout (2-bit positions, 14 bytes a row-block), "
                      "which this build no longer reads: repack"),
            std::string::npos)
      << old_file.status();
}

}  // namespace
}  // namespace moert::backend
