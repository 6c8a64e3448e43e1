// zstd with the old bytes as the frame's prefix (ZSTD_CCtx_refPrefix / ZSTD_DCtx_refPrefix).
#include "experts/delta_codec.h"

#include <zstd.h>

#include <algorithm>
#include <memory>

#include "core/strings.h"

namespace moert::experts {
namespace {

// The window must reach from the end of the frame back over the whole prefix.
int WindowLog(size_t base_bytes, size_t target_bytes) {
  const uint64_t reach = uint64_t{base_bytes} + uint64_t{target_bytes} + 1;
  const ZSTD_bounds bounds = ZSTD_cParam_getBounds(ZSTD_c_windowLog);
  int log = bounds.lowerBound;
  while (log < bounds.upperBound && (uint64_t{1} << log) < reach) ++log;
  return log;
}

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

}  // namespace

absl::StatusOr<std::vector<uint8_t>> EncodePatch(std::span<const uint8_t> base,
                                                 std::span<const uint8_t> target, int level) {
  std::unique_ptr<ZSTD_CCtx, CCtxFree> ctx(ZSTD_createCCtx());
  if (ctx == nullptr) return absl::InternalError("zstd: cannot create a compression context");
  const auto check = [](size_t r) { return ZSTD_isError(r) == 0; };
  bool ok = check(ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_compressionLevel,
                                         std::clamp(level, 1, ZSTD_maxCLevel()))) &&
            check(ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_windowLog,
                                         WindowLog(base.size(), target.size()))) &&
            check(ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_enableLongDistanceMatching, 1)) &&
            check(ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_contentSizeFlag, 1)) &&
            check(ZSTD_CCtx_setParameter(ctx.get(), ZSTD_c_checksumFlag, 1));
  if (ok && !base.empty()) ok = check(ZSTD_CCtx_refPrefix(ctx.get(), base.data(), base.size()));
  if (!ok) return absl::InternalError("zstd: cannot set up the patch encoder");
  std::vector<uint8_t> out(ZSTD_compressBound(target.size()));
  const size_t n = ZSTD_compress2(ctx.get(), out.data(), out.size(), target.data(), target.size());
  if (ZSTD_isError(n) != 0) {
    return absl::InternalError(StrCat("zstd: ", ZSTD_getErrorName(n)));
  }
  out.resize(n);
  return out;
}

absl::Status DecodePatch(std::span<const uint8_t> base, std::span<const uint8_t> frame,
                         std::span<uint8_t> out) {
  const unsigned long long declared = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::DataLossError("zstd frame: not a frame, or no decoded size in it");
  }
  if (declared != out.size()) {
    return absl::DataLossError(
        StrCat("zstd frame: decodes to ", declared, " bytes, expected ", out.size()));
  }
  std::unique_ptr<ZSTD_DCtx, DCtxFree> ctx(ZSTD_createDCtx());
  if (ctx == nullptr) return absl::InternalError("zstd: cannot create a decompression context");
  if (ZSTD_isError(ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax,
                                          WindowLog(base.size(), out.size()))) != 0 ||
      (!base.empty() &&
       ZSTD_isError(ZSTD_DCtx_refPrefix(ctx.get(), base.data(), base.size())) != 0)) {
    return absl::InternalError("zstd: cannot set up the patch decoder");
  }
  // The streaming API, the one the advanced parameters and the prefix apply to.
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  const size_t r = ZSTD_decompressStream(ctx.get(), &dst, &in);
  if (ZSTD_isError(r) != 0) return absl::DataLossError(StrCat("zstd frame: ", ZSTD_getErrorName(r)));
  if (r != 0 || dst.pos != out.size() || in.pos != in.size) {
    return absl::DataLossError(StrCat("zstd frame: decoded ", dst.pos, " of ", out.size(),
                                      " bytes (frame incomplete or followed by more)"));
  }
  return absl::OkStatus();
}

}  // namespace moert::experts
