// The expert directory and the loader: file ranges, runtime layout, the three I/O
// modes (with the O_DIRECT fallback), the read engines (io_uring and the pread pool,
// chunked), and the injected faults: each a clear Status naming the expert and the file
// offset, after which the next load succeeds.
#include "experts/loader.h"

#include <gtest/gtest.h>
#include <sys/statfs.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/file_change.h"
#include "core/strings.h"
#include "experts/checksum.h"
#include "experts/expert_directory.h"
#include "experts/test_model.h"
#include "format/arch.h"

namespace moert::experts {
namespace {

using testing::Block;
using testing::TestModel;
using testing::TestModelOptions;

TEST(ExpertDirectory, RangesFollowTheStackedTensors) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("dir"), "m.gguf");
  const ExpertDirectory dir = model.Directory();
  EXPECT_EQ(dir.n_layer(), 2);
  EXPECT_EQ(dir.n_expert(), 4);
  EXPECT_EQ(dir.expert_count(), 8u);
  const format::GgufTensorInfo* up = model.file->FindTensor("blk.1.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  const uint64_t per_expert = up->n_bytes / 4;
  const ExpertInfo& info = dir.info(1, 2);
  const ExpertPart& part = info.parts[static_cast<size_t>(ExpertPartKind::kUp)];
  EXPECT_EQ(part.file_offset, up->file_offset + 2 * per_expert);
  EXPECT_EQ(part.file_bytes, per_expert);
  EXPECT_EQ(part.format, backend::WeightFormat::kW8);
  EXPECT_FALSE(part.packed_in_file);
  // gate, up, down back to back in the block, each 64-byte aligned.
  uint64_t end = 0;
  for (const ExpertPart& p : info.parts) {
    EXPECT_EQ(p.block_offset % 64, 0u);
    EXPECT_GE(p.block_offset, end);
    EXPECT_EQ(p.runtime_bytes, backend::PackedBytes(p.format, p.rows, p.cols));
    end = p.block_offset + p.runtime_bytes;
  }
  EXPECT_EQ(info.runtime_bytes, end);
  EXPECT_EQ(dir.total_runtime_bytes(), 8 * info.runtime_bytes);
  EXPECT_FALSE(dir.stored_checksum(0, 0).has_value());
}

TEST(ExpertDirectory, ReadsChecksumsFromMetadata) {
  TestModelOptions options;
  options.write_checksums = true;
  const TestModel model = testing::WriteTestModel(testing::TempDir("dir-sums"), "m.gguf", options);
  const ExpertDirectory dir = model.Directory();
  const ExpertInfo& info = dir.info(1, 3);
  const auto part = [&](int p) {
    const ExpertPart& x = info.parts[static_cast<size_t>(p)];
    return model.file->bytes().subspan(x.file_offset, x.file_bytes);
  };
  ASSERT_TRUE(dir.stored_checksum(1, 3).has_value());
  EXPECT_EQ(*dir.stored_checksum(1, 3), ExpertChecksum(part(0), part(1), part(2)));
}

TEST(ExpertDirectory, FloatExpertsAreNotPooled) {
  TestModelOptions options;
  options.layer_types = {format::GgmlType::kF32};
  const TestModel model = testing::WriteTestModel(testing::TempDir("dir-f32"), "m.gguf", options);
  auto dir = ExpertDirectory::Build(*model.file, 1, 4, 256, 128);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(dir.status().message().find("blk.0.ffn_gate_exps.weight"), std::string::npos);
}

TEST(ExpertDirectory, WrongShapeNamesTheTensor) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("dir-shape"), "m.gguf");
  auto dir = ExpertDirectory::Build(*model.file, 2, 8, 256, 128);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dir.status().message().find("blk.0.ffn_gate_exps.weight"), std::string::npos)
      << dir.status();
}

