// What the expert-pool tests of the model share: the oracle models (opened once), the
// load options that make a pool's outputs comparable with fully resident experts, and
// each model's fully resident greedy run, the reference they are compared with.
#ifndef MOERT_TESTS_MODEL_EXPERT_POOL_UTIL_H_
#define MOERT_TESTS_MODEL_EXPERT_POOL_UTIL_H_

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/greedy_run.h"
#include "common/oracle_file.h"
#include "format/gguf.h"
#include "model/model.h"

namespace moert::model::pool_test {

inline const std::string& kModels = test_util::kOracleModels;
inline constexpr int kPromptTokens = 48;
inline constexpr int kDecodeSteps = 12;

using Generation = test_util::GreedyRun;

using test_util::OracleFile;
inline const format::GgufFile& File(const std::string& name) { return OracleFile(name); }

inline ModelLoadOptions Options() {
  ModelLoadOptions options;
  options.threads = 2;
  options.kv_cache_positions = 64;
  // The residency penalty off: with it, the router prefers resident experts under
  // pressure and the tokens may differ from fully resident ones by design.
  options.router.alpha = 0;
  // The load paths without prefetch (the tests that want it turn it on): a prefetch
  // that fails is no error, the expert is read again when a layer needs it.
  options.prefetch = false;
  return options;
}

inline std::unique_ptr<Model> Load(const format::GgufFile& file, const ModelLoadOptions& options) {
  auto model = Model::Load(file, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

inline std::unique_ptr<Model> Load(const std::string& name, const ModelLoadOptions& options) {
  return Load(File(name), options);
}

inline std::vector<int32_t> Prompt() { return test_util::SpreadPrompt(kPromptTokens); }

// A prefill batch, then greedy decoding one token at a time.
inline Generation Generate(Model& model) {
  return test_util::RunGreedy(model, kPromptTokens, kDecodeSteps);
}

// The fully resident run of oracle model `name`, made once per process.
inline const Generation& Reference(const std::string& name) {
  static auto* refs = new std::map<std::string, Generation>();
  auto it = refs->find(name);
  if (it == refs->end()) {
    std::unique_ptr<Model> model = Load(name, Options());
    it = refs->emplace(name, model != nullptr ? Generate(*model) : Generation()).first;
  }
  return it->second;
}

}  // namespace moert::model::pool_test

#endif  // MOERT_TESTS_MODEL_EXPERT_POOL_UTIL_H_
