// The oracle tests' shared encodings (oracle_encodings.h).
#include "vision/oracle_encodings.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "format/gguf.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/oracle_files.h"
#include "vision/preprocess.h"

namespace moert::vision::testing {
namespace {

std::unique_ptr<Mmproj>& MmprojSlot() {
  static auto* slot = new std::unique_ptr<Mmproj>();
  return *slot;
}

}  // namespace

const Mmproj* OracleMmproj() {
  std::unique_ptr<Mmproj>& slot = MmprojSlot();
  if (slot != nullptr) return slot.get();
  const OracleFiles& files = GetOracleFiles();
  EXPECT_FALSE(files.mmproj.empty());
  if (files.mmproj.empty()) return nullptr;
  auto file = format::GgufFile::Open(files.mmproj);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  auto mmproj = LoadMmproj(**file);
  EXPECT_TRUE(mmproj.ok()) << mmproj.status();
  if (!mmproj.ok()) return nullptr;
  slot = std::make_unique<Mmproj>(std::move(*mmproj));
  return slot.get();
}

void ReleaseOracleMmproj() { MmprojSlot().reset(); }

const ReferenceEncoding* GetReferenceEncoding(const std::string& name) {
  static auto* cache = new std::map<std::string, ReferenceEncoding>();
  if (auto it = cache->find(name); it != cache->end()) return &it->second;
  const Mmproj* mmproj = OracleMmproj();
  if (mmproj == nullptr) return nullptr;
  backend::cpu::CpuBackend cpu(2);
  auto encoder = VisionEncoder::Create(*mmproj, cpu);
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  if (!encoder.ok()) return nullptr;
  auto image = DecodeImageFile(kOracleDir + name);
  EXPECT_TRUE(image.ok()) << name << ": " << image.status();
  if (!image.ok()) return nullptr;
  auto pre = Preprocess(*image, {mmproj->hparams.image_mean, mmproj->hparams.image_std});
  EXPECT_TRUE(pre.ok()) << name << ": " << pre.status();
  if (!pre.ok()) return nullptr;
  ReferenceEncoding out;
  for (size_t i = 0; i < pre->slices.size(); ++i) {
    std::vector<float> rows, entropy;
    const absl::Status encoded = (*encoder)->EncodeSlice(pre->slices[i], &rows, &entropy);
    EXPECT_TRUE(encoded.ok()) << name << " slice " << i << ": " << encoded;
    if (!encoded.ok()) return nullptr;
    out.rows.push_back(std::move(rows));
    out.entropy.push_back(std::move(entropy));
  }
  return &cache->emplace(name, std::move(out)).first->second;
}

}  // namespace moert::vision::testing
