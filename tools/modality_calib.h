// moert-pack --modality-bias: routes calibration text and calibration images through a
// MoE model (its own routing: the plain softmax top-k) and turns how often each expert
// took text and image tokens into the modality bias (router/modality_bias.h).
#ifndef MOERT_TOOLS_MODALITY_CALIB_H_
#define MOERT_TOOLS_MODALITY_CALIB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/gguf.h"

namespace moert::tools {

struct ModalityCalibOptions {
  std::vector<int32_t> text_tokens;  // the calibration text, tokenized
  int n_ctx = 128;                   // text tokens per forward pass (a fresh context each)
  int max_chunks = 0;                // 0: all
  std::string mmproj;                // the vision projector
  std::vector<std::string> images;   // calibration images (PNG or JPEG)
  std::string image_prompt = "Describe the image.";  // the user text with each image
  int threads = 1;
  float clip = 4.0f;  // |bias| at most this
};

struct ModalityCalibResult {
  std::vector<float> bias;  // n_layer * n_expert, layer-major
  uint64_t text_token_layers = 0;
  uint64_t image_token_layers = 0;
  double image_ms = 0;  // encoding the images
};

// Errors name what is wrong: no text or no images, an mmproj that does not fit the
// model, an image that does not decode.
absl::StatusOr<ModalityCalibResult> ComputeModalityBias(const format::GgufFile& model,
                                                        const ModalityCalibOptions& options);

}  // namespace moert::tools

#endif  // MOERT_TOOLS_MODALITY_CALIB_H_
