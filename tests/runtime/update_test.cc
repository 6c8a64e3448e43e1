// Expert hot updates in a running runtime (MoERuntime::ApplyUpdate, docs/updates.md) on
// the oracle model with a few experts perturbed: after an update the runtime answers as
// one loaded from the new file, bit for bit, resident and from an expert pool; a
// generation running across an update has the old model's tokens before the swap and
// the new model's after; every refusal names its reason and the old weights keep
// answering; two updates racing apply once.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/delta_fixture.h"
#include "common/greedy_request.h"
#include "experts/delta_apply.h"
#include "experts/delta_make.h"
#include "experts/delta_package.h"
#include "format/gguf.h"
#include "moert/runtime.h"
#include "telemetry/repro_bundle.h"

namespace moert {
namespace {

using test_util::DeltaFixture;
using test_util::Greedy;

constexpr char kModel[] = "tiny-moe-shakespeare-q8_0.gguf";

class HotUpdateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("moert-update-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // Every expert of the first layer retrained hard enough to change greedy decoding.
    std::vector<std::pair<int, int>> changed;
    for (int e = 0; e < 8; ++e) changed.emplace_back(0, e);
    fixture_ = test_util::MakeDeltaFixture(dir_.string(), kModel, changed, 0.5, 7, 24);
    package_ = (dir_ / "update.moert-delta").string();
    test_util::WriteBytes(package_, fixture_.package);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string PublicKey() const { return experts::ToHex(fixture_.keys.public_key); }

  std::unique_ptr<MoERuntime> Runtime(const std::string& path, double pool_fraction = 0,
                                      bool with_key = true) {
    RuntimeOptions options;
    options.threads = 1;
    options.hot_set = false;
    options.cache_dir = (dir_ / "cache").string();
    options.expert_pool_fraction = pool_fraction;
    // Routing that does not prefer resident experts: a pool's outputs are then those of
    // resident experts whatever the pool held before (an update in place keeps the
    // unchanged experts resident, a reload starts empty).
    options.router_alpha = 0;
    if (with_key) options.update_public_key = PublicKey();
    std::unique_ptr<MoERuntime> runtime;
    EXPECT_TRUE(MoERuntime::Create(options, &runtime).ok());
    const Status loaded = runtime->LoadModel(path);
    EXPECT_TRUE(loaded.ok()) << loaded.ToString();
    return runtime;
  }

  static std::vector<int32_t> GreedyIds(MoERuntime& runtime, int n) {
    std::unique_ptr<Session> session;
    EXPECT_TRUE(runtime.CreateSession(&session).ok());
    GenerateResult result;
    const Status status = session->Generate(Greedy(n), {}, &result);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return result.tokens;
  }

  // The count of updates applied `how` ("in_place", "reload") in the runtime's metrics.
  static int Updates(MoERuntime& runtime, const std::string& how) {
    const std::string text = runtime.Metrics();
    const std::string key = "moert_expert_updates_total{how=\"" + how + "\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::stoi(text.substr(at + key.size()));
  }

  std::filesystem::path dir_;
  DeltaFixture fixture_;
  std::string package_;
};

TEST_F(HotUpdateTest, TheFixtureChangesTheGreedyContinuation) {
  // Else the tests below could not tell the old weights from the new.
  auto old_model = Runtime(fixture_.base_path);
  auto new_model = Runtime(fixture_.target_path);
  EXPECT_NE(GreedyIds(*old_model, 24), GreedyIds(*new_model, 24));
}

class HotUpdatePoolTest : public HotUpdateTest, public ::testing::WithParamInterface<double> {};

TEST_P(HotUpdatePoolTest, AfterAnUpdateTheRuntimeAnswersAsOneLoadedFromTheNewFile) {
  auto reference = Runtime(fixture_.target_path, GetParam());
  const std::vector<int32_t> expected = GreedyIds(*reference, 24);
  auto runtime = Runtime(fixture_.base_path, GetParam());
  const std::vector<int32_t> before = GreedyIds(*runtime, 24);
  const Status applied = runtime->ApplyUpdate(package_);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(GreedyIds(*runtime, 24), expected);
  EXPECT_NE(before, expected);
  // Only experts changed: they were replaced in place, the model was not loaded again.
  EXPECT_EQ(Updates(*runtime, "in_place"), 1);
  EXPECT_EQ(Updates(*runtime, "reload"), 0);
  // The file on disk is the new model, byte for byte, with no temporary left beside it.
  EXPECT_EQ(test_util::ReadBytes(fixture_.base_path), test_util::ReadBytes(fixture_.target_path));
  EXPECT_FALSE(std::filesystem::exists(fixture_.base_path + ".moert-update"));
}


TEST_P(HotUpdatePoolTest, AGenerationAcrossAnUpdateHasOldTokensBeforeAndNewTokensAfter) {
  constexpr int kBefore = 6;
  constexpr int kTotal = 20;
  auto old_model = Runtime(fixture_.base_path);
  const std::vector<int32_t> old_ids = GreedyIds(*old_model, kTotal);

  auto runtime = Runtime(fixture_.base_path, GetParam());
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  std::string text_before;
  int seen = 0;
  Status applied;
  std::vector<int32_t> context_at_swap;
  GenerateResult result;
  const Status status = session->Generate(
      Greedy(kTotal),
      [&](std::string_view piece, int32_t) {
        if (seen < kBefore) text_before += piece;
        if (++seen == kBefore) {
          // Between two steps, from the generating thread: the next step runs on the new
          // weights over the same context.
          applied = runtime->ApplyUpdate(package_);
          context_at_swap = session->context_tokens();
        }
        return true;
      },
      &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  ASSERT_EQ(result.tokens.size(), static_cast<size_t>(kTotal));
  EXPECT_EQ(std::vector<int32_t>(result.tokens.begin(), result.tokens.begin() + kBefore),
            std::vector<int32_t>(old_ids.begin(), old_ids.begin() + kBefore));

  // The new model given the same context: the prompt and the old tokens, as text. Its
  // context must tokenize to the same ids (checked), then its continuation is the hot
  // session's.
  auto new_model = Runtime(fixture_.target_path);
  std::unique_ptr<Session> reference;
  ASSERT_TRUE(new_model->CreateSession(&reference).ok());
  GenerateRequest request = Greedy(kTotal - kBefore);
  request.prompt += text_before;
  GenerateResult after;
  ASSERT_TRUE(reference->Generate(request, {}, &after).ok());
  const std::vector<int32_t>& ref_context = reference->context_tokens();
  ASSERT_GE(ref_context.size(), context_at_swap.size());
  ASSERT_EQ(std::vector<int32_t>(ref_context.begin(), ref_context.begin() + context_at_swap.size()),
            context_at_swap)
      << "the prompt and the first tokens do not tokenize back to the same ids";
  EXPECT_EQ(std::vector<int32_t>(result.tokens.begin() + kBefore, result.tokens.end()), after.tokens);
  EXPECT_NE(std::vector<int32_t>(result.tokens.begin() + kBefore, result.tokens.end()),
            std::vector<int32_t>(old_ids.begin() + kBefore, old_ids.end()));
  EXPECT_EQ(Updates(*runtime, "in_place"), 1);
}

// A package whose header changes beyond the experts' checksums (here the model's name)
// cannot be applied in place: the runtime loads the new file instead, and answers as
// one loaded from it.
TEST_P(HotUpdatePoolTest, AHeaderChangeLoadsTheModelAgain) {
  std::vector<uint8_t> target = test_util::ReadBytes(fixture_.target_path);
  {
    auto parsed = format::GgufFile::FromBuffer(target, "target");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const format::GgufKeyValue* name = (*parsed)->FindKey("general.name");
    ASSERT_NE(name, nullptr);
    ASSERT_FALSE(name->value.str.empty());
    const size_t at = static_cast<size_t>(
        reinterpret_cast<const uint8_t*>(name->value.str.data()) - target.data());
    target[at] = target[at] == 'X' ? 'Y' : 'X';  // same length: only bytes move
  }
  const std::string renamed = (dir_ / "renamed.gguf").string();
  test_util::WriteBytes(renamed, target);
  const std::vector<uint8_t> base_bytes = test_util::ReadBytes(fixture_.base_path);
  auto base = format::GgufFile::FromBuffer(base_bytes, "base");
  auto updated = format::GgufFile::FromBuffer(target, "renamed");
  ASSERT_TRUE(base.ok() && updated.ok());
  auto package = experts::MakeDeltaPackage(**base, **updated, fixture_.keys.secret_key);
  ASSERT_TRUE(package.ok()) << package.status();
  const std::string path = (dir_ / "renamed.moert-delta").string();
  test_util::WriteBytes(path, *package);

  auto reference = Runtime(renamed, GetParam());
  const std::vector<int32_t> expected = GreedyIds(*reference, 24);
  auto runtime = Runtime(fixture_.base_path, GetParam());
  std::unique_ptr<Session> session;  // a session on the old weights, across the update
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  GenerateResult first;
  ASSERT_TRUE(session->Generate(Greedy(4), {}, &first).ok());
  const Status applied = runtime->ApplyUpdate(path);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(Updates(*runtime, "reload"), 1);
  EXPECT_EQ(Updates(*runtime, "in_place"), 0);
  EXPECT_EQ(GreedyIds(*runtime, 24), expected);
  EXPECT_EQ(test_util::ReadBytes(fixture_.base_path), target);
  GenerateResult next;
  EXPECT_TRUE(session->Generate(Greedy(4), {}, &next).ok());
}

TEST_F(HotUpdateTest, RefusalsNameTheirReasonAndTheOldWeightsKeepAnswering) {
  // No model.
  {
    std::unique_ptr<MoERuntime> empty;
    ASSERT_TRUE(MoERuntime::Create(RuntimeOptions{}, &empty).ok());
    const Status s = empty->ApplyUpdate(package_);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("no model"), std::string::npos) << s.ToString();
  }
  const std::vector<uint8_t> base_bytes = test_util::ReadBytes(fixture_.base_path);
  auto runtime = Runtime(fixture_.base_path, 0, /*with_key=*/false);
  const std::vector<int32_t> old_ids = GreedyIds(*runtime, 16);
  const auto expect_refused = [&](const std::string& package, StatusCode code,
                                  const std::string& reason) {
    const Status s = runtime->ApplyUpdate(package);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(reason), std::string::npos) << s.ToString();
    EXPECT_EQ(GreedyIds(*runtime, 16), old_ids);
    EXPECT_EQ(test_util::ReadBytes(fixture_.base_path), base_bytes);
  };
  expect_refused(package_, StatusCode::kFailedPrecondition, "update_public_key");