// moert-pack's output: the expert tensors already in runtime layout are copied as is.
TEST(Loader, PackedFileIsCopied) {
  TestModelOptions options;
  options.layer_types = {format::GgmlType::kQ8_0, format::GgmlType::kQ4_0};
  options.packed_layers = {1};
  options.write_checksums = true;
  const TestModel model = testing::WriteTestModel(testing::TempDir("packed"), "m.gguf", options);
  TestModelOptions plain_options = options;
  plain_options.packed_layers = {};
  const TestModel plain =
      testing::WriteTestModel(testing::TempDir("packed-plain"), "m.gguf", plain_options);
  const ExpertDirectory dir = model.Directory();
  const ExpertInfo& info = dir.info(1, 2);
  for (const ExpertPart& part : info.parts) {
    EXPECT_TRUE(part.packed_in_file);
    EXPECT_EQ(part.format, backend::WeightFormat::kW4);
    EXPECT_EQ(part.file_type, format::GgmlType::kMoertW4);
    EXPECT_EQ(part.file_bytes, part.runtime_bytes);
  }
  EXPECT_FALSE(dir.info(0, 2).parts[0].packed_in_file);
  auto loader = Loader::Create(dir, {.mode = IoMode::kBuffered});
  ASSERT_TRUE(loader.ok()) << loader.status();
  Block block(info.runtime_bytes);
  LoadResult r = (*loader)->Wait((*loader)->Submit(info, block.data, dir.stored_checksum(1, 2)));
  ASSERT_TRUE(r.status.ok()) << r.status;
  // The same bytes as repacking the unpacked file's expert.
  EXPECT_EQ(block.bytes(), plain.ExpectedBlock(1, 2));
}

class LoaderModeTest : public ::testing::TestWithParam<IoMode> {};

TEST_P(LoaderModeTest, LoadsTheRuntimeLayout) {
  TestModelOptions options;
  options.layer_types = {format::GgmlType::kQ8_0, format::GgmlType::kQ4_0};
  const TestModel model = testing::WriteTestModel(testing::TempDir("mode"), "m.gguf", options);
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = GetParam()});
  ASSERT_TRUE(loader.ok()) << loader.status();
  if (GetParam() == IoMode::kDirect && (*loader)->mode() != IoMode::kDirect) {
    // A file system without O_DIRECT: the fallback is taken and said.
    EXPECT_EQ((*loader)->mode(), IoMode::kBuffered);
    EXPECT_NE((*loader)->fallback_reason().find("O_DIRECT"), std::string::npos);
  } else {
    EXPECT_EQ((*loader)->mode(), GetParam());
    EXPECT_EQ((*loader)->fallback_reason(), "");
  }
  for (int layer : {0, 1}) {
    for (int expert : {0, 3}) {
      const ExpertInfo& info = dir.info(layer, expert);
      Block block(info.runtime_bytes);
      LoadResult r = (*loader)->Wait((*loader)->Submit(info, block.data, std::nullopt));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(block.bytes(), model.ExpectedBlock(layer, expert));
      EXPECT_GE(r.bytes_read, info.file_bytes);
      // The same bytes verify against their own checksum.
      LoadResult again = (*loader)->Wait((*loader)->Submit(info, block.data, r.checksum));
      EXPECT_TRUE(again.status.ok()) << again.status;
    }
  }
  EXPECT_EQ((*loader)->stats().loads, 8u);
  EXPECT_EQ((*loader)->stats().failed_loads, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, LoaderModeTest,
                         ::testing::Values(IoMode::kDirect, IoMode::kBuffered, IoMode::kMmap),
                         [](const auto& test) { return std::string(IoModeName(test.param)); });

