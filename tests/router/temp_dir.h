// A fresh folder per test for the router tests' fake sysfs and procfs files.
#ifndef MOERT_TESTS_ROUTER_TEMP_DIR_H_
#define MOERT_TESTS_ROUTER_TEMP_DIR_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moert::router {

class TempDir {
 public:
  TempDir() {
    // Parameterised tests' names hold '/': one folder, not a tree to leave behind.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) c = c == '/' ? '_' : c;
    path_ = std::filesystem::temp_directory_path() /
            ("moert-router-test-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "-" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

}  // namespace moert::router

#endif  // MOERT_TESTS_ROUTER_TEMP_DIR_H_
