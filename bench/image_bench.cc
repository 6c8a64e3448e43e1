// The image turn benchmark (see image_bench.h).
#include "image_bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/status.h"
#include "core/strings.h"
#include "runtime/vision.h"
#include "vision/image.h"
#include "vision/image_embedding.h"
#include "vision/prompt.h"

namespace moert::bench {
namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

uint64_t PeakRss() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

// log-softmax of logits, in double.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - max);
  const double log_z = std::log(z) + max;
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_z;
  return out;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

absl::StatusOr<std::vector<ImageBenchResult>> RunImageBench(model::Model& model,
                                                            const tokenizer::Tokenizer& tokenizer,
                                                            const ImageBenchOptions& options) {
  MOERT_ASSIGN_OR_RETURN(
      std::unique_ptr<runtime::VisionProjector> vision,
      runtime::VisionProjector::Load(options.mmproj, model.spec().n_embd, options.threads));
  MOERT_ASSIGN_OR_RETURN(vision::RgbImage pixels, vision::DecodeImageFile(options.image));
  std::vector<float> ratios = options.keep_ratios;
  ratios.erase(std::remove(ratios.begin(), ratios.end(), 1.0f), ratios.end());
  ratios.insert(ratios.begin(), 1.0f);

  std::vector<ImageBenchResult> results;
  std::vector<double> reference_logp;
  std::vector<int32_t> reference_greedy;
  int32_t reference_top1 = -1;
  for (float keep : ratios) {
    ImageBenchResult r;
    r.keep_ratio = keep;
    vision::EmbedOptions embed;
    embed.keep_ratio = keep;
    std::vector<float> first_logits;
    for (int rep = 0; rep < std::max(1, options.repetitions); ++rep) {
      MOERT_ASSIGN_OR_RETURN(vision::ImageEmbedding embedding, vision->Embed(pixels, embed));
      r.encode_ms.push_back(embedding.encode_ms);
      r.slices = embedding.layout.n_slices;
      MOERT_ASSIGN_OR_RETURN(std::vector<vision::PromptPiece> pieces,
                             vision::MinicpmvUserTurn(vision->hparams().minicpmv_version,
                                                      {embedding.layout}, options.prompt));
      vision::PromptPositions positions;
      vision::AppendPromptPositions(tokenizer, pieces, {&embedding}, &positions);
      const std::vector<float> rows = vision::GatherRows(positions.rows, {&embedding});
      r.image_tokens = static_cast<int>(positions.rows.size());
      r.prompt_tokens = static_cast<int>(positions.ids.size());
      const int n_ctx = r.prompt_tokens + options.greedy_tokens + 1;
      MOERT_ASSIGN_OR_RETURN(std::unique_ptr<model::KvCache> cache, model.NewKvCache(n_ctx));
      model::ForwardInput input;
      input.tokens = positions.ids;
      input.embeddings = rows;
      input.image_share =
          static_cast<float>(r.image_tokens) / static_cast<float>(std::max(1, r.prompt_tokens));
      std::vector<float> logits;
      const auto start = std::chrono::steady_clock::now();
      MOERT_RETURN_IF_ERROR(model.Forward(input, cache.get(), model::LogitsFor::kLast, &logits));
      r.prefill_ms.push_back(MsSince(start));
      if (rep > 0) continue;
      // The first repetition also continues greedily for the agreement figures.
      first_logits = logits;
      std::vector<int32_t> greedy;
      for (int i = 0; i < options.greedy_tokens; ++i) {
        greedy.push_back(Argmax(logits));
        model::ForwardInput step;
        step.tokens = std::span(&greedy.back(), 1);
        step.image_share = input.image_share;
        MOERT_RETURN_IF_ERROR(model.Forward(step, cache.get(), model::LogitsFor::kLast, &logits));
      }
      const std::vector<double> logp = LogSoftmax(first_logits);
      if (reference_logp.empty()) {
        reference_logp = logp;
        reference_greedy = greedy;
        reference_top1 = Argmax(first_logits);
      } else {
        double kl = 0;
        for (size_t i = 0; i < logp.size(); ++i) {
          kl += std::exp(reference_logp[i]) * (reference_logp[i] - logp[i]);
        }
        r.kl = std::max(0.0, kl);
        int same = 0;
        for (size_t i = 0; i < greedy.size(); ++i) same += greedy[i] == reference_greedy[i];
        r.greedy_agreement = greedy.empty() ? 1.0 : static_cast<double>(same) / greedy.size();
        r.top1_equal = Argmax(first_logits) == reference_top1 ? 1 : 0;
      }
    }
    r.peak_rss_bytes = PeakRss();
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace moert::bench
