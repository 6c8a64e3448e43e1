// An image encoded for the language model: preprocessing (UHD slicing), the encoder on
// every slice, and visual-token pruning, giving the rows that enter the language
// model at the image's positions and the layout the prompt needs (vision/prompt.h).
#ifndef MOERT_VISION_IMAGE_EMBEDDING_H_
#define MOERT_VISION_IMAGE_EMBEDDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/prompt.h"

namespace moert::vision {

struct EmbedOptions {
  // Visual-token pruning (docs/vision.md): each slice keeps this fraction of its
  // n_query tokens, those whose resampler cross-attention has the lowest entropy, in
  // their original order. 1: off. (0, 1], else InvalidArgument.
  float keep_ratio = 1.0f;
  // ... and never fewer than this many (capped at n_query). >= 1.
  int min_keep = 1;
};

struct ImageEmbedding {
  int width = 0;  // the embeddings' width: the language model's n_embd
  ImageLayout layout;
  // Per slice, the kept query indices (ascending; every index without pruning).
  std::vector<std::vector<int>> kept;
  // Slice-major: slice 0's kept rows, then slice 1's, ...; rows() x width floats.
  std::vector<float> rows;
  double encode_ms = 0;  // preprocessing and encoding, all slices

  int n_rows() const { return width > 0 ? static_cast<int>(rows.size() / width) : 0; }
  // Where slice s's rows start (in rows) and how many it has.
  int slice_offset(int s) const;
  int slice_rows(int s) const { return static_cast<int>(kept[static_cast<size_t>(s)].size()); }
};

// Preprocesses `image` as llama.cpp does and encodes every slice with `encoder`.
// InvalidArgument for bad options or an image preprocessing refuses; a backend error
// as it comes.
absl::StatusOr<ImageEmbedding> EmbedImage(VisionEncoder& encoder, const RgbImage& image,
                                          const EmbedOptions& options = {});

// The tokens pruning keeps: the ceil(keep_ratio * n) (at least min_keep, at most n)
// indices of the lowest `entropy` values (ties: the lower index), ascending.
std::vector<int> KeepLowestEntropy(const std::vector<float>& entropy, float keep_ratio,
                                   int min_keep);

absl::Status ValidateEmbedOptions(const EmbedOptions& options);

// A prompt's positions: token ids, and for each image position (id -1, the model's
// kEmbeddingToken) which image and row of it.
struct PromptPositions {
  struct Row {
    int image = 0;
    int row = 0;
  };
  std::vector<int32_t> ids;
  std::vector<Row> rows;
};

// The pieces (vision/prompt.h) with each text piece tokenized alone (specials
// parsed, no BOS) and each slice's kept rows of images[piece.image], appended to *out.
void AppendPromptPositions(const tokenizer::Tokenizer& tokenizer,
                           const std::vector<PromptPiece>& pieces,
                           const std::vector<const ImageEmbedding*>& images,
                           PromptPositions* out);

// The rows' embeddings, in order: rows.size() x width floats.
std::vector<float> GatherRows(const std::vector<PromptPositions::Row>& rows,
                              const std::vector<const ImageEmbedding*>& images);

}  // namespace moert::vision

#endif  // MOERT_VISION_IMAGE_EMBEDDING_H_
