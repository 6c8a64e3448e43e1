// The hot-set file: round trip, stale and malformed files, and the cache's side
// (the most used experts out, preloading them back in up to the budget).
#include "experts/hot_set.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "experts/expert_cache.h"
#include "experts/test_model.h"

namespace moert::experts {
namespace {

using testing::TestModel;

constexpr uint64_t kKiB = 1024;

TEST(HotSet, RoundTrip) {
  const std::string path = testing::TempDir("hot-roundtrip") + "/m.gguf.moert-hot";
  const HotSetModel model{123456, 16, 64};
  const std::vector<HotExpert> experts = {{3, 7, 40}, {0, 63, 12}, {15, 0, 1}};
  ASSERT_TRUE(WriteHotSet(path, model, experts).ok());
  auto read = ReadHotSet(path, model);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, experts);
  // The documented text format.
  std::string text;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) text += line + "\n";
  }
  EXPECT_EQ(text, "moert-hot 1\nmodel 123456 16 64\n3 7 40\n0 63 12\n15 0 1\n");
  EXPECT_EQ(HotSetPath("/x/m.gguf"), "/x/m.gguf.moert-hot");
}

TEST(HotSet, MissingStaleAndMalformed) {
  const std::string dir = testing::TempDir("hot-bad");
  const HotSetModel model{1000, 2, 4};
  EXPECT_EQ(ReadHotSet(dir + "/none", model).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteHotSet(dir + "/h", model, std::vector<HotExpert>{{1, 1, 1}}).ok());
  EXPECT_EQ(ReadHotSet(dir + "/h", HotSetModel{1001, 2, 4}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadHotSet(dir + "/h", HotSetModel{1000, 2, 8}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const auto write = [&](const std::string& text) {
    std::ofstream(dir + "/bad") << text;
    return ReadHotSet(dir + "/bad", model).status();
  };
  absl::Status s = write("moert-hot 2\nmodel 1000 2 4\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("line 1"), std::string::npos) << s;
  s = write("moert-hot 1\nmodel 1000 2 4\n0 1 5\n1 x 2\n");
  EXPECT_NE(s.message().find("line 4"), std::string::npos) << s;
  s = write("moert-hot 1\nmodel 1000 2 4\n2 0 5\n");
  EXPECT_NE(s.message().find("outside the model"), std::string::npos) << s;
}

TEST(HotSet, CacheSavesTheMostUsedAndPreloadsThemUpToTheBudget) {
  const std::string dir = testing::TempDir("hot-cache");
  const TestModel model = testing::WriteTestModel(dir, "m.gguf");
  const std::string path = HotSetPath(model.path);
  const HotSetModel id{model.Directory().file_size(), 2, 4};
  {
    ExpertCacheOptions options;
    options.pool_bytes = 4 * 128 * kKiB;
    auto cache = ExpertCache::Create(model.Directory(), options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const auto use = [&](int layer, int expert, int times) {
      for (int i = 0; i < times; ++i) {
        ASSERT_TRUE((*cache)->Acquire(layer, expert).ok());
        (*cache)->Release(layer, expert);
      }
    };
    use(1, 2, 5);
    use(0, 3, 2);
    use(0, 0, 2);
    use(1, 0, 1);
    const std::vector<HotExpert> hot = (*cache)->HotExperts(3);
    const std::vector<HotExpert> expected = {{1, 2, 5}, {0, 0, 2}, {0, 3, 2}};
    EXPECT_EQ(hot, expected);
    ASSERT_TRUE(WriteHotSet(path, id, (*cache)->HotExperts(100)).ok());
  }
  auto hot = ReadHotSet(path, id);
  ASSERT_TRUE(hot.ok()) << hot.status();
  ASSERT_EQ(hot->size(), 4u);
  // A pool of 3 experts takes the first three and leaves the fourth on disk.
  ExpertCacheOptions options;
  options.pool_bytes = 3 * 128 * kKiB;
  auto cache = ExpertCache::Create(model.Directory(), options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  size_t loaded = 0;
  ASSERT_TRUE((*cache)->Preload(*hot, &loaded).ok());
  EXPECT_EQ(loaded, 3u);
  EXPECT_TRUE((*cache)->IsResident(1, 2));
  EXPECT_TRUE((*cache)->IsResident(0, 0));
  EXPECT_TRUE((*cache)->IsResident(0, 3));
  EXPECT_FALSE((*cache)->IsResident(1, 0));
  ExpertCacheStats s = (*cache)->stats();
  EXPECT_EQ(s.preloads, 3u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.evictions, 0u);
  // The preloaded experts are hits, with the right bytes.
  auto view = (*cache)->Acquire(1, 2);
  ASSERT_TRUE(view.ok());
  const uint64_t bytes = (*cache)->directory().info(1, 2).runtime_bytes;
  EXPECT_EQ(std::vector<uint8_t>(view->gate.data, view->gate.data + bytes),
            model.ExpectedBlock(1, 2));
  (*cache)->Release(1, 2);
  EXPECT_EQ((*cache)->stats().hits, 1u);
  // A failed preload is skipped and reported; the rest still loads.
  auto cache2 = ExpertCache::Create(model.Directory(), options);
  ASSERT_TRUE(cache2.ok());
  (*cache2)->loader().InjectFault(1, 2, LoaderFault::kShortRead);
  absl::Status st = (*cache2)->Preload(*hot, &loaded);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(loaded, 2u);
  EXPECT_FALSE((*cache2)->IsResident(1, 2));
  EXPECT_EQ((*cache2)->stats().used_bytes, 2 * ExpertCache::ChargeBytes(104448));
}

}  // namespace
}  // namespace moert::experts
