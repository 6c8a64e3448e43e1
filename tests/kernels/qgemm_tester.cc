// Random packed weights and activations for QGemmTester, and its two checks.
#include "kernels/qgemm_tester.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/fp16.h"
#include "core/strings.h"
#include "gtest/gtest.h"

namespace moert::kernels::testing {
namespace {

size_t BlockBytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kW4:
      return sizeof(moert_w4_block);
    case WeightFormat::kW4M:
      return sizeof(moert_w4m_block);
    case WeightFormat::kW8:
      return sizeof(moert_w8_block);
    case WeightFormat::kW4S24:
      return sizeof(moert_w4s24_block);
  }
  return 0;
}

// A random fp16 scale of a realistic magnitude (and some negative, which Q4_K's
// offsets are).
uint16_t RandomScale(std::mt19937& rng, bool allow_negative) {
  std::uniform_real_distribution<float> mag(1e-4f, 4e-2f);
  float v = mag(rng);
  if (allow_negative && (rng() & 1)) v = -v;
  return core::FloatToFp16(v);
}

// Random weight tiles for n rows; padding rows (>= n) are zero, as packing makes them.
std::vector<uint8_t> RandomWeights(WeightFormat f, size_t n, size_t kb, std::mt19937& rng) {
  const size_t tiles = (n + MOERT_NR - 1) / MOERT_NR;
  std::vector<uint8_t> bytes(tiles * kb * BlockBytes(f), 0);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t t = 0; t < tiles; ++t) {
    for (size_t b = 0; b < kb; ++b) {
      uint8_t* p = bytes.data() + (t * kb + b) * BlockBytes(f);
      for (int r = 0; r < MOERT_NR; ++r) {
        const bool live = t * MOERT_NR + static_cast<size_t>(r) < n;
        switch (f) {
          case WeightFormat::kW4: {
            auto* blk = reinterpret_cast<moert_w4_block*>(p);
            blk->d[r] = live ? RandomScale(rng, true) : 0;
            for (auto& q : blk->qs[r]) q = live ? static_cast<uint8_t>(byte(rng)) : 0x88;
            break;
          }
          case WeightFormat::kW4M: {
            auto* blk = reinterpret_cast<moert_w4m_block*>(p);
            blk->d[r] = live ? RandomScale(rng, false) : 0;
            blk->m[r] = live ? RandomScale(rng, true) : 0;
            for (auto& q : blk->qs[r]) q = live ? static_cast<uint8_t>(byte(rng)) : 0;
            break;
          }
          case WeightFormat::kW8: {
            auto* blk = reinterpret_cast<moert_w8_block*>(p);
            blk->d[r] = live ? RandomScale(rng, true) : 0;
            // The full int8 range, -128 included (a file may hold it).
            for (auto& q : blk->qs[r]) q = live ? static_cast<int8_t>(byte(rng) - 128) : 0;
            break;
          }
          case WeightFormat::kW4S24: {
            auto* blk = reinterpret_cast<moert_w4s24_block*>(p);
            blk->d[r] = live ? RandomScale(rng, true) : 0;
            for (auto& q : blk->qs[r]) q = live ? static_cast<uint8_t>(byte(rng)) : 0x88;
            // Random pair codes, 6 and 7 (never written, but defined) included.
            for (auto& q : blk->pc[r]) q = live ? static_cast<uint8_t>(byte(rng)) : 0;
            break;
          }
        }
      }
    }
  }
  return bytes;
}

// Sets every live weight of `bytes` (RandomWeights' layout) to the end of its range:
// rows alternate between the low and the high end; padding rows stay zero.
void MakeWeightsExtreme(WeightFormat f, size_t n, size_t kb, std::vector<uint8_t>& bytes) {
  const size_t tiles = (n + MOERT_NR - 1) / MOERT_NR;
  for (size_t t = 0; t < tiles; ++t) {
    for (size_t b = 0; b < kb; ++b) {
      uint8_t* p = bytes.data() + (t * kb + b) * BlockBytes(f);
      for (int r = 0; r < MOERT_NR; ++r) {
        if (t * MOERT_NR + static_cast<size_t>(r) >= n) continue;
        const bool high = r % 2 != 0;
        switch (f) {
          case WeightFormat::kW4:
            std::memset(reinterpret_cast<moert_w4_block*>(p)->qs[r], high ? 0xFF : 0x00, 16);
            break;
          case WeightFormat::kW4M:
            std::memset(reinterpret_cast<moert_w4m_block*>(p)->qs[r], 0xFF, 16);
            break;
          case WeightFormat::kW8:
            std::memset(reinterpret_cast<moert_w8_block*>(p)->qs[r], high ? 0x7F : 0x80, 32);
            break;
          case WeightFormat::kW4S24:
            std::memset(reinterpret_cast<moert_w4s24_block*>(p)->qs[r], high ? 0xFF : 0x00, 8);
            break;
        }
      }
    }
  }
}

