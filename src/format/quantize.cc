// Reference quantizers, following llama.cpp's quantize_row_*_ref (ggml-quants.c)
// operation for operation: the same float expressions evaluated in the same order,
// its nearest_int rounding trick, its truncating casts and its fp16 rounding
// (core/fp16.h). The library is compiled with -ffp-contract=off (src/CMakeLists.txt),
// so no multiply-add here is fused, on x86-64 and AArch64 alike; a llama.cpp built with -ffp-contract=fast and
// FMA may differ in rare last-bit cases of the K formats, whose searches compare
// sums of products (tests/format/quantize_test.cc checks against real files).
#include "format/quantize.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>

#include "core/fp16.h"
#include "core/strings.h"

namespace moert::format {
namespace {

static_assert(std::endian::native == std::endian::little,
              "quantization writes little-endian blocks in place");

constexpr size_t kQk = 32;    // values per block of the legacy formats
constexpr size_t kQkK = 256;  // values per super-block of the K formats
constexpr float kGroupMaxEps = 1e-15f;

void StoreF16(uint8_t* p, float v) {
  const uint16_t h = core::FloatToFp16(v);
  std::memcpy(p, &h, sizeof(h));
}

float RoundTripF16(float v) { return core::Fp16ToFloat(core::FloatToFp16(v)); }

// C's float-to-integer conversion (truncation toward zero) for the values the
// quantizers produce; NaN and values beyond any block's range, which only an
// overflowing scale can produce, give 0 instead of undefined behaviour.
int TruncToInt(float v) {
  if (!(v > -1e9f && v < 1e9f)) return 0;
  return static_cast<int>(v);
}

// ggml's nearest_int: adding 1.5 * 2^23 leaves the integer in the low mantissa
// bits, rounded to nearest with ties to even. Valid for |v| <= 4194303; beyond
// that it returns the same (meaningless) bits as ggml, and no undefined behaviour.
int NearestInt(float v) {
  const float shifted = v + 12582912.0f;
  const int32_t bits = std::bit_cast<int32_t>(shifted);
  return (bits & 0x007FFFFF) - 0x00400000;
}

// (int)roundf(v), halves away from zero: v - trunc(v) is exact. NaN and values beyond
// any block's range, which only an overflowing 1 / d gives (a block whose values are
// so small that d is subnormal), give 0 as in TruncToInt (the model fuzzer found
// Q8_0's requantization of such a block converting infinity to int). Branch-free
// otherwise: on real data the rounding comparisons are coin flips.
int RoundHalfAway(float v) {
  if (!(v > -1e9f && v < 1e9f)) return 0;
  const int t = static_cast<int>(v);
  const float frac = v - static_cast<float>(t);
  return t + static_cast<int>(frac >= 0.5f) - static_cast<int>(frac <= -0.5f);
}

// Largest magnitude of x[0..n), n a multiple of 4. Four running maxima break the
// dependency chain; max is order-independent, so the result is ggml's.
float AbsMax(const float* x, size_t n) {
  float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (size_t j = 0; j < n; j += 4) {
    for (size_t k = 0; k < 4; ++k) m[k] = std::max(m[k], std::fabs(x[j + k]));
  }
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// Value with the largest magnitude, sign kept: the first one on ties, as ggml's
// loop finds it, and +0 for a block of zeros (ggml's initial value, whatever the
// zeros' signs: its scale becomes 0 / -8 = -0).
float SignedAbsMax(const float* x, size_t n) {
  const float amax = AbsMax(x, n);
  if (amax == 0.0f) return 0.0f;
  for (size_t j = 0; j < n; ++j) {
    if (std::fabs(x[j]) == amax) return x[j];
  }
  return 0.0f;
}

// Each encoder writes one block of values `x` at `y`. (The plain types are
// converted a whole span at a time in Quantize.)

// d f16 | qs int8[32]
void EncodeQ8_0(const float* x, uint8_t* y) {
  const float amax = AbsMax(x, kQk);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(y, d);
  for (size_t j = 0; j < kQk; ++j) {
    // |x * id| <= 127 (plus rounding), so the conversions are exact.
    y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(RoundHalfAway(x[j] * id)));
  }
}

// d f16 | qs[16]: value j in the low nibble of qs[j], value j + 16 in the high one.
void EncodeQ4_0(const float* x, uint8_t* y) {
  const float d = SignedAbsMax(x, kQk) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(y, d);
  for (size_t j = 0; j < kQk / 2; ++j) {
    const int q0 = std::min(15, TruncToInt(x[j] * id + 8.5f));
    const int q1 = std::min(15, TruncToInt(x[j + kQk / 2] * id + 8.5f));
    y[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// d f16 | m f16 | qs[16]
void EncodeQ4_1(const float* x, uint8_t* y) {
  float min = x[0];
  float max = x[0];
  for (size_t j = 1; j < kQk; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(y, d);
  StoreF16(y + 2, min);
  for (size_t j = 0; j < kQk / 2; ++j) {
    const int q0 = std::min(15, TruncToInt((x[j] - min) * id + 0.5f));
    const int q1 = std::min(15, TruncToInt((x[j + kQk / 2] - min) * id + 0.5f));
    y[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// The low nibbles of 32 five-bit values into qs[16] and their fifth bits into qh.
uint32_t PackFiveBits(const int* q, uint8_t* qs) {
  uint32_t qh = 0;
  for (size_t j = 0; j < kQk / 2; ++j) {
    const int q0 = q[j];
    const int q1 = q[j + kQk / 2];
    qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQk / 2);
  }
  return qh;
}

// d f16 | qh u32 | qs[16]
void EncodeQ5_0(const float* x, uint8_t* y) {
  const float d = SignedAbsMax(x, kQk) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(y, d);
  int q[kQk];
  for (size_t j = 0; j < kQk; ++j) {
    // ggml truncates to int8_t, then to uint8_t: only the low five bits are kept.
    q[j] = std::min(31, TruncToInt(x[j] * id + 16.5f));
  }
  const uint32_t qh = PackFiveBits(q, y + 6);
  std::memcpy(y + 2, &qh, sizeof(qh));
}

// d f16 | m f16 | qh u32 | qs[16]
void EncodeQ5_1(const float* x, uint8_t* y) {
  float min = x[0];
  float max = x[0];
  for (size_t j = 1; j < kQk; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(y, d);
  StoreF16(y + 2, min);
  int q[kQk];
  for (size_t j = 0; j < kQk; ++j) {
    // No clamp to 31 in ggml: (uint8_t) truncation, then the 5 bits are packed.
    q[j] = TruncToInt((x[j] - min) * id + 0.5f) & 0xFF;
  }
  const uint32_t qh = PackFiveBits(q, y + 8);
  std::memcpy(y + 4, &qh, sizeof(qh));
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights: a symmetric
// scale for values in [-nmax, nmax - 1], refined by trying 18 nearby scales and
// keeping the one with the smallest x^2-weighted squared error. Writes the codes
// (offset by nmax) to L and returns the scale.
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  auto quantize_with = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = 0.0f;
    *suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
      const float w = x[i] * x[i];
      const float fl = static_cast<float>(l);
      *sumlx += w * x[i] * fl;
      *suml2 += w * fl * fl;
    }
  };
  auto store_codes = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
      L[i] = static_cast<int8_t>(nmax + l);
    }
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  quantize_with(iscale, &sumlx, &suml2);
  store_codes(iscale);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    quantize_with(iscale, &sumlx, &suml2);
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      store_codes(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_qkx2_quants (mean squared error, not MAD): an asymmetric scale and
// min for codes in [0, nmax], searched over nstep + 1 candidate scales with a
// weighted least-squares fit of each. Returns the scale; *the_min is -min >= 0.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = fnmax / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + fnmax) / (max - min);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::copy(Laux, Laux + n, L);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// d f16 | dmin f16 | scales[12] | qs[128]. Eight sub-blocks of 32 with a 6-bit
// scale and min each, packed as format/dequant.cc's ScaleMinK4 reads them.
void EncodeQ4_K(const float* x, uint8_t* y) {
  uint8_t L[kQkK];
  uint8_t Laux[32];
  float weights[32];
  float mins[kQkK / 32];
  float scales[kQkK / 32];
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (size_t j = 0; j < kQkK / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (size_t l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (size_t l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = MakeQkx2Quants(32, 15, xs, weights, L + 32 * j, &mins[j], Laux, -1.0f, 0.1f, 20);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  uint8_t* packed = y + 4;
  std::memset(packed, 0, 12);
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  for (size_t j = 0; j < kQkK / 32; ++j) {
    const uint8_t ls =
        std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  StoreF16(y, max_scale / 63.0f);
  StoreF16(y + 2, max_min / 63.0f);
  const float d_all = RoundTripF16(max_scale / 63.0f);
  const float dmin_all = RoundTripF16(max_min / 63.0f);
  for (size_t j = 0; j < kQkK / 32; ++j) {
    int sc = 0;
    int m = 0;
    if (j < 4) {
      sc = packed[j] & 63;
      m = packed[j + 4] & 63;
    } else {
      sc = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
      m = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
    const float d = d_all * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (size_t i = 0; i < 32; ++i) {
      const int l = NearestInt((x[32 * j + i] + dm) / d);
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(15, l)));
    }
  }
  uint8_t* q = y + 16;
  for (size_t j = 0; j < kQkK; j += 64) {
    for (size_t l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

// ql[128] | qh[64] | scales int8[16] | d f16. Sixteen sub-blocks of 16 with an
// 8-bit scale each; codes are 6 bits, offset by 32.
void EncodeQ6_K(const float* x, uint8_t* y) {
  int8_t L[kQkK];
  float scales[kQkK / 16];
  float max_scale = 0.0f;
  float max_abs_scale = 0.0f;
  for (size_t ib = 0; ib < kQkK / 16; ++ib) {
    const float scale = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    const float abs_scale = std::fabs(scale);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scale;
    }
  }
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  int8_t* block_scales = reinterpret_cast<int8_t*>(y + 192);
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, 210);
    return;
  }
  const float iscale = -128.0f / max_scale;
  StoreF16(y + 208, 1.0f / iscale);
  const float d_all = RoundTripF16(1.0f / iscale);
  for (size_t ib = 0; ib < kQkK / 16; ++ib) {
    block_scales[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
  }
  for (size_t j = 0; j < kQkK / 16; ++j) {
    const float d = d_all * static_cast<float>(block_scales[j]);
    if (d == 0.0f) continue;
    for (size_t i = 0; i < 16; ++i) {
      const int l = std::max(-32, std::min(31, NearestInt(x[16 * j + i] / d)));
      L[16 * j + i] = static_cast<int8_t>(l + 32);
    }
  }
  for (size_t j = 0; j < kQkK; j += 128) {
    for (size_t l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0x0F;
      const int q2 = L[j + l + 32] & 0x0F;
      const int q3 = L[j + l + 64] & 0x0F;
      const int q4 = L[j + l + 96] & 0x0F;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                   ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

using Encoder = void (*)(const float*, uint8_t*);

std::optional<Encoder> EncoderOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return EncodeQ8_0;
    case GgmlType::kQ4_0:
      return EncodeQ4_0;
    case GgmlType::kQ4_1:
      return EncodeQ4_1;
    case GgmlType::kQ5_0:
      return EncodeQ5_0;
    case GgmlType::kQ5_1:
      return EncodeQ5_1;
    case GgmlType::kQ4_K:
      return EncodeQ4_K;
    case GgmlType::kQ6_K:
      return EncodeQ6_K;
    default:
      return std::nullopt;
  }
}

bool IsPlain(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
}

bool AllFinite(std::span<const float> x, size_t* first_bad) {
  uint32_t bad = 0;
  for (float v : x) bad |= (std::bit_cast<uint32_t>(v) & 0x7F800000u) == 0x7F800000u;
  if (bad == 0) return true;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      *first_bad = i;
      break;
    }
  }
  return false;
}

}  // namespace

bool CanQuantize(GgmlType type) { return IsPlain(type) || EncoderOf(type).has_value(); }

absl::Status Quantize(GgmlType type, std::span<const float> src, std::span<uint8_t> dst) {
  const GgmlTypeTraits& traits = TraitsOf(type);
  const std::optional<Encoder> encode = EncoderOf(type);
  if (!encode && !IsPlain(type)) {
    return absl::UnimplementedError(StrCat("Quantize: no quantizer for type ", traits.name));
  }
  const std::optional<uint64_t> bytes = GgmlRowBytes(type, src.size());
  if (!bytes) {
    return absl::InvalidArgumentError(StrCat("Quantize(", traits.name, "): ", src.size(),
                                             " values are not a whole number of blocks of ",
                                             traits.block_elements));
  }
  if (*bytes != dst.size()) {
    return absl::InvalidArgumentError(StrCat("Quantize(", traits.name, "): ", src.size(),
                                             " values take ", *bytes, " bytes, got ", dst.size()));
  }
  if (size_t bad = 0; !AllFinite(src, &bad)) {
    return absl::InvalidArgumentError(
        StrCat("Quantize(", traits.name, "): value ", bad, " is not finite (", src[bad], ")"));
  }
  switch (type) {
    case GgmlType::kF32:
      if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size_bytes());
      return absl::OkStatus();
    case GgmlType::kF16:
      for (size_t i = 0; i < src.size(); ++i) StoreF16(&dst[2 * i], src[i]);
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (size_t i = 0; i < src.size(); ++i) {
        const uint16_t h = core::FloatToBf16(src[i]);
        std::memcpy(&dst[2 * i], &h, sizeof(h));
      }
      return absl::OkStatus();
    default:
      break;
  }
  const size_t n_blocks = src.size() / traits.block_elements;
  for (size_t b = 0; b < n_blocks; ++b) {
    (*encode)(src.data() + b * traits.block_elements, dst.data() + b * traits.block_bytes);
  }
  return absl::OkStatus();
}

}  // namespace moert::format
