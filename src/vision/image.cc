// PNG/JPEG decoding through stb_image (Debian's libstb-dev, header-only here), with
// the checks stb does not do before it allocates: format sniffing, the pixel cap from
// the header, and (PNG) chunk lengths and CRCs. JPEG EXIF orientation is parsed here.
#include "vision/image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

// stb_image's allocations go through these so that tests can see what it asked for.
namespace moert::vision::internal {
namespace {
thread_local size_t stb_peak_allocation = 0;
}  // namespace

void* StbMalloc(size_t size) {
  stb_peak_allocation = std::max(stb_peak_allocation, size);
  return std::malloc(size);
}

void* StbRealloc(void* p, size_t size) {
  stb_peak_allocation = std::max(stb_peak_allocation, size);
  return std::realloc(p, size);
}

size_t StbPeakAllocationBytes() { return stb_peak_allocation; }
void ResetStbPeakAllocation() { stb_peak_allocation = 0; }

}  // namespace moert::vision::internal

// Static functions only (an app linking libmoert.a may have its own stb_image), no
// stdio (files are read below), and only the two formats we accept.
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_MALLOC(size) ::moert::vision::internal::StbMalloc(size)
#define STBI_REALLOC(p, size) ::moert::vision::internal::StbRealloc(p, size)
#define STBI_FREE(p) std::free(p)
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
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace moert::vision {
namespace {

enum class Format { kPng, kJpeg };

constexpr std::array<uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

const char* FormatName(Format format) { return format == Format::kPng ? "PNG" : "JPEG"; }

uint32_t ReadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

uint16_t ReadBe16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }

absl::StatusOr<Format> SniffFormat(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("image data is empty");
  if (bytes.size() >= kPngSignature.size() &&
      std::equal(kPngSignature.begin(), kPngSignature.end(), bytes.begin())) {
    return Format::kPng;
  }
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    return Format::kJpeg;
  }
  size_t n = std::min<size_t>(bytes.size(), 8);
  absl::string_view head(reinterpret_cast<const char*>(bytes.data()), n);
  return absl::InvalidArgumentError(absl::StrCat("not a PNG or JPEG image (", bytes.size(),
                                                 " bytes starting \"", absl::CHexEscape(head),
                                                 "\")"));
}

absl::Status CheckPixelCap(Format format, int64_t width, int64_t height, int64_t max_pixels) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(FormatName(format), " header gives a ", width,
                                                   "x", height, " image: zero width or height"));
  }
  if (width > max_pixels / height) {
    return absl::InvalidArgumentError(absl::StrCat(
        FormatName(format), " image is ", width, "x", height, " = ", width * height,
        " pixels, over the pixel cap of ", max_pixels, " (DecodeOptions::max_pixels)"));
  }
  return absl::OkStatus();
}

// CRC-32 (ISO 3309, as PNG uses), table-driven.
uint32_t Crc32(std::span<const uint8_t> data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string ChunkName(const uint8_t* type) {
  return absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(type), 4));
}

// The IHDR size, when the first chunk is a well-formed IHDR (it must be, except in
// Apple's CgBI PNGs, which stb also reads; those are left to stb's header parse).
bool PngHeaderSize(std::span<const uint8_t> bytes, int64_t* width, int64_t* height) {
  if (bytes.size() < 8 + 8 + 13) return false;
  const uint8_t* chunk = bytes.data() + 8;
  if (ReadBe32(chunk) != 13 || std::memcmp(chunk + 4, "IHDR", 4) != 0) return false;
  *width = ReadBe32(chunk + 8);
  *height = ReadBe32(chunk + 12);
  return true;
}

// Walks the chunks from the signature to IEND: every chunk must fit in the data and
// (verify_crc) carry the right CRC. Bytes after IEND are ignored, as stb does.
absl::Status CheckPngChunks(std::span<const uint8_t> bytes, bool verify_crc) {
  size_t offset = kPngSignature.size();
  const size_t size = bytes.size();
  for (;;) {
    if (size - offset < 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated PNG: the data ends at byte ", size, " before the IEND chunk"));
    }
    const uint8_t* chunk = bytes.data() + offset;
    uint32_t length = ReadBe32(chunk);
    if (length > 0x7FFFFFFFu) {
      return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: chunk '", ChunkName(chunk + 4),
                                                     "' at offset ", offset, " has length ", length,
                                                     " (over 2^31-1)"));
    }
    if (size - offset - 8 < uint64_t{length} + 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "truncated PNG: chunk '", ChunkName(chunk + 4), "' at offset ", offset, " needs ",
          uint64_t{length} + 12, " bytes, only ", size - offset, " remain"));
    }
    if (verify_crc) {
      uint32_t stored = ReadBe32(chunk + 8 + length);
      uint32_t computed = Crc32(std::span<const uint8_t>(chunk + 4, size_t{length} + 4));
      if (stored != computed) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "corrupt PNG: CRC mismatch in chunk '%s' at offset %d (stored %08x, computed %08x)",
            ChunkName(chunk + 4), offset, stored, computed));
      }
    }
    if (std::memcmp(chunk + 4, "IEND", 4) == 0) return absl::OkStatus();
    offset += size_t{length} + 12;
  }
}

