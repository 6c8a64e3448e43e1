// Tests of core::MappedFile: contents, empty files, missing files, directories.
#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace moert::core {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::testing::UnitTest::GetInstance()->random_seed())))
      .string();
}

TEST(MappedFile, MapsTheBytesOfAFile) {
  std::string path = TempPath("moert_mapped_file");
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello";
  }
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->data()), 5), "hello");
  std::remove(path.c_str());
}

TEST(MappedFile, EmptyFileIsAnEmptySpan) {
  std::string path = TempPath("moert_mapped_empty");
  { std::ofstream out(path, std::ios::binary); }
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_TRUE((*file)->bytes().empty());
  std::remove(path.c_str());
}

TEST(MappedFile, MissingFileIsNotFoundAndNamesThePath) {
  auto file = MappedFile::Open("/nonexistent/moert/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/moert/model.gguf"), std::string::npos);
}

TEST(MappedFile, DirectoryIsRejected) {
  auto file = MappedFile::Open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
}

// A range at an offset that is not page-aligned (a model inside an APK): the view holds
// exactly those bytes, CopyOut reads inside it and names the file offset of what it cannot.
TEST(MappedFile, MapsARangeAtAnyOffset) {
  std::string path = TempPath("moert_mapped_range");
  std::string contents;
  for (int i = 0; i < 3 * 4096 + 777; ++i) contents += static_cast<char>('a' + i % 26);
  {
    std::ofstream out(path, std::ios::binary);
    out << contents;
  }
  const uint64_t offset = 4096 + 123;
  auto file = MappedFile::OpenRange(path, offset, 5000);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->file_offset(), offset);
  ASSERT_EQ((*file)->size(), 5000u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->data()), 5000),
            contents.substr(offset, 5000));
  std::string copy(10, '\0');
  ASSERT_TRUE((*file)->CopyOut(4990, {reinterpret_cast<uint8_t*>(copy.data()), 10}).ok());
  EXPECT_EQ(copy, contents.substr(offset + 4990, 10));
  const absl::Status past = (*file)->CopyOut(4995, {reinterpret_cast<uint8_t*>(copy.data()), 10});
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(past.message().find("file offset " + std::to_string(offset + 4995)), std::string::npos)
      << past;

  // A range past the end: OutOfRange naming the path, the range and the size.
  auto beyond = MappedFile::OpenRange(path, offset, contents.size());
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(beyond.status().message().find(path), std::string::npos) << beyond.status();
  EXPECT_NE(beyond.status().message().find(std::to_string(contents.size()) + " bytes"),
            std::string::npos)
      << beyond.status();
  // An empty range maps nothing.
  auto empty = MappedFile::OpenRange(path, offset, 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->bytes().empty());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace moert::core
