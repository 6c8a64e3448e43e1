// A model file changed under a loader, in each I/O mode: truncated in place, replaced
// by another file through rename, and truncated in the middle of a load (after the
// loader checked the file): each a clear Status naming the file (FailedPrecondition,
// or DataLoss for the change mid-load: a short read, or the mapping's SIGBUS caught),
// never a crash; once the original is back, loads give the same bytes as before.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_change.h"
#include "experts/loader.h"
#include "experts/test_model.h"

namespace moert::experts {
namespace {

using testing::Block;
using testing::TestModel;
using testing::TestModelOptions;
using test_util::FileChange;

class LoaderFileChangeTest : public ::testing::TestWithParam<IoMode> {
 protected:
  void SetUp() override {
    model_ = testing::WriteTestModel(testing::TempDir("change"), "m.gguf");
    TestModelOptions other;
    other.layer_types = {format::GgmlType::kQ4_0, format::GgmlType::kQ4_0};
    other_ = testing::WriteTestModel(testing::TempDir("change-other"), "other.gguf", other);
    dir_ = std::make_unique<ExpertDirectory>(model_.Directory());
    for (int e = 0; e < 4; ++e) want_.push_back(model_.ExpectedBlock(1, e));
  }

  std::unique_ptr<Loader> Open(std::function<void(const ExpertInfo&)> hook = nullptr) {
    LoaderOptions options;
    options.mode = GetParam();
    options.before_read_for_testing = std::move(hook);
    auto loader = Loader::Create(*dir_, options);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  LoadResult Load(Loader& loader, int expert, Block* block) {
    return loader.Wait(loader.Submit(dir_->info(1, expert), block->data, std::nullopt));
  }

  // A load that works and gives the file's bytes.
  void ExpectGood(Loader& loader, int expert) {
    Block block(dir_->info(1, expert).runtime_bytes);
    const LoadResult r = Load(loader, expert, &block);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(block.bytes(), want_[static_cast<size_t>(expert)]);
  }

  // A load that fails with `code` and a message naming the file and holding `says`.
  void ExpectError(Loader& loader, int expert, absl::StatusCode code, const std::string& says) {
    Block block(dir_->info(1, expert).runtime_bytes);
    const LoadResult r = Load(loader, expert, &block);
    ASSERT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.code(), code) << r.status;
    const std::string message(r.status.message());
    EXPECT_NE(message.find(model_.path), std::string::npos) << message;
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_NE(message.find("layer 1, expert " + std::to_string(expert)), std::string::npos)
        << message;
  }

  // Where the experts' bytes begin: cutting the file there takes every one of them.
  uint64_t ExpertsStart() const { return dir_->info(0, 0).parts[0].file_offset; }

  TestModel model_;
  TestModel other_;
  std::unique_ptr<ExpertDirectory> dir_;
  std::vector<std::vector<uint8_t>> want_;
};

TEST_P(LoaderFileChangeTest, TruncatedInPlace) {
  std::unique_ptr<Loader> loader = Open();
  ASSERT_NE(loader, nullptr);
  ExpectGood(*loader, 0);
  const FileChange change(model_.path);
  change.Truncate(ExpertsStart());
  ExpectError(*loader, 2, absl::StatusCode::kFailedPrecondition, "bytes now");
  change.Restore();
  ExpectGood(*loader, 2);
  ExpectGood(*loader, 0);
}

TEST_P(LoaderFileChangeTest, ReplacedByRename) {
  std::unique_ptr<Loader> loader = Open();
  ASSERT_NE(loader, nullptr);
  ExpectGood(*loader, 0);
  const FileChange change(model_.path);
  change.ReplaceWith(other_.path);
  ExpectError(*loader, 3, absl::StatusCode::kFailedPrecondition, "another file");
  change.Restore();
  ExpectGood(*loader, 3);
}

TEST_P(LoaderFileChangeTest, TruncatedInTheMiddleOfALoad) {
  std::atomic<bool> cut{false};
  const FileChange change(model_.path);
  // After the loader's check of the file, before its reads: once.
  std::unique_ptr<Loader> loader = Open([&](const ExpertInfo&) {
    if (!cut.exchange(true)) change.Truncate(ExpertsStart());
  });
  ASSERT_NE(loader, nullptr);
  ExpectError(*loader, 1, absl::StatusCode::kDataLoss,
              GetParam() == IoMode::kMmap ? "SIGBUS" : "short read");
  change.Restore();
  ExpectGood(*loader, 1);
  EXPECT_EQ(loader->stats().failed_loads, 1u);
}

// A model opened by a relative path stays the same file when the process changes its
// working folder.
TEST_P(LoaderFileChangeTest, ARelativePathSurvivesAChangeOfFolder) {
  const std::filesystem::path was = std::filesystem::current_path();
  const std::filesystem::path file(model_.path);
  std::filesystem::current_path(file.parent_path());
  auto relative = format::GgufFile::Open(file.filename().string());
  ASSERT_TRUE(relative.ok()) << relative.status();
  auto dir = ExpertDirectory::Build(**relative, 2, 4, 256, 128);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto loader = Loader::Create(*dir, {.mode = GetParam()});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  Block block(dir->info(1, 2).runtime_bytes);
  const LoadResult r =
      (*loader)->Wait((*loader)->Submit(dir->info(1, 2), block.data, std::nullopt));
  std::filesystem::current_path(was);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(block.bytes(), want_[2]);
}

INSTANTIATE_TEST_SUITE_P(Modes, LoaderFileChangeTest,
                         ::testing::Values(IoMode::kDirect, IoMode::kBuffered, IoMode::kMmap),
                         [](const auto& test) { return std::string(IoModeName(test.param)); });

}  // namespace
}  // namespace moert::experts