  // Another key.
  RuntimeOptions options = runtime->options();
  options.update_public_key = experts::ToHex(experts::GenerateKeyPair().public_key);
  ASSERT_TRUE(runtime->SetOptions(options).ok());
  {
    const Status s = runtime->ApplyUpdate(package_);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    EXPECT_NE(s.message().find(package_), std::string::npos) << s.ToString();
  }
  options.update_public_key = PublicKey();
  ASSERT_TRUE(runtime->SetOptions(options).ok());

  // A truncated package, and a missing one.
  const std::string truncated = (dir_ / "truncated.moert-delta").string();
  test_util::WriteBytes(truncated, std::span<const uint8_t>(fixture_.package)
                                       .subspan(0, fixture_.package.size() / 2));
  {
    const Status s = runtime->ApplyUpdate(truncated);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(truncated), std::string::npos) << s.ToString();
    EXPECT_EQ(GreedyIds(*runtime, 16), old_ids);
  }
  EXPECT_FALSE(runtime->ApplyUpdate((dir_ / "missing.moert-delta").string()).ok());

  // Applied once; then the same package is refused as already applied, and one for the
  // old base as for another base.
  ASSERT_TRUE(runtime->ApplyUpdate(package_).ok());
  const std::vector<int32_t> new_ids = GreedyIds(*runtime, 16);
  const Status again = runtime->ApplyUpdate(package_);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  EXPECT_NE(again.message().find("already applied"), std::string::npos) << again.ToString();
  const std::string other_dir = (dir_ / "other").string();
  std::filesystem::create_directories(other_dir);
  DeltaFixture other = test_util::MakeDeltaFixture(other_dir, kModel, {{1, 2}}, 0.25, 11);
  const std::string other_package = other_dir + "/other.moert-delta";
  test_util::WriteBytes(other_package, other.package);
  options.update_public_key = experts::ToHex(other.keys.public_key);
  ASSERT_TRUE(runtime->SetOptions(options).ok());
  const Status other_base = runtime->ApplyUpdate(other_package);
  EXPECT_EQ(other_base.code(), StatusCode::kFailedPrecondition) << other_base.ToString();
  EXPECT_EQ(GreedyIds(*runtime, 16), new_ids);
}

