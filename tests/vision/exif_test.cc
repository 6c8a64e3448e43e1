// Tests of JPEG EXIF orientation: test JPEGs of an asymmetric block pattern, with an
// APP1 Exif segment for each orientation 1..8 in both TIFF byte orders, must decode
// to the displayed image. Expected corners come from the EXIF definitions ("row 0
// is the visual top/right/..."), not from the code's own mapping. Colours are
// compared per block, loosely, because JPEG is lossy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "vision/image.h"
#include "vision/test_images.h"

namespace moert::vision {
namespace {

using testing::EncodeJpeg;
using testing::ExifSegment;
using testing::InsertAfterSoi;

using Color = std::array<int, 3>;

// The stored image: 3 x 2 blocks of 16 pixels, every block its own colour, so any
// flip or rotation moves colours to recognisably different corners.
constexpr int kBlock = 16;
constexpr int kColumns = 3;
constexpr int kRows = 2;
constexpr Color kColors[kRows][kColumns] = {
    {{230, 30, 30}, {30, 200, 30}, {30, 30, 230}},
    {{240, 240, 240}, {20, 20, 20}, {230, 220, 20}},
};

RgbImage StoredPattern() {
  RgbImage image;
  image.width = kColumns * kBlock;
  image.height = kRows * kBlock;
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        image.pixels[(static_cast<size_t>(y) * image.width + x) * 3 + c] =
            static_cast<uint8_t>(kColors[y / kBlock][x / kBlock][c]);
      }
    }
  }
  return image;
}

// The mean colour of the 8x8 centre of the 16x16 block whose top-left is (x0, y0).
Color BlockMean(const RgbImage& image, int x0, int y0) {
  Color sum = {0, 0, 0};
  for (int y = y0 + 4; y < y0 + 12; ++y) {
    for (int x = x0 + 4; x < x0 + 12; ++x) {
      for (int c = 0; c < 3; ++c) sum[c] += image.at(x, y, c);
    }
  }
  for (int& s : sum) s /= 64;
  return sum;
}

bool Near(const Color& a, const Color& b) {
  for (int c = 0; c < 3; ++c) {
    if (std::abs(a[c] - b[c]) > 24) return false;
  }
  return true;
}

enum Corner { kTopLeft, kTopRight, kBottomLeft, kBottomRight };

// Where each stored corner block is displayed, from the EXIF 2.3 definitions of
// the Orientation tag (the 0th row / 0th column of the stored image is the visual
// ... side): {stored TL, stored TR, stored BL, stored BR} -> displayed corner.
constexpr Corner kDisplayedCorner[9][4] = {
    {},
    {kTopLeft, kTopRight, kBottomLeft, kBottomRight},  // 1: row 0 top, column 0 left
    {kTopRight, kTopLeft, kBottomRight, kBottomLeft},  // 2: row 0 top, column 0 right
    {kBottomRight, kBottomLeft, kTopRight, kTopLeft},  // 3: row 0 bottom, column 0 right
    {kBottomLeft, kBottomRight, kTopLeft, kTopRight},  // 4: row 0 bottom, column 0 left
    {kTopLeft, kBottomLeft, kTopRight, kBottomRight},  // 5: row 0 left, column 0 top
    {kTopRight, kBottomRight, kTopLeft, kBottomLeft},  // 6: row 0 right, column 0 top
    {kBottomRight, kTopRight, kBottomLeft, kTopLeft},  // 7: row 0 right, column 0 bottom
    {kBottomLeft, kTopLeft, kBottomRight, kTopRight},  // 8: row 0 left, column 0 bottom
};

Color DisplayedCornerBlock(const RgbImage& image, Corner corner) {
  const int right = image.width - kBlock;
  const int bottom = image.height - kBlock;
  switch (corner) {
    case kTopLeft:
      return BlockMean(image, 0, 0);
    case kTopRight:
      return BlockMean(image, right, 0);
    case kBottomLeft:
      return BlockMean(image, 0, bottom);
    case kBottomRight:
      return BlockMean(image, right, bottom);
  }
  return {};
}

TEST(JpegExif, EveryOrientationInBothByteOrders) {
  const std::vector<uint8_t> jpeg = EncodeJpeg(StoredPattern(), 95);
  const Color stored_corners[4] = {kColors[0][0], kColors[0][kColumns - 1], kColors[kRows - 1][0],
                                   kColors[kRows - 1][kColumns - 1]};
  for (bool little_endian : {true, false}) {
    for (int orientation = 1; orientation <= 8; ++orientation) {
      SCOPED_TRACE(::testing::Message()
                   << "orientation " << orientation << ", " << (little_endian ? "II" : "MM"));
      const std::vector<uint8_t> bytes =
          InsertAfterSoi(jpeg, ExifSegment(orientation, little_endian));
      EXPECT_EQ(ReadJpegExifOrientation(bytes), orientation);
      absl::StatusOr<RgbImage> image = DecodeImage(bytes);
      ASSERT_TRUE(image.ok()) << image.status();
      const bool swapped = orientation >= 5;
      EXPECT_EQ(image->width, swapped ? kRows * kBlock : kColumns * kBlock);
      EXPECT_EQ(image->height, swapped ? kColumns * kBlock : kRows * kBlock);
      for (int s = 0; s < 4; ++s) {
        const Color got = DisplayedCornerBlock(*image, kDisplayedCorner[orientation][s]);
        EXPECT_TRUE(Near(got, stored_corners[s]))
            << "stored corner " << s << " expected at displayed corner "
            << kDisplayedCorner[orientation][s] << ": got " << got[0] << "," << got[1] << ","
            << got[2] << ", want " << stored_corners[s][0] << "," << stored_corners[s][1] << ","
            << stored_corners[s][2];
      }
      // The middle block of the long side (stored (1, 0) and (1, 1)) moves too: check
      // the whole image against the orientation applied to the unrotated decode.
      DecodeOptions raw;
      raw.apply_exif_orientation = false;
      absl::StatusOr<RgbImage> stored = DecodeImage(bytes, raw);
      ASSERT_TRUE(stored.ok()) << stored.status();
      EXPECT_EQ(stored->width, kColumns * kBlock);
      EXPECT_EQ(ApplyExifOrientation(*stored, orientation).pixels, image->pixels);
    }
  }
}

