// MoERuntime::ApplyUpdate's work on a loaded model: check and apply a delta package to
// its file, then put the new weights in between steps (docs/updates.md): the changed
// experts alone where the model can take them in place, else the whole model loaded
// again from the new file.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/delta_apply.h"
#include "experts/delta_package.h"
#include "experts/expert_directory.h"
#include "format/gguf.h"
#include "runtime/internal.h"
#include "runtime/repro.h"

namespace moert::runtime {
namespace {

// The bytes of the expert checksums' metadata value in `file`'s header (empty: none).
std::span<const uint8_t> ChecksumBytes(const format::GgufFile& file) {
  const format::GgufKeyValue* kv = file.FindKey(experts::kChecksumKey);
  return kv != nullptr ? kv->value.array_bytes : std::span<const uint8_t>();
}

// Empty when `updated`'s header is `old`'s but for the experts' checksums (so every
// tensor lies where it did, and the data outside the changed experts is the same: the
// package copies it); else why not, as a sentence.
std::string HeaderDifference(const format::GgufFile& old, const format::GgufFile& updated) {
  if (old.data_offset() != updated.data_offset() || old.bytes().size() != updated.bytes().size()) {
    return "the file's header or size changed";
  }
  const std::span<const uint8_t> a = old.bytes().subspan(0, old.data_offset());
  const std::span<const uint8_t> b = updated.bytes().subspan(0, updated.data_offset());
  const std::span<const uint8_t> ca = ChecksumBytes(old);
  const std::span<const uint8_t> cb = ChecksumBytes(updated);
  if (ca.size() != cb.size() || (!ca.empty() && ca.data() - old.bytes().data() !=
                                                    cb.data() - updated.bytes().data())) {
    return "the experts' checksums moved in the header";
  }
  const size_t skip_from = ca.empty() ? a.size() : static_cast<size_t>(ca.data() - a.data());
  const size_t skip_to = skip_from + ca.size();
  if (!std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(skip_from), b.begin()) ||
      !std::equal(a.begin() + static_cast<std::ptrdiff_t>(skip_to), a.end(),
                  b.begin() + static_cast<std::ptrdiff_t>(skip_to))) {
    return "the header changed beyond the experts' checksums (metadata or tensor layout)";
  }
  return "";
}

void CountUpdate(telemetry::Registry& registry, const char* how, size_t experts) {
  registry
      .AddCounter("moert_expert_updates_total",
                  "Expert hot updates applied, by how the new weights came in: in_place (the "
                  "changed experts alone) or reload (the whole model loaded again).",
                  {"how"})
      .WithLabels({how})
      .Increment();
  registry
      .AddCounter("moert_updated_experts_total", "Routed experts hot updates replaced.")
      .Get()
      .Increment(experts);
}

}  // namespace

