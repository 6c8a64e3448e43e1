// Repro bundles of a session (docs/repro.md): what goes into one (the device, the model
// and its hash, the runtime's options, the context's token ids, the router logits of
// the first decoded token, the KV cache of the first layers, the expert pool, the last
// 2 s of trace events, the error) and where it is written. The container is
// telemetry/repro_bundle.h's.
#ifndef MOERT_RUNTIME_REPRO_H_
#define MOERT_RUNTIME_REPRO_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "moert/runtime.h"
#include "telemetry/repro_bundle.h"

namespace moert::runtime {

// The KV cache layers a bundle keeps (the first ones): small, so the cap holds.
inline constexpr int kReproKvLayers = 2;
// ... and at most this many positions of them.
inline constexpr int kReproKvPositions = 512;

// What a model's sessions need to write bundles (LoadedModel::repro), set at load.
struct ReproSettings {
  bool on_error = false;   // RuntimeOptions::repro_on_error
  bool on_degrade = false;
  bool on_crash = false;   // the crash handler is installed: steps publish their record
  std::string dir;         // where automatic bundles go; empty: none known
  uint64_t max_bytes = telemetry::kReproDefaultMaxBytes;
  std::string options;     // the runtime's options, key=value lines
  std::string model;       // path, hash, architecture, backend, ... key=value lines
  std::string fingerprint; // DeviceFingerprint, read at load
};

ReproSettings MakeReproSettings(const RuntimeOptions& options, const ModelInfo& info);

// "fnv1a64:<16 hex digits>": FNV-1a over the file's size and its first 4 MiB (the GGUF
// header, its metadata and tensor directory, and the first tensors). Cheap, and the same
// file on any machine gives the same hash; not a content hash of the whole file.
// "unreadable" when the file cannot be read.
std::string ModelHash(const std::string& path);

// CPU model, features and cores, memory, the kernel, and the OpenCL device and driver
// when the model runs there: key=value lines.
std::string DeviceFingerprint(const ModelInfo& info);

// What a session captures for a bundle.
struct ReproCapture {
  std::string trigger;  // "request", "error", "degrade"
  std::string error;
  std::span<const int32_t> tokens;
  const model::KvCache* cache = nullptr;  // may be null
  const std::vector<std::vector<float>>* router_logits = nullptr;  // per layer; may be null
};

// The bundle of `capture` on `model` (call under the model's forward mutex: it reads the
// KV cache and the pool).
telemetry::ReproBundle BuildReproBundle(const ReproSettings& settings, model::Model& model,
                                        const ReproCapture& capture);

// A fresh file name under `dir` for a bundle of `trigger`:
// DIR/repro-<unix ms>-<pid>-<n>-<trigger>.moert-repro.
std::string ReproPath(const std::string& dir, const std::string& trigger);

}  // namespace moert::runtime

#endif  // MOERT_RUNTIME_REPRO_H_
