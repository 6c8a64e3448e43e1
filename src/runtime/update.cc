// MoERuntime::ApplyUpdate's work on a loaded model: check and apply a delta package to
// its file, load the new weights and swap them in between steps (docs/updates.md).
#include <memory>
#include <mutex>
#include <string>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/delta_apply.h"
#include "experts/delta_package.h"
#include "runtime/internal.h"

namespace moert::runtime {

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
  experts::DeltaApplyOptions options;
  if (pooled) options.before_rename = [&steps] { steps.lock(); };
  auto applied = experts::ApplyDeltaFile(path, *package, path, options);
  if (!applied.ok()) return applied.status();

  auto fresh = Load(loaded.source, loaded.options, {}, metrics);
  if (!fresh.ok()) {
    return absl::Status(fresh.status().code(),
                        StrCat("the model file was updated but its new weights did not load "
                               "(the old ones keep running): ", fresh.status().message()));
  }
  std::shared_ptr<model::Model> weights = std::move((*fresh)->model);
  if (!steps.owns_lock()) steps.lock();
  {
    std::lock_guard<std::mutex> lock(loaded.weights_mutex);
    loaded.model.swap(weights);
  }
  ++loaded.updates;
  // Repro bundles name the weights they ran on: the new file's figures (its prefix hash
  // may not change: the experts lie past it), the package's whole-file hash and the
  // update count. Sessions read these under forward_mutex, held here.
  loaded.repro.model =
      StrCat((*fresh)->repro.model, "update=", loaded.updates,
             "\ntarget_hash=blake2b:", experts::ToHex(package->manifest.target_hash), "\n");
  steps.unlock();
  // `weights` (the old ones) go here unless a session still holds them.
  telemetry::Log(telemetry::LogLevel::kInfo,
                 StrCat("updated ", applied->experts.size(), " experts of ", path, " from ",
                        package_path));
  return absl::OkStatus();
}

}  // namespace moert::runtime
