// Tests of vision/preprocess.h against llama.cpp: the slices of the three shared
// images (sizes, patches, grid, normalized pixel statistics of reference.txt), the
// resize arithmetic on the reference sizes and on exact halves (where std::round
// and round-half-even part), clip.cpp's bicubic on hand-computed cases, and tiny
// or extreme images.
#include "vision/preprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "vision/image.h"
#include "vision/test_images.h"

namespace moert::vision {
namespace {

using ::testing::HasSubstr;
using testing::MmprojPath;

constexpr NormalizeParams kHalf = {{0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};

struct ReferenceSlice {
  int width, height, patches_w, patches_h;
  size_t n;
  double sum, sumsq;
  float first8[8];
};

struct ReferenceImage {
  const char* name;
  SliceGrid grid;
  int embeds_columns;
  std::vector<ReferenceSlice> slices;
};

// reference.txt, "slice i: ..." and "slice i pixels(HWC,RGB,normalized) ..." lines.
const std::vector<ReferenceImage>& ReferenceImages() {
  static const std::vector<ReferenceImage> images = {
      {"test.png",
       {2, 1},
       2,
       {{518, 392, 37, 28, 609168, -25507.6157, 210763.214, {-1, -1, -1, -1, -1, -1, -1, -1}},
        {364, 546, 26, 39, 596232, -155745.619, 213972.426, {-1, -1, -1, -1, -1, -1, -1, -1}},
        {364,
         546,
         26,
         39,
         596232,
         106524.309,
         197877.455,
         {-0.00392156839f, -1, -0.435294092f, 0.003921628f, -1, -0.427450955f, 0.003921628f, -1}}}},
      {"test_small.png",
       {0, 0},
       2,
       {{518,
         392,
         37,
         28,
         609168,
         -58628.4717,
         218412.099,
         {-1, -1, -1, -1, -1, -1, -0.992156863f, -1}}}},
      {"test_wide.png",
       {3, 1},
       3,
       {{770, 252, 55, 18, 582120, 1194.22846, 186574.514, {-1, -1, -1, -1, -1, -1, -1, -1}},
        {448, 448, 32, 32, 602112, -203648.022, 253558.733, {-1, -1, -1, -1, -1, -1, -1, -1}},
        {448,
         448,
         32,
         32,
         602112,
         -22837.2341,
         104324.793,
         {-0.333333313f, -1, -0.505882382f, -0.333333313f, -1, -0.505882382f, -0.333333313f, -1}},
        {448,
         448,
         32,
         32,
         602112,
         232225.174,
         220963.055,
         {0.333333373f, -1, -0.00392156839f, 0.333333373f, -1, -0.00392156839f, 0.333333373f,
          -1}}}},
  };
  return images;
}

void ExpectRelativelyNear(double got, double want, const char* what) {
  EXPECT_LE(std::abs(got - want), 1e-6 * std::abs(want))
      << what << ": got " << got << ", reference " << want;
}

// reference.txt prints 9 significant digits (%.9g). The preprocessing is bit-exact
// and the sums are taken in the same order, so they must agree to the printed digit,
// which catches a single pixel one u8 step off (0.0078 in the sum) that the 1e-6
// relative check above lets through.
void ExpectSameToPrintedDigits(double got, double want, const char* what) {
  const double half_digit = 0.5 * std::pow(10.0, std::floor(std::log10(std::abs(want))) - 8);
  EXPECT_LE(std::abs(got - want), half_digit * 1.01)
      << what << ": got " << got << ", reference " << want << " (%.9g)";
}

TEST(Preprocess, SharedImagesMatchLlamaCpp) {
  for (const ReferenceImage& ref : ReferenceImages()) {
    SCOPED_TRACE(ref.name);
    absl::StatusOr<RgbImage> image = DecodeImageFile(MmprojPath(ref.name));
    ASSERT_TRUE(image.ok()) << image.status();
    absl::StatusOr<PreprocessedImage> pre = Preprocess(*image, kHalf);
    ASSERT_TRUE(pre.ok()) << pre.status();
    EXPECT_EQ(pre->grid, ref.grid);
    EXPECT_EQ(pre->embeds_columns, ref.embeds_columns);
    EXPECT_EQ(NumImageEmbedsCol({image->width, image->height}), ref.embeds_columns);
    ASSERT_EQ(pre->slices.size(), ref.slices.size());
    for (size_t i = 0; i < ref.slices.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "slice " << i);
      const Slice& slice = pre->slices[i];
      const ReferenceSlice& want = ref.slices[i];
      EXPECT_EQ(slice.width, want.width);
      EXPECT_EQ(slice.height, want.height);
      EXPECT_EQ(slice.patches_w, want.patches_w);
      EXPECT_EQ(slice.patches_h, want.patches_h);
      ASSERT_EQ(slice.pixels.size(), want.n);
      double sum = 0, sumsq = 0;
      for (float v : slice.pixels) {
        sum += v;
        sumsq += static_cast<double>(v) * v;
      }
      ExpectRelativelyNear(sum, want.sum, "sum");
      ExpectRelativelyNear(sumsq, want.sumsq, "sumsq");
      ExpectSameToPrintedDigits(sum, want.sum, "sum");
      ExpectSameToPrintedDigits(sumsq, want.sumsq, "sumsq");
      for (int k = 0; k < 8; ++k) EXPECT_NEAR(slice.pixels[k], want.first8[k], 1e-7) << k;
      // With mean = std = 0.5 every value is an exact u8 step: (u8/255 - .5) / .5.
      for (size_t k = 0; k < slice.pixels.size(); k += 9973) {
        const float u8 = std::round((slice.pixels[k] * 0.5f + 0.5f) * 255.0f);
        EXPECT_EQ(slice.pixels[k], (u8 / 255.0f - 0.5f) / 0.5f);
      }
    }
  }
}

TEST(PlanSlices, ReferenceSizes) {
  absl::StatusOr<SlicePlan> plan = PlanSlices({640, 480});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->multiple, 2);
  EXPECT_EQ(plan->source, (ImageSize{518, 392}));
  EXPECT_EQ(plan->grid, (SliceGrid{2, 1}));
  EXPECT_EQ(plan->refine, (ImageSize{728, 546}));
  EXPECT_EQ(plan->tile_size(), (ImageSize{364, 546}));
  EXPECT_EQ(plan->num_slices(), 3);
  EXPECT_EQ(plan->embeds_columns, 2);

