// The runtime's vision projector and image decoding (see vision.h).
#include "runtime/vision.h"

#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "format/gguf.h"

namespace moert {

Image Image::FromFile(std::string path) {
  Image image;
  image.path = std::move(path);
  return image;
}

Image Image::FromEncoded(std::vector<uint8_t> bytes) {
  Image image;
  image.encoded = std::move(bytes);
  return image;
}

Image Image::FromRgb8(const uint8_t* pixels, int width, int height, size_t stride_bytes) {
  Image image;
  image.width = width;
  image.height = height;
  if (pixels == nullptr || width <= 0 || height <= 0) return image;  // DecodePublicImage says why
  const size_t row = static_cast<size_t>(width) * 3;
  const size_t stride = stride_bytes == 0 ? row : stride_bytes;
  if (stride < row) return image;
  image.rgb.resize(row * static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = pixels + static_cast<size_t>(y) * stride;
    std::copy(src, src + row, image.rgb.begin() + static_cast<std::ptrdiff_t>(row * y));
  }
  return image;
}

namespace runtime {

VisionProjector::~VisionProjector() = default;

absl::StatusOr<std::unique_ptr<VisionProjector>> VisionProjector::Load(const std::string& path,
                                                                       int64_t n_embd,
                                                                       int threads) {
  const auto named = [&](const absl::Status& s) {
    const std::string message(s.message());
    if (message.find(path) != std::string::npos) return s;
    return absl::Status(s.code(), StrCat(path, ": ", message));
  };
  auto file = format::GgufFile::Open(path);
  if (!file.ok()) return named(file.status());
  auto mmproj = vision::LoadMmproj(**file);
  if (!mmproj.ok()) return named(mmproj.status());
  if (mmproj->hparams.resampler_width != n_embd) {
    return absl::InvalidArgumentError(StrCat(
        path, ": the projector's embeddings are ", mmproj->hparams.resampler_width,
        " wide but the language model's n_embd is ", n_embd, " (an mmproj of another model?)"));
  }
  std::unique_ptr<VisionProjector> p(new VisionProjector());
  p->path_ = path;
  p->mmproj_ = std::move(*mmproj);
  p->pool_ = std::make_unique<backend::cpu::ThreadPool>(threads);
  p->backend_ = std::make_unique<backend::cpu::CpuBackend>(*p->pool_);
  p->backend_->set_xnnpack_f32(true);  // the encoder's big fp32 matmuls
  auto encoder = vision::VisionEncoder::Create(p->mmproj_, *p->backend_);
  if (!encoder.ok()) return named(encoder.status());
  p->encoder_ = std::move(*encoder);
  return p;
}

absl::StatusOr<vision::ImageEmbedding> VisionProjector::Embed(const vision::RgbImage& image,
                                                              const vision::EmbedOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  return vision::EmbedImage(*encoder_, image, options);
}

absl::StatusOr<vision::RgbImage> DecodePublicImage(const Image& image) {
  const int set = !image.path.empty() + !image.encoded.empty() +
                  (!image.rgb.empty() || image.width != 0 || image.height != 0);
  if (set != 1) {
    return absl::InvalidArgumentError(
        set == 0 ? "an image needs a path, encoded bytes or RGB8 pixels"
                 : "an image has more than one of path, encoded bytes and RGB8 pixels set");
  }
  if (!image.path.empty()) return vision::DecodeImageFile(image.path);
  if (!image.encoded.empty()) return vision::DecodeImage(image.encoded);
  if (image.width <= 0 || image.height <= 0) {
    return absl::InvalidArgumentError(
        StrCat("an RGB8 image of ", image.width, "x", image.height, " has no pixels"));
  }
  const size_t row = static_cast<size_t>(image.width) * 3;
  if (image.rgb.size() != row * static_cast<size_t>(image.height)) {
    return absl::InvalidArgumentError(StrCat("an RGB8 image of ", image.width, "x", image.height,
                                             " needs ", row * static_cast<size_t>(image.height),
                                             " bytes, got ", image.rgb.size()));
  }
  return vision::ImageFromRgb8(image.rgb, image.width, image.height, row);
}

uint64_t PixelDigest(const vision::RgbImage& image) {
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](uint64_t byte) {
    h ^= byte;
    h *= 1099511628211ull;
  };
  for (int shift = 0; shift < 32; shift += 8) {
    mix((static_cast<uint32_t>(image.width) >> shift) & 0xFF);
    mix((static_cast<uint32_t>(image.height) >> shift) & 0xFF);
  }
  for (uint8_t b : image.pixels) mix(b);
  return h;
}

}  // namespace runtime
}  // namespace moert
