// Helpers for the vision tests: reading the shared test images, encoding small PNGs
// and JPEGs with stb_image_write, hand-built PNG chunks and JPEG EXIF segments.
#ifndef MOERT_TESTS_VISION_TEST_IMAGES_H_
#define MOERT_TESTS_VISION_TEST_IMAGES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vision/image.h"

namespace moert::vision::testing {

// ../shared/mmproj/<name>.
std::string MmprojPath(const std::string& name);

// The whole file; fails the test (and returns empty) when it cannot be read.
std::vector<uint8_t> ReadBytes(const std::string& path);

// A unique path in the temp folder, for files a test writes.
std::string TempPath(const std::string& name);
void WriteBytes(const std::string& path, std::string_view bytes);

// stb_image_write encodings of `image`.
std::vector<uint8_t> EncodePng(const RgbImage& image);
std::vector<uint8_t> EncodePngChannels(int width, int height, int channels,
                                       const std::vector<uint8_t>& pixels);
std::vector<uint8_t> EncodeJpeg(const RgbImage& image, int quality);

uint32_t Crc32(const uint8_t* data, size_t size);

// One PNG chunk: big-endian length, type, data, CRC-32.
std::vector<uint8_t> PngChunk(std::string_view type, const std::vector<uint8_t>& data);
// Signature + IHDR (8-bit, `color_type`) + one IDAT with `idat` + IEND.
std::vector<uint8_t> PngWithHeader(uint32_t width, uint32_t height, uint8_t color_type,
                                   const std::vector<uint8_t>& idat = {});

// An APP1 Exif segment whose IFD0 holds Orientation = `orientation`, in little-
// (II) or big-endian (MM) TIFF order, after an unrelated tag (ImageWidth).
std::vector<uint8_t> ExifSegment(int orientation, bool little_endian);
// `jpeg` with `segment` inserted right after SOI.
std::vector<uint8_t> InsertAfterSoi(const std::vector<uint8_t>& jpeg,
                                    const std::vector<uint8_t>& segment);

}  // namespace moert::vision::testing

#endif  // MOERT_TESTS_VISION_TEST_IMAGES_H_
