// Model::Load: reads the spec, picks the architecture's implementation and loads
// its weights.
#include "model/model.h"

#include <new>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "model/decoder.h"

namespace moert::model {

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const format::GgufFile& file,
                                                   const ModelLoadOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        StrCat("thread count ", options.threads, " is negative (0 means one per core)"));
  }
  if (options.poll < -1 || options.poll > 100) {
    return absl::InvalidArgumentError(StrCat("poll level ", options.poll,
                                             " is outside -1..100 (-1: auto, 0: idle threads "
                                             "sleep at once)"));
  }
  MOERT_ASSIGN_OR_RETURN(format::ModelSpec spec, format::ReadModelSpec(file));
  if (spec.rope_scaling == format::RopeScaling::kYarn && spec.rope_scaling_factor != 1.0f) {
    return absl::UnimplementedError(StrCat(file.name(), ": YaRN RoPE scaling (factor ",
                                           spec.rope_scaling_factor,
                                           ") is not implemented by the reference model"));
  }
  // Every supported architecture is the pre-norm decoder; its row of the architecture
  // table says how its layers differ.
  auto model = std::make_unique<DecoderModel>(std::move(spec), options.threads);
  try {
    MOERT_RETURN_IF_ERROR(model->LoadWeights(file, options));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        StrCat(file.name(), ": out of memory while loading the weights as fp32"));
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace moert::model
