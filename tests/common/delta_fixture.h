// Delta packages for tests: the oracle model with a few experts perturbed (a stand-in
// for retrained experts), written to a folder with a key pair and the package between
// them. Shared by the experts and runtime tests.
#ifndef MOERT_TESTS_COMMON_DELTA_FIXTURE_H_
#define MOERT_TESTS_COMMON_DELTA_FIXTURE_H_

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/oracle_file.h"
#include "experts/delta_make.h"
#include "experts/delta_package.h"

namespace moert::test_util {

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void WriteBytes(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.flush()) << path;
}

struct DeltaFixture {
  std::string dir;
  std::string base_path;    // a copy of the oracle model
  std::string target_path;  // it with `experts` perturbed
  std::vector<std::pair<int, int>> experts;
  experts::KeyPair keys;
  std::vector<uint8_t> package;
  experts::DeltaMakeStats stats;
};

// `dir` must exist. The oracle `model` (a file in shared/models) with `changed`
// perturbed: a fraction `fraction` of their weights moved by `steps` quantization steps.
inline DeltaFixture MakeDeltaFixture(const std::string& dir, const std::string& model,
                                     std::vector<std::pair<int, int>> changed,
                                     double fraction = 0.25, uint64_t seed = 7,
                                     int steps = 1) {
  DeltaFixture f;
  f.dir = dir;
  f.base_path = dir + "/base.gguf";
  f.target_path = dir + "/target.gguf";
  f.experts = std::move(changed);
  const format::GgufFile& oracle = OracleFile(model);
  WriteBytes(f.base_path, oracle.bytes());
  auto perturbed = experts::PerturbExperts(oracle, f.experts, fraction, seed, steps);
  EXPECT_TRUE(perturbed.ok()) << perturbed.status();
  if (!perturbed.ok()) return f;
  WriteBytes(f.target_path, *perturbed);
  auto target = format::GgufFile::FromBuffer(*perturbed, "target");
  EXPECT_TRUE(target.ok()) << target.status();
  if (!target.ok()) return f;
  f.keys = experts::GenerateKeyPair();
  auto package = experts::MakeDeltaPackage(oracle, **target, f.keys.secret_key, &f.stats);
  EXPECT_TRUE(package.ok()) << package.status();
  if (package.ok()) f.package = std::move(*package);
  return f;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_DELTA_FIXTURE_H_
