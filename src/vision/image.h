// Image input for the vision models: PNG and JPEG decoding (stb_image, the decoder
// llama.cpp uses, so the pixels match), EXIF orientation for JPEG, and wrapping an
// already-decoded RGB8 buffer. Every bad input is a Status, never a crash, and an
// image over the pixel cap is refused from its header, before anything is allocated.
#ifndef MOERT_VISION_IMAGE_H_
#define MOERT_VISION_IMAGE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::vision {

// An 8-bit RGB image, rows top to bottom, tightly packed: pixel (x, y) channel c is
// pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;

  uint8_t at(int x, int y, int c) const {
    const size_t i = static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x);
    return pixels[i * 3 + static_cast<size_t>(c)];
  }
};

// 64 megapixels: an 8192x8192 image decodes (192 MiB of RGB), 20000x20000 does not.
inline constexpr int64_t kDefaultMaxPixels = int64_t{64} * 1024 * 1024;

struct DecodeOptions {
  // Images with more than this many pixels (width * height) are refused from their
  // header, before decoding. Must be positive.
  int64_t max_pixels = kDefaultMaxPixels;
  // JPEG only: rotate/flip the decoded pixels as the EXIF Orientation tag says, the
  // way a photo viewer shows them. llama.cpp does not (it feeds the stored pixels),
  // so turn this off to match it on rotated camera photos.
  bool apply_exif_orientation = true;
  // PNG only: check every chunk's CRC-32, so that corrupt bytes are an error rather
  // than wrong pixels. stb_image (and so llama.cpp) does not check them.
  bool verify_png_crc = true;
};

// Decodes a PNG or JPEG file (the format comes from the bytes, not the file name).
// NotFound for a missing file; InvalidArgument for anything wrong with the contents;
// every message names the path.
absl::StatusOr<RgbImage> DecodeImageFile(const std::string& path,
                                         const DecodeOptions& options = {});

// Decodes PNG or JPEG bytes held in memory. Alpha is dropped, grey is replicated to
// RGB, 16-bit PNG is reduced to 8 bits (as stb_image does for llama.cpp).
// InvalidArgument naming what was wrong: not PNG/JPEG, truncated or corrupt data,
// zero width or height, more pixels than options.max_pixels.
absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes,
                                     const DecodeOptions& options = {});

// Copies an already-decoded RGB8 buffer: row y starts at data[y * stride_bytes] and
// holds width * 3 bytes (R, G, B). The buffer must hold at least
// (height - 1) * stride_bytes + width * 3 bytes. InvalidArgument for a null pointer,
// non-positive sizes, a stride below width * 3, a buffer too small, or more pixels
// than max_pixels.
absl::StatusOr<RgbImage> ImageFromRgb8(std::span<const uint8_t> data, int width, int height,
                                       size_t stride_bytes, int64_t max_pixels = kDefaultMaxPixels);

// The EXIF Orientation (tag 0x0112 of IFD0 in the APP1 "Exif" segment) of JPEG
// bytes: 1..8, or 1 when there is none or the Exif data is malformed (a broken
// Exif block never makes an image undecodable). Both TIFF byte orders.
int ReadJpegExifOrientation(std::span<const uint8_t> bytes);

// Applies EXIF orientation 1..8 to stored pixels, giving the displayed image:
// 2 mirror left-right, 3 rotate 180, 4 mirror top-bottom, 5 transpose, 6 rotate 90
// clockwise, 7 transverse, 8 rotate 90 counter-clockwise. 5..8 swap width and
// height. Any other value returns the image unchanged.
RgbImage ApplyExifOrientation(const RgbImage& image, int orientation);

namespace internal {
// The largest single allocation stb_image requested on this thread since the last
// reset, in bytes. Lets tests check that a refused image never reached the decoder.
size_t StbPeakAllocationBytes();
void ResetStbPeakAllocation();
}  // namespace internal

}  // namespace moert::vision

#endif  // MOERT_VISION_IMAGE_H_
