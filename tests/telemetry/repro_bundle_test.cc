// The repro bundle container: a round trip keeps every section, the size cap drops the
// KV cache and then the trace (and says so), and a truncated, corrupted or hostile file
// is an error naming what is wrong.
#include "telemetry/repro_bundle.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>

namespace moert::telemetry {
namespace {

ReproBundle SampleBundle(int kv_positions = 4) {
  ReproBundle b;
  b.trigger = "error";
  b.error = "DATA_LOSS: layer 1 expert 3: checksum mismatch";
  b.created_ns = 123456789012345ull;
  b.fingerprint = "cpu=Test CPU\ncores=8\nmem_total_kb=1024\n";
  b.model = "path=/m.gguf\nhash=moert-fnv1a64:0123456789abcdef\n";
  b.options = "threads=2\nbackend=cpu\n";
  b.tokens = {1, 15043, -1, 29871, 0};
  b.router_logits.width = 4;
  b.router_logits.layers = {0, 1};
  b.router_logits.logits = {0.5f, -1.25f, 3.0f, 1e-7f, -0.0f, 2.5f, -3.5f, 7.0f};
  b.kv.layers = 2;
  b.kv.positions = kv_positions;
  b.kv.key_width = 3;
  b.kv.value_width = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  b.kv.keys.resize(static_cast<size_t>(2 * kv_positions * 3));
  b.kv.values.resize(static_cast<size_t>(2 * kv_positions * 2));
  for (float& f : b.kv.keys) f = dist(rng);
  for (float& f : b.kv.values) f = dist(rng);
  b.pool = "pool_bytes=4096\nlayer0_resident=0x5\n";
  b.trace = R"({"traceEvents":[{"name":"forward","ph":"X","ts":1,"dur":2}]})";
  return b;
}

TEST(ReproBundleTest, RoundTripKeepsEverySection) {
  const ReproBundle b = SampleBundle();
  absl::StatusOr<std::string> bytes = EncodeReproBundle(b, 0);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<ReproBundle> back = DecodeReproBundle(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, b);
  EXPECT_EQ(back->kv.keys, b.kv.keys);
  EXPECT_TRUE(back->dropped.empty());
}

TEST(ReproBundleTest, WriteAndReadAFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "moert-repro-bundle-test" / "nested";
  std::filesystem::remove_all(dir.parent_path());
  const std::string path = (dir / "a.moert-repro").string();
  absl::StatusOr<std::vector<std::string>> dropped = WriteReproBundle(path, SampleBundle(), 0);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_TRUE(dropped->empty());
  absl::StatusOr<ReproBundle> back = ReadReproBundle(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, SampleBundle());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove_all(dir.parent_path());
  EXPECT_EQ(ReadReproBundle(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(ReproBundleTest, CapDropsKvThenTrace) {
  // Random floats do not compress: the KV cache dominates the file.
  ReproBundle b = SampleBundle(4096);
  std::string trace = "{\"traceEvents\":[";
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) trace += std::to_string(rng()) + ",";
  b.trace = trace + "0]}";
  const absl::StatusOr<std::string> full = EncodeReproBundle(b, 0);
  ASSERT_TRUE(full.ok()) << full.status();

  ReproBundle no_kv = b;
  no_kv.kv = ReproKv();
  const absl::StatusOr<std::string> without_kv = EncodeReproBundle(no_kv, 0);
  ASSERT_TRUE(without_kv.ok());
  ASSERT_GT(full->size(), without_kv->size() + 1000);

  // A cap between the two: the KV cache goes, the trace stays.
  const uint64_t cap = without_kv->size() + 100;
  absl::StatusOr<std::string> capped = EncodeReproBundle(b, cap);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_LE(capped->size(), cap);
  absl::StatusOr<ReproBundle> back = DecodeReproBundle(*capped);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dropped, std::vector<std::string>{"kv"});
  EXPECT_EQ(back->kv, ReproKv());
  EXPECT_EQ(back->trace, b.trace);
  EXPECT_EQ(back->tokens, b.tokens);

  // Below that: the trace goes too.
  no_kv.trace.clear();
  const absl::StatusOr<std::string> required = EncodeReproBundle(no_kv, 0);
  ASSERT_TRUE(required.ok());
  capped = EncodeReproBundle(b, required->size() + 40);
  ASSERT_TRUE(capped.ok()) << capped.status();
  back = DecodeReproBundle(*capped);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dropped, (std::vector<std::string>{"kv", "trace"}));
  EXPECT_TRUE(back->trace.empty());
  EXPECT_EQ(back->router_logits, b.router_logits);

  // Below the required sections: an error naming both sizes.
  const absl::StatusOr<std::string> too_small = EncodeReproBundle(b, 64);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_small.status().message().find("over the cap of 64 bytes"), std::string::npos)
      << too_small.status();
}

TEST(ReproBundleTest, EveryTruncationIsAnError) {
  const absl::StatusOr<std::string> bytes = EncodeReproBundle(SampleBundle(), 0);
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    const absl::StatusOr<ReproBundle> b = DecodeReproBundle(std::string_view(*bytes).substr(0, n));
    EXPECT_FALSE(b.ok()) << "truncated to " << n << " bytes";
  }
  EXPECT_NE(DecodeReproBundle(bytes->substr(0, 10)).status().message().find("header"),
            std::string::npos);
  EXPECT_NE(DecodeReproBundle(bytes->substr(0, bytes->size() - 1)).status().message().find("truncated"),
            std::string::npos);
}

TEST(ReproBundleTest, CorruptBytesAreErrors) {
  const absl::StatusOr<std::string> bytes = EncodeReproBundle(SampleBundle(), 0);
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[0] = 'X';
  EXPECT_NE(DecodeReproBundle(bad).status().message().find("magic"), std::string::npos);
  bad = *bytes;
  bad[8] = 9;  // version
  EXPECT_NE(DecodeReproBundle(bad).status().message().find("version 9"), std::string::npos);
  bad = *bytes;
  bad[12] = 100;  // section count
  EXPECT_NE(DecodeReproBundle(bad).status().message().find("100 sections"), std::string::npos);
  bad = *bytes;
  bad[23] = 0x7f;  // uncompressed size, huge
  EXPECT_NE(DecodeReproBundle(bad).status().message().find("uncompressed size"), std::string::npos);
  // Every single flipped byte of the frame: zstd's checksum or the parser catches it.
  for (size_t i = 32; i < bytes->size(); ++i) {
    bad = *bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    EXPECT_FALSE(DecodeReproBundle(bad).ok()) << "byte " << i;
  }
}

TEST(ReproBundleTest, ShapesAreChecked) {
  ReproBundle b = SampleBundle();
  b.router_logits.logits.pop_back();
  EXPECT_EQ(EncodeReproBundle(b, 0).status().code(), absl::StatusCode::kInvalidArgument);
  b = SampleBundle();
  b.kv.values.push_back(1);
  EXPECT_EQ(EncodeReproBundle(b, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReproBundleTest, ValuesOfKeyValueLines) {
  EXPECT_EQ(ReproValue("a=1\nab=2\nb=\n", "ab"), "2");
  EXPECT_EQ(ReproValue("a=1\nab=2\nb=\n", "a"), "1");
  EXPECT_EQ(ReproValue("a=1\nab=2\nb=\n", "b"), "");
  EXPECT_EQ(ReproValue("a=1", "c"), "");
}

}  // namespace
}  // namespace moert::telemetry
