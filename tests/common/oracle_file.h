// The oracle models of the shared folder (MOERT_SHARED_DIR/models), each opened once
// per test process and kept open for the tests that load models from it.
#ifndef MOERT_TESTS_COMMON_ORACLE_FILE_H_
#define MOERT_TESTS_COMMON_ORACLE_FILE_H_

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "format/gguf.h"

namespace moert::test_util {

inline const std::string kOracleModels = std::string(MOERT_SHARED_DIR) + "/models/";

// The open file of oracle model `name` (a test failure when it cannot be opened).
inline const format::GgufFile& OracleFile(const std::string& name) {
  static auto* files = new std::map<std::string, std::unique_ptr<format::GgufFile>>();
  auto it = files->find(name);
  if (it == files->end()) {
    auto file = format::GgufFile::Open(kOracleModels + name);
    EXPECT_TRUE(file.ok()) << file.status();
    it = files->emplace(name, std::move(*file)).first;
  }
  return *it->second;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_ORACLE_FILE_H_