  plan = PlanSlices({200, 150});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->multiple, 1);
  EXPECT_EQ(plan->source, (ImageSize{518, 392}));  // upscaled
  EXPECT_EQ(plan->grid, (SliceGrid{0, 0}));
  EXPECT_EQ(plan->num_slices(), 1);
  EXPECT_EQ(plan->embeds_columns, 2);  // clip_uhd_num_image_embeds_col=2

  plan = PlanSlices({1200, 400});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->multiple, 3);
  EXPECT_EQ(plan->source, (ImageSize{770, 252}));
  EXPECT_EQ(plan->grid, (SliceGrid{3, 1}));
  EXPECT_EQ(plan->refine, (ImageSize{1344, 448}));
  EXPECT_EQ(plan->num_slices(), 4);
}

TEST(FindBestResize, ReferenceSizes) {
  EXPECT_EQ(FindBestResize({640, 480}, 448, 14, false), (ImageSize{518, 392}));
  EXPECT_EQ(FindBestResize({200, 150}, 448, 14, true), (ImageSize{518, 392}));
  EXPECT_EQ(FindBestResize({1200, 400}, 448, 14, false), (ImageSize{770, 252}));
  EXPECT_EQ(GetRefineSize({640, 480}, {2, 1}, 448, 14, true), (ImageSize{728, 546}));
  EXPECT_EQ(GetRefineSize({1200, 400}, {3, 1}, 448, 14, true), (ImageSize{1344, 448}));
  // Small enough and no upscale: only EnsureDivide.
  EXPECT_EQ(FindBestResize({200, 150}, 448, 14, false), (ImageSize{196, 154}));
}

