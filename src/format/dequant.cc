// Scalar dequantization of ggml's block formats, following llama.cpp's
// dequantize_row_* (ggml-quants.c) value for value. docs/formats.md has the layouts.
//
// Every product below is exact in float (an fp16 scale has 11 significant bits,
// the integer factors at most 8), so each output is one correctly rounded
// operation and the result does not depend on evaluation order or on whether the
// compiler fuses a multiply and a subtract; this is what makes the results equal
// llama.cpp's on every target. Q8_K (float32 scale) rounds once, in d * q, as
// llama.cpp does.
#include "format/dequant.h"

#include <array>
#include <bit>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/fp16.h"

namespace moert::format {
namespace {

// GGUF stores multi-byte fields little-endian and the decoders read them in place.
static_assert(std::endian::native == std::endian::little,
              "dequantization assumes a little-endian host");

constexpr size_t kQk = 32;    // values per block of the legacy formats
constexpr size_t kQkK = 256;  // values per super-block of the K formats

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return core::Fp16ToFloat(h);
}

float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Each decoder turns one block at `b` into its values at `y`. The caller has
// checked that the block and its outputs lie inside the spans.

void DecodeF32(const uint8_t* b, float* y) { *y = LoadF32(b); }
void DecodeF16(const uint8_t* b, float* y) { *y = LoadF16(b); }
void DecodeBf16(const uint8_t* b, float* y) { *y = core::Bf16ToFloat(LoadU16(b)); }

// d f16 | qs[16]
void DecodeQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + kQk / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// d f16 | m f16 | qs[16]
void DecodeQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + kQk / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// d f16 | qh u32 | qs[16]. Bit j of qh is the fifth bit of value j.
void DecodeQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (size_t j = 0; j < kQk / 2; ++j) {
    const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | hi0) - 16) * d;
    y[j + kQk / 2] = static_cast<float>(((qs[j] >> 4) | hi1) - 16) * d;
  }
}

// d f16 | m f16 | qh u32 | qs[16]
void DecodeQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (size_t j = 0; j < kQk / 2; ++j) {
    const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>((qs[j] & 0x0F) | hi0) * d + m;
    y[j + kQk / 2] = static_cast<float>((qs[j] >> 4) | hi1) * d + m;
  }
}

// d f16 | qs int8[32]
void DecodeQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  for (size_t j = 0; j < kQk; ++j) {
    y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

// d f16 | s f16 | qs int8[32]. s (d times the sum of qs) only serves dot products;
// ggml has no dequantize_row_q8_1, this is the obvious d * q.
void DecodeQ8_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  for (size_t j = 0; j < kQk; ++j) {
    y[j] = static_cast<float>(static_cast<int8_t>(b[4 + j])) * d;
  }
}

// scales[16] | qs[64] | d f16 | dmin f16. Each scales byte: low nibble scales, high
// nibble mins one group of 16 values.
void DecodeQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = LoadF16(b + 80);
  const float min = LoadF16(b + 82);
  size_t is = 0;
  for (size_t n = 0; n < kQkK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (size_t half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F);
        const float ml = min * static_cast<float>(sc >> 4);
        const uint8_t* qh = q + 16 * half;
        for (size_t l = 0; l < 16; ++l) {
          *y++ = dl * static_cast<float>((qh[l] >> shift) & 3) - ml;
        }
      }
    }
    q += 32;
  }
}

