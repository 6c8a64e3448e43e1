// A model that starts inside a bigger file, at an offset that is not page-aligned (an
// uncompressed asset in an APK, loaded by fd): GgufFile::OpenRange gives the same model,
// and its logits equal the model loaded from its own file bit for bit, resident and from
// an expert pool in each I/O mode (the loader's reads add the offset).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <unistd.h>

#include "experts/io_mode.h"
#include "model/expert_pool_util.h"

namespace moert::model {
namespace {

using namespace pool_test;

constexpr char kModel[] = "tiny-moe-shakespeare-q8_0.gguf";
constexpr uint64_t kPrefix = 2 * 4096 + 1001;

class EmbeddedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string((std::filesystem::temp_directory_path() /
                             ("moert_embedded_model." + std::to_string(::getpid())))
                                .string());
    std::ifstream in(kModels + kModel, std::ios::binary);
    const std::string model((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_ = model.size();
    std::ofstream out(*path_, std::ios::binary);
    out << std::string(kPrefix, '\x7f') << model << std::string(3333, '\0');
  }
  static void TearDownTestSuite() {
    std::remove(path_->c_str());
    delete path_;
  }
  static std::string* path_;
  static uint64_t size_;
};
std::string* EmbeddedModelTest::path_ = nullptr;
uint64_t EmbeddedModelTest::size_ = 0;

TEST_F(EmbeddedModelTest, LogitsEqualTheModelsOwnFile) {
  auto file = format::GgufFile::OpenRange(*path_, kPrefix, size_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->file_offset(), kPrefix);
  EXPECT_EQ((*file)->tensors().size(), File(kModel).tensors().size());
  const Generation& reference = Reference(kModel);
  ASSERT_FALSE(reference.decode.empty());

  std::unique_ptr<Model> resident = Load(**file, Options());
  ASSERT_NE(resident, nullptr);
  const Generation got = Generate(*resident);
  EXPECT_TRUE(test_util::SameBits(got.prefill, reference.prefill));
  EXPECT_TRUE(test_util::SameBits(got.decode, reference.decode));

  for (experts::IoMode mode :
       {experts::IoMode::kDirect, experts::IoMode::kBuffered, experts::IoMode::kMmap}) {
    SCOPED_TRACE(std::string(experts::IoModeName(mode)));
    ModelLoadOptions options = Options();
    options.expert_pool_fraction = 0.3;  // most experts are read from the file again
    options.io_mode = mode;
    options.hot_set = false;
    std::unique_ptr<Model> pooled = Load(**file, options);
    ASSERT_NE(pooled, nullptr);
    const Generation streamed = Generate(*pooled);
    EXPECT_TRUE(test_util::SameBits(streamed.prefill, reference.prefill));
    EXPECT_TRUE(test_util::SameBits(streamed.decode, reference.decode));
    EXPECT_EQ(streamed.tokens, reference.tokens);
  }
}

TEST_F(EmbeddedModelTest, TheWrongOffsetIsAClearError) {
  auto file = format::GgufFile::OpenRange(*path_, kPrefix - 1, size_);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(*path_), std::string::npos) << file.status();
  auto past = format::GgufFile::OpenRange(*path_, kPrefix, size_ + 4000);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange) << past.status();
}

}  // namespace
}  // namespace moert::model
