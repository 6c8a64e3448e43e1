// llama.cpp's MiniCPM-V slicing and bicubic resize, transcribed operation by
// operation: each float or double expression below is evaluated in the type and the
// order clip.cpp evaluates it, because a one-ulp difference before std::round moves
// a pixel by one u8 step. Do not "simplify" the arithmetic.
#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moert::vision {
namespace {

// Larger sides could overflow int in EnsureDivide's float round trip; stb_image does
// not decode them either (STBI_MAX_DIMENSIONS).
constexpr int kMaxSide = 1 << 24;

absl::Status CheckSize(ImageSize size) {
  if (size.width <= 0 || size.height <= 0 || size.width > kMaxSide || size.height > kMaxSide) {
    return absl::InvalidArgumentError(absl::StrCat("image size ", size.width, "x", size.height,
                                                   ": each side must be in [1, ", kMaxSide, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckSlice(ImageSize original, const char* what, ImageSize slice) {
  if (slice.width / kPatchSize > kMaxPatchesPerSide ||
      slice.height / kPatchSize > kMaxPatchesPerSide) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", original.width, "x", original.height, " has too extreme an aspect ratio: its ",
        what, " would be ", slice.width, "x", slice.height, " pixels, over ", kMaxPatchesPerSide,
        " patches of ", kPatchSize, " on a side"));
  }
  return absl::OkStatus();
}

// clip.cpp's ratio and log_ratio, both computed in double and stored to float.
float LogRatio(ImageSize size) {
  return static_cast<float>(std::log(1.0 * size.width / size.height));
}

int Multiple(ImageSize size) {
  const float ratio =
      static_cast<float>(1.0 * size.width * size.height / (kScaleResolution * kScaleResolution));
  return static_cast<int>(std::fmin(std::ceil(ratio), kMaxSliceNums));
}

}  // namespace

int EnsureDivide(int length, int patch_size) {
  return std::max(
      static_cast<int>(std::round(static_cast<float>(length) / static_cast<float>(patch_size)) *
                       static_cast<float>(patch_size)),
      patch_size);
}

ImageSize FindBestResize(ImageSize original, int scale_resolution, int patch_size,
                         bool allow_upscale) {
  int width = original.width;
  int height = original.height;
  if (int64_t{width} * height > int64_t{scale_resolution} * scale_resolution || allow_upscale) {
    const float r = static_cast<float>(width) / static_cast<float>(height);
    height = static_cast<int>(static_cast<float>(scale_resolution) / std::sqrt(r));
    width = static_cast<int>(static_cast<float>(height) * r);
  }
  return {EnsureDivide(width, patch_size), EnsureDivide(height, patch_size)};
}

ImageSize GetRefineSize(ImageSize original, SliceGrid grid, int scale_resolution, int patch_size,
                        bool allow_upscale) {
  const int refine_width = EnsureDivide(original.width, grid.columns);
  const int refine_height = EnsureDivide(original.height, grid.rows);
  const ImageSize tile = FindBestResize({refine_width / grid.columns, refine_height / grid.rows},
                                        scale_resolution, patch_size, allow_upscale);
  return {tile.width * grid.columns, tile.height * grid.rows};
}

SliceGrid BestGrid(int max_slice_nums, int multiple, float log_ratio) {
  SliceGrid best{};
  float min_error = std::numeric_limits<float>::infinity();
  for (int n : {multiple - 1, multiple, multiple + 1}) {
    if (n == 1 || n > max_slice_nums) continue;
    for (int m = 1; m <= n; ++m) {
      if (n % m != 0) continue;
      const float error = static_cast<float>(std::abs(log_ratio - std::log(1.0 * m / (n / m))));
      if (error < min_error) {
        best = {m, n / m};
        min_error = error;
      }
    }
  }
  return best;
}

absl::StatusOr<SlicePlan> PlanSlices(ImageSize size) {
  MOERT_RETURN_IF_ERROR(CheckSize(size));
  SlicePlan plan;
  plan.multiple = Multiple(size);
  const SliceGrid best = BestGrid(kMaxSliceNums, plan.multiple, LogRatio(size));
  plan.embeds_columns = best.columns;
  if (plan.multiple <= 1) {
    plan.source = FindBestResize(size, kScaleResolution, kPatchSize, /*allow_upscale=*/true);
  } else {
    plan.source = FindBestResize(size, kScaleResolution, kPatchSize, /*allow_upscale=*/false);
    plan.grid = best;
    plan.refine = GetRefineSize(size, best, kScaleResolution, kPatchSize, /*allow_upscale=*/true);
  }
  MOERT_RETURN_IF_ERROR(CheckSlice(size, "source slice", plan.source));
  if (plan.grid.columns > 0) MOERT_RETURN_IF_ERROR(CheckSlice(size, "tiles", plan.tile_size()));
  return plan;
}

int NumImageEmbedsCol(ImageSize size) {
  return BestGrid(kMaxSliceNums, Multiple(size), LogRatio(size)).columns;
}

RgbImage BicubicResize(const RgbImage& image, int target_width, int target_height) {
  const int nx = image.width;
  const int ny = image.height;
  RgbImage dst;
  dst.width = target_width;
  dst.height = target_height;
  dst.pixels.resize(static_cast<size_t>(target_width) * static_cast<size_t>(target_height) * 3);

  const float tx = static_cast<float>(nx) / static_cast<float>(target_width);
  const float ty = static_cast<float>(ny) / static_cast<float>(target_height);
  auto clamp = [](int v, int lo, int hi) { return std::max(lo, std::min(v, hi)); };
  auto sample = [&](int row, int col, int k) -> int {
    return image.pixels[(static_cast<size_t>(clamp(row, 0, ny - 1)) * static_cast<size_t>(nx) +
                         static_cast<size_t>(clamp(col, 0, nx - 1))) *
                            3 +
                        static_cast<size_t>(k)];
  };

  for (int i = 0; i < target_height; ++i) {
    for (int j = 0; j < target_width; ++j) {
      const int x = static_cast<int>(tx * static_cast<float>(j));
      const int y = static_cast<int>(ty * static_cast<float>(i));
      const float dx = tx * static_cast<float>(j) - static_cast<float>(x);
      const float dy = ty * static_cast<float>(i) - static_cast<float>(y);
      for (int k = 0; k < 3; ++k) {
        float c[4];
        for (int jj = 0; jj <= 3; ++jj) {
          const int row = y - 1 + jj;
          const int p0 = sample(row, x, k);
          // u8 - u8 is an int, exact in float; the coefficients are double math
          // stored to float; the cubic is float math, left to right.
          const float d0 = static_cast<float>(sample(row, x - 1, k) - p0);
          const float d2 = static_cast<float>(sample(row, x + 1, k) - p0);
          const float d3 = static_cast<float>(sample(row, x + 2, k) - p0);
          const float a0 = static_cast<float>(p0);
          const float a1 = static_cast<float>(-1.0 / 3 * d0 + d2 - 1.0 / 6 * d3);
          const float a2 = static_cast<float>(1.0 / 2 * d0 + 1.0 / 2 * d2);
          const float a3 = static_cast<float>(-1.0 / 6 * d0 - 1.0 / 2 * d2 + 1.0 / 6 * d3);
          c[jj] = a0 + a1 * dx + a2 * dx * dx + a3 * dx * dx * dx;
        }
        // clip.cpp evaluates this inside the jj loop; only the last pass (all four
        // rows known) survives, so once here is the same.
        const float d0 = c[0] - c[1];
        const float d2 = c[2] - c[1];
        const float d3 = c[3] - c[1];
        const float a0 = c[1];
        const float a1 = static_cast<float>(-1.0 / 3 * d0 + d2 - 1.0 / 6 * d3);
        const float a2 = static_cast<float>(1.0 / 2 * d0 + 1.0 / 2 * d2);
        const float a3 = static_cast<float>(-1.0 / 6 * d0 - 1.0 / 2 * d2 + 1.0 / 6 * d3);
        const float cc = a0 + a1 * dy + a2 * dy * dy + a3 * dy * dy * dy;
        dst.pixels[(static_cast<size_t>(i) * static_cast<size_t>(target_width) +
                    static_cast<size_t>(j)) *
                       3 +
                   static_cast<size_t>(k)] =
            static_cast<uint8_t>(std::min(std::max(std::round(cc), 0.0f), 255.0f));
      }
    }
  }
  return dst;
}

absl::StatusOr<std::vector<RgbImage>> SliceImage(const RgbImage& image) {
  const ImageSize size{image.width, image.height};
  MOERT_RETURN_IF_ERROR(CheckSize(size));
  const size_t expected = static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3;
  if (image.pixels.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("RgbImage ", image.width, "x", image.height,
                                                   " holds ", image.pixels.size(),
                                                   " bytes, expected ", expected));
  }
  MOERT_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlices(size));

  std::vector<RgbImage> slices;
  slices.reserve(static_cast<size_t>(plan.num_slices()));
  slices.push_back(BicubicResize(image, plan.source.width, plan.source.height));
  if (plan.grid.columns == 0) return slices;

  const RgbImage refine = BicubicResize(image, plan.refine.width, plan.refine.height);
  const ImageSize tile = plan.tile_size();
  const size_t tile_row_bytes = static_cast<size_t>(tile.width) * 3;
  for (int r = 0; r < plan.grid.rows; ++r) {
    for (int c = 0; c < plan.grid.columns; ++c) {
      RgbImage out;
      out.width = tile.width;
      out.height = tile.height;
      out.pixels.resize(tile_row_bytes * static_cast<size_t>(tile.height));
      for (int y = 0; y < tile.height; ++y) {
        const size_t src_row = static_cast<size_t>(r * tile.height + y);
        const uint8_t* src =
            refine.pixels.data() +
            (src_row * static_cast<size_t>(refine.width) + static_cast<size_t>(c * tile.width)) * 3;
        std::copy(src, src + tile_row_bytes,
                  out.pixels.begin() + static_cast<std::ptrdiff_t>(y * tile_row_bytes));
      }
      slices.push_back(std::move(out));
    }
  }
  return slices;
}

