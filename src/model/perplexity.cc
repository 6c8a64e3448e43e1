// Chunked perplexity as llama-perplexity computes it (see perplexity.h).
#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/strings.h"

namespace moert::model {
namespace {

// -log softmax(logits)[token], with the sum of exponentials in double as llama.cpp.
double NegativeLogLikelihood(const float* logits, int64_t n_vocab, int32_t token) {
  float max = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum_exp = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max);
  return -(static_cast<double>(logits[token] - max) - std::log(sum_exp));
}

}  // namespace

absl::StatusOr<PerplexityResult> ComputePerplexity(Model& model, std::span<const int32_t> tokens,
                                                   const PerplexityOptions& options) {
  const int n_ctx = options.n_ctx;
  if (n_ctx < 3) {
    return absl::InvalidArgumentError(
        StrCat("perplexity needs a context of at least 3 tokens, got ", n_ctx));
  }
  if (options.n_batch < 0) {
    return absl::InvalidArgumentError(StrCat("batch size ", options.n_batch, " is negative"));
  }
  if (tokens.size() < 2 * static_cast<size_t>(n_ctx)) {
    return absl::InvalidArgumentError(StrCat("the text has ", tokens.size(),
                                             " tokens; a context of ", n_ctx, " needs at least ",
                                             2 * static_cast<int64_t>(n_ctx)));
  }
  const int n_batch = options.n_batch == 0 || options.n_batch > n_ctx ? n_ctx : options.n_batch;
  int n_chunks = static_cast<int>(tokens.size() / static_cast<size_t>(n_ctx));
  if (options.max_chunks > 0) n_chunks = std::min(n_chunks, options.max_chunks);
  const int first = n_ctx / 2;
  const int64_t n_vocab = model.spec().n_vocab;

  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, model.NewKvCache(n_ctx));
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  std::vector<float> logits;
  double nll = 0;
  double nll2 = 0;
  int64_t count = 0;
  for (int c = 0; c < n_chunks; ++c) {
    const size_t start = static_cast<size_t>(c) * static_cast<size_t>(n_ctx);
    std::copy(tokens.begin() + start, tokens.begin() + start + n_ctx, chunk.begin());
    if (options.bos >= 0) chunk[0] = options.bos;
    cache->Truncate(0);
    for (int b = 0; b < n_ctx; b += n_batch) {
      const int m = std::min(n_batch, n_ctx - b);
      MOERT_RETURN_IF_ERROR(model.Forward(std::span<const int32_t>(chunk).subspan(b, m),
                                          cache.get(), LogitsFor::kAll, &logits));
      // Score this batch's positions in [first, n_ctx - 1), each predicting the
      // original next token (only position 0 was replaced by BOS).
      for (int i = std::max(b, first); i < std::min(b + m, n_ctx - 1); ++i) {
        const double v = NegativeLogLikelihood(logits.data() + (i - b) * n_vocab, n_vocab,
                                               tokens[start + i + 1]);
        nll += v;
        nll2 += v * v;
        ++count;
      }
    }
    if (options.progress) {
      options.progress({c + 1, n_chunks, std::exp(nll / static_cast<double>(count))});
    }
  }

  PerplexityResult result;
  result.n_chunks = n_chunks;
  result.n_scored = count;
  result.mean_nll = nll / static_cast<double>(count);
  result.ppl = std::exp(result.mean_nll);
  const double variance = nll2 / static_cast<double>(count) - result.mean_nll * result.mean_nll;
  result.ppl_error = variance > 0 && count > 1
                         ? std::sqrt(variance / static_cast<double>(count - 1)) * result.ppl
                         : 0;
  return result;
}

}  // namespace moert::model
