// Tests of vision/image.h: the shared PNGs decode to llama.cpp's pixels (sizes and
// u8 sums of reference.txt), and every kind of bad input is a Status naming what
// was wrong: truncated and corrupt PNGs, non-images, 0x0 and oversized headers
// (refused before stb allocates), missing files, bad RGB8 buffers.
#include "vision/image.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "vision/test_images.h"

namespace moert::vision {
namespace {

using testing::EncodeJpeg;
using testing::EncodePng;
using testing::EncodePngChannels;
using ::testing::HasSubstr;
using testing::MmprojPath;
using testing::PngChunk;
using testing::PngWithHeader;
using testing::ReadBytes;
using testing::TempPath;
using testing::WriteBytes;

struct ReferenceImage {
  const char* name;
  int width;
  int height;
  uint64_t u8_sum;
  uint8_t first8[8];
};

// reference.txt: "image=... width=... height=..." and "image u8 RGB sum=... first8=...".
constexpr ReferenceImage kReferenceImages[] = {
    {"test.png", 640, 480, 112630509, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"test_small.png", 200, 150, 10356795, {0, 0, 0, 1, 0, 0, 2, 0}},
    {"test_wide.png", 1200, 400, 184156462, {0, 0, 0, 0, 0, 0, 0, 0}},
};

TEST(DecodeImage, SharedPngsMatchLlamaCppPixels) {
  for (const ReferenceImage& ref : kReferenceImages) {
    SCOPED_TRACE(ref.name);
    absl::StatusOr<RgbImage> image = DecodeImageFile(MmprojPath(ref.name));
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, ref.width);
    EXPECT_EQ(image->height, ref.height);
    ASSERT_EQ(image->pixels.size(), static_cast<size_t>(ref.width) * ref.height * 3);
    uint64_t sum = std::accumulate(image->pixels.begin(), image->pixels.end(), uint64_t{0});
    EXPECT_EQ(sum, ref.u8_sum);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(image->pixels[i], ref.first8[i]) << "byte " << i;

    // The same bytes from memory decode identically.
    absl::StatusOr<RgbImage> from_memory = DecodeImage(ReadBytes(MmprojPath(ref.name)));
    ASSERT_TRUE(from_memory.ok()) << from_memory.status();
    EXPECT_EQ(from_memory->pixels, image->pixels);
  }
}

TEST(DecodeImage, PixelCapIsSettable) {
  const std::vector<uint8_t> bytes = ReadBytes(MmprojPath("test_small.png"));
  DecodeOptions options;
  options.max_pixels = 200 * 150;
  EXPECT_TRUE(DecodeImage(bytes, options).ok());
  options.max_pixels = 200 * 150 - 1;
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, options);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("pixel cap of 29999"));
  options.max_pixels = 0;
  EXPECT_FALSE(DecodeImage(bytes, options).ok());
}

TEST(DecodeImage, AlphaIsDroppedAndGreyReplicated) {
  // 2x1 RGBA: the alpha bytes (7, 200) must not show up.
  absl::StatusOr<RgbImage> rgba =
      DecodeImage(EncodePngChannels(2, 1, 4, {10, 20, 30, 7, 40, 50, 60, 200}));
  ASSERT_TRUE(rgba.ok()) << rgba.status();
  EXPECT_EQ(rgba->pixels, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
  absl::StatusOr<RgbImage> grey = DecodeImage(EncodePngChannels(2, 1, 1, {17, 99}));
  ASSERT_TRUE(grey.ok()) << grey.status();
  EXPECT_EQ(grey->pixels, (std::vector<uint8_t>{17, 17, 17, 99, 99, 99}));
}

TEST(DecodeImage, OneByOnePngDecodes) {
  RgbImage one{1, 1, {12, 34, 56}};
  absl::StatusOr<RgbImage> image = DecodeImage(EncodePng(one));
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 1);
  EXPECT_EQ(image->height, 1);
  EXPECT_EQ(image->pixels, one.pixels);
}

TEST(DecodeImage, EveryTruncatedPngIsAnError) {
  const std::vector<uint8_t> bytes = ReadBytes(MmprojPath("test_small.png"));
  ASSERT_GT(bytes.size(), 1000u);
  std::vector<size_t> cuts = {0,
                              1,
                              7,
                              8,
                              9,
                              16,
                              32,
                              33,
                              34,
                              40,
                              100,
                              bytes.size() / 2,
                              bytes.size() - 13,
                              bytes.size() - 12,
                              bytes.size() - 4,
                              bytes.size() - 1};
  for (size_t cut = 200; cut < bytes.size(); cut += 997) cuts.push_back(cut);
  for (bool verify_crc : {true, false}) {
    DecodeOptions options;
    options.verify_png_crc = verify_crc;
    for (size_t cut : cuts) {
      SCOPED_TRACE(::testing::Message() << "prefix of " << cut << " bytes, crc " << verify_crc);
      absl::StatusOr<RgbImage> image =
          DecodeImage(std::span<const uint8_t>(bytes.data(), cut), options);
      ASSERT_FALSE(image.ok());
      EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
      if (cut >= 8) {
        EXPECT_THAT(image.status().message(), HasSubstr("truncated PNG"));
      }
    }
  }
}

