// Making a delta package from two versions of a model file (moert-delta make): the
// files must have the same tensors (names, types, shapes, places in the data section);
// only routed experts and the header's metadata may differ. Each changed expert is an
// entry coded against the base's bytes of it (experts/delta_codec.h).
#ifndef MOERT_EXPERTS_DELTA_MAKE_H_
#define MOERT_EXPERTS_DELTA_MAKE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "experts/delta_package.h"
#include "format/gguf.h"

namespace moert::experts {

struct DeltaMakeStats {
  std::vector<std::pair<int, int>> changed;  // (layer, expert) of the changed experts
  uint64_t changed_expert_bytes = 0;  // the changed experts' full file bytes
  uint64_t all_expert_bytes = 0;      // every routed expert's file bytes
  uint64_t expert_frame_bytes = 0;    // their frames in the package
  uint64_t header_frame_bytes = 0;
  uint64_t package_bytes = 0;
  bool header_changed = false;
  std::vector<std::string> changed_keys;  // metadata keys whose values differ
};

// The package turning `base` into `target`, signed with `key`. InvalidArgument naming
// the tensor for tensors that differ in anything but routed experts' bytes, and for a
// target whose stored expert checksum (moert.expert_xxh64) disagrees with its bytes.
absl::StatusOr<std::vector<uint8_t>> MakeDeltaPackage(const format::GgufFile& base,
                                                      const format::GgufFile& target,
                                                      const SecretKey& key,
                                                      DeltaMakeStats* stats = nullptr);

// The (layer, part) of a stacked routed-expert tensor name (blk.N.ffn_{gate,up,down}_exps.weight);
// false for any other name. part: 0 gate, 1 up, 2 down (ExpertPartKind).
bool ParseExpertTensorName(std::string_view name, int* layer, int* part);

// A list of experts as the tools take it: "LAYER:EXPERT,LAYER:EXPERT,..." (moert-delta
// perturb --experts, moert-bench-update --experts). InvalidArgument naming the first
// item that is not two numbers around a colon, or for an empty list.
absl::StatusOr<std::vector<std::pair<int, int>>> ParseExpertList(std::string_view text);

// A stand-in for a retrained expert (tests, moert-delta perturb): the bytes of `file`
// with a `fraction` (0, 1] of the weights of each listed (layer, expert) moved by one
// quantization step, `steps` times (Q8_0, Q4_0: a quant +-steps; F16: one ulp; F32:
// steps %), chosen by `seed`.
// Scales and the file's layout stay. InvalidArgument for an expert not in the file;
// Unimplemented naming the tensor for another type.
absl::StatusOr<std::vector<uint8_t>> PerturbExperts(const format::GgufFile& file,
                                                    const std::vector<std::pair<int, int>>& experts,
                                                    double fraction, uint64_t seed,
                                                    int steps = 1);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_DELTA_MAKE_H_
