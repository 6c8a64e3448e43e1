// The delta codec of delta packages: a zstd frame of the new bytes whose prefix is the
// old bytes (zstd's --patch-from: matches against the old expert cost a few bytes
// each, so an expert that changed a little codes to a little). Frames carry their
// decoded size; the decoder writes exactly that many bytes or fails.
#ifndef MOERT_EXPERTS_DELTA_CODEC_H_
#define MOERT_EXPERTS_DELTA_CODEC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::experts {

// The frame turning `base` into `target` (zstd level `level`, 1 .. 19). Internal on a
// zstd failure (out of memory).
absl::StatusOr<std::vector<uint8_t>> EncodePatch(std::span<const uint8_t> base,
                                                 std::span<const uint8_t> target, int level = 19);

// Decodes `frame` against `base` into `out`: DataLoss naming zstd's error for a frame
// that is corrupt, does not declare out.size() bytes or decodes to another size.
absl::Status DecodePatch(std::span<const uint8_t> base, std::span<const uint8_t> frame,
                         std::span<uint8_t> out);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_DELTA_CODEC_H_
