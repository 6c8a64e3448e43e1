// Perplexity of a model over a token sequence, computed the way llama.cpp's
// llama-perplexity does: the text is cut into chunks of n_ctx tokens, each chunk
// starts over with an empty KV cache and BOS in place of its first token, and the
// second half of each chunk is scored (positions n_ctx/2 .. n_ctx-2 predicting the
// next token). PPL = exp(mean negative log-likelihood).
#ifndef MOERT_MODEL_PERPLEXITY_H_
#define MOERT_MODEL_PERPLEXITY_H_

#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace moert::model {

struct PerplexityProgress {
  int chunk = 0;     // chunks done so far (1-based after the first)
  int n_chunks = 0;  // chunks in all
  double ppl = 0;    // perplexity over the chunks done so far
};

struct PerplexityOptions {
  int n_ctx = 0;       // tokens per chunk, >= 3
  int n_batch = 0;     // tokens per Forward call; 0 or more than n_ctx: n_ctx
  int32_t bos = -1;    // written over the first token of every chunk; -1: keep it
  int max_chunks = 0;  // score at most this many chunks (0: every whole chunk)
  // Called after every chunk (may be empty).
  std::function<void(const PerplexityProgress&)> progress;
};

struct PerplexityResult {
  double ppl = 0;
  // llama-perplexity's +/-: ppl times the standard error of the mean NLL.
  double ppl_error = 0;
  double mean_nll = 0;
  int n_chunks = 0;
  int64_t n_scored = 0;  // tokens scored
};

// InvalidArgument for n_ctx < 3, a negative n_batch, or fewer than 2 * n_ctx tokens
// (naming both numbers); the model's own errors (a token id outside its vocabulary,
// a context it cannot hold) as Forward reports them.
absl::StatusOr<PerplexityResult> ComputePerplexity(Model& model, std::span<const int32_t> tokens,
                                                   const PerplexityOptions& options);

}  // namespace moert::model

#endif  // MOERT_MODEL_PERPLEXITY_H_
