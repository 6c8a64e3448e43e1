// Test image builders; the one place the test binary compiles stb_image_write.
#include "vision/test_images.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#pragma GCC diagnostic push
// stb is not clean under our warning flags (old-style casts, unused static functions
// seen with GCC 12 and clang; the rest are its known ones): silence it alone.
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wcast-align"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace moert::vision::testing {
namespace {

void AppendToVector(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

void PutBe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void Put16(std::vector<uint8_t>& out, uint32_t v, bool little) {
  if (little) {
    out.push_back(static_cast<uint8_t>(v));
    out.push_back(static_cast<uint8_t>(v >> 8));
  } else {
    out.push_back(static_cast<uint8_t>(v >> 8));
    out.push_back(static_cast<uint8_t>(v));
  }
}

void Put32(std::vector<uint8_t>& out, uint32_t v, bool little) {
  if (little) {
    Put16(out, v & 0xFFFF, true);
    Put16(out, v >> 16, true);
  } else {
    Put16(out, v >> 16, false);
    Put16(out, v & 0xFFFF, false);
  }
}

}  // namespace

std::string MmprojPath(const std::string& name) {
  return std::string(MOERT_SHARED_DIR) + "/mmproj/" + name;
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
           std::to_string(::getpid()) + "_" + name))
      .string();
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

std::vector<uint8_t> EncodePngChannels(int width, int height, int channels,
                                       const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  EXPECT_TRUE(stbi_write_png_to_func(AppendToVector, &out, width, height, channels, pixels.data(),
                                     width * channels));
  return out;
}

std::vector<uint8_t> EncodePng(const RgbImage& image) {
  return EncodePngChannels(image.width, image.height, 3, image.pixels);
}

std::vector<uint8_t> EncodeJpeg(const RgbImage& image, int quality) {
  std::vector<uint8_t> out;
  EXPECT_TRUE(stbi_write_jpg_to_func(AppendToVector, &out, image.width, image.height, 3,
                                     image.pixels.data(), quality));
  return out;
}

uint32_t Crc32(const uint8_t* data, size_t size) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    c ^= data[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

std::vector<uint8_t> PngChunk(std::string_view type, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  PutBe32(out, static_cast<uint32_t>(data.size()));
  out.insert(out.end(), type.begin(), type.end());
  out.insert(out.end(), data.begin(), data.end());
  PutBe32(out, Crc32(out.data() + 4, out.size() - 4));
  return out;
}

std::vector<uint8_t> PngWithHeader(uint32_t width, uint32_t height, uint8_t color_type,
                                   const std::vector<uint8_t>& idat) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  PutBe32(ihdr, width);
  PutBe32(ihdr, height);
  ihdr.insert(ihdr.end(), {8, color_type, 0, 0, 0});
  for (const auto& chunk : {PngChunk("IHDR", ihdr), PngChunk("IDAT", idat), PngChunk("IEND", {})}) {
    png.insert(png.end(), chunk.begin(), chunk.end());
  }
  return png;
}

std::vector<uint8_t> ExifSegment(int orientation, bool little_endian) {
  std::vector<uint8_t> tiff;
  tiff.push_back(little_endian ? 'I' : 'M');
  tiff.push_back(little_endian ? 'I' : 'M');
  Put16(tiff, 42, little_endian);
  Put32(tiff, 8, little_endian);  // IFD0 right after the header
  Put16(tiff, 2, little_endian);  // two entries
  // ImageWidth (0x0100), LONG, 1, 1234: something to skip over.
  Put16(tiff, 0x0100, little_endian);
  Put16(tiff, 4, little_endian);
  Put32(tiff, 1, little_endian);
  Put32(tiff, 1234, little_endian);
  // Orientation (0x0112), SHORT, 1: the value sits in the first two bytes.
  Put16(tiff, 0x0112, little_endian);
  Put16(tiff, 3, little_endian);
  Put32(tiff, 1, little_endian);
  Put16(tiff, static_cast<uint32_t>(orientation), little_endian);
  Put16(tiff, 0, little_endian);
  Put32(tiff, 0, little_endian);  // no IFD1

  std::vector<uint8_t> segment = {0xFF, 0xE1};
  const size_t length = 2 + 6 + tiff.size();
  segment.push_back(static_cast<uint8_t>(length >> 8));
  segment.push_back(static_cast<uint8_t>(length));
  segment.insert(segment.end(), {'E', 'x', 'i', 'f', 0, 0});
  segment.insert(segment.end(), tiff.begin(), tiff.end());
  return segment;
}

std::vector<uint8_t> InsertAfterSoi(const std::vector<uint8_t>& jpeg,
                                    const std::vector<uint8_t>& segment) {
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);
  out.insert(out.end(), segment.begin(), segment.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

}  // namespace moert::vision::testing
