// The MiniCPM-V image encoder over backend::Backend: one preprocessed slice through the
// SigLIP-style ViT (patch embedding as im2col + matmul, bucketed 70x70 position
// embedding, pre-norm blocks with LayerNorm, unmasked attention and ggml's GELU,
// post-LN) and the perceiver resampler (its queries cross-attend to the slice's patches
// with an on-the-fly 2D sincos position embedding on the keys, post-LN, projection),
// as llama.cpp's clip.cpp computes it (../shared/mmproj/NOTES.md). The output is
// n_query embeddings of the language model's width per slice.
#ifndef MOERT_VISION_ENCODER_H_
#define MOERT_VISION_ENCODER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/scratch.h"
#include "vision/mmproj.h"
#include "vision/preprocess.h"

namespace moert::vision {

class VisionEncoder {
 public:
  // The encoder of `mmproj` (borrowed: it must outlive the encoder) on `backend`.
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Create(const Mmproj& mmproj,
                                                               backend::Backend& backend);
  ~VisionEncoder();

  const MmprojHparams& hparams() const { return m_.hparams; }
  // One slice: n_query x resampler_width floats, token-major, into *out (resized).
  // With `entropy`, also each output token's resampler cross-attention entropy (nats,
  // the mean over heads; n_query values), which visual-token pruning ranks by
  // (docs/vision.md). InvalidArgument for a slice whose size is not whole patches or
  // whose pixels do not match it.
  absl::Status EncodeSlice(const Slice& slice, std::vector<float>* out,
                           std::vector<float>* entropy = nullptr);

  // The resampler's 2D sincos position embedding of a patches_h x patches_w grid (token
  // p = row * patches_w + col: [sin(col w_d), cos(col w_d) | sin(row w_d), cos(row w_d)],
  // d < width / 4, w_d = 10000^(-d / (width / 4))), [patches][width].
  static std::vector<float> SincosPositions(int patches_w, int patches_h, int width);

 private:
  struct Weights;
  VisionEncoder(const Mmproj& mmproj, backend::Backend& backend);
  absl::Status Upload();

  const Mmproj& m_;
  backend::Backend& b_;
  std::unique_ptr<Weights> w_;
  backend::ScratchBuffers scratch_;
};

}  // namespace moert::vision

#endif  // MOERT_VISION_ENCODER_H_