TEST(Loader, DirectReadRefusedFallsBackToBuffered) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("refused"), "m.gguf");
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = IoMode::kDirect});
  ASSERT_TRUE(loader.ok()) << loader.status();
  if ((*loader)->mode() != IoMode::kDirect) GTEST_SKIP() << (*loader)->fallback_reason();
  (*loader)->InjectFault(0, 1, LoaderFault::kDirectRefused);
  const ExpertInfo& info = dir.info(0, 1);
  Block block(info.runtime_bytes);
  LoadResult r = (*loader)->Wait((*loader)->Submit(info, block.data, std::nullopt));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(block.bytes(), model.ExpectedBlock(0, 1));
  EXPECT_EQ((*loader)->mode(), IoMode::kBuffered);
  EXPECT_NE((*loader)->fallback_reason().find("EINVAL"), std::string::npos)
      << (*loader)->fallback_reason();
  EXPECT_EQ((*loader)->requested_mode(), IoMode::kDirect);
}

// tmpfs refused O_DIRECT before Linux 6.6: there the fallback happens at open and is
// reported; a newer tmpfs takes direct reads.
TEST(Loader, DirectOnTmpfsWorksOrFallsBack) {
  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  const std::string dir_path = "/dev/shm/moert-experts-loader-test";
  std::filesystem::remove_all(dir_path);
  std::filesystem::create_directories(dir_path);
  const TestModel model = testing::WriteTestModel(dir_path, "m.gguf");
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = IoMode::kDirect});
  ASSERT_TRUE(loader.ok()) << loader.status();
  if ((*loader)->mode() == IoMode::kDirect) {
    EXPECT_EQ((*loader)->fallback_reason(), "");
  } else {
    EXPECT_EQ((*loader)->mode(), IoMode::kBuffered);
    EXPECT_NE((*loader)->fallback_reason().find("O_DIRECT"), std::string::npos);
  }
  const ExpertInfo& info = dir.info(1, 1);
  Block block(info.runtime_bytes);
  LoadResult r = (*loader)->Wait((*loader)->Submit(info, block.data, std::nullopt));
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(block.bytes(), model.ExpectedBlock(1, 1));
  loader->reset();
  std::filesystem::remove_all(dir_path);
}

struct FaultCase {
  LoaderFault fault;
  IoMode mode;
  const char* message;
};

class LoaderFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(LoaderFaultTest, FailsCleanlyAndTheNextLoadWorks) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("fault"), "m.gguf");
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = GetParam().mode});
  ASSERT_TRUE(loader.ok()) << loader.status();
  const ExpertInfo& info = dir.info(1, 2);
  Block block(info.runtime_bytes);
  // The checksum is known from a first good load.
  LoadResult good = (*loader)->Wait((*loader)->Submit(info, block.data, std::nullopt));
  ASSERT_TRUE(good.status.ok()) << good.status;

  (*loader)->InjectFault(1, 2, GetParam().fault);
  LoadResult bad = (*loader)->Wait((*loader)->Submit(info, block.data, good.checksum));
  ASSERT_FALSE(bad.status.ok());
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss);
  const std::string message(bad.status.message());
  EXPECT_NE(message.find("layer 1, expert 2"), std::string::npos) << message;
  EXPECT_NE(message.find(GetParam().message), std::string::npos) << message;
  EXPECT_NE(message.find(StrCat("file offset", GetParam().fault == LoaderFault::kChecksumMismatch
                                                   ? "s "
                                                   : " ",
                                info.parts[0].file_offset)),
            std::string::npos)
      << message;

  // The fault was for one load: the next one is good again.
  LoadResult next = (*loader)->Wait((*loader)->Submit(info, block.data, good.checksum));
  EXPECT_TRUE(next.status.ok()) << next.status;
  EXPECT_EQ(block.bytes(), model.ExpectedBlock(1, 2));
  EXPECT_EQ((*loader)->stats().failed_loads, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, LoaderFaultTest,
    ::testing::Values(FaultCase{LoaderFault::kShortRead, IoMode::kDirect, "short read"},
                      FaultCase{LoaderFault::kShortRead, IoMode::kBuffered, "short read"},
                      FaultCase{LoaderFault::kShortRead, IoMode::kMmap, "short read"},
                      FaultCase{LoaderFault::kIoError, IoMode::kDirect, "Input/output error"},
                      FaultCase{LoaderFault::kIoError, IoMode::kBuffered, "Input/output error"},
                      FaultCase{LoaderFault::kChecksumMismatch, IoMode::kDirect,
                                "checksum mismatch"},
                      FaultCase{LoaderFault::kChecksumMismatch, IoMode::kMmap,
                                "checksum mismatch"}),
    [](const auto& test) {
      const char* fault = test.param.fault == LoaderFault::kShortRead  ? "ShortRead"
                          : test.param.fault == LoaderFault::kIoError ? "IoError"
                                                                       : "ChecksumMismatch";
      return StrCat(fault, "_", IoModeName(test.param.mode));
    });

