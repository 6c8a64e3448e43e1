// KV cache element types (see kv_type.h).
#include "backend/kv_type.h"

#include "core/strings.h"

namespace moert::backend {

std::string_view KvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kQ8_0:
      return "q8_0";
  }
  return "f32";
}

absl::StatusOr<KvType> ParseKvType(std::string_view name) {
  for (KvType type : kAllKvTypes) {
    if (name == KvTypeName(type)) return type;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown KV cache type '", name, "' (f32, f16 or q8_0)"));
}

absl::StatusOr<size_t> KvRowBytes(KvType type, int64_t width) {
  if (width < 1) {
    return absl::InvalidArgumentError(
        StrCat("a ", KvTypeName(type), " KV cache row of width ", width));
  }
  const size_t values = static_cast<size_t>(width);
  switch (type) {
    case KvType::kF32:
      return values * 4;
    case KvType::kF16:
      return values * 2;
    case KvType::kQ8_0:
      if (width % kQ8_0BlockValues != 0) {
        return absl::InvalidArgumentError(StrCat("a q8_0 KV cache needs rows of a multiple of ",
                                                 kQ8_0BlockValues, " values; this one is ", width,
                                                 " wide"));
      }
      return values / kQ8_0BlockValues * kQ8_0BlockBytes;
  }
  return absl::InvalidArgumentError("an unknown KV cache type");
}

}  // namespace moert::backend