TEST(EnsureDivide, HalvesRoundAwayFromZero) {
  // x / 14 = k + 0.5 with k even: std::round goes up, round-half-even would go down.
  EXPECT_EQ(EnsureDivide(35, 14), 42);    // 2.5 -> 3 (half-even: 2 -> 28)
  EXPECT_EQ(EnsureDivide(63, 14), 70);    // 4.5 -> 5 (half-even: 56)
  EXPECT_EQ(EnsureDivide(427, 14), 434);  // 30.5 -> 31 (half-even: 420)
  EXPECT_EQ(EnsureDivide(21, 14), 28);    // 1.5 -> 2 either way
  EXPECT_EQ(EnsureDivide(5, 2), 6);       // 2.5 -> 3 (half-even: 4)
  // Never below the patch size.
  EXPECT_EQ(EnsureDivide(0, 14), 14);
  EXPECT_EQ(EnsureDivide(1, 14), 14);
  EXPECT_EQ(EnsureDivide(7, 14), 14);
  EXPECT_EQ(EnsureDivide(6, 14), 14);
  EXPECT_EQ(EnsureDivide(27, 14), 28);
  EXPECT_EQ(EnsureDivide(448, 14), 448);
}

TEST(FindBestResize, HalvesRoundAwayFromZero) {
  // Not resized (35 * 63 < 448²): each side is an exact half.
  EXPECT_EQ(FindBestResize({35, 63}, 448, 14, false), (ImageSize{42, 70}));
  // Upscaled 110x100: r = 1.1f, height = int(448 / sqrt(r)) = 427 (30.5 patches),
  // width = int(427 * r) = 469 (33.5 patches): 476x434 (half-even: 476x420).
  EXPECT_EQ(FindBestResize({110, 100}, 448, 14, true), (ImageSize{476, 434}));
}

TEST(BestGrid, FirstMinimumWins) {
  // Square, multiple 2: (1,2) and (2,1) tie at ln 2; the first, one column, wins.
  EXPECT_EQ(BestGrid(9, 2, 0.0f), (SliceGrid{1, 2}));
  // multiple 5 for a square: 2x2 is exact.
  EXPECT_EQ(BestGrid(9, 5, 0.0f), (SliceGrid{2, 2}));
  // multiple 1 still has the n = 2 candidates (clip_uhd_num_image_embeds_col).
  EXPECT_EQ(BestGrid(9, 1, std::log(4.0f / 3.0f)), (SliceGrid{2, 1}));
  // multiple 9: n = 10 is over max_slice_nums, so 8 and 9 only.
  EXPECT_EQ(BestGrid(9, 9, 0.0f), (SliceGrid{3, 3}));
  EXPECT_EQ(BestGrid(9, 9, std::log(8.0f)), (SliceGrid{8, 1}));
  // No candidate at all.
  EXPECT_EQ(BestGrid(1, 0, 0.0f), (SliceGrid{0, 0}));
  absl::StatusOr<SlicePlan> square = PlanSlices({500, 500});
  ASSERT_TRUE(square.ok());
  EXPECT_EQ(square->grid, (SliceGrid{1, 2}));
}

RgbImage Rgb(int width, int height, std::vector<uint8_t> pixels) {
  return RgbImage{width, height, std::move(pixels)};
}

