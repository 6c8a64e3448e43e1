// The hot set: the experts a model used most, saved in the cache directory
// (core/cache_dir.h: CACHE_DIR/hot/MODEL.gguf.moert-hot) so the next start can load
// them before the first token needs them.
//
// File (text, one record per line, '\n' line ends):
//   moert-hot 1
//   model <file size in bytes> <layers> <experts per layer>
//   <layer> <expert> <uses>        one line per expert, most used first
// The second line identifies the model: a file whose size or shape differs makes the
// hot set stale (FailedPrecondition), and it is then ignored. Writes go to a
// temporary file renamed over the old one, so a reader never sees half a file.
#ifndef MOERT_EXPERTS_HOT_SET_H_
#define MOERT_EXPERTS_HOT_SET_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moert::experts {

struct HotExpert {
  int layer = 0;
  int expert = 0;
  uint64_t uses = 0;
  friend bool operator==(const HotExpert&, const HotExpert&) = default;
};

// Identifies the model a hot set belongs to.
struct HotSetModel {
  uint64_t file_size = 0;
  int n_layer = 0;
  int n_expert = 0;
};

// "<model_path>.moert-hot" (given a model file's name: the hot set's file name).
std::string HotSetPath(const std::string& model_path);

// Writes `experts` (in the given order) to `path`. Internal naming the path when it
// cannot be written.
absl::Status WriteHotSet(const std::string& path, const HotSetModel& model,
                         std::span<const HotExpert> experts);

// Reads a hot set. NotFound when there is none; FailedPrecondition when it belongs to
// another model; InvalidArgument naming the line for a malformed file or an expert
// outside the model.
absl::StatusOr<std::vector<HotExpert>> ReadHotSet(const std::string& path,
                                                  const HotSetModel& model);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_HOT_SET_H_
