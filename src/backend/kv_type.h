// The element types of a KV cache, named as llama.cpp's --cache-type-k / --cache-type-v
// name them: fp32 rows, IEEE half rows, or ggml's Q8_0 blocks. What a cache holds is
// the model's choice; the backend writes rows of it (Backend::StoreKv) and attends
// over them (AttentionArgs::k_type / v_type). Layouts and sizes: docs/backends.md,
// "KV cache types".
#ifndef MOERT_BACKEND_KV_TYPE_H_
#define MOERT_BACKEND_KV_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace moert::backend {

enum class KvType { kF32, kF16, kQ8_0 };
inline constexpr KvType kAllKvTypes[] = {KvType::kF32, KvType::kF16, KvType::kQ8_0};

// "f32", "f16", "q8_0" (ggml's type names, as llama.cpp's flags spell them).
std::string_view KvTypeName(KvType type);
// The type a name spells, exactly; InvalidArgument naming it and the choices otherwise.
absl::StatusOr<KvType> ParseKvType(std::string_view name);

// ggml's block_q8_0: an IEEE half scale d, then 32 int8 q; each value is q * d.
inline constexpr int64_t kQ8_0BlockValues = 32;
inline constexpr size_t kQ8_0BlockBytes = 2 + kQ8_0BlockValues;

// The bytes a row of `width` values takes: 4 * width (f32), 2 * width (f16), 34 per
// 32 values (q8_0). InvalidArgument naming the width when it is not positive or, for
// q8_0, not a multiple of 32.
absl::StatusOr<size_t> KvRowBytes(KvType type, int64_t width);

}  // namespace moert::backend

#endif  // MOERT_BACKEND_KV_TYPE_H_