// The dequantized value of row r (within its tile), column j of a block.
double WeightValue(WeightFormat f, const uint8_t* block, int r, int j) {
  switch (f) {
    case WeightFormat::kW4: {
      const auto* b = reinterpret_cast<const moert_w4_block*>(block);
      const int q = j < 16 ? (b->qs[r][j] & 0x0F) : (b->qs[r][j - 16] >> 4);
      return core::Fp16ToFloat(b->d[r]) * (q - 8);
    }
    case WeightFormat::kW4M: {
      const auto* b = reinterpret_cast<const moert_w4m_block*>(block);
      const int q = j < 16 ? (b->qs[r][j] & 0x0F) : (b->qs[r][j - 16] >> 4);
      return static_cast<double>(core::Fp16ToFloat(b->d[r])) * q + core::Fp16ToFloat(b->m[r]);
    }
    case WeightFormat::kW8: {
      const auto* b = reinterpret_cast<const moert_w8_block*>(block);
      return static_cast<double>(core::Fp16ToFloat(b->d[r])) * b->qs[r][j];
    }
    case WeightFormat::kW4S24: {
      const auto* b = reinterpret_cast<const moert_w4s24_block*>(block);
      // The group's 3-bit code (bits 3g..3g+2 of the row's 24 code bits) and the two
      // columns it keeps (codes 6 and 7 read as 0 and 5), written out apart from the
      // kernels' table.
      static constexpr int kPairs[8][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2},
                                           {1, 3}, {2, 3}, {0, 1}, {2, 3}};
      const int g = j / 4;
      const uint32_t bits = b->pc[r][0] + 256u * b->pc[r][1] + 65536u * b->pc[r][2];
      const int code = static_cast<int>(bits / (1u << (3 * g)) % 8);
      for (int s = 0; s < 2; ++s) {
        const int k = 2 * g + s;
        if (4 * g + kPairs[code][s] == j) {
          const int q = k < 8 ? (b->qs[r][k] & 0x0F) : (b->qs[r][k - 8] >> 4);
          return static_cast<double>(core::Fp16ToFloat(b->d[r])) * (q - 8);
        }
      }
      return 0;
    }
  }
  return 0;
}

}  // namespace

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kW4:
      return "q4";
    case WeightFormat::kW4M:
      return "q4m";
    case WeightFormat::kW8:
      return "q8";
    case WeightFormat::kW4S24:
      return "q4s24";
  }
  return "?";
}

const GemmConfig& FamilyOf(const KernelConfig& config, WeightFormat f) {
  switch (f) {
    case WeightFormat::kW4:
      return config.q4;
    case WeightFormat::kW4M:
      return config.q4m;
    case WeightFormat::kW8:
      return config.q8;
    case WeightFormat::kW4S24:
      return config.q4s24;
  }
  return config.q4;
}

std::string QGemmTester::Describe() const {
  return StrCat(WeightFormatName(format_), " m=", m_, " n=", n_, " k=", kb_ * MOERT_QK,
                " a_pad_blocks=", a_pad_blocks_, " c_pad=", c_pad_, " seed=", seed_,
                extreme_ ? " extreme" : "", extreme_weights_ ? " extreme_weights" : "");
}

