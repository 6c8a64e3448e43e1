// MiniCPM-V image preprocessing exactly as llama.cpp's clip.cpp does it (commit
// c392e5094, uhd_slice_image + normalize_image_u8_to_f32): resize to a patch-aligned
// "source" image, choose a slice grid, resize again and cut it into tiles, then
// normalize each slice to float. The float steps round as written, so this file is
// built without FMA contraction (-ffp-contract=off, src/CMakeLists.txt); see
// ../shared/mmproj/NOTES.md, "Preprocessing", for every constant and rounding rule.
#ifndef MOERT_VISION_PREPROCESS_H_
#define MOERT_VISION_PREPROCESS_H_

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "vision/image.h"

namespace moert::vision {

// llama.cpp's literals for MiniCPM-V (not read from the mmproj).
inline constexpr int kMaxSliceNums = 9;
inline constexpr int kScaleResolution = 448;
inline constexpr int kPatchSize = 14;
// clip.cpp buckets patch positions in int[1024] arrays: no slice may be wider or
// taller than this many patches (llama.cpp would overrun them; we refuse the image).
inline constexpr int kMaxPatchesPerSide = 1024;

struct ImageSize {
  int width = 0;
  int height = 0;
  bool operator==(const ImageSize&) const = default;
};

// A grid of tiles: columns across, rows down.
struct SliceGrid {
  int columns = 0;
  int rows = 0;
  bool operator==(const SliceGrid&) const = default;
};

// ensure_divide: `length` rounded to the nearest multiple of `patch_size` (std::round
// of the float quotient, so halves go up), at least `patch_size`. patch_size > 0.
int EnsureDivide(int length, int patch_size);

// uhd_find_best_resize: when the image has more than scale_resolution² pixels or
// allow_upscale, it is scaled (float math, truncated to int) to about
// scale_resolution² pixels at its aspect ratio; then each side goes through
// EnsureDivide. Sizes must be positive.
ImageSize FindBestResize(ImageSize original, int scale_resolution, int patch_size,
                         bool allow_upscale);

// uhd_get_refine_size: the size the whole image is resized to before it is cut into
// grid tiles (each tile's size is FindBestResize of the original's share).
ImageSize GetRefineSize(ImageSize original, SliceGrid grid, int scale_resolution, int patch_size,
                        bool allow_upscale);

// uhd_best_grid: over n in {multiple - 1, multiple, multiple + 1} with n != 1 and
// n <= max_slice_nums, every grid (m, n / m) with m dividing n, the first one with
// the least |log_ratio - ln(m / (n / m))| (errors stored as float, as clip.cpp does).
// {0, 0} when there is no candidate.
SliceGrid BestGrid(int max_slice_nums, int multiple, float log_ratio);

// What uhd_slice_image will do with an image of this size, without the pixels.
struct SlicePlan {
  int multiple = 0;  // min(ceil(W * H / 448²), 9)
  ImageSize source;  // slice 0
  SliceGrid grid;    // the tiles after slice 0; {0, 0} when multiple <= 1
  ImageSize refine;  // the resize that is cut into tiles; {0, 0} without tiles
  // clip_uhd_num_image_embeds_col: the best grid's columns for the original size,
  // which the prompt groups tiles by. Set for single-slice images too (the prompt
  // does not use it then).
  int embeds_columns = 0;

  int num_slices() const { return 1 + grid.columns * grid.rows; }
  ImageSize tile_size() const {
    return grid.columns > 0 ? ImageSize{refine.width / grid.columns, refine.height / grid.rows}
                            : ImageSize{};
  }
};

// The plan for an original of `size`. InvalidArgument for non-positive sizes, and
// for aspect ratios so extreme that a slice would exceed kMaxPatchesPerSide.
absl::StatusOr<SlicePlan> PlanSlices(ImageSize size);

// clip_uhd_num_image_embeds_col for an original of `size` (positive sizes).
int NumImageEmbedsCol(ImageSize size);

// clip.cpp's bicubic_resize (not PIL's): top-left aligned sample positions, edges
// clamped, a cubic through 4 samples per row and then over 4 rows, std::round and
// clamp to [0, 255]. `image` must be valid and the target size positive.
RgbImage BicubicResize(const RgbImage& image, int target_width, int target_height);

// uhd_slice_image: the u8 slices in llama.cpp's order, [source, tiles row-major].
// InvalidArgument for an invalid image (non-positive size, pixels of the wrong
// length) or one PlanSlices refuses.
absl::StatusOr<std::vector<RgbImage>> SliceImage(const RgbImage& image);

// Per-channel normalization, from the mmproj (clip.vision.image_mean / image_std).
struct NormalizeParams {
  std::array<float, 3> mean;
  std::array<float, 3> std;
};

// One slice, normalized: f = (u8 / 255.0f - mean[c]) / std[c], HWC interleaved RGB,
// row-major (pixels[(y * width + x) * 3 + c]).
struct Slice {
  int width = 0;
  int height = 0;
  int patches_w = 0;  // width / kPatchSize
  int patches_h = 0;  // height / kPatchSize
  std::vector<float> pixels;
};

struct PreprocessedImage {
  std::vector<Slice> slices;  // [source, tiles row-major]
  SliceGrid grid;             // the tile grid; {0, 0} when there is only the source
  int embeds_columns = 0;     // clip_uhd_num_image_embeds_col (see SlicePlan)
};

// normalize_image_u8_to_f32 of one image.
std::vector<float> NormalizeImage(const RgbImage& image, const NormalizeParams& params);

// clip_image_preprocess for MiniCPM-V: SliceImage, then NormalizeImage per slice.
// InvalidArgument for what SliceImage refuses and for a non-finite mean or std or a
// zero std.
absl::StatusOr<PreprocessedImage> Preprocess(const RgbImage& image, const NormalizeParams& params);

}  // namespace moert::vision

#endif  // MOERT_VISION_PREPROCESS_H_