TEST(BicubicResize, HandComputedRow) {
  // One row, 2 -> 4 pixels: tx = 0.5, samples at x = 0, 0.5, 1, 1.5 (top-left
  // aligned), the right edge clamped. Channel values 0 then v:
  //   x = 0.5: v / 2 in exact math. In clip.cpp's float arithmetic v = 1 gives
  //     0.49999997 -> 0, v = 5 gives exactly 2.5 -> 3 (half-even: 2), v = 255 gives
  //     127.5 -> 128.
  //   x = 1.5: v * (1 + 1/6 - 1/8 + 1/48) = 1.0625 v -> 1, 5.3125 -> 5, 270.9 -> 255.
  const RgbImage image = Rgb(2, 1, {0, 0, 0, 1, 5, 255});
  const RgbImage out = BicubicResize(image, 4, 1);
  EXPECT_EQ(out.width, 4);
  EXPECT_EQ(out.height, 1);
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{0, 0, 0, 0, 3, 128, 1, 5, 255, 1, 5, 255}));

  // The same along a column: the vertical pass uses the same cubic.
  const RgbImage column = BicubicResize(Rgb(1, 2, {0, 0, 0, 1, 5, 255}), 1, 4);
  EXPECT_EQ(column.pixels, out.pixels);
}

TEST(BicubicResize, HandComputedDownscaleAndOvershoot) {
  // 3 -> 2: tx = 1.5; x = 1.5 sits between 60 and 120 with 0 on the left:
  //   d0 = -60, d2 = 60, d3 = 60 (clamped): a1 = 70, a2 = 0, a3 = -10,
  //   60 + 35 - 1.25 = 93.75 -> 94.
  EXPECT_EQ(BicubicResize(Rgb(3, 1, {0, 0, 0, 60, 60, 60, 120, 120, 120}), 2, 1).pixels,
            (std::vector<uint8_t>{0, 0, 0, 94, 94, 94}));
  // 0, 90 -> 4: 0, 45, 90, 95.625 -> 96 (the cubic overshoots past the edge value).
  EXPECT_EQ(BicubicResize(Rgb(2, 1, {0, 0, 0, 90, 90, 90}), 4, 1).pixels,
            (std::vector<uint8_t>{0, 0, 0, 45, 45, 45, 90, 90, 90, 96, 96, 96}));
  // Identity size is the identity.
  const RgbImage image = Rgb(2, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  EXPECT_EQ(BicubicResize(image, 2, 2).pixels, image.pixels);
}

TEST(BicubicResize, ArithmeticIsClipCppsToTheLastBit) {
  // Cases found by search where a plausible rewrite lands one u8 step away; the
  // expected bytes come from a float-by-float emulation of clip.cpp (Python,
  // rounding to float32 after every operation), not from this code.
  // Coefficients a1..a3 computed in float instead of double: G and B of pixel 1
  // become 138 and 126.
  EXPECT_EQ(BicubicResize(Rgb(2, 1, {23, 78, 19, 201, 199, 234}), 4, 1).pixels,
            (std::vector<uint8_t>{23, 78, 19, 112, 139, 127, 201, 199, 234, 212, 207, 247}));
  // The row cubic contracted to fused multiply-adds (what GCC does on aarch64
  // without -ffp-contract=off): B of pixel 1 becomes 51.
  EXPECT_EQ(BicubicResize(Rgb(3, 2,
                              {16, 68, 181, 149, 220, 23, 219, 49, 179, 69, 181, 0, 188, 140, 109,
                               147, 124, 111}),
                          4, 2)
                .pixels,
            (std::vector<uint8_t>{16, 68,  181, 114, 194, 52, 192, 144, 91,  223, 40,  188,
                                  69, 181, 0,   162, 150, 83, 175, 129, 117, 145, 123, 111}));
}

TEST(Preprocess, OneByOneImage) {
  // multiple 1, upscaled: r = 1, 448x448, every pixel the one input colour.
  const RgbImage image = Rgb(1, 1, {0, 128, 255});
  absl::StatusOr<PreprocessedImage> pre = Preprocess(image, kHalf);
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_EQ(pre->slices.size(), 1u);
  const Slice& slice = pre->slices[0];
  EXPECT_EQ(slice.width, 448);
  EXPECT_EQ(slice.height, 448);
  EXPECT_EQ(slice.patches_w, 32);
  EXPECT_EQ(slice.patches_h, 32);
  EXPECT_EQ(pre->grid, (SliceGrid{0, 0}));
  ASSERT_EQ(slice.pixels.size(), size_t{448} * 448 * 3);
  const float expected[3] = {-1.0f, (128 / 255.0f - 0.5f) / 0.5f, 1.0f};
  for (size_t i = 0; i < slice.pixels.size(); ++i) ASSERT_EQ(slice.pixels[i], expected[i % 3]);

  // Decoded from a 1x1 PNG, too.
  absl::StatusOr<RgbImage> decoded = DecodeImage(testing::EncodePng(image));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(Preprocess(*decoded, kHalf).ok());
}

TEST(Preprocess, ThinImagesKeepAtLeastOnePatch) {
  // 1x1000: upscaled to height int(448 / sqrt(0.001)) = 14167 -> 14168 and width
  // int(14167 * 0.001) = 14 -> 14: one patch wide (EnsureDivide's minimum).
  absl::StatusOr<SlicePlan> plan = PlanSlices({1, 1000});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->source, (ImageSize{14, 14168}));
  absl::StatusOr<std::vector<RgbImage>> slices =
      SliceImage(Rgb(1, 1000, std::vector<uint8_t>(3000, 7)));
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_EQ((*slices)[0].width, 14);
  EXPECT_EQ((*slices)[0].pixels, std::vector<uint8_t>(size_t{14} * 14168 * 3, 7));
}

