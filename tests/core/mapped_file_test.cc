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

// DropPages only takes pages out of the resident set: the bytes read afterwards are the
// file's, whatever range (unaligned, past the end, inside a range view) it is given.
TEST(MappedFile, DropPagesKeepsTheBytes) {
  std::string path = TempPath("moert_mapped_drop");
  std::string contents;
  for (int i = 0; i < 5 * 4096 + 99; ++i) contents += static_cast<char>('A' + i % 23);
  {
    std::ofstream out(path, std::ios::binary);
    out << contents;
  }
  auto whole = MappedFile::Open(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const auto text = [](const MappedFile& f) {
    return std::string(reinterpret_cast<const char*>(f.data()), f.size());
  };
  ASSERT_EQ(text(**whole), contents);
  (*whole)->DropPages(100, 3 * 4096);
  (*whole)->DropPages(4 * 4096, 1u << 30);  // clipped to the view
  (*whole)->DropPages(1u << 30, 10);       // past it: nothing
  EXPECT_EQ(text(**whole), contents);
  auto range = MappedFile::OpenRange(path, 4096 + 5, 2 * 4096);
  ASSERT_TRUE(range.ok()) << range.status();
  (*range)->DropPages(0, (*range)->size());
  EXPECT_EQ(text(**range), contents.substr(4096 + 5, 2 * 4096));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace moert::core