// A repro bundle written after an update names the weights it ran on: the update count
// and the new file's whole-file hash (the package's target), which the prefix hash of
// the model text cannot tell apart when only experts changed.
TEST_F(HotUpdateTest, ReproBundlesAfterAnUpdateNameTheNewWeights) {
  auto runtime = Runtime(fixture_.base_path);
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy(4), {}, &result).ok());
  const std::string before_path = (dir_ / "before.moert-repro").string();
  ASSERT_TRUE(session->WriteRepro(before_path).ok());
  const Status applied = runtime->ApplyUpdate(package_);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  ASSERT_TRUE(session->Generate(Greedy(4), {}, &result).ok());
  const std::string after_path = (dir_ / "after.moert-repro").string();
  ASSERT_TRUE(session->WriteRepro(after_path).ok());

  absl::StatusOr<telemetry::ReproBundle> before = telemetry::ReadReproBundle(before_path);
  absl::StatusOr<telemetry::ReproBundle> after = telemetry::ReadReproBundle(after_path);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(after.ok()) << after.status();
  absl::StatusOr<experts::FileHash> target = experts::HashFile(fixture_.target_path);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(before->model.find("update="), std::string::npos) << before->model;
  EXPECT_NE(after->model.find("update=1\n"), std::string::npos) << after->model;
  EXPECT_NE(after->model.find("target_hash=blake2b:" + experts::ToHex(*target)),
            std::string::npos)
      << after->model;
}