TEST(Preprocess, TooExtremeAspectRatiosAreRefused) {
  // 1x2000 would need 1431 patches down (clip.cpp's position buckets hold 1024).
  for (ImageSize size : {ImageSize{1, 2000}, ImageSize{20000, 1}}) {
    absl::StatusOr<SlicePlan> plan = PlanSlices(size);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr("aspect ratio"));
    EXPECT_THAT(plan.status().message(), HasSubstr("1024 patches"));
  }
  absl::StatusOr<PreprocessedImage> pre =
      Preprocess(Rgb(20000, 1, std::vector<uint8_t>(60000)), kHalf);
  ASSERT_FALSE(pre.ok());
  EXPECT_THAT(pre.status().message(), HasSubstr("aspect ratio"));
}

TEST(Preprocess, InvalidInputsAreErrors) {
  EXPECT_FALSE(PlanSlices({0, 10}).ok());
  EXPECT_FALSE(PlanSlices({10, -1}).ok());
  absl::StatusOr<PreprocessedImage> pre = Preprocess(Rgb(2, 2, {1, 2, 3}), kHalf);
  ASSERT_FALSE(pre.ok());
  EXPECT_THAT(pre.status().message(), HasSubstr("holds 3 bytes, expected 12"));
  pre = Preprocess(Rgb(0, 0, {}), kHalf);
  ASSERT_FALSE(pre.ok());
  NormalizeParams zero_std = {{0.5f, 0.5f, 0.5f}, {0.5f, 0.0f, 0.5f}};
  pre = Preprocess(Rgb(1, 1, {1, 2, 3}), zero_std);
  ASSERT_FALSE(pre.ok());
  EXPECT_THAT(pre.status().message(), HasSubstr("channel 1"));
  NormalizeParams nan_mean = {{NAN, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
  EXPECT_FALSE(Preprocess(Rgb(1, 1, {1, 2, 3}), nan_mean).ok());
}

TEST(NormalizeImage, UsesPerChannelMeanAndStd) {
  // CLIP-style constants, not 0.5: f = (u8 / 255 - mean[c]) / std[c] in float.
  const NormalizeParams clip = {{0.48145466f, 0.4578275f, 0.40821073f},
                                {0.26862954f, 0.26130258f, 0.27577711f}};
  const std::vector<float> out = NormalizeImage(Rgb(1, 1, {10, 128, 250}), clip);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], (10 / 255.0f - clip.mean[0]) / clip.std[0]);
  EXPECT_EQ(out[1], (128 / 255.0f - clip.mean[1]) / clip.std[1]);
  EXPECT_EQ(out[2], (250 / 255.0f - clip.mean[2]) / clip.std[2]);
}

}  // namespace
}  // namespace moert::vision
