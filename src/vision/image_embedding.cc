// Image -> language-model rows (see image_embedding.h).
#include "vision/image_embedding.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/status.h"
#include "core/strings.h"
#include "telemetry/trace.h"
#include "vision/preprocess.h"

namespace moert::vision {

int ImageEmbedding::slice_offset(int s) const {
  int offset = 0;
  for (int i = 0; i < s; ++i) offset += slice_rows(i);
  return offset;
}

absl::Status ValidateEmbedOptions(const EmbedOptions& options) {
  if (!(options.keep_ratio > 0 && options.keep_ratio <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("image keep ratio must be in (0, 1] (1: no pruning), got ", options.keep_ratio));
  }
  if (options.min_keep < 1) {
    return absl::InvalidArgumentError(
        StrCat("image min_keep must be >= 1, got ", options.min_keep));
  }
  return absl::OkStatus();
}

std::vector<int> KeepLowestEntropy(const std::vector<float>& entropy, float keep_ratio,
                                   int min_keep) {
  const int n = static_cast<int>(entropy.size());
  const int wanted = static_cast<int>(std::ceil(static_cast<double>(keep_ratio) * n));
  const int keep = std::clamp(std::max(wanted, min_keep), 0, n);
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return entropy[static_cast<size_t>(a)] < entropy[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());
  return order;
}

void AppendPromptPositions(const tokenizer::Tokenizer& tokenizer,
                           const std::vector<PromptPiece>& pieces,
                           const std::vector<const ImageEmbedding*>& images,
                           PromptPositions* out) {
  for (const PromptPiece& piece : pieces) {
    if (piece.is_text()) {
      const std::vector<int32_t> ids =
          tokenizer.Encode(piece.text, /*add_special=*/false, /*parse_special=*/true);
      out->ids.insert(out->ids.end(), ids.begin(), ids.end());
      continue;
    }
    const ImageEmbedding& image = *images[static_cast<size_t>(piece.image)];
    const int offset = image.slice_offset(piece.slice);
    for (int r = 0; r < image.slice_rows(piece.slice); ++r) {
      out->ids.push_back(-1);
      out->rows.push_back({piece.image, offset + r});
    }
  }
}

std::vector<float> GatherRows(const std::vector<PromptPositions::Row>& rows,
                              const std::vector<const ImageEmbedding*>& images) {
  std::vector<float> out;
  if (rows.empty()) return out;
  const size_t width = static_cast<size_t>(images[static_cast<size_t>(rows[0].image)]->width);
  out.reserve(rows.size() * width);
  for (const PromptPositions::Row& r : rows) {
    const ImageEmbedding& image = *images[static_cast<size_t>(r.image)];
    const float* row = image.rows.data() + static_cast<size_t>(r.row) * width;
    out.insert(out.end(), row, row + width);
  }
  return out;
}

absl::StatusOr<ImageEmbedding> EmbedImage(VisionEncoder& encoder, const RgbImage& image,
                                          const EmbedOptions& options) {
  MOERT_TRACE_SCOPE("image encode");
  MOERT_RETURN_IF_ERROR(ValidateEmbedOptions(options));
  const auto start = std::chrono::steady_clock::now();
  const MmprojHparams& hp = encoder.hparams();
  NormalizeParams norm{hp.image_mean, hp.image_std};
  MOERT_ASSIGN_OR_RETURN(PreprocessedImage pre, Preprocess(image, norm));
  ImageEmbedding out;
  out.width = hp.resampler_width;
  out.layout.n_slices = static_cast<int>(pre.slices.size());
  out.layout.columns = std::max(1, pre.embeds_columns);
  const bool prune = options.keep_ratio < 1;
  std::vector<float> rows, entropy;
  const size_t width = static_cast<size_t>(out.width);
  for (const Slice& slice : pre.slices) {
    MOERT_RETURN_IF_ERROR(encoder.EncodeSlice(slice, &rows, prune ? &entropy : nullptr));
    std::vector<int> kept(static_cast<size_t>(hp.n_query));
    std::iota(kept.begin(), kept.end(), 0);
    if (prune) kept = KeepLowestEntropy(entropy, options.keep_ratio, options.min_keep);
    for (int q : kept) {
      const float* row = rows.data() + static_cast<size_t>(q) * width;
      out.rows.insert(out.rows.end(), row, row + width);
    }
    out.kept.push_back(std::move(kept));
  }
  out.encode_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace moert::vision
