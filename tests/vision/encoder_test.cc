// The image encoder against llama.cpp on the MiniCPM-V 2.6 oracle (../shared/mmproj):
// the mmproj is rebuilt here from SPEC.md (moert-synth's generator), each of the three
// test images is decoded and preprocessed, every slice is encoded on the CPU backend,
// and each slice's embedding matches reference.txt's figures (its sum and sum of
// squares, its first 16 values, tokens 1 and 63) within 1e-4 of its largest |value|.
// Slow (a 330 MB mmproj, 3584-wide resampler matmuls): the x86 step only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu_fallback.h"
#include "backend/registry.h"
#include "format/gguf.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/mmproj.h"
#include "vision/oracle_encodings.h"
#include "vision/oracle_files.h"
#include "vision/preprocess.h"

namespace moert::vision {
namespace {

const std::string kDir = std::string(MOERT_SHARED_DIR) + "/mmproj/";

// reference.txt's figures of one slice's embedding.
struct SliceRef {
  double sum = 0, sumsq = 0;
  std::vector<float> first16, tok1, tok63;
};

std::vector<float> Floats(const std::string& list) {
  std::vector<float> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stof(item));
  return out;
}

// The value after `key=` in `line`, up to the next space.
std::string Field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  if (at == std::string::npos) return "";
  const size_t from = at + key.size() + 1;
  return line.substr(from, line.find(' ', from) - from);
}

// image name -> slice figures, for the f32 mmproj's runs.
std::map<std::string, std::vector<SliceRef>> ReadReference() {
  std::map<std::string, std::vector<SliceRef>> out;
  std::ifstream in(kDir + "reference.txt");
  std::string line, image;
  while (std::getline(in, line)) {
    if (line.rfind("## image=", 0) == 0) {
      image = testing::ImageSection(line, image);
      continue;
    }
    if (image.empty() || line.rfind("slice ", 0) != 0 || line.find(" embd ") == std::string::npos) {
      continue;
    }
    const size_t index = static_cast<size_t>(std::stoi(line.substr(6)));
    std::vector<SliceRef>& slices = out[image];
    if (slices.size() <= index) slices.resize(index + 1);
    SliceRef& s = slices[index];
    if (line.find("sumsq=") != std::string::npos) {
      s.sum = std::stod(Field(line, "sum"));
      s.sumsq = std::stod(Field(line, "sumsq"));
      s.first16 = Floats(Field(line, "first16"));
    } else {
      s.tok1 = Floats(Field(line, "tok1[0:4]"));
      s.tok63 = Floats(Field(line, "tok63[0:4]"));
    }
  }
  return out;
}

class EncoderOracleSlowTest : public ::testing::Test {
 protected:
  // The mmproj and the reference encodings are the binary's (oracle_encodings.h), which
  // the image chat tests reuse; the mmproj's 330 MB go when this suite is done.
  static void SetUpTestSuite() {
    mmproj_ = testing::OracleMmproj();
    ASSERT_NE(mmproj_, nullptr);
  }
  static void TearDownTestSuite() {
    testing::ReleaseOracleMmproj();
    mmproj_ = nullptr;
  }

  static const Mmproj* mmproj_;
};

const Mmproj* EncoderOracleSlowTest::mmproj_ = nullptr;

TEST_F(EncoderOracleSlowTest, TheOracleLoads) {
  ASSERT_NE(mmproj_, nullptr);
  const MmprojHparams& h = mmproj_->hparams;
  EXPECT_EQ(h.minicpmv_version, 3);
  EXPECT_EQ(h.n_query, 64);
  EXPECT_EQ(h.resampler_width, 3584);
  EXPECT_EQ(h.n_embd, 64);
  EXPECT_EQ(h.n_ff, 128);
  EXPECT_EQ(h.n_head, 2);
  EXPECT_EQ(h.n_layer, 2);
  EXPECT_FLOAT_EQ(h.eps, 1e-6f);
  EXPECT_EQ(mmproj_->patch_embd.cols, 3 * 14 * 14);
  EXPECT_EQ(mmproj_->position_embd.rows, 4900);
  EXPECT_EQ(mmproj_->layers[1].fc1.rows, 128);  // ffn_down is fc1: D to F
  EXPECT_EQ(mmproj_->resampler.kv.rows, 3584);
  // SPEC.md's worked example: v.patch_embd.weight element 0 (kx 0, ky 0, c 0, o 0).
  EXPECT_EQ(mmproj_->patch_embd.data[0], -0.011717407f);
}