TEST(JpegExif, MiddleBlocksLandWhereRotationPutsThem) {
  // Orientation 6 (rotate 90 clockwise): the stored top row of blocks becomes the
  // right column, read top to bottom; the stored bottom row the left column.
  const std::vector<uint8_t> bytes =
      InsertAfterSoi(EncodeJpeg(StoredPattern(), 95), ExifSegment(6, false));
  absl::StatusOr<RgbImage> image = DecodeImage(bytes);
  ASSERT_TRUE(image.ok()) << image.status();
  for (int i = 0; i < kColumns; ++i) {
    EXPECT_TRUE(Near(BlockMean(*image, kBlock, i * kBlock), kColors[0][i])) << "block " << i;
    EXPECT_TRUE(Near(BlockMean(*image, 0, i * kBlock), kColors[1][i])) << "block " << i;
  }
}

TEST(JpegExif, NoOrMalformedExifMeansUpright) {
  const std::vector<uint8_t> jpeg = EncodeJpeg(StoredPattern(), 95);
  EXPECT_EQ(ReadJpegExifOrientation(jpeg), 1);

  // Out-of-range values, an IFD offset past the end, a bad byte-order mark and a
  // truncated segment are all ignored: the image still decodes, upright.
  std::vector<std::vector<uint8_t>> segments;
  segments.push_back(ExifSegment(0, true));
  segments.push_back(ExifSegment(9, false));
  std::vector<uint8_t> far_ifd = ExifSegment(6, true);
  far_ifd[4 + 6 + 4] = 0xF0;  // IFD0 offset low byte: far past the segment
  segments.push_back(far_ifd);
  std::vector<uint8_t> bad_order = ExifSegment(6, true);
  bad_order[4 + 6] = 'X';
  segments.push_back(bad_order);
  for (const std::vector<uint8_t>& segment : segments) {
    const std::vector<uint8_t> bytes = InsertAfterSoi(jpeg, segment);
    EXPECT_EQ(ReadJpegExifOrientation(bytes), 1);
    absl::StatusOr<RgbImage> image = DecodeImage(bytes);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, kColumns * kBlock);
  }
  // A segment length running past the end of the data.
  std::vector<uint8_t> truncated = InsertAfterSoi(jpeg, ExifSegment(6, true));
  truncated.resize(20);
  EXPECT_EQ(ReadJpegExifOrientation(truncated), 1);
}

TEST(JpegExif, ExifAfterOtherAppSegmentsIsFound) {
  // An XMP-style APP1 and an APP0 before the Exif APP1.
  std::vector<uint8_t> other = {0xFF, 0xE1, 0x00, 0x0A, 'h', 't', 't', 'p', ':', '/', '/', 'x'};
  std::vector<uint8_t> app0 = {0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00};
  std::vector<uint8_t> segment = app0;
  segment.insert(segment.end(), other.begin(), other.end());
  std::vector<uint8_t> exif = ExifSegment(3, false);
  segment.insert(segment.end(), exif.begin(), exif.end());
  const std::vector<uint8_t> bytes = InsertAfterSoi(EncodeJpeg(StoredPattern(), 95), segment);
  EXPECT_EQ(ReadJpegExifOrientation(bytes), 3);
  absl::StatusOr<RgbImage> image = DecodeImage(bytes);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_TRUE(Near(BlockMean(*image, 0, 0), kColors[kRows - 1][kColumns - 1]));
}

TEST(ApplyExifOrientation, ExactPixelsOnATinyImage) {
  // 3x2 stored: a b c / d e f (one byte per pixel shown; all channels equal).
  RgbImage image{3, 2, {}};
  for (uint8_t v : {1, 2, 3, 4, 5, 6}) image.pixels.insert(image.pixels.end(), {v, v, v});
  auto grey = [](const RgbImage& im) {
    std::vector<int> out;
    for (size_t i = 0; i < im.pixels.size(); i += 3) out.push_back(im.pixels[i]);
    return out;
  };
  const std::vector<std::vector<int>> expected = {
      {},
      {1, 2, 3, 4, 5, 6},
      {3, 2, 1, 6, 5, 4},
      {6, 5, 4, 3, 2, 1},
      {4, 5, 6, 1, 2, 3},
      {1, 4, 2, 5, 3, 6},  // transpose
      {4, 1, 5, 2, 6, 3},  // rotate 90 clockwise
      {6, 3, 5, 2, 4, 1},  // transverse
      {3, 6, 2, 5, 1, 4},  // rotate 90 counter-clockwise
  };
  for (int orientation = 1; orientation <= 8; ++orientation) {
    RgbImage out = ApplyExifOrientation(image, orientation);
    EXPECT_EQ(grey(out), expected[orientation]) << "orientation " << orientation;
    EXPECT_EQ(out.width, orientation >= 5 ? 2 : 3);
  }
  EXPECT_EQ(ApplyExifOrientation(image, 0).pixels, image.pixels);
  EXPECT_EQ(ApplyExifOrientation(image, 9).pixels, image.pixels);
}

}  // namespace
}  // namespace moert::vision