void QGemmTester::Test(moert_qgemm_ukernel_fn kernel, moert_qgemm_ukernel_fn reference) const {
  std::mt19937 rng(seed_);
  std::vector<uint8_t> w = RandomWeights(format_, n_, kb_, rng);
  if (extreme_weights_) MakeWeightsExtreme(format_, n_, kb_, w);

  // Activations: random floats quantized by the scalar reference.
  const size_t a_row_blocks = kb_ + a_pad_blocks_;
  std::vector<moert_a8_block> a(m_ * a_row_blocks);
  std::normal_distribution<float> normal(0.0f, extreme_ ? 100.0f : 1.0f);
  std::vector<float> x(kb_ * MOERT_QK);
  for (size_t i = 0; i < m_; ++i) {
    for (float& v : x) v = normal(rng);
    if (extreme_) {
      // Saturate whole blocks at +-127 so sums reach their extremes.
      for (size_t j = 0; j < x.size(); ++j) x[j] = (j % 3 == 0) ? -50.0f : 50.0f;
      x[0] = 50.0f;
    }
    if (extreme_weights_) {
      // One value a block (all +127 or all -127 after quantization), alternating.
      for (size_t j = 0; j < x.size(); ++j) x[j] = (j / MOERT_QK + i) % 2 == 0 ? 50.0f : -50.0f;
    }
    moert_q8_quant_ukernel__scalar(x.size(), x.data(), a.data() + i * a_row_blocks);
  }
  const size_t a_stride = a_row_blocks * sizeof(moert_a8_block);
  const size_t c_stride = n_ + c_pad_;

  const float kSentinel = -12345.0f;
  // One row more than the output: a kernel that writes past row m - 1 (a tile's unused
  // rows) is caught here too, not only under ASan.
  std::vector<float> c((m_ + 1) * c_stride, kSentinel);
  std::vector<float> c_ref(m_ * c_stride, kSentinel);
  kernel(m_, n_, kb_, a.data(), a_stride, w.data(), c.data(), c_stride);
  reference(m_, n_, kb_, a.data(), a_stride, w.data(), c_ref.data(), c_stride);
  for (size_t j = 0; j < c_stride; ++j) {
    EXPECT_EQ(c[m_ * c_stride + j], kSentinel)
        << Describe() << ": wrote row " << m_ << " column " << j;
  }

  const size_t block_bytes = BlockBytes(format_);
  int reported = 0;
  for (size_t i = 0; i < m_; ++i) {
    for (size_t j = 0; j < c_stride; ++j) {
      const size_t at = i * c_stride + j;
      if (j >= n_) {
        EXPECT_EQ(c[at], kSentinel) << Describe() << ": wrote padding at row " << i
                                    << " column " << j;
        continue;
      }
      uint32_t bits, ref_bits;
      std::memcpy(&bits, &c[at], 4);
      std::memcpy(&ref_bits, &c_ref[at], 4);
      if (bits != ref_bits && reported++ < 5) {
        ADD_FAILURE() << Describe() << ": c[" << i << "][" << j << "] = " << c[at]
                      << ", scalar reference " << c_ref[at] << " (must be bit-identical)";
      }
      // The reference against a naive double sum over dequantized values.
      double sum = 0, mag = 0;
      const uint8_t* tile = w.data() + (j / MOERT_NR) * kb_ * block_bytes;
      for (size_t b = 0; b < kb_; ++b) {
        const moert_a8_block& ab = a[i * a_row_blocks + b];
        for (int jj = 0; jj < MOERT_QK; ++jj) {
          const double wv =
              WeightValue(format_, tile + b * block_bytes, static_cast<int>(j % MOERT_NR), jj);
          const double av = static_cast<double>(ab.d) * ab.qs[jj];
          sum += wv * av;
          mag += std::fabs(wv * av);
        }
      }
      // Both the reference and the kernel: for the scalar variant the bit-for-bit check
      // above compares it with itself, so the naive sum is what checks it.
      const double tol = 1e-5 * mag + 1e-6;
      if (std::fabs(c_ref[at] - sum) > tol && reported++ < 5) {
        ADD_FAILURE() << Describe() << ": scalar reference c[" << i << "][" << j
                      << "] = " << c_ref[at] << ", naive sum " << sum << " (tolerance " << tol
                      << ")";
      }
      if (std::fabs(c[at] - sum) > tol && reported++ < 5) {
        ADD_FAILURE() << Describe() << ": c[" << i << "][" << j << "] = " << c[at]
                      << ", naive sum " << sum << " (tolerance " << tol << ")";
      }
    }
  }
}

}  // namespace moert::kernels::testing