// The Orientation value in a TIFF block (the APP1 payload after "Exif\0\0"), or 0.
int TiffOrientation(std::span<const uint8_t> tiff) {
  if (tiff.size() < 8) return 0;
  bool little;
  if (tiff[0] == 'I' && tiff[1] == 'I') {
    little = true;
  } else if (tiff[0] == 'M' && tiff[1] == 'M') {
    little = false;
  } else {
    return 0;
  }
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? uint32_t{tiff[at]} | uint32_t{tiff[at + 1]} << 8
                  : uint32_t{tiff[at]} << 8 | uint32_t{tiff[at + 1]};
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
  };
  if (u16(2) != 42) return 0;
  uint64_t ifd = u32(4);
  if (ifd + 2 > tiff.size()) return 0;
  uint32_t count = u16(static_cast<size_t>(ifd));
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t entry = ifd + 2 + uint64_t{12} * i;
    if (entry + 12 > tiff.size()) return 0;
    size_t e = static_cast<size_t>(entry);
    if (u16(e) != 0x0112) continue;
    uint32_t type = u16(e + 2);
    if (u32(e + 4) < 1) return 0;
    if (type == 3) return static_cast<int>(u16(e + 8));  // SHORT, left-justified
    if (type == 4) return static_cast<int>(std::min<uint32_t>(u32(e + 8), 0xFFFF));  // LONG
    return 0;
  }
  return 0;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  auto errno_error = [&](const char* what, int err) {
    std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_error("cannot open image", errno);
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { ::close(*f); });
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_error("cannot stat image", errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("image '", path, "' is not a regular file"));
  }
  if (st.st_size > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("image '", path, "' is ", st.st_size,
                                                   " bytes; the decoder takes at most ", INT_MAX));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("cannot read image", errno);
    }
    if (n == 0) break;  // The file shrank while we read it; decode what is there.
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace

absl::StatusOr<RgbImage> DecodeImage(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  if (options.max_pixels <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeOptions::max_pixels must be positive, got ", options.max_pixels));
  }
  MOERT_ASSIGN_OR_RETURN(Format format, SniffFormat(bytes));
  if (bytes.size() > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("image data is ", bytes.size(),
                                                   " bytes; the decoder takes at most ", INT_MAX));
  }
  const int length = static_cast<int>(bytes.size());

  if (format == Format::kPng) {
    // The size first: stb's own header parse refuses some large images with only
    // "too large", and the pixel cap should be what the message names.
    int64_t width = 0, height = 0;
    if (PngHeaderSize(bytes, &width, &height)) {
      MOERT_RETURN_IF_ERROR(CheckPixelCap(format, width, height, options.max_pixels));
    }
    MOERT_RETURN_IF_ERROR(CheckPngChunks(bytes, options.verify_png_crc));
  }

  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(bytes.data(), length, &width, &height, &channels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt ", FormatName(format), " header: ", stbi_failure_reason()));
  }
  MOERT_RETURN_IF_ERROR(CheckPixelCap(format, width, height, options.max_pixels));

  std::unique_ptr<stbi_uc, void (*)(void*)> decoded(
      stbi_load_from_memory(bytes.data(), length, &width, &height, &channels, 3), stbi_image_free);
  if (decoded == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt or truncated ", FormatName(format),
                                                   " data: ", stbi_failure_reason()));
  }
  RgbImage image;
  image.width = width;
  image.height = height;
  const uint8_t* begin = decoded.get();
  image.pixels.assign(begin, begin + static_cast<size_t>(width) * static_cast<size_t>(height) * 3);

  if (format == Format::kJpeg && options.apply_exif_orientation) {
    int orientation = ReadJpegExifOrientation(bytes);
    if (orientation != 1) image = ApplyExifOrientation(image, orientation);
  }
  return image;
}