TEST_F(EncoderOracleSlowTest, EverySliceMatchesLlamaCpp) {
  ASSERT_NE(mmproj_, nullptr);
  const auto reference = ReadReference();
  ASSERT_EQ(reference.size(), 3u) << "reference.txt's f32 runs";
  for (const auto& [name, slices] : reference) {
    const testing::ReferenceEncoding* encoded = testing::GetReferenceEncoding(name);
    ASSERT_NE(encoded, nullptr) << name;
    ASSERT_EQ(encoded->rows.size(), slices.size()) << name;
    for (size_t i = 0; i < slices.size(); ++i) {
      const std::string what = name + " slice " + std::to_string(i);
      const std::vector<float>& e = encoded->rows[i];
      ASSERT_EQ(e.size(), size_t{64} * 3584) << what;
      float max = 0;
      double sum = 0, sumsq = 0;
      for (float v : e) {
        max = std::max(max, std::fabs(v));
        sum += v;
        sumsq += static_cast<double>(v) * v;
      }
      const double tol = 1e-4 * max;
      const SliceRef& r = slices[i];
      ASSERT_EQ(r.first16.size(), 16u) << what;
      for (size_t j = 0; j < 16; ++j) EXPECT_NEAR(e[j], r.first16[j], tol) << what << " value " << j;
      for (size_t j = 0; j < 4; ++j) {
        EXPECT_NEAR(e[3584 + j], r.tok1[j], tol) << what << " token 1 value " << j;
        EXPECT_NEAR(e[63 * 3584 + j], r.tok63[j], tol) << what << " token 63 value " << j;
      }
      // The sum of 229,376 values whose errors are independent: the bound times sqrt(n).
      EXPECT_NEAR(sum, r.sum, tol * std::sqrt(static_cast<double>(e.size()))) << what;
      EXPECT_NEAR(sumsq, r.sumsq, 1e-5 * r.sumsq) << what;
      std::printf("%s: max |v| %.4f, sum %.6f (llama.cpp %.6f), sumsq %.4f (%.4f)\n", what.c_str(),
                  max, sum, r.sum, sumsq, r.sumsq);
    }
  }
}

TEST_F(EncoderOracleSlowTest, ASliceThatIsNotWholePatchesIsRefused) {
  ASSERT_NE(mmproj_, nullptr);
  backend::cpu::CpuBackend cpu(1);
  auto encoder = VisionEncoder::Create(*mmproj_, cpu);
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  Slice bad;
  bad.width = 15;
  bad.height = 14;
  bad.patches_w = 1;
  bad.patches_h = 1;
  bad.pixels.assign(15 * 14 * 3, 0.0f);
  std::vector<float> out;
  EXPECT_EQ((*encoder)->EncodeSlice(bad, &out).code(), absl::StatusCode::kInvalidArgument);
  Slice short_pixels;
  short_pixels.width = short_pixels.height = 14;
  short_pixels.patches_w = short_pixels.patches_h = 1;
  short_pixels.pixels.assign(10, 0.0f);
  EXPECT_EQ((*encoder)->EncodeSlice(short_pixels, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SincosPositions, AreTheColumnThenTheRowsSinesAndCosines) {
  const std::vector<float> p = VisionEncoder::SincosPositions(3, 2, 16);  // quarter 4
  ASSERT_EQ(p.size(), size_t{6 * 16});
  // Token 5 = row 1, col 2; d = 1: omega = 10000^(-1/4) = 0.1.
  const float* t = p.data() + 5 * 16;
  EXPECT_NEAR(t[1], std::sin(2 * 0.1f), 1e-6);
  EXPECT_NEAR(t[4 + 1], std::cos(2 * 0.1f), 1e-6);
  EXPECT_NEAR(t[8 + 1], std::sin(1 * 0.1f), 1e-6);
  EXPECT_NEAR(t[12 + 1], std::cos(1 * 0.1f), 1e-6);
  EXPECT_EQ(p[0], 0.0f);  // token 0, d 0: sin(0)
  EXPECT_EQ(p[4], 1.0f);  // cos(0)
}

// The same encoder over the OpenCL backend (PoCL here; the ops OpenCL lacks run on the
// CPU through CpuFallbackBackend): test_small.png's slice within 1e-4 of the largest
// |value| of the CPU's embedding, and the same pruning entropies to 1e-4.
TEST_F(EncoderOracleSlowTest, OpenClEncodesAsTheCpuDoes) {
  backend::BackendOptions options;
  options.allow_cpu_device = true;
  auto device = backend::CreateBackend("opencl", options);
  if (!device.ok()) GTEST_SKIP() << "no OpenCL device: " << device.status();
  backend::cpu::CpuBackend cpu(2);
  backend::CpuFallbackBackend opencl(std::move(*device), cpu);
  auto on_device = VisionEncoder::Create(*mmproj_, opencl);
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  auto image = DecodeImageFile(kDir + "test_small.png");
  ASSERT_TRUE(image.ok());
  const MmprojHparams& h = mmproj_->hparams;
  auto pre = Preprocess(*image, {h.image_mean, h.image_std});
  ASSERT_TRUE(pre.ok());
  std::vector<float> got, got_entropy;
  ASSERT_TRUE((*on_device)->EncodeSlice(pre->slices[0], &got, &got_entropy).ok());
  // The CPU's encoding of the same slice, as EverySliceMatchesLlamaCpp checked it.
  const testing::ReferenceEncoding* on_cpu = testing::GetReferenceEncoding("test_small.png");
  ASSERT_NE(on_cpu, nullptr);
  const std::vector<float>& want = on_cpu->rows[0];
  const std::vector<float>& want_entropy = on_cpu->entropy[0];
  ASSERT_EQ(got.size(), want.size());
  float max_abs = 0;
  for (float v : want) max_abs = std::max(max_abs, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f * max_abs) << "value " << i;
  }
  ASSERT_EQ(got_entropy.size(), want_entropy.size());
  for (size_t i = 0; i < got_entropy.size(); ++i) {
    EXPECT_NEAR(got_entropy[i], want_entropy[i], 1e-4f) << "token " << i;
  }
}

}  // namespace
}  // namespace moert::vision
