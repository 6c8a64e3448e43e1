// Changing a model file under a loaded model, and putting it back: truncation in
// place, replacement by another file through rename, and the restore that makes the
// path the same file again (same inode, bytes and modification time), for the tests
// of the loader's and the model's answers to a changed file.
#ifndef MOERT_TESTS_COMMON_FILE_CHANGE_H_
#define MOERT_TESTS_COMMON_FILE_CHANGE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moert::test_util {

class FileChange {
 public:
  // Remembers `path` as it is now.
  explicit FileChange(std::string path) : path_(std::move(path)) {
    bytes_.resize(std::filesystem::file_size(path_));
    std::ifstream in(path_, std::ios::binary);
    in.read(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
    EXPECT_EQ(::stat(path_.c_str(), &stat_), 0) << path_;
  }

  const std::string& path() const { return path_; }
  uint64_t size() const { return bytes_.size(); }

  // Cuts the file to `size` bytes in place (the same inode).
  void Truncate(uint64_t size) const { std::filesystem::resize_file(path_, size); }

  // Moves the file aside and renames a copy of `other` over the path.
  void ReplaceWith(const std::string& other) const {
    std::filesystem::rename(path_, Aside());
    const std::string incoming = path_ + ".incoming";
    std::filesystem::copy_file(other, incoming);
    std::filesystem::rename(incoming, path_);
  }

  // The path is the remembered file again: moved back if it was replaced, else its
  // bytes written back in place, with the modification time it had.
  void Restore() const {
    if (std::filesystem::exists(Aside())) {
      std::filesystem::rename(Aside(), path_);
      return;
    }
    {
      std::ofstream out(path_, std::ios::binary | std::ios::in | std::ios::out);
      out.write(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
    }
    const struct timespec times[2] = {stat_.st_atim, stat_.st_mtim};
    EXPECT_EQ(::utimensat(AT_FDCWD, path_.c_str(), times, 0), 0) << path_;
  }

 private:
  std::string Aside() const { return path_ + ".aside"; }

  std::string path_;
  std::vector<char> bytes_;
  struct stat stat_ {};
};

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_FILE_CHANGE_H_