absl::StatusOr<RgbImage> DecodeImageFile(const std::string& path, const DecodeOptions& options) {
  MOERT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  absl::StatusOr<RgbImage> image = DecodeImage(bytes, options);
  if (!image.ok()) {
    return absl::Status(image.status().code(),
                        absl::StrCat("image '", path, "': ", image.status().message()));
  }
  return image;
}

absl::StatusOr<RgbImage> ImageFromRgb8(std::span<const uint8_t> data, int width, int height,
                                       size_t stride_bytes, int64_t max_pixels) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RGB8 image size ", width, "x", height, ": zero or negative"));
  }
  if (max_pixels <= 0 || int64_t{width} > max_pixels / height) {
    return absl::InvalidArgumentError(absl::StrCat("RGB8 image is ", width, "x", height, " = ",
                                                   int64_t{width} * height,
                                                   " pixels, over the pixel cap of ", max_pixels));
  }
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  if (stride_bytes < row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RGB8 stride ", stride_bytes, " bytes is below width * 3 = ", row_bytes));
  }
  if (data.data() == nullptr) return absl::InvalidArgumentError("RGB8 buffer is null");
  const size_t rows_before_last = static_cast<size_t>(height) - 1;
  if (stride_bytes > (SIZE_MAX - row_bytes) / std::max<size_t>(rows_before_last, 1) ||
      data.size() < rows_before_last * stride_bytes + row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RGB8 buffer of ", data.size(), " bytes is too small for ", width, "x", height,
                     " pixels with a stride of ", stride_bytes, " bytes"));
  }
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(row_bytes * static_cast<size_t>(height));
  for (size_t y = 0; y < static_cast<size_t>(height); ++y) {
    std::memcpy(image.pixels.data() + y * row_bytes, data.data() + y * stride_bytes, row_bytes);
  }
  return image;
}

int ReadJpegExifOrientation(std::span<const uint8_t> bytes) {
  if (bytes.size() < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8) return 1;
  size_t at = 2;
  while (at + 4 <= bytes.size()) {
    if (bytes[at] != 0xFF) return 1;  // Not a marker: malformed, give up quietly.
    uint8_t marker = bytes[at + 1];
    if (marker == 0xFF) {  // Fill byte.
      ++at;
      continue;
    }
    if (marker == 0xD9 || marker == 0xDA) return 1;              // EOI, or SOS: metadata is over.
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // No length field.
      at += 2;
      continue;
    }
    size_t length = ReadBe16(bytes.data() + at + 2);
    if (length < 2 || at + 2 + length > bytes.size()) return 1;
    std::span<const uint8_t> payload = bytes.subspan(at + 4, length - 2);
    static constexpr uint8_t kExif[6] = {'E', 'x', 'i', 'f', 0, 0};
    if (marker == 0xE1 && payload.size() >= 6 && std::memcmp(payload.data(), kExif, 6) == 0) {
      int orientation = TiffOrientation(payload.subspan(6));
      return orientation >= 1 && orientation <= 8 ? orientation : 1;
    }
    at += 2 + length;
  }
  return 1;
}

RgbImage ApplyExifOrientation(const RgbImage& image, int orientation) {
  if (orientation < 2 || orientation > 8) return image;
  const int w = image.width;
  const int h = image.height;
  const bool swap = orientation >= 5;
  RgbImage out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.pixels.resize(image.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;  // The stored pixel shown at (x, y).
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          sy = y;
          break;
        case 3:
          sx = w - 1 - x;
          sy = h - 1 - y;
          break;
        case 4:
          sx = x;
          sy = h - 1 - y;
          break;
        case 5:
          sx = y;
          sy = x;
          break;
        case 6:
          sx = y;
          sy = h - 1 - x;
          break;
        case 7:
          sx = w - 1 - y;
          sy = h - 1 - x;
          break;
        case 8:
          sx = w - 1 - y;
          sy = x;
          break;
      }
      const uint8_t* src =
          image.pixels.data() +
          (static_cast<size_t>(sy) * static_cast<size_t>(w) + static_cast<size_t>(sx)) * 3;
      uint8_t* dst =
          out.pixels.data() +
          (static_cast<size_t>(y) * static_cast<size_t>(out.width) + static_cast<size_t>(x)) * 3;
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
  return out;
}

}  // namespace moert::vision
