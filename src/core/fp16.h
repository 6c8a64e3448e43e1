// IEEE half (fp16) and bfloat16 conversions to and from float, bit-exact with
// ggml's: GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16 as the F16C and NEON instructions
// compute them, and ggml_compute_{bf16_to_fp32,fp32_to_bf16}.
//
// Integer-only on purpose: _Float16 and the F16C intrinsics are not available on
// every target g++ 12 builds for, and a float-arithmetic trick would change results
// when a host runs with flush-to-zero or denormals-are-zero set.
#ifndef MOERT_CORE_FP16_H_
#define MOERT_CORE_FP16_H_

#include <bit>
#include <cstdint>

namespace moert::core {

// Exact: every half value, subnormals included, is a float. A signalling NaN comes
// back quiet with its payload kept, as vcvtph2ps and fcvt return it.
constexpr float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits = 0;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
    if (mantissa != 0) bits |= 0x00400000u;
  } else if (exponent != 0) {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: mantissa * 2^-24. Normalise so the leading one lands on
    // bit 10, the implicit bit of a float's 23-bit fraction shifted down by 13.
    const int shift = std::countl_zero(mantissa) - 21;
    mantissa = (mantissa << shift) & 0x3FFu;
    bits = sign | (static_cast<uint32_t>(127 - 14 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even, as vcvtps2ph with rounding mode 0 (what ggml's
// GGML_FP32_TO_FP16 uses on x86) and fcvt (aarch64) do: values from 65520 up
// become infinity, values at or below 2^-25 become zero, subnormals are produced.
// A NaN stays NaN, made quiet, keeping the top bits of its payload; ggml's
// portable fallback instead always returns 0x7E00 for NaN.
constexpr uint16_t FloatToFp16(float f) {
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000u);
  const uint32_t magnitude = w & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // infinity or NaN
    if (magnitude == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520: rounds up to inf
  uint32_t half = 0;
  uint32_t remainder = 0;
  uint32_t halfway = 0;
  if (magnitude >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15) and drop 13 fraction bits. A
    // carry out of the fraction correctly bumps the exponent.
    half = (magnitude >> 13) - ((127u - 15u) << 10);
    remainder = magnitude & 0x1FFFu;
    halfway = 0x1000u;
  } else {
    // Subnormal half (or zero): the value is m * 2^(e-150) with the implicit bit
    // in m; in units of 2^-24 that is m >> (126 - e).
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t m = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    half = m >> shift;
    remainder = m & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  }
  if (remainder > halfway || (remainder == halfway && (half & 1u) != 0)) ++half;
  return static_cast<uint16_t>(sign | half);
}

// bf16 is the top half of a float; ggml widens it without touching NaNs.
constexpr float Bf16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// As ggml_compute_fp32_to_bf16: round to nearest even, NaN truncated and made
// quiet. Float subnormals round like any other value (ggml flushed them to zero
// before mid-2024; current versions, the ones this matches, do not).
constexpr uint16_t FloatToBf16(float f) {
  const uint32_t w = std::bit_cast<uint32_t>(f);
  if ((w & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((w >> 16) | 0x40u);
  return static_cast<uint16_t>((w + 0x7FFFu + ((w >> 16) & 1u)) >> 16);
}

}  // namespace moert::core

#endif  // MOERT_CORE_FP16_H_