// Offset of the first IDAT chunk's data in a PNG.
size_t FirstIdatData(const std::vector<uint8_t>& png) {
  for (size_t at = 8; at + 8 <= png.size();) {
    uint32_t length = (uint32_t{png[at]} << 24) | (uint32_t{png[at + 1]} << 16) |
                      (uint32_t{png[at + 2]} << 8) | png[at + 3];
    if (std::string(png.begin() + at + 4, png.begin() + at + 8) == "IDAT") return at + 8;
    at += 12 + length;
  }
  return 0;
}

TEST(DecodeImage, CorruptIdatIsAnError) {
  const std::vector<uint8_t> bytes = ReadBytes(MmprojPath("test_small.png"));
  const size_t idat = FirstIdatData(bytes);
  ASSERT_GT(idat, 0u);
  for (size_t offset : {size_t{0}, size_t{2}, size_t{100}, size_t{5000}}) {
    SCOPED_TRACE(::testing::Message() << "IDAT byte " << offset);
    std::vector<uint8_t> corrupt = bytes;
    for (size_t i = 0; i < 16; ++i) corrupt[idat + offset + i] ^= 0x5A;
    absl::StatusOr<RgbImage> image = DecodeImage(corrupt);
    ASSERT_FALSE(image.ok());
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr("CRC mismatch in chunk 'IDAT'"));

    // Without the CRC check stb sees the corrupt deflate stream: an error or (where
    // the damage still inflates) wrong pixels of the right size, never a crash.
    DecodeOptions no_crc;
    no_crc.verify_png_crc = false;
    absl::StatusOr<RgbImage> unchecked = DecodeImage(corrupt, no_crc);
    if (unchecked.ok()) {
      EXPECT_EQ(unchecked->pixels.size(), size_t{200} * 150 * 3);
    } else {
      EXPECT_THAT(unchecked.status().message(), HasSubstr("corrupt or truncated PNG data"));
    }
  }
}

TEST(DecodeImage, GarbageDeflateWithGoodCrcIsAnError) {
  // A well-formed chunk structure around an IDAT that is not a zlib stream.
  std::vector<uint8_t> png = PngWithHeader(4, 4, 2, std::vector<uint8_t>(40, 0xFF));
  absl::StatusOr<RgbImage> image = DecodeImage(png);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("corrupt or truncated PNG data"));
}

TEST(DecodeImage, TextFileNamedPngIsRejected) {
  const std::string path = TempPath("not_an_image.png");
  WriteBytes(path, "hello, this is text\n");
  absl::StatusOr<RgbImage> image = DecodeImageFile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("not a PNG or JPEG image"));
  EXPECT_THAT(image.status().message(), HasSubstr(path));
  EXPECT_THAT(image.status().message(), HasSubstr("hello, t"));
}

TEST(DecodeImage, EmptyFileIsRejected) {
  const std::string path = TempPath("empty.png");
  WriteBytes(path, "");
  absl::StatusOr<RgbImage> image = DecodeImageFile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(image.ok());
  EXPECT_THAT(image.status().message(), HasSubstr("empty"));
}

TEST(DecodeImage, ZeroByZeroHeaderIsRejected) {
  for (auto [w, h] : {std::pair{0u, 0u}, std::pair{0u, 5u}, std::pair{5u, 0u}}) {
    absl::StatusOr<RgbImage> image = DecodeImage(PngWithHeader(w, h, 2));
    ASSERT_FALSE(image.ok());
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr("zero width or height"));
  }
}

// SOI + a baseline SOF0 for a width x height 3-component JPEG, and nothing more.
std::vector<uint8_t> JpegHeader(int width, int height) {
  return {0xFF,
          0xD8,
          0xFF,
          0xC0,
          0,
          17,
          8,
          static_cast<uint8_t>(height >> 8),
          static_cast<uint8_t>(height),
          static_cast<uint8_t>(width >> 8),
          static_cast<uint8_t>(width),
          3,
          1,
          0x22,
          0,
          2,
          0x11,
          1,
          3,
          0x11,
          1};
}