TEST(IoMode, EngineNamesRoundTrip) {
  for (IoEngine engine : {IoEngine::kAuto, IoEngine::kUring, IoEngine::kPread}) {
    EXPECT_EQ(ParseIoEngine(IoEngineName(engine)), engine) << IoEngineName(engine);
  }
  EXPECT_EQ(IoEngineName(IoEngine::kUring), "io_uring");
  EXPECT_EQ(ParseIoEngine("uring"), std::nullopt);
}

// The chunked reads of the pread modes, through each engine.
struct EngineCase {
  IoMode mode;
  IoEngine engine;
};

std::string EngineCaseName(const ::testing::TestParamInfo<EngineCase>& test) {
  return StrCat(IoModeName(test.param.mode), "_",
                test.param.engine == IoEngine::kUring ? "uring" : "pread");
}

class LoaderEngineTest : public ::testing::TestWithParam<EngineCase> {
 protected:
  void SetUp() override {
    TestModelOptions options;
    options.layer_types = {format::GgmlType::kQ8_0, format::GgmlType::kQ4_0};
    model_ = testing::WriteTestModel(testing::TempDir("engine"), "m.gguf", options);
    dir_ = std::make_unique<ExpertDirectory>(model_.Directory());
  }

  LoaderOptions Options(IoEngine engine, unsigned depth, uint64_t chunk) const {
    LoaderOptions options;
    options.mode = GetParam().mode;
    options.io_engine = engine;
    options.read_queue_depth = depth;
    options.read_chunk_bytes = chunk;
    return options;
  }

  std::unique_ptr<Loader> Open(const LoaderOptions& options) const {
    auto loader = Loader::Create(*dir_, options);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return loader.ok() ? std::move(*loader) : nullptr;
  }

  // Why `loader` does not read through io_uring where the case asks for it; empty
  // where it does or the case asks for preads.
  static std::string UringMissing(const Loader& loader) {
    if (GetParam().engine != IoEngine::kUring || loader.io_engine() == IoEngine::kUring) {
      return "";
    }
    return StrCat("io_uring unavailable: ", loader.io_engine_fallback_reason());
  }

  // Every expert of the model, in order: its block and its checksum.
  struct Loaded {
    std::vector<std::vector<uint8_t>> blocks;
    std::vector<uint64_t> checksums;
  };
  Loaded LoadAll(Loader& loader) const {
    Loaded loaded;
    for (int layer = 0; layer < dir_->n_layer(); ++layer) {
      for (int expert = 0; expert < dir_->n_expert(); ++expert) {
        const ExpertInfo& info = dir_->info(layer, expert);
        Block block(info.runtime_bytes);
        const LoadResult r = loader.Wait(loader.Submit(info, block.data, std::nullopt));
        EXPECT_TRUE(r.status.ok()) << r.status;
        loaded.blocks.push_back(block.bytes());
        loaded.checksums.push_back(r.checksum);
      }
    }
    return loaded;
  }

