// Applying a delta package to a model file on disk, crash-safely: the target is
// written to a temporary file beside the output (`OUT.moert-update`, locked while it is
// written, so two updates of one file never interleave), checked against the package's
// target hash, fsynced, renamed over the output and the directory fsynced. A power cut
// at any point leaves the output as it was (the base, or nothing new) or the complete
// target, never a mix; a stale temporary file is overwritten by the next update.
#ifndef MOERT_EXPERTS_DELTA_APPLY_H_
#define MOERT_EXPERTS_DELTA_APPLY_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "experts/delta_package.h"

namespace moert::experts {

// The points between the steps of an apply, for crash tests.
enum class ApplyStep {
  kTempWritten,  // the temporary file holds the target, not yet fsynced
  kTempSynced,   // fsynced and its hash checked, not yet renamed
  kRenamed,      // renamed over the output, the directory not yet fsynced
};
const char* ApplyStepName(ApplyStep step);

struct DeltaApplyOptions {
  // Called once the target is written, fsynced and checked, just before the rename (a
  // runtime whose model reads this file stops its steps there).
  std::function<void()> before_rename = nullptr;
  // Test hook: called after each step; a non-OK status stops the apply there as a
  // failure would (the temporary file is removed), a process exit in it is a crash.
  std::function<absl::Status(ApplyStep)> after_step_for_testing = nullptr;
  // Test hook: writes past this many bytes of the temporary file fail with ENOSPC (a full
  // disk); 0: no limit.
  uint64_t disk_bytes_for_testing = 0;
};

struct DeltaApplyResult {
  std::vector<std::pair<int, int>> experts;  // (layer, expert) updated
  uint64_t bytes_written = 0;
};

// FailedPrecondition naming both hashes when `base` is not the package's base file (a
// package for another model or version), or when an expert of it is not the one the
// package was made against.
// `base_hash`: its BLAKE2b-256 when the caller has it (HashMapped), else computed here.
absl::Status CheckDeltaBase(std::span<const uint8_t> base, const DeltaManifest& manifest,
                            const FileHash* base_hash = nullptr);

// Decodes every entry against `base` (checked with CheckDeltaBase first) and checks each
// against its manifest checksum, writing nothing: DataLoss naming the entry (the layer
// and expert) for a frame that is corrupt or decodes to another checksum.
absl::Status VerifyDelta(std::span<const uint8_t> base, const DeltaPackage& package);

// Writes the target of `package` over `out_path` from the base file `base_path` (may be
// the same path: an update in place). Errors: CheckDeltaBase's and VerifyDelta's;
// ResourceExhausted naming the file for a full disk; FailedPrecondition when another
// update is writing the same output; DataLoss when the file written does not hash to the
// target. On error the output is untouched and the temporary file removed.
absl::StatusOr<DeltaApplyResult> ApplyDeltaFile(const std::string& base_path,
                                                const DeltaPackage& package,
                                                const std::string& out_path,
                                                const DeltaApplyOptions& options = {});

// The BLAKE2b-256 of a file's contents (NotFound / Internal naming the path).
absl::StatusOr<FileHash> HashFile(const std::string& path);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_DELTA_APPLY_H_
