// A model with an expert pool whose file changes while it is loaded, in each I/O mode:
// truncated in place, replaced by another model through rename, truncated in the
// middle of an expert's read. The next Forward that must read an expert fails with a
// clear Status naming the file (never SIGBUS) and leaves the KV cache as it was; the
// experts already resident still run, bit for bit; once the file is back, every
// expert loads again and the logits are the fully resident ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/file_change.h"
#include "experts/expert_cache.h"
#include "format/gguf.h"
#include "model/decoder.h"
#include "model/expert_pool_util.h"
#include "model/model.h"

namespace moert::model {
namespace {

using pool_test::Prompt;
using pool_test::Reference;
using test_util::FileChange;
using test_util::SameBits;

const std::string kName = "tiny-moe-shakespeare-q4_0.gguf";

class ExpertPoolFileChangeTest : public ::testing::TestWithParam<experts::IoMode> {
 protected:
  void SetUp() override {
    std::string mode(experts::IoModeName(GetParam()));
    dir_ = ::testing::TempDir() + "/moert-pool-change-" + mode + "-" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/m.gguf";
    std::filesystem::copy_file(pool_test::kModels + kName, path_);
    change_ = std::make_unique<FileChange>(path_);
  }
  void TearDown() override {
    model_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The copy loaded with every expert fitting the pool; the file is closed after the
  // load, as the runtime does, so only the expert loader reads it from then on.
  void LoadCopy(std::function<void(const experts::ExpertInfo&)> hook = nullptr) {
    ModelLoadOptions options = pool_test::Options();
    options.expert_pool_fraction = 1.0;
    options.io_mode = GetParam();
    options.expert_cache.loader.before_read_for_testing = std::move(hook);
    auto file = format::GgufFile::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status();
    model_ = pool_test::Load(**file, options);
    ASSERT_NE(model_, nullptr);
    auto kv = model_->NewKvCache(64);
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
  }

  experts::ExpertCache& cache() { return *dynamic_cast<DecoderModel&>(*model_).expert_cache(); }

  // The prompt from position 0: OK and the fully resident logits.
  void ExpectPrefill() {
    kv_->Truncate(0);
    std::vector<float> logits;
    const absl::Status s = model_->Forward(Prompt(), kv_.get(), LogitsFor::kAll, &logits);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameBits(logits, Reference(kName).prefill));
  }

  // The prompt from position 0 fails with `code`, naming the file and saying `says`.
  void ExpectFailure(absl::StatusCode code, const std::string& says) {
    kv_->Truncate(0);
    std::vector<float> logits;
    const absl::Status s = model_->Forward(Prompt(), kv_.get(), LogitsFor::kAll, &logits);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(path_), std::string::npos) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
    EXPECT_EQ(kv_->size(), 0);  // as it was
    EXPECT_EQ(model_->memory_stats().pool.pinned_experts, 0u);
  }

  std::string dir_;
  std::string path_;
  std::unique_ptr<FileChange> change_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
};

TEST_P(ExpertPoolFileChangeTest, TruncatedWhileLoaded) {
  LoadCopy();
  ExpectPrefill();  // every expert the prompt needs is resident from here on
  change_->Truncate(change_->size() / 2);
  ExpectPrefill();  // hits only: the file is not read
  cache().EvictAll();
  ExpectFailure(absl::StatusCode::kFailedPrecondition, "bytes now");
  change_->Restore();
  ExpectPrefill();
}

TEST_P(ExpertPoolFileChangeTest, ReplacedWhileLoaded) {
  LoadCopy();
  ExpectPrefill();
  change_->ReplaceWith(pool_test::kModels + "tiny-moe-shakespeare-q8_0.gguf");
  ExpectPrefill();
  cache().EvictAll();
  ExpectFailure(absl::StatusCode::kFailedPrecondition, "another file");
  change_->Restore();
  ExpectPrefill();
}

TEST_P(ExpertPoolFileChangeTest, TruncatedInTheMiddleOfARead) {
  std::atomic<bool> cut{false};
  // After the loader's check of the file, before its reads, in the first load: the
  // tensor data all lies past the first 4 KiB (the metadata alone is longer).
  LoadCopy([&](const experts::ExpertInfo&) {
    if (!cut.exchange(true)) change_->Truncate(4096);
  });
  ExpectFailure(absl::StatusCode::kDataLoss,
                GetParam() == experts::IoMode::kMmap ? "SIGBUS" : "short read");
  change_->Restore();
  ExpectPrefill();
}

INSTANTIATE_TEST_SUITE_P(Modes, ExpertPoolFileChangeTest,
                         ::testing::Values(experts::IoMode::kDirect, experts::IoMode::kBuffered,
                                           experts::IoMode::kMmap),
                         [](const auto& test) {
                           return std::string(experts::IoModeName(test.param));
                         });

}  // namespace
}  // namespace moert::model
