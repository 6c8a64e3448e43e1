// Where every routed expert lives in a GGUF file and what it becomes in memory.
//
// A stacked expert tensor blk.N.ffn_{gate,up,down}_exps.weight holds its experts
// expert-major (expert index outermost), so one expert's gate (or up, or down) is one
// contiguous byte range. At runtime an expert is one expert-pool block holding its
// three matrices in a kernel layout (backend::NaturalFormat of the file type, or the
// file's own layout for moert's packed types), each part starting 64-byte aligned.
//
// Checksums: XXH64 of the file bytes (experts/checksum.h). When the file carries the
// metadata key kChecksumKey (an array of uint64, one per (layer, expert), layer-major,
// n_layer * n_expert entries; 0 for layers without routed experts) they are known from
// the start; otherwise the cache computes each one on first load and verifies every
// later load against it.
#ifndef MOERT_EXPERTS_EXPERT_DIRECTORY_H_
#define MOERT_EXPERTS_EXPERT_DIRECTORY_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/packing.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::experts {

inline constexpr char kChecksumKey[] = "moert.expert_xxh64";

// Parts of an expert, in the order they lie in its block.
enum class ExpertPartKind { kGate = 0, kUp = 1, kDown = 2 };
inline constexpr int kExpertParts = 3;

struct ExpertPart {
  std::string tensor;           // the stacked tensor's name, for error messages
  uint64_t file_offset = 0;     // absolute offset of this expert's bytes in the file
  uint64_t file_bytes = 0;
  format::GgmlType file_type = format::GgmlType::kF32;
  backend::WeightFormat format = backend::WeightFormat::kW8;  // runtime layout
  bool packed_in_file = false;  // the file holds the runtime layout: a plain copy
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t block_offset = 0;    // where the packed matrix starts in the expert's block
  uint64_t runtime_bytes = 0;   // backend::PackedBytes(format, rows, cols)
};

struct ExpertInfo {
  int layer = 0;
  int expert = 0;
  std::array<ExpertPart, kExpertParts> parts;
  uint64_t runtime_bytes = 0;  // block payload: the end of the last part
  uint64_t file_bytes = 0;     // sum of the parts' file bytes
};

class ExpertDirectory {
 public:
  // Every layer < n_layer whose three stacked expert tensors exist (a layer with none
  // of them is a dense layer). InvalidArgument naming the tensor for a layer with only
  // some of them, a tensor whose shape is not [n_expert][rows][cols], whose bytes lie
  // outside the file, or whose cols is not a multiple of 32; Unimplemented for a type
  // that cannot be packed (F32/F16/BF16 stay fp32 in memory and are not pooled) or a
  // packed type whose rows are not a multiple of 8. InvalidArgument for a kChecksumKey
  // entry of the wrong type or length. No expert at all is InvalidArgument.
  static absl::StatusOr<ExpertDirectory> Build(const format::GgufFile& file, int n_layer,
                                               int n_expert, int64_t n_embd, int64_t n_ff);

  const std::string& path() const { return path_; }  // the file (GgufFile::name())
  uint64_t file_size() const { return file_size_; }  // the GGUF's bytes
  // Where the GGUF starts in path() (a model inside an APK); the parts' file offsets are
  // relative to it.
  uint64_t file_offset() const { return file_offset_; }
  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  bool has_layer(int layer) const;
  // Precondition: has_layer(layer) and 0 <= expert < n_expert().
  const ExpertInfo& info(int layer, int expert) const;
  // The checksum from the file's metadata, when it has one.
  std::optional<uint64_t> stored_checksum(int layer, int expert) const;

  // Empty when `other` (the file after a hot update that changed only experts' bytes)
  // puts every expert at the same offsets in the same layout as this directory, their
  // checksums aside; else what differs first, as a sentence.
  std::string LayoutDifference(const ExpertDirectory& other) const;
  // Takes `other`'s stored checksums (LayoutDifference(other) is empty).
  void AdoptChecksums(const ExpertDirectory& other) { stored_checksums_ = other.stored_checksums_; }

  int pooled_layers() const { return pooled_layers_; }
  uint64_t expert_count() const { return uint64_t(pooled_layers_) * uint64_t(n_expert_); }
  uint64_t max_runtime_bytes() const { return max_runtime_bytes_; }
  uint64_t max_file_bytes() const { return max_file_bytes_; }
  uint64_t max_part_file_bytes() const { return max_part_file_bytes_; }
  uint64_t total_runtime_bytes() const { return total_runtime_bytes_; }
  uint64_t total_file_bytes() const { return total_file_bytes_; }

 private:
  ExpertDirectory() = default;

  std::string path_;
  uint64_t file_size_ = 0;
  uint64_t file_offset_ = 0;
  int n_layer_ = 0;
  int n_expert_ = 0;
  int pooled_layers_ = 0;
  std::vector<bool> has_layer_;
  std::vector<ExpertInfo> infos_;  // n_layer * n_expert; empty infos for dense layers
  std::vector<uint64_t> stored_checksums_;  // empty: none in the file
  uint64_t max_runtime_bytes_ = 0;
  uint64_t max_file_bytes_ = 0;
  uint64_t max_part_file_bytes_ = 0;
  uint64_t total_runtime_bytes_ = 0;
  uint64_t total_file_bytes_ = 0;
};

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_EXPERT_DIRECTORY_H_
