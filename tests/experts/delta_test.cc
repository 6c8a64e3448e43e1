// Delta packages (experts/delta_*.h) on the oracle model: make, verify and apply round
// trips bit for bit, the package's size against the changed experts', every kind of bad
// package refused with its reason, a full disk, two updates racing, and an apply killed
// after each of its steps leaving a file that loads and is the old or the new model.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/delta_fixture.h"
#include "experts/checksum.h"
#include "experts/delta_apply.h"
#include "experts/delta_codec.h"
#include "experts/delta_make.h"
#include "experts/delta_package.h"
#include "experts/test_model.h"

namespace moert::experts {
namespace {

using test_util::DeltaFixture;
using test_util::ReadBytes;
using test_util::WriteBytes;

constexpr char kModel[] = "tiny-moe-shakespeare-q8_0.gguf";

DeltaFixture Fixture(const std::string& name,
                     std::vector<std::pair<int, int>> changed = {{0, 1}, {2, 5}, {3, 7}}) {
  return test_util::MakeDeltaFixture(testing::TempDir(name), kModel, std::move(changed));
}

// The package's manifest, changed by `edit` and signed again with the fixture's key: a
// package its signer got wrong (or a signing key that leaked).
std::vector<uint8_t> Resigned(const DeltaFixture& f, const std::function<void(DeltaManifest&)>& edit) {
  auto package = ParseDeltaPackage(f.package, f.keys.public_key);
  EXPECT_TRUE(package.ok()) << package.status();
  DeltaManifest m = package->manifest;
  edit(m);
  return SerializeDeltaPackage(m, package->payload, f.keys.secret_key);
}

TEST(DeltaCodecTest, PatchRoundTripsAndRejectsAnotherSize) {
  std::vector<uint8_t> base(100000), target;
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  target = base;
  for (size_t i = 0; i < target.size(); i += 97) target[i] ^= 0x5A;
  auto frame = EncodePatch(base, target);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_LT(frame->size(), target.size() / 4);  // mostly matches against the prefix
  std::vector<uint8_t> out(target.size());
  ASSERT_TRUE(DecodePatch(base, *frame, out).ok());
  EXPECT_EQ(out, target);
  std::vector<uint8_t> shorter(target.size() - 1);
  EXPECT_EQ(DecodePatch(base, *frame, shorter).code(), absl::StatusCode::kDataLoss);
  // Against another prefix the frame decodes to other bytes (its checksum catches it).
  std::vector<uint8_t> other = base;
  other[5000] ^= 1;
  const absl::Status s = DecodePatch(other, *frame, out);
  EXPECT_TRUE(!s.ok() || out != target);
}

TEST(DeltaMakeTest, ExpertListsParseOrNameTheBadItem) {
  auto ok = ParseExpertList("0:1,3:7");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (std::vector<std::pair<int, int>>{{0, 1}, {3, 7}}));
  for (const char* bad : {"0:1,3", "0-1", "0:1x", "a:b", ""}) {
    auto parsed = ParseExpertList(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseExpertList("0:1,0:1x").status().message().find("'0:1x'"), std::string::npos);
}

TEST(DeltaPackageTest, KeysRoundTripThroughHex) {
  const KeyPair pair = GenerateKeyPair();
  auto pub = ParsePublicKey(ToHex(pair.public_key) + "\n");
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(*pub, pair.public_key);
  auto secret = ParseSecretKey(ToHex(pair.secret_key));
  ASSERT_TRUE(secret.ok());
  EXPECT_EQ(*secret, pair.secret_key);
  EXPECT_EQ(ParsePublicKey("abc").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePublicKey(std::string(64, 'g')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeltaTest, OfflineRoundTripIsBitExactAndSmall) {
  DeltaFixture f = Fixture("delta-roundtrip");
  ASSERT_FALSE(f.package.empty());
  EXPECT_EQ(f.stats.changed, f.experts);
  EXPECT_FALSE(f.stats.header_changed);
  auto package = ParseDeltaPackage(f.package, f.keys.public_key);
  ASSERT_TRUE(package.ok()) << package.status();
  ASSERT_EQ(package->manifest.entries.size(), 1 + f.experts.size());
  const std::vector<uint8_t> base = ReadBytes(f.base_path);
  ASSERT_TRUE(VerifyDelta(base, *package).ok());

  const std::string out = f.dir + "/applied.gguf";
  auto result = ApplyDeltaFile(f.base_path, *package, out);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->experts, f.experts);
  EXPECT_EQ(ReadBytes(out), ReadBytes(f.target_path));
  EXPECT_FALSE(std::filesystem::exists(out + ".moert-update"));
  // In place: the base file becomes the target.
  ASSERT_TRUE(ApplyDeltaFile(f.base_path, *package, f.base_path).ok());
  EXPECT_EQ(ReadBytes(f.base_path), ReadBytes(f.target_path));
  // Applying again is refused as already applied.
  auto again = ApplyDeltaFile(f.base_path, *package, f.base_path);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already applied"), std::string::npos);

  // A quarter of the changed experts' weights moved by one step: the package is a small
  // part of those experts' bytes (the figure is reported, the bound is loose).
  const double ratio = static_cast<double>(f.stats.package_bytes) /
                       static_cast<double>(f.stats.changed_expert_bytes);
  std::printf("delta package: %llu bytes for %zu changed experts of %llu bytes (%.1f%%); all "
              "routed experts %llu bytes\n",
              static_cast<unsigned long long>(f.stats.package_bytes), f.stats.changed.size(),
              static_cast<unsigned long long>(f.stats.changed_expert_bytes), 100 * ratio,
              static_cast<unsigned long long>(f.stats.all_expert_bytes));
  ::testing::Test::RecordProperty("package_bytes", std::to_string(f.stats.package_bytes));
  ::testing::Test::RecordProperty("changed_expert_bytes",
                                  std::to_string(f.stats.changed_expert_bytes));
  EXPECT_LT(ratio, 0.5);
}

TEST(DeltaTest, BadPackagesAreRefusedWithTheirReason) {
  DeltaFixture f = Fixture("delta-bad");
  ASSERT_FALSE(f.package.empty());
  const std::vector<uint8_t> base = ReadBytes(f.base_path);

  // Another signer's key.
  const KeyPair other = GenerateKeyPair();
  auto wrong_key = ParseDeltaPackage(f.package, other.public_key);
  EXPECT_EQ(wrong_key.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(wrong_key.status().message().find("signature"), std::string::npos);
  // A byte changed after signing, anywhere past the magic and version.
  for (size_t at : {size_t{20}, kDeltaHeaderBytes + 40, f.package.size() / 2, f.package.size() - 1}) {
    std::vector<uint8_t> changed = f.package;
    changed[at] ^= 0x10;
    auto parsed = ParseDeltaPackage(changed, f.keys.public_key);
    EXPECT_FALSE(parsed.ok()) << "byte " << at;
  }
  // Truncated at every length class: never parsed, always named.
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{100}, kDeltaHeaderBytes,
                   kDeltaHeaderBytes + 10, f.package.size() / 3, f.package.size() - 64,
                   f.package.size() - 1}) {
    auto parsed = ParseDeltaPackage(std::span(f.package).subspan(0, n), f.keys.public_key);
    ASSERT_FALSE(parsed.ok()) << n;
    if (n >= 8) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << n << parsed.status();
      EXPECT_NE(parsed.status().message().find("truncated"), std::string::npos) << n;
    }
  }
  // Not a package at all.
  EXPECT_EQ(ParseDeltaPackage(base, f.keys.public_key).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A package for another base: made from the target to a second perturbation.
  {
    auto target_file = format::GgufFile::Open(f.target_path);
    ASSERT_TRUE(target_file.ok());
    auto second = PerturbExperts(**target_file, {{1, 1}}, 0.1, 99);
    ASSERT_TRUE(second.ok());
    auto second_file = format::GgufFile::FromBuffer(*second);
    ASSERT_TRUE(second_file.ok());
    auto bytes = MakeDeltaPackage(**target_file, **second_file, f.keys.secret_key);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto package = ParseDeltaPackage(*bytes, f.keys.public_key);
    ASSERT_TRUE(package.ok());
    const std::string out = f.dir + "/other-base.gguf";
    auto applied = ApplyDeltaFile(f.base_path, *package, out);
    EXPECT_EQ(applied.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(applied.status().message().find("another base"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(out));
  }

  // Signed, but a delta that decodes to another checksum than its manifest's.
  {
    auto bytes = Resigned(f, [](DeltaManifest& m) { m.entries[2].new_checksum ^= 1; });
    auto package = ParseDeltaPackage(bytes, f.keys.public_key);
    ASSERT_TRUE(package.ok()) << package.status();
    const absl::Status verified = VerifyDelta(base, *package);
    EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(verified.message().find("decodes to checksum"), std::string::npos) << verified;
    EXPECT_NE(verified.message().find("layer 2, expert 5"), std::string::npos) << verified;
    const std::string out = f.dir + "/bad-checksum.gguf";
    EXPECT_EQ(ApplyDeltaFile(f.base_path, *package, out).status().code(),
              absl::StatusCode::kDataLoss);
    EXPECT_FALSE(std::filesystem::exists(out));
    EXPECT_FALSE(std::filesystem::exists(out + ".moert-update"));
  }
  // Signed, but made against other bytes of an expert.
  {
    auto bytes = Resigned(f, [](DeltaManifest& m) { m.entries[1].old_checksum ^= 1; });
    auto package = ParseDeltaPackage(bytes, f.keys.public_key);
    ASSERT_TRUE(package.ok());
    EXPECT_EQ(VerifyDelta(base, *package).code(), absl::StatusCode::kFailedPrecondition);
  }
  // Signed, but entries out of bounds: every one InvalidArgument naming the entry.
  const std::vector<std::function<void(DeltaManifest&)>> crafted = {
      [](DeltaManifest& m) { m.entries[1].ranges[0].base_offset = m.base_size - 10; },
      [](DeltaManifest& m) { m.entries[1].ranges[1].target_bytes += 1; },
      [](DeltaManifest& m) { m.entries[1].payload_bytes = uint64_t{1} << 62; },
      [](DeltaManifest& m) { m.entries[2].ranges = m.entries[1].ranges; },
      [](DeltaManifest& m) { m.entries[1].kind = static_cast<DeltaKind>(7); },
      [](DeltaManifest& m) { m.entries[1].encoding = static_cast<DeltaEncoding>(0); },
      [](DeltaManifest& m) { std::swap(m.entries[1], m.entries[2]); },
      [](DeltaManifest& m) { m.entries[0].ranges[0].target_bytes = 3; },
      [](DeltaManifest& m) { m.target_data_offset = m.target_size + 1; },
  };
  for (size_t i = 0; i < crafted.size(); ++i) {
    auto parsed = ParseDeltaPackage(Resigned(f, crafted[i]), f.keys.public_key);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << "case " << i << ": " << parsed.status();
  }
}

TEST(DeltaTest, MakeRefusesChangesOutsideTheExperts) {
  const std::string dir = testing::TempDir("delta-make-bad");
  const format::GgufFile& oracle = test_util::OracleFile(kModel);
  std::vector<uint8_t> changed(oracle.bytes().begin(), oracle.bytes().end());
  const format::GgufTensorInfo* t = oracle.FindTensor("blk.1.attn_q.weight");
  ASSERT_NE(t, nullptr);
  changed[t->file_offset + 5] ^= 1;
  auto file = format::GgufFile::FromBuffer(changed);
  ASSERT_TRUE(file.ok());
  const KeyPair keys = GenerateKeyPair();
  auto made = MakeDeltaPackage(oracle, **file, keys.secret_key);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("blk.1.attn_q.weight"), std::string::npos)
      << made.status();
}

// The expert directory's stored checksums (moert.expert_xxh64) must follow the bytes.
TEST(DeltaTest, StoredChecksumsMustMatchTheTarget) {
  testing::TestModelOptions options;
  options.write_checksums = true;
  const testing::TestModel model =
      testing::WriteTestModel(testing::TempDir("delta-sums"), "m.gguf", options);
  auto perturbed = PerturbExperts(*model.file, {{1, 2}}, 0.5, 3);
  ASSERT_TRUE(perturbed.ok()) << perturbed.status();
  auto stale = format::GgufFile::FromBuffer(*perturbed);
  ASSERT_TRUE(stale.ok());
  const KeyPair keys = GenerateKeyPair();
  auto made = MakeDeltaPackage(*model.file, **stale, keys.secret_key);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("layer 1, expert 2"), std::string::npos) << made.status();
}

TEST(DeltaTest, FullDiskLeavesTheModelAsItWas) {
  DeltaFixture f = Fixture("delta-full");
  auto package = ParseDeltaPackage(f.package, f.keys.public_key);
  ASSERT_TRUE(package.ok());
  const std::vector<uint8_t> before = ReadBytes(f.base_path);
  for (uint64_t room : {uint64_t{1}, uint64_t{4096}, before.size() / 2, before.size() - 1}) {
    DeltaApplyOptions options;
    options.disk_bytes_for_testing = room;
    auto applied = ApplyDeltaFile(f.base_path, *package, f.base_path, options);
    EXPECT_EQ(applied.status().code(), absl::StatusCode::kResourceExhausted) << room;
    EXPECT_NE(applied.status().message().find("No space left"), std::string::npos)
        << applied.status();
    EXPECT_EQ(ReadBytes(f.base_path), before);
    EXPECT_FALSE(std::filesystem::exists(f.base_path + ".moert-update"));
  }
  EXPECT_TRUE(ApplyDeltaFile(f.base_path, *package, f.base_path).ok());
}

TEST(DeltaTest, ASecondUpdateWhileOneWritesIsRefused) {
  DeltaFixture f = Fixture("delta-race");
  auto package = ParseDeltaPackage(f.package, f.keys.public_key);
  ASSERT_TRUE(package.ok());
  absl::Status second = absl::OkStatus();
  DeltaApplyOptions options;
  options.after_step_for_testing = [&](ApplyStep step) {
    if (step == ApplyStep::kTempWritten) {
      second = ApplyDeltaFile(f.base_path, *package, f.base_path).status();
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE(ApplyDeltaFile(f.base_path, *package, f.base_path, options).ok());
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.message().find("another update"), std::string::npos) << second;
  EXPECT_EQ(ReadBytes(f.base_path), ReadBytes(f.target_path));
}

// A crash after each step (the process exits in the hook): the model file loads and is
// the old model (before the rename) or the new one (after), and a later update works.
TEST(DeltaTest, AnUpdateKilledAfterEachStepLeavesALoadableModel) {
  for (ApplyStep at : {ApplyStep::kTempWritten, ApplyStep::kTempSynced, ApplyStep::kRenamed}) {
    SCOPED_TRACE(ApplyStepName(at));
    DeltaFixture f = Fixture(std::string("delta-crash-") + ApplyStepName(at));
    auto package = ParseDeltaPackage(f.package, f.keys.public_key);
    ASSERT_TRUE(package.ok());
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      DeltaApplyOptions options;
      options.after_step_for_testing = [at](ApplyStep step) {
        if (step == at) _exit(3);
        return absl::OkStatus();
      };
      (void)ApplyDeltaFile(f.base_path, *package, f.base_path, options);
      _exit(0);
    }
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    ASSERT_TRUE(WIFEXITED(wstatus));
    EXPECT_EQ(WEXITSTATUS(wstatus), 3);
    auto reopened = format::GgufFile::Open(f.base_path);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    const std::vector<uint8_t> now = ReadBytes(f.base_path);
    const bool renamed = at == ApplyStep::kRenamed;
    EXPECT_EQ(HashBytes(now), renamed ? package->manifest.target_hash : package->manifest.base_hash);
    if (!renamed) {
      // The stale temporary file does not stand in the way of the next update.
      auto applied = ApplyDeltaFile(f.base_path, *package, f.base_path);
      ASSERT_TRUE(applied.ok()) << applied.status();
      EXPECT_EQ(ReadBytes(f.base_path), ReadBytes(f.target_path));
    }
  }
}

// A step that fails (not a crash) leaves the output untouched and no temporary file.
TEST(DeltaTest, AFailedStepCleansUp) {
  for (ApplyStep at : {ApplyStep::kTempWritten, ApplyStep::kTempSynced}) {
    DeltaFixture f = Fixture(std::string("delta-fail-") + ApplyStepName(at));
    auto package = ParseDeltaPackage(f.package, f.keys.public_key);
    ASSERT_TRUE(package.ok());
    const std::vector<uint8_t> before = ReadBytes(f.base_path);
    DeltaApplyOptions options;
    options.after_step_for_testing = [at](ApplyStep step) {
      return step == at ? absl::AbortedError("injected") : absl::OkStatus();
    };
    EXPECT_EQ(ApplyDeltaFile(f.base_path, *package, f.base_path, options).status().code(),
              absl::StatusCode::kAborted);
    EXPECT_EQ(ReadBytes(f.base_path), before);
    EXPECT_FALSE(std::filesystem::exists(f.base_path + ".moert-update"));
  }
}

}  // namespace
}  // namespace moert::experts
