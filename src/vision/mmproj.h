// A MiniCPM-V vision projector ("mmproj"): llama.cpp's clip GGUF (general.architecture
// `clip`, a SigLIP-style ViT and the MiniCPM-V perceiver resampler), its hyperparameters
// and weights as fp32 matrices (../shared/mmproj/NOTES.md lists every key and tensor).
// minicpmv_version 2 (MiniCPM-V 2.5: a 4096-wide resampler, 96 queries), 3 (2.6) and 4
// (o 2.6) (3584 wide, 64 queries); clip.minicpmv_query_num overrides the query count.
// A missing or ill-shaped key or tensor, another projector type or version is an error
// that names it.
#ifndef MOERT_VISION_MMPROJ_H_
#define MOERT_VISION_MMPROJ_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/matrix.h"
#include "format/gguf.h"

namespace moert::vision {

struct MmprojHparams {
  int minicpmv_version = 0;
  int n_query = 0;          // resampler queries: image positions per slice
  int image_size = 0;       // clip.vision.image_size (not used for slicing)
  int patch_size = 0;       // 14
  int n_embd = 0;           // the ViT's width (D)
  int n_ff = 0;             // the ViT's FFN width (F)
  int n_layer = 0;
  int n_head = 0;
  int projection_dim = 0;   // clip.vision.projection_dim
  int resampler_width = 0;  // R: 4096 (version 2) or 3584: the language model's n_embd
  int resampler_head_dim = 128;
  float eps = 1e-6f;
  std::array<float, 3> image_mean{};
  std::array<float, 3> image_std{};
  bool use_gelu = true;
  bool use_silu = false;
};

struct VisionLayer {
  backend::Matrix q, k, v, o;  // [D][D]
  std::vector<float> q_b, k_b, v_b, o_b;
  std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
  backend::Matrix fc1;  // v.blk.N.ffn_down: [F][D] (llama.cpp's names are inverted)
  std::vector<float> fc1_b;
  backend::Matrix fc2;  // v.blk.N.ffn_up: [D][F]
  std::vector<float> fc2_b;
};

struct Resampler {
  backend::Matrix query;  // [n_query][R]
  backend::Matrix kv;     // [R][D], no bias
  backend::Matrix q, k, v, o;  // [R][R]
  std::vector<float> q_b, k_b, v_b, o_b;
  std::vector<float> ln_q_w, ln_q_b, ln_kv_w, ln_kv_b, ln_post_w, ln_post_b;
  backend::Matrix proj;  // [R][R], no bias
};

struct Mmproj {
  MmprojHparams hparams;
  backend::Matrix patch_embd;  // [D][3 * patch * patch], a kernel's (kx, ky, c) flattened
  std::vector<float> patch_b;  // empty: no bias
  backend::Matrix position_embd;  // [>= 4900][D]: the 70x70 bucketed positions
  std::vector<VisionLayer> layers;
  std::vector<float> post_ln_w, post_ln_b;  // empty: no post-LN
  Resampler resampler;
};

// The projector in `file`; InvalidArgument / Unimplemented naming the key or tensor at
// fault.
absl::StatusOr<Mmproj> LoadMmproj(const format::GgufFile& file);

}  // namespace moert::vision

#endif  // MOERT_VISION_MMPROJ_H_
