// Writes the experts tests' GGUF (see test_model.h).
#include "experts/test_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "experts/checksum.h"
#include "format/arch.h"
#include "format/gguf_writer.h"
#include "format/quantize.h"

namespace moert::experts::testing {
namespace {

// Removes this process's folders (TempDir) when the tests are done.
class RemoveTempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    const std::string suffix = "-" + std::to_string(getpid());
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir(), error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("moert-experts-", 0) == 0 && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        std::filesystem::remove_all(entry.path(), error);
      }
    }
  }
};

[[maybe_unused]] ::testing::Environment* const kRemoveTempDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

}  // namespace

std::string TempDir(const std::string& name) {
  // Unique per process: ctest runs the instances of a parameterized test side by side.
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string unique = test != nullptr ? std::string(test->name()) : std::string();
  for (char& c : unique) {
    if (c == '/') c = '_';
  }
  const std::string dir = ::testing::TempDir() + "/moert-experts-" + name + "-" + unique + "-" +
                          std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TestModel WriteTestModel(const std::string& dir, const std::string& name,
                         const TestModelOptions& options) {
  format::GgufWriter writer;
  writer.SetString("general.architecture", "moert-experts-test");
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const int n_layer = static_cast<int>(options.layer_types.size());
  std::vector<uint64_t> checksums(size_t(n_layer) * size_t(options.n_expert), 0);
  for (int l = 0; l < n_layer; ++l) {
    const format::GgmlType type = options.layer_types[static_cast<size_t>(l)];
    const struct {
      format::TensorKind kind;
      int64_t rows, cols;
    } parts[3] = {{format::TensorKind::kFfnGateExps, options.n_ff, options.n_embd},
                  {format::TensorKind::kFfnUpExps, options.n_ff, options.n_embd},
                  {format::TensorKind::kFfnDownExps, options.n_embd, options.n_ff}};
    std::vector<std::vector<uint8_t>> bytes(3);
    for (int p = 0; p < 3; ++p) {
      const uint64_t n = uint64_t(options.n_expert) * uint64_t(parts[p].rows) *
                         uint64_t(parts[p].cols);
      std::vector<float> values(n);
      for (float& v : values) v = value(rng);
      const uint64_t row_bytes = *format::GgmlRowBytes(type, uint64_t(parts[p].cols));
      bytes[p].resize(row_bytes * n / uint64_t(parts[p].cols));
      EXPECT_TRUE(format::Quantize(type, values, bytes[p]).ok());
      format::GgmlType file_type = type;
      if (std::find(options.packed_layers.begin(), options.packed_layers.end(), l) !=
          options.packed_layers.end()) {
        // Each expert in its runtime layout, one extent after the other.
        const backend::WeightFormat format = backend::NaturalFormat(type);
        const size_t src_each = bytes[p].size() / size_t(options.n_expert);
        const size_t dst_each = backend::PackedBytes(format, parts[p].rows, parts[p].cols);
        std::vector<uint8_t> packed(dst_each * size_t(options.n_expert));
        for (int e = 0; e < options.n_expert; ++e) {
          EXPECT_TRUE(backend::PackRows(type,
                                        std::span<const uint8_t>(bytes[p]).subspan(
                                            size_t(e) * src_each, src_each),
                                        parts[p].rows, parts[p].cols, format,
                                        {packed.data() + size_t(e) * dst_each, dst_each})
                          .ok());
        }
        bytes[p] = std::move(packed);
        file_type = backend::PackedTypeOf(format);
      }
      EXPECT_TRUE(writer
                      .AddTensor(format::TensorWeightName(parts[p].kind, l), file_type,
                                 {uint64_t(parts[p].cols), uint64_t(parts[p].rows),
                                  uint64_t(options.n_expert)},
                                 bytes[p])
                      .ok());
    }
    for (int e = 0; e < options.n_expert; ++e) {
      std::span<const uint8_t> spans[3];
      for (int p = 0; p < 3; ++p) {
        const size_t each = bytes[p].size() / size_t(options.n_expert);
        spans[p] = std::span<const uint8_t>(bytes[p]).subspan(size_t(e) * each, each);
      }
      checksums[size_t(l) * size_t(options.n_expert) + size_t(e)] =
          ExpertChecksum(spans[0], spans[1], spans[2]);
    }
  }
  if (options.write_checksums) {
    std::vector<uint8_t> raw(checksums.size() * 8);
    for (size_t i = 0; i < checksums.size(); ++i) {
      for (int b = 0; b < 8; ++b) raw[i * 8 + size_t(b)] = uint8_t(checksums[i] >> (8 * b));
    }
    writer.SetArray(kChecksumKey, format::GgufValueType::kUint64, checksums.size(), raw);
  }
  TestModel model;
  model.path = dir + "/" + name;
  model.options = options;
  EXPECT_TRUE(writer.WriteFile(model.path).ok());
  auto file = format::GgufFile::Open(model.path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (file.ok()) model.file = std::move(*file);
  return model;
}

ExpertDirectory TestModel::Directory() const {
  auto dir = ExpertDirectory::Build(*file, static_cast<int>(options.layer_types.size()),
                                    options.n_expert, options.n_embd, options.n_ff);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return std::move(*dir);
}

std::vector<uint8_t> TestModel::ExpectedBlock(int layer, int expert) const {
  const ExpertDirectory dir = Directory();
  const ExpertInfo& info = dir.info(layer, expert);
  std::vector<uint8_t> block(info.runtime_bytes, 0);
  for (const ExpertPart& part : info.parts) {
    const std::span<const uint8_t> src = file->bytes().subspan(part.file_offset, part.file_bytes);
    EXPECT_TRUE(backend::PackRows(part.file_type, src, part.rows, part.cols, part.format,
                                  {block.data() + part.block_offset, part.runtime_bytes})
                    .ok());
  }
  return block;
}

}  // namespace moert::experts::testing
