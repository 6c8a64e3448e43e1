// The loader's read engines on their own: a batch of many chunk reads at any depth
// gives each chunk its bytes and its result: whole, short where the file ends, 0 past
// it, -errno on a bad descriptor, and tells the caller of each as it finishes; the
// io_uring engine skips by name where the kernel refuses a ring.
#include "experts/read_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/strings.h"
#include "experts/test_model.h"

namespace moert::experts {
namespace {

struct EngineDepth {
  IoEngine engine;
  unsigned depth;
};

class ReadEngineTest : public ::testing::TestWithParam<EngineDepth> {};

TEST_P(ReadEngineTest, EveryChunkGetsItsBytesAndResult) {
  OpenedReadEngine opened = OpenReadEngine(GetParam().engine, GetParam().depth);
  ASSERT_NE(opened.engine, nullptr);
  if (opened.engine->kind() != GetParam().engine) {
    GTEST_SKIP() << "io_uring unavailable: " << opened.fallback_reason;
  }
  EXPECT_EQ(opened.fallback_reason, "");
  EXPECT_EQ(opened.engine->depth(), GetParam().depth);

  constexpr uint64_t kFileBytes = 1 << 20;
  std::vector<uint8_t> content(kFileBytes);
  std::mt19937 rng(7);
  for (uint8_t& b : content) b = static_cast<uint8_t>(rng());
  const std::string path = testing::TempDir("read-engine") + "/data.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(content.data()), kFileBytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);

  // 300 chunks inside the file at odd offsets and lengths, one that runs past its end,
  // one wholly past it, one on a closed descriptor.
  std::vector<ChunkRead> chunks;
  std::vector<std::vector<uint8_t>> buffers;
  std::uniform_int_distribution<uint64_t> length(1, 20000);
  for (int i = 0; i < 300; ++i) {
    const uint64_t n = length(rng);
    const uint64_t at = std::uniform_int_distribution<uint64_t>(0, kFileBytes - n)(rng);
    chunks.push_back({.fd = fd, .want = n, .need = n, .offset = at});
  }
  chunks.push_back({.fd = fd, .want = 8192, .need = 8192, .offset = kFileBytes - 1000});
  chunks.push_back({.fd = fd, .want = 4096, .need = 4096, .offset = kFileBytes + 4096});
  const int closed = ::dup(fd);
  ASSERT_GE(closed, 0);
  ::close(closed);
  chunks.push_back({.fd = closed, .want = 100, .need = 100, .offset = 0});
  buffers.resize(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    buffers[i].assign(chunks[i].want, 0);
    chunks[i].buf = buffers[i].data();
    chunks[i].result = 12345;  // overwritten by Run
  }

  // on_finished: once per chunk, on this thread, each time with the chunk's result set
  // and its bytes in.
  std::vector<int> calls(chunks.size(), 0);
  size_t bad_calls = 0;
  const std::thread::id caller = std::this_thread::get_id();
  const ChunkFinished on_finished = [&](size_t i) {
    ASSERT_LT(i, chunks.size());
    ++calls[i];
    const ChunkRead& c = chunks[i];
    const bool bytes_in = c.result <= 0 || c.fd != fd ||
                          std::memcmp(buffers[i].data(), content.data() + c.offset,
                                      static_cast<size_t>(c.result)) == 0;
    if (std::this_thread::get_id() != caller || c.result == 12345 || !bytes_in) ++bad_calls;
  };
  ASSERT_TRUE(opened.engine->Run(chunks, on_finished).ok());
  EXPECT_EQ(bad_calls, 0u);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), 1), static_cast<std::ptrdiff_t>(chunks.size()));
  for (size_t i = 0; i + 3 < chunks.size(); ++i) {
    const ChunkRead& c = chunks[i];
    ASSERT_EQ(c.result, static_cast<int64_t>(c.want)) << "chunk " << i;
    EXPECT_EQ(std::memcmp(buffers[i].data(), content.data() + c.offset, c.want), 0)
        << "chunk " << i << " at " << c.offset;
  }
  const ChunkRead& past_end = chunks[chunks.size() - 3];
  EXPECT_EQ(past_end.result, 1000);
  EXPECT_EQ(
      std::memcmp(buffers[chunks.size() - 3].data(), content.data() + kFileBytes - 1000, 1000), 0);
  EXPECT_EQ(chunks[chunks.size() - 2].result, 0);
  EXPECT_EQ(chunks.back().result, -int64_t{EBADF});

  // The engine is reusable: an empty batch, then one chunk.
  EXPECT_TRUE(opened.engine->Run({}).ok());
  std::vector<uint8_t> one(64);
  ChunkRead again{.fd = fd, .buf = one.data(), .want = 64, .need = 64, .offset = 64};
  ASSERT_TRUE(opened.engine->Run({&again, 1}).ok());
  EXPECT_EQ(again.result, 64);
  EXPECT_EQ(std::memcmp(one.data(), content.data() + 64, 64), 0);
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Engines, ReadEngineTest,
                         ::testing::Values(EngineDepth{IoEngine::kPread, 1},
                                           EngineDepth{IoEngine::kPread, 4},
                                           EngineDepth{IoEngine::kUring, 1},
                                           EngineDepth{IoEngine::kUring, 8}),
                         [](const auto& test) {
                           return StrCat(test.param.engine == IoEngine::kUring ? "uring" : "pread",
                                         "_qd", test.param.depth);
                         });

}  // namespace
}  // namespace moert::experts
