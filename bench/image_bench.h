// moert-bench --mmproj F --image I: the image turn of a vision model. For each keep
// ratio of visual-token pruning: the encoder's time per slice and per image, the image
// turn's prefill speed (minicpmv-cli's prompt: the image's slices and a short text),
// peak RSS, and what pruning costs: the KL divergence of the first step's next-token
// distribution from the unpruned one's, and how many of the greedy tokens agree.
#ifndef MOERT_BENCH_IMAGE_BENCH_H_
#define MOERT_BENCH_IMAGE_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace moert::bench {

struct ImageBenchOptions {
  std::string mmproj;
  std::string image;
  std::string prompt = "Describe the image.";
  std::vector<float> keep_ratios = {1.0f, 0.5f, 0.3f};
  int repetitions = 3;
  int threads = 1;
  int greedy_tokens = 16;  // the greedy continuation compared with the unpruned one
};

struct ImageBenchResult {
  float keep_ratio = 1;
  int slices = 0;
  int image_tokens = 0;   // image positions in the prompt
  int prompt_tokens = 0;  // all of them
  std::vector<double> encode_ms;   // per repetition: decoding excluded, all slices
  std::vector<double> prefill_ms;  // per repetition: the whole image turn
  double kl = 0;                   // KL(unpruned || this) of the first step, nats
  double greedy_agreement = 1;     // greedy tokens equal to the unpruned run's, position-wise
  int top1_equal = 1;              // the first step's argmax equals the unpruned one's
  uint64_t peak_rss_bytes = 0;
};

// Runs every keep ratio (1.0 first, as the reference for KL and agreement, added if
// absent). Errors name the file or what is wrong.
absl::StatusOr<std::vector<ImageBenchResult>> RunImageBench(model::Model& model,
                                                            const tokenizer::Tokenizer& tokenizer,
                                                            const ImageBenchOptions& options);

}  // namespace moert::bench

#endif  // MOERT_BENCH_IMAGE_BENCH_H_
