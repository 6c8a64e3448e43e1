// The MiniCPM-V 2.6 oracle pair (../shared/mmproj/SPEC.md), written once per test
// binary by moert-synth's generator into a temporary directory that is removed at exit.
#ifndef MOERT_TESTS_VISION_ORACLE_FILES_H_
#define MOERT_TESTS_VISION_ORACLE_FILES_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "minicpmv_oracle.h"

namespace moert::vision::testing {

inline const std::string kOracleDir = std::string(MOERT_SHARED_DIR) + "/mmproj/";

struct OracleFiles {
  std::string mmproj;  // empty when writing failed (the failure is reported)
  std::string llm;
};

// reference.txt's section headers: "## image=NAME mmproj=FILE ...". For a header of the
// f32 mmproj's runs, NAME; for another header, ""; otherwise `current` unchanged.
inline std::string ImageSection(const std::string& line, const std::string& current) {
  if (line.rfind("## image=", 0) != 0) return current;
  if (line.find("mmproj-minicpmv26-tiny-f32.gguf") == std::string::npos) return "";
  return line.substr(9, line.find(' ', 9) - 9);
}

inline const OracleFiles& GetOracleFiles() {
  static const OracleFiles* files = [] {
    auto* f = new OracleFiles();
    static const std::string dir = ::testing::TempDir() + "/moert-minicpmv-oracle";
    std::filesystem::create_directories(dir);
    std::atexit([] { std::filesystem::remove_all(dir); });
    auto written = synth::WriteMinicpmv26Oracle(dir, kOracleDir + "vocab.json");
    EXPECT_TRUE(written.ok()) << written.status();
    if (written.ok()) {
      f->mmproj = (*written)[0];
      f->llm = (*written)[1];
    }
    return f;
  }();
  return *files;
}

}  // namespace moert::vision::testing

#endif  // MOERT_TESTS_VISION_ORACLE_FILES_H_