TEST(DecodeImage, HugeHeaderIsRefusedBeforeDecoding) {
  // 20000x20000 RGB and grey PNG headers, a 20000x20000 JPEG frame header: refused
  // by the pixel cap, and stb_image never gets to allocate the pixels.
  const std::vector<std::vector<uint8_t>> headers = {
      PngWithHeader(20000, 20000, 2), PngWithHeader(20000, 20000, 0), JpegHeader(20000, 20000)};
  for (const std::vector<uint8_t>& bytes : headers) {
    internal::ResetStbPeakAllocation();
    absl::StatusOr<RgbImage> image = DecodeImage(bytes);
    ASSERT_FALSE(image.ok());
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr("20000x20000 = 400000000 pixels"));
    EXPECT_THAT(image.status().message(), HasSubstr("pixel cap"));
    // At most the JPEG header parser's own state, nothing near 1.2 GB.
    EXPECT_LT(internal::StbPeakAllocationBytes(), size_t{1} << 20);
  }
}

TEST(DecodeImage, StbPeakAllocationSeesARealDecode) {
  // The allocation probe itself works: a real decode asks for at least the pixels.
  internal::ResetStbPeakAllocation();
  ASSERT_TRUE(DecodeImage(ReadBytes(MmprojPath("test_small.png"))).ok());
  EXPECT_GE(internal::StbPeakAllocationBytes(), size_t{200} * 150 * 3);
}

TEST(DecodeImage, TruncatedJpegIsAnError) {
  RgbImage pattern{16, 16, std::vector<uint8_t>(16 * 16 * 3)};
  for (size_t i = 0; i < pattern.pixels.size(); ++i)
    pattern.pixels[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> jpeg = EncodeJpeg(pattern, 90);
  ASSERT_TRUE(DecodeImage(jpeg).ok());
  for (size_t cut : {size_t{3}, size_t{10}, size_t{100}, jpeg.size() / 2, jpeg.size() - 2}) {
    SCOPED_TRACE(::testing::Message() << "prefix of " << cut << " of " << jpeg.size() << " bytes");
    absl::StatusOr<RgbImage> image = DecodeImage(std::span<const uint8_t>(jpeg.data(), cut));
    ASSERT_FALSE(image.ok());
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr("JPEG"));
  }
}

TEST(DecodeImageFile, MissingFileIsNotFound) {
  absl::StatusOr<RgbImage> image = DecodeImageFile("/nonexistent/moert/picture.png");
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(image.status().message(), HasSubstr("/nonexistent/moert/picture.png"));
}

TEST(DecodeImageFile, DirectoryIsRejected) {
  absl::StatusOr<RgbImage> image = DecodeImageFile(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(image.status().message(), HasSubstr("not a regular file"));
}

TEST(ImageFromRgb8, CopiesRowsWithStride) {
  // 2x2 with a stride of 8 (2 padding bytes per row, which must not be copied).
  const std::vector<uint8_t> buffer = {1, 2, 3, 4, 5, 6, 99, 99, 7, 8, 9, 10, 11, 12};
  absl::StatusOr<RgbImage> image = ImageFromRgb8(buffer, 2, 2, 8);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 2);
  EXPECT_EQ(image->height, 2);
  EXPECT_EQ(image->pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(image->at(1, 1, 2), 12);
}

TEST(ImageFromRgb8, BadSizesAreErrors) {
  const std::vector<uint8_t> buffer(100);
  struct Case {
    int width, height;
    size_t stride, size;
    const char* message;
  } cases[] = {
      {0, 2, 6, 100, "zero or negative"},
      {2, -1, 6, 100, "zero or negative"},
      {2, 2, 5, 100, "stride 5 bytes is below width * 3 = 6"},
      {4, 4, 12, 47, "buffer of 47 bytes is too small"},
      {2, 2, SIZE_MAX / 2, 100, "too small"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    absl::StatusOr<RgbImage> image =
        ImageFromRgb8(std::span<const uint8_t>(buffer.data(), c.size), c.width, c.height, c.stride);
    ASSERT_FALSE(image.ok());
    EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(image.status().message(), HasSubstr(c.message));
  }
  // Exactly (height - 1) * stride + width * 3 bytes is enough.
  EXPECT_TRUE(ImageFromRgb8(std::span<const uint8_t>(buffer.data(), 3 * 12 + 12), 4, 4, 12).ok());
  EXPECT_FALSE(ImageFromRgb8({}, 1, 1, 3).ok());
  absl::StatusOr<RgbImage> capped = ImageFromRgb8(buffer, 3, 3, 9, /*max_pixels=*/8);
  ASSERT_FALSE(capped.ok());
  EXPECT_THAT(capped.status().message(), HasSubstr("pixel cap of 8"));
}

}  // namespace
}  // namespace moert::vision