  // The bytes a load of `info` asks of the file system in the loader's mode.
  uint64_t AskedBytes(const Loader& loader, const ExpertInfo& info) const {
    if (loader.mode() != IoMode::kDirect) return info.file_bytes;
    uint64_t asked = 0;
    for (const ExpertPart& part : info.parts) {
      const uint64_t at = dir_->file_offset() + part.file_offset;
      const uint64_t end = (at + part.file_bytes + kDirectAlignment - 1) / kDirectAlignment;
      asked += (end - at / kDirectAlignment) * kDirectAlignment;
    }
    return asked;
  }

  TestModel model_;
  std::unique_ptr<ExpertDirectory> dir_;
};

// Many chunk reads in flight give the bytes of one pread per part, bit for bit, for
// every expert of the model.
TEST_P(LoaderEngineTest, SameBytesAsOnePreadPerPart) {
  std::unique_ptr<Loader> reference = Open(Options(IoEngine::kPread, 1, 0));
  ASSERT_NE(reference, nullptr);
  EXPECT_EQ(reference->io_engine(), IoEngine::kPread);
  EXPECT_EQ(reference->io_engine_fallback_reason(), "");
  const Loaded want = LoadAll(*reference);
  // 8 KiB chunks: a 34,816-byte q8_0 part (18,432 in q4_0) is 5 (3) of them, the last
  // one short.
  std::unique_ptr<Loader> loader = Open(Options(GetParam().engine, 8, 8192));
  ASSERT_NE(loader, nullptr);
  if (const std::string missing = UringMissing(*loader); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  EXPECT_EQ(loader->io_engine(), GetParam().engine);
  EXPECT_EQ(loader->io_engine_fallback_reason(), "");
  EXPECT_EQ(loader->read_queue_depth(), 8u);
  const Loaded got = LoadAll(*loader);
  ASSERT_EQ(got.blocks.size(), want.blocks.size());
  for (size_t i = 0; i < want.blocks.size(); ++i) {
    const int layer = static_cast<int>(i) / dir_->n_expert();
    const int expert = static_cast<int>(i) % dir_->n_expert();
    EXPECT_EQ(got.blocks[i], want.blocks[i]) << "layer " << layer << ", expert " << expert;
    EXPECT_EQ(got.blocks[i], model_.ExpectedBlock(layer, expert));
    EXPECT_EQ(got.checksums[i], want.checksums[i]);
    // Hashed chunk by chunk as the reads came in: the checksum of the file's bytes.
    const ExpertInfo& info = dir_->info(layer, expert);
    const auto part = [&](int p) {
      const ExpertPart& x = info.parts[static_cast<size_t>(p)];
      return model_.file->bytes().subspan(x.file_offset, x.file_bytes);
    };
    EXPECT_EQ(got.checksums[i], ExpertChecksum(part(0), part(1), part(2)));
  }
  EXPECT_EQ(loader->stats().bytes_read, reference->stats().bytes_read);
  EXPECT_EQ(loader->stats().failed_loads, 0u);
}

// Two I/O threads, every expert queued before any is waited for (so both threads read
// at once and loads may finish out of order): each block and checksum is the one
// pread-per-part load's, each staging buffer the threads' own.
TEST_P(LoaderEngineTest, TwoIoThreadsGiveTheSameBytes) {
  LoaderOptions one = Options(IoEngine::kPread, 1, 0);
  one.io_threads = 1;
  std::unique_ptr<Loader> reference = Open(one);
  ASSERT_NE(reference, nullptr);
  const Loaded want = LoadAll(*reference);
  LoaderOptions options = Options(GetParam().engine, 4, 8192);
  options.io_threads = 2;
  options.queue_capacity = 64;
  std::unique_ptr<Loader> loader = Open(options);
  ASSERT_NE(loader, nullptr);
  if (const std::string missing = UringMissing(*loader); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  EXPECT_EQ(loader->staging_bytes(), 2 * reference->staging_bytes());
  std::vector<std::unique_ptr<Block>> blocks;
  std::vector<Loader::Ticket> tickets;
  for (int layer = 0; layer < dir_->n_layer(); ++layer) {
    for (int expert = 0; expert < dir_->n_expert(); ++expert) {
      const ExpertInfo& info = dir_->info(layer, expert);
      blocks.push_back(std::make_unique<Block>(info.runtime_bytes));
      tickets.push_back(loader->Submit(info, blocks.back()->data, std::nullopt));
    }
  }
  ASSERT_EQ(tickets.size(), want.blocks.size());
  for (size_t i = 0; i < tickets.size(); ++i) {
    const LoadResult r = loader->Wait(tickets[i]);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(blocks[i]->bytes(), want.blocks[i]) << "load " << i;
    EXPECT_EQ(r.checksum, want.checksums[i]) << "load " << i;
  }
  EXPECT_EQ(loader->stats().loads, want.blocks.size());
  EXPECT_EQ(loader->stats().bytes_read, reference->stats().bytes_read);
}

// Chunks smaller than a part that do not divide it (and, in buffered mode, off the
// alignment), at a depth that does not divide the chunk count: the same bytes, and the
// bytes asked of the file system are the part ranges, nothing read twice.
TEST_P(LoaderEngineTest, ChunksThatDoNotDivideAPart) {
  const uint64_t part_bytes = dir_->info(0, 0).parts[0].file_bytes;
  for (const uint64_t chunk : {uint64_t{4096}, uint64_t{5000}, uint64_t{12288}}) {
    ASSERT_LT(chunk, part_bytes);
    ASSERT_NE(part_bytes % chunk, 0u);
    SCOPED_TRACE(StrCat("read_chunk_bytes ", chunk));
    std::unique_ptr<Loader> loader = Open(Options(GetParam().engine, 3, chunk));
    ASSERT_NE(loader, nullptr);
    if (const std::string missing = UringMissing(*loader); !missing.empty()) {
      GTEST_SKIP() << missing;
    }
    uint64_t asked = 0;
    for (int layer = 0; layer < dir_->n_layer(); ++layer) {
      for (int expert : {0, 3}) {
        const ExpertInfo& info = dir_->info(layer, expert);
        Block block(info.runtime_bytes);
        const LoadResult r = loader->Wait(loader->Submit(info, block.data, std::nullopt));
        ASSERT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(block.bytes(), model_.ExpectedBlock(layer, expert))
            << "layer " << layer << ", expert " << expert;
        EXPECT_EQ(r.bytes_read, AskedBytes(*loader, info));
        asked += r.bytes_read;
      }
    }
    EXPECT_EQ(loader->stats().bytes_read, asked);
  }
}

// The file cut in the middle of a part, after the loader's check and before its reads:
// DataLoss naming that part's tensor and offset, no fallback from O_DIRECT (the cut
// read ends off the alignment: the end of the file, not a refused read), and the next
// load works once the file is back.
TEST_P(LoaderEngineTest, FileCutInAPartIsAShortReadNamingTheTensor) {
  const ExpertInfo& info = dir_->info(1, 3);
  const ExpertPart& down = info.parts[static_cast<size_t>(ExpertPartKind::kDown)];
  const test_util::FileChange change(model_.path);
  std::atomic<bool> cut{false};
  LoaderOptions options = Options(GetParam().engine, 8, 4096);
  options.before_read_for_testing = [&](const ExpertInfo&) {
    if (!cut.exchange(true)) change.Truncate(down.file_offset + down.file_bytes / 2 + 100);
  };
  std::unique_ptr<Loader> loader = Open(options);
  ASSERT_NE(loader, nullptr);
  if (const std::string missing = UringMissing(*loader); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  const IoMode mode = loader->mode();
  Block block(info.runtime_bytes);
  const LoadResult bad = loader->Wait(loader->Submit(info, block.data, std::nullopt));
  ASSERT_FALSE(bad.status.ok());
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss) << bad.status;
  const std::string message(bad.status.message());
  EXPECT_NE(message.find("layer 1, expert 3"), std::string::npos) << message;
  EXPECT_NE(message.find("short read"), std::string::npos) << message;
  EXPECT_NE(message.find(StrCat("'", down.tensor, "'")), std::string::npos) << message;
  EXPECT_NE(message.find(StrCat("file offset ", down.file_offset)), std::string::npos)
      << message;
  EXPECT_NE(message.find(StrCat("got ", down.file_bytes / 2 + 100, " of ")), std::string::npos)
      << message;
  EXPECT_EQ(loader->mode(), mode);
  change.Restore();
  const LoadResult good = loader->Wait(loader->Submit(info, block.data, std::nullopt));
  ASSERT_TRUE(good.status.ok()) << good.status;
  EXPECT_EQ(block.bytes(), model_.ExpectedBlock(1, 3));
}

// The injected faults through the engine: short read and I/O error name the gate
// tensor; a refused O_DIRECT read falls back to buffered with the right bytes.
TEST_P(LoaderEngineTest, InjectedFaults) {
  std::unique_ptr<Loader> loader = Open(Options(GetParam().engine, 8, 8192));
  ASSERT_NE(loader, nullptr);
  if (const std::string missing = UringMissing(*loader); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  const ExpertInfo& info = dir_->info(0, 2);
  Block block(info.runtime_bytes);
  for (const auto& [fault, says] : {std::pair{LoaderFault::kShortRead, "short read"},
                                    std::pair{LoaderFault::kIoError, "Input/output error"}}) {
    loader->InjectFault(0, 2, fault);
    const LoadResult bad = loader->Wait(loader->Submit(info, block.data, std::nullopt));
    ASSERT_FALSE(bad.status.ok());
    EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss);
    const std::string message(bad.status.message());
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_NE(message.find(StrCat("'", info.parts[0].tensor, "' at file offset ",
                                  info.parts[0].file_offset)),
              std::string::npos)
        << message;
  }
  if (loader->mode() == IoMode::kDirect) {
    loader->InjectFault(0, 2, LoaderFault::kDirectRefused);
    const LoadResult r = loader->Wait(loader->Submit(info, block.data, std::nullopt));
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(loader->mode(), IoMode::kBuffered);
    EXPECT_NE(loader->fallback_reason().find("EINVAL"), std::string::npos);
    EXPECT_EQ(r.bytes_read, info.file_bytes);
  }
  const LoadResult good = loader->Wait(loader->Submit(info, block.data, std::nullopt));
  ASSERT_TRUE(good.status.ok()) << good.status;
  EXPECT_EQ(block.bytes(), model_.ExpectedBlock(0, 2));
}

INSTANTIATE_TEST_SUITE_P(Engines, LoaderEngineTest,
                         ::testing::Values(EngineCase{IoMode::kDirect, IoEngine::kUring},
                                           EngineCase{IoMode::kDirect, IoEngine::kPread},
                                           EngineCase{IoMode::kBuffered, IoEngine::kUring},
                                           EngineCase{IoMode::kBuffered, IoEngine::kPread}),
                         EngineCaseName);

// kMmap issues no reads: no engine.
TEST(Loader, MmapHasNoReadEngine) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("mmap-engine"), "m.gguf");
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = IoMode::kMmap, .io_engine = IoEngine::kUring});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->io_engine(), std::nullopt);
  EXPECT_EQ((*loader)->io_engine_fallback_reason(), "");
}

TEST(Loader, TruncatedFileIsFailedPrecondition) {
  const TestModel model = testing::WriteTestModel(testing::TempDir("truncated"), "m.gguf");
  const ExpertDirectory dir = model.Directory();
  std::filesystem::resize_file(model.path, dir.file_size() - 100);
  auto loader = Loader::Create(dir, {.mode = IoMode::kBuffered});
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(loader.status().message().find(model.path), std::string::npos);
}

}  // namespace
}  // namespace moert::experts
