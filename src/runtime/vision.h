// The runtime's side of image input: a loaded vision projector (the mmproj's encoder
// on its own CPU backend), decoding the public Image, and the cache key that lets a
// conversation re-render an image it already encoded.
#ifndef MOERT_RUNTIME_VISION_H_
#define MOERT_RUNTIME_VISION_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "moert/runtime.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/image_embedding.h"
#include "vision/mmproj.h"

namespace moert::runtime {

class VisionProjector {
 public:
  // The projector in `path` for a language model of width n_embd; errors name the file.
  static absl::StatusOr<std::unique_ptr<VisionProjector>> Load(const std::string& path,
                                                               int64_t n_embd, int threads);
  ~VisionProjector();

  const std::string& path() const { return path_; }
  const vision::MmprojHparams& hparams() const { return mmproj_.hparams; }

  // Encodes one image (callers on several threads take turns).
  absl::StatusOr<vision::ImageEmbedding> Embed(const vision::RgbImage& image,
                                               const vision::EmbedOptions& options);

 private:
  VisionProjector() = default;

  std::string path_;
  vision::Mmproj mmproj_;
  std::unique_ptr<backend::cpu::ThreadPool> pool_;
  std::unique_ptr<backend::cpu::CpuBackend> backend_;
  std::unique_ptr<vision::VisionEncoder> encoder_;
  std::mutex mutex_;
};

// A public Image's pixels; InvalidArgument naming what is wrong (none or several of
// path, encoded and rgb set, a bad file or buffer), NotFound for a missing file.
absl::StatusOr<vision::RgbImage> DecodePublicImage(const Image& image);

// A 64-bit digest of decoded pixels (FNV-1a over the size and the bytes).
uint64_t PixelDigest(const vision::RgbImage& image);

}  // namespace moert::runtime

#endif  // MOERT_RUNTIME_VISION_H_
