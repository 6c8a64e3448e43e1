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

}  // namespace
}  // namespace moert::core
