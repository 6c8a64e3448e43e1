// moert-replay (tools/replay.h) on the oracle model: a bundle written from a short Q8_0
// generation replays clean against the fp32 reference within the default bound; a fault
// injected into one op of the quantized run is named by exactly that layer, op and
// expert; the binary says the same and exits 2; a corrupt bundle and a bundle of another
// model are answered with a Status naming the problem.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "common/greedy_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moert/runtime.h"
#include "replay.h"

namespace moert {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

using ::testing::HasSubstr;
using pipeline::ObservedOp;
using test_util::Greedy;

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
const std::string kQ8 = kModels + "tiny-moe-shakespeare-q8_0.gguf";
const std::string kQ4 = kModels + "tiny-moe-shakespeare-q4_0.gguf";

class ReplayTest : public ::testing::Test {
 protected:
  // One bundle for the suite: an 8-token greedy generation on Q8_0.
  static void SetUpTestSuite() {
    // One directory per process: ctest runs each test in a process of its own, in parallel.
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("moert-replay-test-" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    RuntimeOptions options;
    options.threads = 1;
    options.hot_set = false;
    options.cache_dir = (*dir_ / "cache").string();
    std::unique_ptr<MoERuntime> runtime;
    ASSERT_TRUE(MoERuntime::Create(options, &runtime).ok());
    ASSERT_TRUE(runtime->LoadModel(kQ8).ok());
    std::unique_ptr<Session> session;
    ASSERT_TRUE(runtime->CreateSession(&session).ok());
    ASSERT_TRUE(session->Generate(Greedy(8)).ok());
    bundle_ = new std::string((*dir_ / "q8.moert-repro").string());
    const Status written = session->WriteRepro(*bundle_);
    ASSERT_TRUE(written.ok()) << written.ToString();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete bundle_;
  }

  static tools::ReplayOptions Options() {
    tools::ReplayOptions o;
    o.bundle = *bundle_;
    o.model = kQ8;
    o.max_tokens = 12;
    return o;
  }

  static std::filesystem::path* dir_;
  static std::string* bundle_;
};

std::filesystem::path* ReplayTest::dir_ = nullptr;
std::string* ReplayTest::bundle_ = nullptr;

TEST_F(ReplayTest, ACleanBundleReplaysWithinTheDefaultBound) {
  const auto report = tools::Replay(Options());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->first.has_value()) << tools::FormatReplayDiff(*report->first);
  EXPECT_GT(report->tokens, 1);
  EXPECT_GT(report->ops, 0);
  // Measured on the oracle: Q8_0 against fp32 stays well inside 0.25 relative.
  EXPECT_LT(report->largest_ratio, 1.0);
}

TEST_F(ReplayTest, ABlockFaultIsNamedByItsLayerAndOp) {
  for (const ObservedOp op : {ObservedOp::kAttention, ObservedOp::kFfn}) {
    tools::ReplayOptions o = Options();
    o.fault = tools::ReplayFault{2, op, -1, 100.0f};
    const auto report = tools::Replay(o);
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_TRUE(report->first.has_value()) << pipeline::ObservedOpName(op);
    EXPECT_EQ(report->first->layer, 2);
    EXPECT_EQ(report->first->op, op);
    EXPECT_EQ(report->first->token, 0);
    EXPECT_FALSE(report->first->routing_differs);
  }
}

TEST_F(ReplayTest, AnExpertFaultIsNamedByItsLayerOpAndExpert) {
  // Which experts the replayed tokens choose is the model's business: a fault on an
  // expert that some token chooses is named exactly; at least one must be.
  int named = 0;
  for (int expert = 0; expert < 8; ++expert) {
    tools::ReplayOptions o = Options();
    o.fault = tools::ReplayFault{1, ObservedOp::kExpertDown, expert, 100.0f};
    const auto report = tools::Replay(o);
    ASSERT_TRUE(report.ok()) << report.status();
    if (!report->first) continue;
    ++named;
    EXPECT_EQ(report->first->layer, 1);
    EXPECT_EQ(report->first->op, ObservedOp::kExpertDown);
    EXPECT_EQ(report->first->expert, expert);
    EXPECT_THAT(tools::FormatReplayDiff(*report->first),
                HasSubstr("layer 1 expert " + std::to_string(expert) + " down: max abs diff"));
  }
  EXPECT_GT(named, 0);
}

TEST_F(ReplayTest, TheBinaryNamesTheFaultAndExitsTwo) {
#if defined(MOERT_TEST_UNDER_EMULATOR)
  GTEST_SKIP() << "runs the moert-replay binary, which needs qemu-user in binfmt";
#endif
  const std::string out = (*dir_ / "replay.out").string();
  const std::string cmd = std::string(MOERT_REPLAY_BIN) + " " + *bundle_ + " -m " + kQ8 +
                          " --inject-fault 3:ffn=50 > " + out + " 2>/dev/null";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  const std::string text = Slurp(out);
  EXPECT_THAT(text, HasSubstr("layer 3 ffn: max abs diff"));

  const std::string clean = std::string(MOERT_REPLAY_BIN) + " " + *bundle_ + " -m " + kQ8 +
                            " > " + out + " 2>/dev/null";
  const int clean_rc = std::system(clean.c_str());
  ASSERT_TRUE(WIFEXITED(clean_rc));
  EXPECT_EQ(WEXITSTATUS(clean_rc), 0);
}

TEST_F(ReplayTest, AnotherModelsBundleIsRefusedByHash) {
  tools::ReplayOptions o = Options();
  o.model = kQ4;
  const auto report = tools::Replay(o);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("is not the bundle's model"));
}

TEST_F(ReplayTest, ACorruptOrTruncatedBundleIsAnError) {
  const std::string bytes = Slurp(*bundle_);
  ASSERT_GT(bytes.size(), 64u);
  const std::string truncated = (*dir_ / "truncated.moert-repro").string();
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), bytes.size() / 2);
  std::string flipped = bytes;
  for (size_t i = 16; i < flipped.size(); i += 7) flipped[i] = static_cast<char>(~flipped[i]);
  const std::string corrupt = (*dir_ / "corrupt.moert-repro").string();
  std::ofstream(corrupt, std::ios::binary).write(flipped.data(), flipped.size());
  for (const std::string& path : {truncated, corrupt, (*dir_ / "missing").string()}) {
    tools::ReplayOptions o = Options();
    o.bundle = path;
    const auto report = tools::Replay(o);
    EXPECT_FALSE(report.ok()) << path;
  }
  EXPECT_FALSE(tools::ParseReplayFault("2:softmax").ok());
  EXPECT_FALSE(tools::ParseReplayFault("2:ffn:3").ok());
  const auto fault = tools::ParseReplayFault("4:down:3=0.5");
  ASSERT_TRUE(fault.ok());
  EXPECT_EQ(fault->layer, 4);
  EXPECT_EQ(fault->expert, 3);
  EXPECT_EQ(fault->delta, 0.5f);
}

}  // namespace
}  // namespace moert
