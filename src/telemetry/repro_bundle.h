// Repro bundles (issue 18, seed 4.3): what a failed, degraded or questioned request
// looked like, in one small file a user can attach to a bug report and moert-replay can
// re-run. The container is versioned: a fixed header, then one zstd frame holding named
// sections (docs/formats.md, "Repro bundle"). The writer keeps the file under a size
// cap by dropping the largest optional sections first (the KV cache, then the trace)
// and says which it dropped; the reader checks every size and count before it trusts
// it, so a truncated or hostile file is an error naming what is wrong, never a crash.
//
// This file knows nothing of models: the runtime fills the fields (runtime/repro.h).
#ifndef MOERT_TELEMETRY_REPRO_BUNDLE_H_
#define MOERT_TELEMETRY_REPRO_BUNDLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::telemetry {

inline constexpr uint32_t kReproBundleVersion = 1;
// The crash variant a signal handler writes (telemetry/crash_repro.h): its magic and
// version, shared by the writer and the reader.
inline constexpr char kReproCrashMagic[8] = {'M', 'O', 'E', 'R', 'T', 'C', 'R', 'S'};
inline constexpr uint32_t kReproCrashVersion = 1;
// The default cap on a bundle file (RuntimeOptions::repro_max_bytes).
inline constexpr uint64_t kReproDefaultMaxBytes = 5ull << 20;
// The reader refuses bundles that would inflate past this.
inline constexpr uint64_t kReproMaxUncompressedBytes = 256ull << 20;

// The router logits of one token: one row of `width` floats per MoE layer.
struct ReproRouterLogits {
  int32_t width = 0;             // the layers' expert count
  std::vector<int32_t> layers;   // which layer each row is
  std::vector<float> logits;     // layers.size() * width

  bool operator==(const ReproRouterLogits&) const = default;
};

// The KV cache of the first `layers` layers over `positions` positions, as f32.
struct ReproKv {
  int32_t layers = 0;
  int32_t positions = 0;
  int32_t key_width = 0;
  int32_t value_width = 0;
  std::vector<float> keys;    // [layer][position][key_width]
  std::vector<float> values;  // [layer][position][value_width]

  bool operator==(const ReproKv&) const = default;
};

struct ReproBundle {
  uint32_t version = kReproBundleVersion;
  std::string trigger;      // "request", "error", "degrade" (the crash file is not a bundle)
  std::string error;        // the Status or degrade reason; empty for a request
  uint64_t created_ns = 0;  // telemetry::NowNs() when captured
  // key=value lines (docs/repro.md lists the keys).
  std::string fingerprint;  // CPU, features, cores, memory, OpenCL device and driver
  std::string model;        // path, hash, architecture, backend, quantization
  std::string options;      // the runtime's options
  std::vector<int32_t> tokens;  // the session's context token ids (kEmbeddingToken: -1)
  ReproRouterLogits router_logits;  // of the first decoded token; empty when none
  ReproKv kv;                       // optional (dropped first)
  std::string pool;                 // the expert pool's state; empty without one
  std::string trace;                // Chrome trace JSON of the last 2 s; optional
  // Optional sections the writer dropped to honour the cap ("kv", "trace"), in order.
  std::vector<std::string> dropped;

  bool operator==(const ReproBundle&) const = default;
};

// The bundle as file bytes, at most `max_bytes` (0: no cap): when the whole bundle is
// larger, the KV cache is dropped, then the trace, each recorded in `dropped`.
// ResourceExhausted naming both sizes when even the required sections do not fit.
absl::StatusOr<std::string> EncodeReproBundle(const ReproBundle& bundle, uint64_t max_bytes);
// The inverse. InvalidArgument or DataLoss naming what is wrong (magic, version, sizes,
// a section and its field) for anything that is not a well-formed bundle.
absl::StatusOr<ReproBundle> DecodeReproBundle(std::string_view bytes);

// EncodeReproBundle to `path` (written beside it, then renamed into place), making the
// directory when missing. Returns what `dropped` ended as.
absl::StatusOr<std::vector<std::string>> WriteReproBundle(const std::string& path,
                                                          const ReproBundle& bundle,
                                                          uint64_t max_bytes);
// Reads and decodes `path`; errors name the path.
absl::StatusOr<ReproBundle> ReadReproBundle(const std::string& path);

// The value of `key` in key=value lines ("" when absent).
std::string ReproValue(std::string_view lines, std::string_view key);

}  // namespace moert::telemetry

#endif  // MOERT_TELEMETRY_REPRO_BUNDLE_H_
