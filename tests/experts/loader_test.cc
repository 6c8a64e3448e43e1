// The expert directory and the loader: file ranges, runtime layout, the three I/O
// modes (with the O_DIRECT fallback), and the injected faults: each a clear Status
// naming the expert and the file offset, after which the next load succeeds.
#include "experts/loader.h"

#include <gtest/gtest.h>
#include <sys/statfs.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

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
