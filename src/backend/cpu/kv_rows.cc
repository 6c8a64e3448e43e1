// Typed KV cache rows on the CPU (see kv_rows.h). Encoding is scalar: a token stores one
// row per layer, and core/fp16.h's integer conversions give the same bits on every
// target and under every floating-point mode. Decoding, which attention does for every
// cached row every step, goes through the KV widening kernels (kernels/kv-widen/).
#include "backend/cpu/kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace moert::backend::cpu {
namespace {

void PutHalf(uint16_t h, uint8_t* dst) { std::memcpy(dst, &h, 2); }

// ggml's quantize_row_q8_0_ref, block by block: amax through ggml's MAX macro (so a
// NaN is treated as ggml treats it), d = amax / 127 stored as half, q = roundf(x / d)
// computed as x * (1 / d) with the unrounded d. A value that does not convert (a NaN,
// or an overflow after a subnormal d) stores 0, what x86 gives ggml's cast.
void QuantizeRowQ8_0(const float* x, int64_t width, uint8_t* dst) {
  for (int64_t b = 0; b < width / kQ8_0BlockValues; ++b, x += kQ8_0BlockValues) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kQ8_0BlockValues; ++j) {
      const float a = std::fabs(x[j]);
      amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* block = dst + b * static_cast<int64_t>(kQ8_0BlockBytes);
    PutHalf(core::FloatToFp16(d), block);
    for (int64_t j = 0; j < kQ8_0BlockValues; ++j) {
      const float r = std::round(x[j] * id);
      const int8_t q = r >= -128.0f && r <= 127.0f ? static_cast<int8_t>(r) : int8_t{0};
      std::memcpy(block + 2 + j, &q, 1);
    }
  }
}

}  // namespace

void EncodeKvRow(KvType type, const float* x, int64_t width, uint8_t* dst) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(dst, x, static_cast<size_t>(width) * 4);
      return;
    case KvType::kF16:
      for (int64_t i = 0; i < width; ++i) PutHalf(core::FloatToFp16(x[i]), dst + 2 * i);
      return;
    case KvType::kQ8_0:
      QuantizeRowQ8_0(x, width, dst);
      return;
  }
}

void DecodeKvValues(const kernels::KvWidenConfig& widen, KvType type, const uint8_t* row,
                    int64_t begin, int64_t count, float* out) {
  switch (type) {
    case KvType::kF32:
      std::memcpy(out, row + begin * 4, static_cast<size_t>(count) * 4);
      return;
    case KvType::kF16:
      widen.f16(static_cast<size_t>(count), row + 2 * begin, out);
      return;
    case KvType::kQ8_0: {
      // Whole blocks through the kernel; a partial block at either end widened whole by
      // it too, and the values wanted copied out.
      const auto partial = [&](int64_t from, int64_t to) {
        const int64_t b = from / kQ8_0BlockValues;
        float block[kQ8_0BlockValues];
        widen.q8_0(1, row + b * static_cast<int64_t>(kQ8_0BlockBytes), block);
        std::copy(block + (from - b * kQ8_0BlockValues), block + (to - b * kQ8_0BlockValues),
                  out + (from - begin));
      };
      const int64_t end = begin + count;
      int64_t i = begin;
      const int64_t head_end =
          std::min(end, (begin + kQ8_0BlockValues - 1) / kQ8_0BlockValues * kQ8_0BlockValues);
      if (i < head_end) {
        partial(i, head_end);
        i = head_end;
      }
      const int64_t blocks = (end - i) / kQ8_0BlockValues;
      if (blocks > 0) {
        widen.q8_0(static_cast<size_t>(blocks),
                   row + i / kQ8_0BlockValues * static_cast<int64_t>(kQ8_0BlockBytes),
                   out + (i - begin));
        i += blocks * kQ8_0BlockValues;
      }
      if (i < end) partial(i, end);
      return;
    }
  }
}

}  // namespace moert::backend::cpu