std::vector<float> NormalizeImage(const RgbImage& image, const NormalizeParams& params) {
  std::vector<float> out(image.pixels.size());
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const size_t c = i % 3;
    out[i] = (static_cast<float>(image.pixels[i]) / 255.0f - params.mean[c]) / params.std[c];
  }
  return out;
}

absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image, const NormalizeParams& params) {
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(params.mean[c]) || !std::isfinite(params.std[c]) || params.std[c] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("normalization channel ", c, ": mean ",
                                                     params.mean[c], ", std ", params.std[c],
                                                     " (must be finite, std nonzero)"));
    }
  }
  MOERT_ASSIGN_OR_RETURN(std::vector<RgbImage> slices, SliceImage(image));
  PreprocessedImage result;
  // SliceImage validated the size, so the plan is known to succeed.
  MOERT_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlices({image.width, image.height}));
  result.grid = plan.grid;
  result.embeds_columns = plan.embeds_columns;
  result.slices.reserve(slices.size());
  for (const RgbImage& u8 : slices) {
    Slice slice;
    slice.width = u8.width;
    slice.height = u8.height;
    slice.patches_w = u8.width / kPatchSize;
    slice.patches_h = u8.height / kPatchSize;
    slice.pixels = NormalizeImage(u8, params);
    result.slices.push_back(std::move(slice));
  }
  return result;
}

}  // namespace moert::vision