// The sixteen 6-bit scales of Q3_K, packed in 12 bytes: bytes 0..7 hold the low
// nibbles (scale s < 8 in the low nibble of byte s, scale s >= 8 in the high nibble
// of byte s - 8); bytes 8..11 hold the top two bits, scale s in bits 2*(s/4) of
// byte 8 + s%4. Returned with the -32 offset applied. Same result as ggml's
// kmask1/kmask2 word shuffle, written per index.
int Q3KScale(const uint8_t* packed, size_t s) {
  const int low = s < 8 ? (packed[s] & 0x0F) : (packed[s - 8] >> 4);
  const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// hmask[32] | qs[64] | scales[12] | d f16
void DecodeQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* scales = b + 96;
  const float d_all = LoadF16(b + 108);
  size_t is = 0;
  uint8_t m = 1;
  for (size_t n = 0; n < kQkK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (size_t half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(Q3KScale(scales, is++));
        const uint8_t* ql = q + 16 * half;
        const uint8_t* hm = hmask + 16 * half;
        for (size_t l = 0; l < 16; ++l) {
          // A clear hmask bit means the value is 4 lower: codes 0..7 map to -4..3.
          const int v = ((ql[l] >> shift) & 3) - ((hm[l] & m) != 0 ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// ggml's get_scale_min_k4: the eight 6-bit (scale, min) pairs of Q4_K and Q5_K in
// 12 bytes. Pairs 0..3 are the low 6 bits of bytes j and j+4; pairs 4..7 take a
// nibble each from byte j+4 and their top two bits from the spare top bits of
// bytes j-4 (scale) and j (min).
void ScaleMinK4(size_t j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Sub-block j's effective scale and min in Q4_K/Q5_K: d * scale_j and dmin * min_j.
struct ScaleMin {
  float scale;
  float min;
};

ScaleMin SubBlockScaleMin(size_t j, const uint8_t* scales, float d, float dmin) {
  int sc = 0;
  int m = 0;
  ScaleMinK4(j, scales, &sc, &m);
  return {d * static_cast<float>(sc), dmin * static_cast<float>(m)};
}

// d f16 | dmin f16 | scales[12] | qs[128]
void DecodeQ4_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float min = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (size_t is = 0; is < 8; is += 2) {
    const ScaleMin lo = SubBlockScaleMin(is, scales, d, min);
    const ScaleMin hi = SubBlockScaleMin(is + 1, scales, d, min);
    for (size_t l = 0; l < 32; ++l) *y++ = lo.scale * static_cast<float>(q[l] & 0x0F) - lo.min;
    for (size_t l = 0; l < 32; ++l) *y++ = hi.scale * static_cast<float>(q[l] >> 4) - hi.min;
    q += 32;
  }
}

// d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
void DecodeQ5_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float min = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (size_t is = 0; is < 8; is += 2) {
    const ScaleMin lo = SubBlockScaleMin(is, scales, d, min);
    const ScaleMin hi = SubBlockScaleMin(is + 1, scales, d, min);
    // The 64 values of pair `is` take their fifth bit from bits is and is+1 of qh.
    const size_t bit = is;
    for (size_t l = 0; l < 32; ++l) {
      const int v = (ql[l] & 0x0F) | (((qh[l] >> bit) & 1) << 4);
      *y++ = lo.scale * static_cast<float>(v) - lo.min;
    }
    for (size_t l = 0; l < 32; ++l) {
      const int v = (ql[l] >> 4) | (((qh[l] >> (bit + 1)) & 1) << 4);
      *y++ = hi.scale * static_cast<float>(v) - hi.min;
    }
    ql += 32;
  }
}

// ql[128] | qh[64] | scales int8[16] | d f16
void DecodeQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* sc = b + 192;
  const float d = LoadF16(b + 208);
  for (size_t n = 0; n < kQkK; n += 128) {
    for (size_t l = 0; l < 32; ++l) {
      const size_t is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      auto scale = [&](size_t i) { return static_cast<float>(static_cast<int8_t>(sc[i])); };
      y[l] = d * scale(is) * static_cast<float>(q1);
      y[l + 32] = d * scale(is + 2) * static_cast<float>(q2);
      y[l + 64] = d * scale(is + 4) * static_cast<float>(q3);
      y[l + 96] = d * scale(is + 6) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// d f32 | qs int8[256] | bsums int16[16]. bsums (sums of 16 qs) only serve dot
// products.
void DecodeQ8_K(const uint8_t* b, float* y) {
  const float d = LoadF32(b);
  for (size_t j = 0; j < kQkK; ++j) {
    y[j] = d * static_cast<float>(static_cast<int8_t>(b[4 + j]));
  }
}

// One decoder per type: the block shape it was written for and a row loop with the
// block decoder inlined (an indirect call per value would cost more than converting
// an f16).
struct Decoder {
  GgmlType type;
  size_t block_elements;
  size_t block_bytes;
  void (*decode_blocks)(const uint8_t* src, size_t blocks, float* dst);
};

template <size_t kElements, size_t kBytes, void (*kDecodeBlock)(const uint8_t*, float*)>
constexpr Decoder MakeDecoder(GgmlType type) {
  return Decoder{type, kElements, kBytes, [](const uint8_t* src, size_t blocks, float* dst) {
                   for (size_t i = 0; i < blocks; ++i) {
                     kDecodeBlock(src + i * kBytes, dst + i * kElements);
                   }
                 }};
}

constexpr std::array kDecoders = {
    MakeDecoder<1, 4, DecodeF32>(GgmlType::kF32),
    MakeDecoder<1, 2, DecodeF16>(GgmlType::kF16),
    MakeDecoder<1, 2, DecodeBf16>(GgmlType::kBF16),
    MakeDecoder<kQk, 18, DecodeQ4_0>(GgmlType::kQ4_0),
    MakeDecoder<kQk, 20, DecodeQ4_1>(GgmlType::kQ4_1),
    MakeDecoder<kQk, 22, DecodeQ5_0>(GgmlType::kQ5_0),
    MakeDecoder<kQk, 24, DecodeQ5_1>(GgmlType::kQ5_1),
    MakeDecoder<kQk, 34, DecodeQ8_0>(GgmlType::kQ8_0),
    MakeDecoder<kQk, 36, DecodeQ8_1>(GgmlType::kQ8_1),
    MakeDecoder<kQkK, 84, DecodeQ2_K>(GgmlType::kQ2_K),
    MakeDecoder<kQkK, 110, DecodeQ3_K>(GgmlType::kQ3_K),
    MakeDecoder<kQkK, 144, DecodeQ4_K>(GgmlType::kQ4_K),
    MakeDecoder<kQkK, 176, DecodeQ5_K>(GgmlType::kQ5_K),
    MakeDecoder<kQkK, 210, DecodeQ6_K>(GgmlType::kQ6_K),
    MakeDecoder<kQkK, 292, DecodeQ8_K>(GgmlType::kQ8_K),
};

const Decoder* FindDecoder(GgmlType type) {
  for (const Decoder& d : kDecoders) {
    if (d.type == type) return &d;
  }
  return nullptr;
}

// The name for messages; a value outside the enum (a cast file id) has none.
std::string TypeLabel(GgmlType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  // Debian's Abseil has its own string_view, which StrCat takes and std's is not.
  if (auto traits = LookupGgmlType(id)) return std::string(traits->name);
  return absl::StrCat("type id ", id);
}

}  // namespace

bool CanDequantize(GgmlType type) { return FindDecoder(type) != nullptr; }

KSubBlockScaleMin QKSubBlockScaleMin(const uint8_t* block, size_t j) {
  const ScaleMin sm = SubBlockScaleMin(j, block + 4, LoadF16(block), LoadF16(block + 2));
  return {sm.scale, sm.min};
}

absl::Status Dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst) {
  const Decoder* decoder = FindDecoder(type);
  if (decoder == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("Dequantize: no dequantizer for ", TypeLabel(type)));
  }
  const GgmlTypeTraits& traits = TraitsOf(type);
  const std::string name = TypeLabel(type);
  // The decoders hard-code their block geometry; a disagreement with the type
  // table would make the bounds checks below meaningless.
  if (traits.block_elements != decoder->block_elements ||
      traits.block_bytes != decoder->block_bytes) {
    return absl::InternalError(absl::StrCat("Dequantize ", name,
                                            ": decoder block shape disagrees with the "
                                            "ggml type table"));
  }
  const std::optional<uint64_t> need = GgmlRowBytes(type, dst.size());
  if (!need.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Dequantize ", name, ": ", dst.size(), " values is not a whole number of ",
        traits.block_elements, "-value blocks"));
  }
  if (src.size() != *need) {
    return absl::InvalidArgumentError(absl::StrCat("Dequantize ", name, ": ",
                                                   dst.size(), " values take ", *need,
                                                   " bytes, source has ", src.size()));
  }
  const size_t blocks = dst.size() / decoder->block_elements;
  if (blocks != 0) decoder->decode_blocks(src.data(), blocks, dst.data());
  return absl::OkStatus();
}

}  // namespace moert::format
