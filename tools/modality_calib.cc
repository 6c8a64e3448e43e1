// Routing statistics over text and images for moert-pack --modality-bias (see
// modality_calib.h).
#include "modality_calib.h"

#include <algorithm>
#include <memory>
#include <span>

#include "core/status.h"
#include "core/strings.h"
#include "format/model_spec.h"
#include "model/model.h"
#include "router/modality_bias.h"
#include "runtime/vision.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"
#include "vision/prompt.h"

namespace moert::tools {

absl::StatusOr<ModalityCalibResult> ComputeModalityBias(const format::GgufFile& file,
                                                        const ModalityCalibOptions& options) {
  if (options.text_tokens.empty()) {
    return absl::InvalidArgumentError("--modality-bias needs a calibration text (--calib TEXT)");
  }
  if (options.images.empty() || options.mmproj.empty()) {
    return absl::InvalidArgumentError(
        "--modality-bias needs calibration images (--calib-image FILE) and their vision "
        "projector (--mmproj FILE)");
  }
  MOERT_ASSIGN_OR_RETURN(format::ModelSpec spec, format::ReadModelSpec(file));
  MOERT_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::FromGguf(file));
  const int n_ctx = std::max(1, options.n_ctx);

  router::ModalityBiasEstimator estimator(static_cast<int>(spec.n_layer),
                                          static_cast<int>(spec.n_expert));
  // The positions of the pass running now, and how far each layer's micro-batches got.
  std::vector<uint8_t> image_mask;
  std::vector<int64_t> offset(spec.n_layer, 0);
  model::ModelLoadOptions load;
  load.threads = options.threads;
  load.reference_routing = true;  // the model's own routing, nothing adjusted
  load.route_observer = [&](int layer, int64_t n, int slots, const int* experts, const float*) {
    const size_t from = static_cast<size_t>(offset[static_cast<size_t>(layer)]);
    const size_t count = std::min(static_cast<size_t>(n), image_mask.size() - from);
    estimator.Observe(layer, n, slots, experts, std::span(image_mask).subspan(from, count));
    offset[static_cast<size_t>(layer)] += n;
  };
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(file, load));
  MOERT_ASSIGN_OR_RETURN(
      std::unique_ptr<runtime::VisionProjector> vision,
      runtime::VisionProjector::Load(options.mmproj, spec.n_embd, options.threads));

  std::vector<float> logits;
  const auto run = [&](const model::ForwardInput& input) -> absl::Status {
    image_mask.assign(input.tokens.size(), 0);
    for (size_t i = 0; i < input.tokens.size(); ++i) {
      image_mask[i] = input.tokens[i] == model::kEmbeddingToken ? 1 : 0;
    }
    std::fill(offset.begin(), offset.end(), 0);
    MOERT_ASSIGN_OR_RETURN(std::unique_ptr<model::KvCache> cache,
                           model->NewKvCache(static_cast<int>(input.tokens.size())));
    return model->Forward(input, cache.get(), model::LogitsFor::kLast, &logits);
  };

  ModalityCalibResult result;
  int chunks = 0;
  for (size_t at = 0; at < options.text_tokens.size(); at += static_cast<size_t>(n_ctx)) {
    if (options.max_chunks > 0 && chunks == options.max_chunks) break;
    const size_t n = std::min(static_cast<size_t>(n_ctx), options.text_tokens.size() - at);
    model::ForwardInput input;
    input.tokens = std::span(options.text_tokens).subspan(at, n);
    MOERT_RETURN_IF_ERROR(run(input));
    ++chunks;
  }
  for (const std::string& path : options.images) {
    MOERT_ASSIGN_OR_RETURN(vision::RgbImage pixels, vision::DecodeImageFile(path));
    MOERT_ASSIGN_OR_RETURN(vision::ImageEmbedding embedding, vision->Embed(pixels, {}));
    result.image_ms += embedding.encode_ms;
    MOERT_ASSIGN_OR_RETURN(std::vector<vision::PromptPiece> pieces,
                           vision::MinicpmvUserTurn(vision->hparams().minicpmv_version,
                                                    {embedding.layout}, options.image_prompt));
    vision::PromptPositions positions;
    vision::AppendPromptPositions(tok, pieces, {&embedding}, &positions);
    const std::vector<float> rows = vision::GatherRows(positions.rows, {&embedding});
    model::ForwardInput input;
    input.tokens = positions.ids;
    input.embeddings = rows;
    absl::Status status = run(input);
    if (!status.ok()) return absl::Status(status.code(), StrCat(path, ": ", status.message()));
  }
  MOERT_ASSIGN_OR_RETURN(result.bias, estimator.Bias(options.clip));
  result.text_token_layers = estimator.text_token_layers();
  result.image_token_layers = estimator.image_token_layers();
  return result;
}

}  // namespace moert::tools