absl::Status ApplyUpdate(LoadedModel& loaded, const std::string& package_path,
                         const std::string& public_key_hex,
                         const std::shared_ptr<telemetry::Registry>& metrics) {
  if (public_key_hex.empty()) {
    return absl::FailedPreconditionError(
        "no update key: set RuntimeOptions::update_public_key (moert-delta keygen's .pub) to "
        "accept delta packages");
  }
  MOERT_ASSIGN_OR_RETURN(const experts::PublicKey key, experts::ParsePublicKey(public_key_hex));
  std::unique_lock<std::mutex> one_update(loaded.update_mutex, std::try_to_lock);
  if (!one_update.owns_lock()) {
    return absl::FailedPreconditionError(
        StrCat("another update of ", loaded.info.path, " is running; try again when it is done"));
  }
  auto file = core::MappedFile::Open(package_path);
  if (!file.ok()) return file.status();
  auto package = experts::ParseDeltaPackage((*file)->bytes(), key);
  if (!package.ok()) {
    return absl::Status(package.status().code(),
                        StrCat(package_path, ": ", package.status().message()));
  }
  if (loaded.source.length.has_value()) {
    return absl::FailedPreconditionError(
        StrCat(loaded.info.path, " was loaded from a range of a file (an fd): only a model "
               "file of its own can be updated; load it by path"));
  }
  const std::string& path = loaded.source.path;
  bool pooled = false;
  {
    std::lock_guard<std::mutex> lock(loaded.forward_mutex);
    pooled = loaded.model->memory_stats().expert_pool;
  }
  // A model with an expert pool reads its file at every miss: from the rename on, only
  // the new weights may run (steps wait from there to the swap).
  std::unique_lock<std::mutex> steps(loaded.forward_mutex, std::defer_lock);
  // How long the update holds the steps off, counted and logged when it lets them go.
  std::chrono::steady_clock::time_point held_from;
  const auto hold_steps = [&] {
    if (steps.owns_lock()) return;
    steps.lock();
    held_from = std::chrono::steady_clock::now();
  };
  const auto release_steps = [&] {
    const auto held = std::chrono::steady_clock::now() - held_from;
    steps.unlock();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(held).count();
    loaded.metrics
        ->AddCounter("moert_update_steps_held_seconds_total",
                     "Time expert hot updates held generation steps off (the swap).", {}, 1e9)
        .Get()
        .Increment(static_cast<uint64_t>(ns));
    return static_cast<double>(ns) / 1e6;
  };
  // The loaded file's header, to tell afterwards whether only experts changed (mapped:
  // it stays readable after the rename).
  auto old_file = format::GgufFile::Open(path);
  experts::DeltaApplyOptions options;
  if (pooled) options.before_rename = hold_steps;
  auto applied = experts::ApplyDeltaFile(path, *package, path, options);
  if (!applied.ok()) return applied.status();
  // Repro bundles name the weights they ran on: the new file's figures (its prefix hash
  // may not change: the experts lie past it), the package's whole-file hash and the
  // update count.
  const auto new_repro_model = [&](const std::string& file_figures) {
    return StrCat(file_figures, "update=", loaded.updates.load(), "\ntarget_hash=blake2b:",
                  experts::ToHex(package->manifest.target_hash), "\n");
  };

  std::string why_reload = old_file.ok() ? "" : std::string(old_file.status().message());
  if (why_reload.empty()) {
    auto new_file = format::GgufFile::Open(path);
    why_reload = new_file.ok() ? HeaderDifference(**old_file, **new_file)
                               : std::string(new_file.status().message());
    if (why_reload.empty()) {
      // Only experts changed: convert their new weights (resident experts: while steps
      // run), then write them in between two steps. The model stays the same object.
      const std::shared_ptr<model::Model> weights = loaded.Weights();
      const std::string figures = MakeReproSettings(loaded.options, loaded.info).model;
      auto prepared = weights->PrepareExpertUpdate(**new_file, applied->experts);
      absl::Status committed = prepared.status();
      if (prepared.ok()) {
        hold_steps();
        committed = weights->CommitExpertUpdate(**prepared);
      }
      if (committed.ok()) {
        ++loaded.updates;
        loaded.repro.model = new_repro_model(figures);
        const double held_ms = release_steps();
        CountUpdate(*loaded.metrics, "in_place", applied->experts.size());
        telemetry::Log(telemetry::LogLevel::kInfo,
                       StrCat("updated ", applied->experts.size(), " experts of ", path,
                              " in place from ", package_path, " (steps held ", held_ms,
                              " ms)"));
        return absl::OkStatus();
      }
      why_reload = std::string(committed.message());
    }
  }
  telemetry::Log(telemetry::LogLevel::kInfo,
                 StrCat("loading ", path, " again for the update: the experts cannot be "
                        "replaced in place: ", why_reload));
  auto fresh = Load(loaded.source, loaded.options, {}, metrics);
  if (!fresh.ok()) {
    return absl::Status(fresh.status().code(),
                        StrCat("the model file was updated but its new weights did not load "
                               "(the old ones keep running): ", fresh.status().message()));
  }
  std::shared_ptr<model::Model> weights = std::move((*fresh)->model);
  hold_steps();
  {
    std::lock_guard<std::mutex> lock(loaded.weights_mutex);
    loaded.model.swap(weights);
  }
  ++loaded.updates;
  // Sessions read these under forward_mutex, held here.
  loaded.repro.model = new_repro_model((*fresh)->repro.model);
  const double held_ms = release_steps();
  // `weights` (the old ones) go here unless a session still holds them.
  CountUpdate(*loaded.metrics, "reload", applied->experts.size());
  telemetry::Log(telemetry::LogLevel::kInfo,
                 StrCat("updated ", applied->experts.size(), " experts of ", path, " from ",
                        package_path, " (steps held ", held_ms, " ms)"));
  return absl::OkStatus();
}

}  // namespace moert::runtime
