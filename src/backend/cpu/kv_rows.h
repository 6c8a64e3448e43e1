// Rows of a typed KV cache on the CPU (backend/kv_type.h): fp32 rows encoded as a
// cache type stores them (StoreKv) and values decoded back to floats as the attention
// kernels read them. Bit-exact with ggml: an f16 value is core::FloatToFp16's, a q8_0
// row is quantize_row_q8_0_ref's (ggml-quants.c) and dequantize_row_q8_0's.
#ifndef MOERT_BACKEND_CPU_KV_ROWS_H_
#define MOERT_BACKEND_CPU_KV_ROWS_H_

#include <cstdint>

#include "backend/kv_type.h"
#include "kernels/config.h"

namespace moert::backend::cpu {

// One row of `width` floats as KvRowBytes(type, width) bytes at dst (no alignment
// needed). q8_0: width a multiple of 32, checked by the caller (KvRowBytes).
void EncodeKvRow(KvType type, const float* x, int64_t width, uint8_t* dst);

// Values [begin, begin + count) of a row of `type` at `row` as floats, through `widen`'s
// kernels (the same bits on every ISA; a q8_0 range's partial blocks at either end are
// widened here, the same way).
void DecodeKvValues(const kernels::KvWidenConfig& widen, KvType type, const uint8_t* row,
                    int64_t begin, int64_t count, float* out);

}  // namespace moert::backend::cpu

#endif  // MOERT_BACKEND_CPU_KV_ROWS_H_