TEST_F(HotUpdateTest, AModelLoadedFromAnFdRangeIsRefused) {
  RuntimeOptions options;
  options.threads = 1;
  options.hot_set = false;
  options.cache_dir = (dir_ / "cache").string();
  options.update_public_key = PublicKey();
  std::unique_ptr<MoERuntime> runtime;
  ASSERT_TRUE(MoERuntime::Create(options, &runtime).ok());
  const int fd = ::open(fixture_.base_path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(runtime->LoadModelFromFd(fd, 0, 0).ok());
  const Status s = runtime->ApplyUpdate(package_);
  ::close(fd);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("load it by path"), std::string::npos) << s.ToString();
}

TEST_F(HotUpdateTest, TwoUpdatesRacingApplyOnce) {
  auto runtime = Runtime(fixture_.base_path);
  Status first, second;
  std::thread a([&] { first = runtime->ApplyUpdate(package_); });
  std::thread b([&] { second = runtime->ApplyUpdate(package_); });
  a.join();
  b.join();
  EXPECT_NE(first.ok(), second.ok()) << first.ToString() << " / " << second.ToString();
  const Status& refused = first.ok() ? second : first;
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  auto reference = Runtime(fixture_.target_path);
  EXPECT_EQ(GreedyIds(*runtime, 16), GreedyIds(*reference, 16));
}

INSTANTIATE_TEST_SUITE_P(ResidentAndPooled, HotUpdatePoolTest, ::testing::Values(0.0, 0.4),
                         [](const ::testing::TestParamInfo<double>& param) {
                           return param.param == 0.0 ? std::string("resident")
                                                    : std::string("pool");
                         });

}  // namespace
}  // namespace moert
