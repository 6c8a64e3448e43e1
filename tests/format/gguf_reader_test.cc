// Tests of the GGUF reader: the real test model, the typed accessors, and malformed
// files built byte by byte (truncations, bad headers, caps, bad tensor infos).
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/strings.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moert::format {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kModelDir = std::string(MOERT_SHARED_DIR) + "/models/";

// Builds GGUF bytes by hand, so that tests can write what the writer never would.
class RawGguf {
 public:
  RawGguf& Bytes(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& U8(uint8_t v) { return Le(v, 1); }
  RawGguf& U16(uint16_t v) { return Le(v, 2); }
  RawGguf& U32(uint32_t v) { return Le(v, 4); }
  RawGguf& U64(uint64_t v) { return Le(v, 8); }
  RawGguf& Str(std::string_view s) { return U64(s.size()).Bytes(s); }
  RawGguf& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return Bytes("GGUF").U32(version).U64(n_tensors).U64(n_kv);
  }
  // Key and value type; the caller appends the value.
  RawGguf& Key(std::string_view key, GgufValueType type) {
    return Str(key).U32(static_cast<uint32_t>(type));
  }
  RawGguf& KvU32(std::string_view key, uint32_t v) {
    return Key(key, GgufValueType::kUint32).U32(v);
  }
  RawGguf& TensorInfo(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                      uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  RawGguf& PadTo(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  RawGguf& Zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  RawGguf& Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  std::vector<uint8_t> bytes_;
};

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::kF32);
constexpr uint32_t kQ8_0 = static_cast<uint32_t>(GgmlType::kQ8_0);

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::vector<uint8_t>& bytes,
                                                const GgufLimits& limits = {}) {
  return GgufFile::FromBuffer(bytes, "test.gguf", limits);
}

// Asserts that parsing fails with `code` and a message containing every one of `parts`.
void ExpectError(const std::vector<uint8_t>& bytes, absl::StatusCode code,
                 const std::vector<std::string>& parts, const GgufLimits& limits = {}) {
  auto file = Parse(bytes, limits);
  ASSERT_FALSE(file.ok()) << "parsed a malformed file";
  EXPECT_EQ(file.status().code(), code) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("test.gguf: "));
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(part));
  }
}

// One f32 tensor "t" of 8 values at `offset`, file padded to hold `data_bytes`.
std::vector<uint8_t> OneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                               size_t data_bytes) {
  RawGguf g;
  g.Header(3, 1, 0).TensorInfo("t", std::move(dims), type, offset).PadTo(32).Zeros(data_bytes);
  return g.bytes();
}

// ---------------------------------------------------------------------------------
// The real model.

TEST(GgufReaderTest, ReadsTinyModelQ8_0) {
  auto file = GgufFile::Open(kModelDir + "tiny-moe-shakespeare-q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 26u);
  EXPECT_EQ(f.tensors().size(), 43u);
  EXPECT_EQ(f.data_offset(), 47840u);
  EXPECT_EQ(f.bytes().size(), 15408864u);

  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetString("general.name"), "tiny-moe-shakespeare");
  EXPECT_EQ(*f.GetUint("llama.expert_count"), 8u);
  EXPECT_EQ(*f.GetUint("llama.expert_used_count"), 2u);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 4);
  EXPECT_EQ(*f.GetUint("llama.vocab_size"), 2048u);
  EXPECT_EQ(*f.GetUint("general.file_type"), 7u);
  EXPECT_DOUBLE_EQ(*f.GetFloat("llama.rope.freq_base"), 10000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_TRUE(*f.GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(*f.GetBool("tokenizer.ggml.add_eos_token"));
  EXPECT_EQ(f.FindKey("general.architecture")->file_offset, 24u);

  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2048u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  auto scores = f.GetFloatArray("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.ok()) << scores.status();
  EXPECT_EQ(scores->size(), 2048u);
  auto types = f.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok()) << types.status();
  ASSERT_EQ(types->size(), 2048u);
  EXPECT_THAT(std::vector<int64_t>(types->begin(), types->begin() + 5), ElementsAre(2, 3, 3, 6, 6));

  const GgufTensorInfo* out = f.FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->type, GgmlType::kQ8_0);
  EXPECT_THAT(out->dims, ElementsAre(256, 2048));
  EXPECT_EQ(out->n_elements, 256u * 2048u);
  EXPECT_EQ(out->n_bytes, 557056u);
  EXPECT_EQ(out->offset, 0u);
  EXPECT_EQ(out->file_offset, 47840u);
  EXPECT_EQ(out->info_offset, 45125u);
  std::span<const uint8_t> data = f.TensorData(*out);
  ASSERT_EQ(data.size(), 557056u);
  EXPECT_EQ(data.data(), f.bytes().data() + 47840);
  // First q8_0 block: f16 scale 0x147d, then the quants.
  EXPECT_EQ(data[0], 0x7d);
  EXPECT_EQ(data[1], 0x14);
  EXPECT_EQ(data[2], 0x70);

  const GgufTensorInfo* norm = f.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::kF32);
  EXPECT_THAT(norm->dims, ElementsAre(256));
  EXPECT_EQ(norm->offset, 557056u);
  EXPECT_EQ(norm->n_bytes, 1024u);
  float first;
  std::memcpy(&first, f.TensorData(*norm).data(), sizeof(first));
  EXPECT_FLOAT_EQ(first, 1.1928110122680664f);

  const GgufTensorInfo* down = f.FindTensor("blk.0.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, GgmlType::kQ8_0);
  EXPECT_THAT(down->dims, ElementsAre(512, 256, 8));
  EXPECT_EQ(down->offset, 1325056u);
  EXPECT_EQ(down->n_bytes, 512u * 256u * 8u / 32u * 34u);
  const GgufTensorInfo* gate_inp = f.FindTensor("blk.3.ffn_gate_inp.weight");
  ASSERT_NE(gate_inp, nullptr);
  EXPECT_EQ(gate_inp->type, GgmlType::kF32);
  EXPECT_THAT(gate_inp->dims, ElementsAre(256, 8));

  // The last tensor ends exactly at the end of the file.
  const GgufTensorInfo& last = f.tensors().back();
  EXPECT_EQ(last.name, "blk.3.ffn_up_exps.weight");
  EXPECT_EQ(last.file_offset + last.n_bytes, f.bytes().size());
  EXPECT_EQ(f.FindTensor("no.such.tensor"), nullptr);
  EXPECT_EQ(f.FindKey("no.such.key"), nullptr);
}

TEST(GgufReaderTest, ReadsEveryTinyModelVariant) {
  struct Variant {
    const char* file;
    GgmlType down_type;
    uint64_t n_kv;
  };
  for (const Variant& v : {Variant{"tiny-moe-shakespeare-f32.gguf", GgmlType::kF32, 25},
                           Variant{"tiny-moe-shakespeare-f16.gguf", GgmlType::kF16, 25},
                           Variant{"tiny-moe-shakespeare-q4_0.gguf", GgmlType::kQ4_0, 26}}) {
    SCOPED_TRACE(v.file);
    auto file = GgufFile::Open(kModelDir + v.file);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->tensors().size(), 43u);
    EXPECT_EQ((*file)->metadata().size(), v.n_kv);
    EXPECT_EQ(*(*file)->GetUint("llama.expert_count"), 8u);
    const GgufTensorInfo* down = (*file)->FindTensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->type, v.down_type);
    EXPECT_THAT(down->dims, ElementsAre(512, 256, 8));
  }
}

TEST(GgufReaderTest, OpenMissingFileIsNotFound) {
  auto file = GgufFile::Open(kModelDir + "does-not-exist.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------
// Accessors.

class GgufAccessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter w;
    w.SetUint32("u32", 7);
    w.SetInt32("neg", -5);
    w.SetInt8("i8", 12);
    w.SetUint64("big", std::numeric_limits<uint64_t>::max());
    w.SetFloat32("f32", 0.5f);
    w.SetFloat64("f64", 0.25);
    w.SetBool("yes", true);
    w.SetString("str", "hello");
    w.SetStringArray("strs", {"a", "", "ccc"});
    w.SetFloat32Array("floats", {1.5f, -2.0f});
    w.SetInt32Array("ints", {1, -2, 3});
    const uint64_t big[] = {1, std::numeric_limits<uint64_t>::max()};
    w.SetArray("bigs", GgufValueType::kUint64, 2,
               std::span(reinterpret_cast<const uint8_t*>(big), sizeof(big)));
    bytes_ = w.Serialize();
    auto file = GgufFile::FromBuffer(bytes_, "acc.gguf");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufAccessorTest, IntegersConvertWhenTheValueFits) {
  EXPECT_EQ(*file_->GetUint("u32"), 7u);
  EXPECT_EQ(*file_->GetInt("u32"), 7);
  EXPECT_EQ(*file_->GetUint("i8"), 12u);
  EXPECT_EQ(*file_->GetInt("neg"), -5);
  EXPECT_EQ(*file_->GetUint("big"), std::numeric_limits<uint64_t>::max());

  auto neg = file_->GetUint("neg");
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(neg.status().message()),
              AllOf(HasSubstr("acc.gguf: key 'neg'"), HasSubstr("int32"), HasSubstr("-5")));
  auto big = file_->GetInt("big");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("key 'big'"));
}

TEST_F(GgufAccessorTest, WrongTypeNamesKeyExpectedAndActual) {
  auto s = file_->GetString("u32");
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              AllOf(HasSubstr("key 'u32'"), HasSubstr("(entry at byte 24)"),
                    HasSubstr("expected string"), HasSubstr("got uint32")));
  auto u = file_->GetUint("str");
  EXPECT_THAT(
      std::string(u.status().message()),
      AllOf(HasSubstr("key 'str'"), HasSubstr("unsigned integer"), HasSubstr("got string")));
  EXPECT_THAT(std::string(file_->GetFloat("u32").status().message()),
              AllOf(HasSubstr("float"), HasSubstr("got uint32")));
  EXPECT_THAT(std::string(file_->GetBool("u32").status().message()),
              AllOf(HasSubstr("expected bool"), HasSubstr("got uint32")));
  EXPECT_THAT(std::string(file_->GetInt("f32").status().message()),
              AllOf(HasSubstr("key 'f32'"), HasSubstr("got float32")));
  EXPECT_THAT(std::string(file_->GetStringArray("floats").status().message()),
              AllOf(HasSubstr("key 'floats'"), HasSubstr("expected array of string"),
                    HasSubstr("got array of float32")));
  EXPECT_THAT(std::string(file_->GetFloatArray("ints").status().message()),
              AllOf(HasSubstr("expected array of float32"), HasSubstr("got array of int32")));
  EXPECT_THAT(std::string(file_->GetIntArray("strs").status().message()),
              HasSubstr("got array of string"));
  EXPECT_THAT(std::string(file_->GetIntArray("u32").status().message()), HasSubstr("got uint32"));
  EXPECT_EQ(file_->GetString("u32").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GgufAccessorTest, MissingKeyIsNotFound) {
  for (auto code :
       {file_->GetUint("nope").status().code(), file_->GetInt("nope").status().code(),
        file_->GetFloat("nope").status().code(), file_->GetBool("nope").status().code(),
        file_->GetString("nope").status().code(), file_->GetStringArray("nope").status().code(),
        file_->GetFloatArray("nope").status().code(), file_->GetIntArray("nope").status().code()}) {
    EXPECT_EQ(code, absl::StatusCode::kNotFound);
  }
  EXPECT_THAT(std::string(file_->GetUint("nope").status().message()), HasSubstr("'nope'"));
}

TEST_F(GgufAccessorTest, ArraysDecode) {
  EXPECT_THAT(*file_->GetStringArray("strs"), ElementsAre("a", "", "ccc"));
  EXPECT_THAT(*file_->GetFloatArray("floats"), ElementsAre(1.5f, -2.0f));
  EXPECT_THAT(*file_->GetIntArray("ints"), ElementsAre(1, -2, 3));
  auto bigs = file_->GetIntArray("bigs");
  EXPECT_EQ(bigs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bigs.status().message()),
              AllOf(HasSubstr("key 'bigs'"), HasSubstr("element 1")));
  EXPECT_DOUBLE_EQ(*file_->GetFloat("f32"), 0.5);
  EXPECT_DOUBLE_EQ(*file_->GetFloat("f64"), 0.25);
  EXPECT_TRUE(*file_->GetBool("yes"));
  EXPECT_EQ(*file_->GetString("str"), "hello");
}

// ---------------------------------------------------------------------------------
// Header.

TEST(GgufMalformedTest, EmptyAndTinyBuffers) {
  ExpectError({}, absl::StatusCode::kDataLoss, {"header", "at byte 0", "magic"});
  ExpectError({'G', 'G'}, absl::StatusCode::kDataLoss, {"magic"});
  auto file = GgufFile::FromBuffer({}, "empty.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
}

TEST(GgufMalformedTest, WrongMagic) {
  RawGguf g;
  g.Bytes("GGUX").U32(3).U64(0).U64(0);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument, {"not a GGUF file", "GGUX"});
}

TEST(GgufMalformedTest, VersionOneIsRejected) {
  RawGguf g;
  g.Header(1, 0, 0);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument, {"at byte 4", "version 1"});
}

TEST(GgufMalformedTest, UnknownVersions) {
  for (uint32_t version : {0u, 4u, 99u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(version);
    RawGguf g;
    g.Header(version, 0, 0);
    ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
                {moert::StrCat("unknown GGUF version ", version)});
  }
}

TEST(GgufMalformedTest, ByteSwappedVersionSaysBigEndian) {
  for (uint32_t version : {0x02000000u, 0x03000000u}) {
    RawGguf g;
    g.Header(version, 0, 0);
    ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument, {"byte-swapped", "big-endian"});
  }
}

TEST(GgufMalformedTest, VersionTwoAndThreeParse) {
  for (uint32_t version : {2u, 3u}) {
    RawGguf g;
    g.Header(version, 0, 1).KvU32("a", 1);
    auto file = Parse(g.bytes());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->version(), version);
    EXPECT_EQ(*(*file)->GetUint("a"), 1u);
  }
}

TEST(GgufMalformedTest, AbsurdCounts) {
  RawGguf tensors;
  tensors.Header(3, uint64_t{1} << 40, 0);
  ExpectError(tensors.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor count 1099511627776 exceeds the limit 65536", "at byte 8"});
  RawGguf kvs;
  kvs.Header(3, 0, std::numeric_limits<uint64_t>::max());
  ExpectError(kvs.bytes(), absl::StatusCode::kInvalidArgument,
              {"metadata count 18446744073709551615 exceeds the limit", "at byte 16"});
  // Within the caps but more than the file holds: truncation, without a huge reserve.
  RawGguf many;
  many.Header(3, 60000, 60000);
  ExpectError(many.bytes(), absl::StatusCode::kDataLoss, {"metadata entry #0 (at byte 24)"});
  RawGguf many_tensors;
  many_tensors.Header(3, 60000, 0);
  ExpectError(many_tensors.bytes(), absl::StatusCode::kDataLoss, {"tensor info #0 (at byte 24)"});
}

TEST(GgufMalformedTest, LimitsAreConfigurable) {
  RawGguf g;
  g.Header(3, 2, 2).KvU32("a", 1).KvU32("b", 2);
  g.TensorInfo("x", {8}, kF32, 0).TensorInfo("y", {8}, kF32, 32).PadTo(32).Zeros(64);
  ASSERT_TRUE(Parse(g.bytes()).ok());
  GgufLimits one_tensor;
  one_tensor.max_tensors = 1;
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument, {"tensor count 2 exceeds the limit 1"},
              one_tensor);
  GgufLimits one_kv;
  one_kv.max_metadata = 1;
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"metadata count 2 exceeds the limit 1"}, one_kv);
  GgufLimits short_strings;
  short_strings.max_string_bytes = 0;
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"metadata entry #0 (at byte 24)", "key length 1 exceeds the limit 0"},
              short_strings);
  GgufLimits one_dim;
  one_dim.max_dims = 0;
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor 'x'", "1 dimensions exceed the limit 0"}, one_dim);
}

// ---------------------------------------------------------------------------------
// Metadata.

TEST(GgufMalformedTest, AbsurdKeyLength) {
  RawGguf g;
  g.Header(3, 0, 1).U64(uint64_t{1} << 60).Bytes("abc");
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"metadata entry #0 (at byte 24)", "at byte 24", "key length 1152921504606846976",
               "exceeds the limit 1048576"});
  RawGguf past_end;
  past_end.Header(3, 0, 1).U64(1000).Bytes("abc");
  ExpectError(past_end.bytes(), absl::StatusCode::kDataLoss,
              {"metadata entry #0 (at byte 24)", "at byte 32", "file ends inside a key",
               "needs 1000 bytes, 3 left"});
}

TEST(GgufMalformedTest, AbsurdStringValueLength) {
  RawGguf g;
  g.Header(3, 0, 1).Key("general.name", GgufValueType::kString).U64(~uint64_t{0}).Bytes("x");
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'general.name' (entry at byte 24)", "at byte 48",
               "string value length 18446744073709551615 exceeds the limit"});
  RawGguf past_end;
  past_end.Header(3, 0, 1).Key("general.name", GgufValueType::kString).U64(64).Bytes("x");
  ExpectError(past_end.bytes(), absl::StatusCode::kDataLoss,
              {"key 'general.name' (entry at byte 24)", "file ends inside a string value"});
}

TEST(GgufMalformedTest, AbsurdArraySizes) {
  RawGguf g;
  g.Header(3, 0, 1).Key("tokens", GgufValueType::kArray).U32(8).U64(uint64_t{1} << 62);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'tokens' (entry at byte 24)", "at byte 46", "array size 4611686018427387904",
               "exceeds the limit 16777216"});
  // Within the cap, but the elements would run past the end of the file.
  RawGguf ints;
  ints.Header(3, 0, 1).Key("ints", GgufValueType::kArray).U32(5).U64(1000).U32(1);
  ExpectError(ints.bytes(), absl::StatusCode::kDataLoss,
              {"key 'ints'", "at byte 52", "an array of 1000 int32 values", "needs 4000 bytes"});
  RawGguf strs;
  strs.Header(3, 0, 1).Key("strs", GgufValueType::kArray).U32(8).U64(3).Str("a").Str("b");
  ExpectError(strs.bytes(), absl::StatusCode::kDataLoss,
              {"key 'strs'", "array element 2", "length of a string value"});
  RawGguf bad_string;
  bad_string.Header(3, 0, 1)
      .Key("strs", GgufValueType::kArray)
      .U32(8)
      .U64(2)
      .Str("a")
      .U64(uint64_t{1} << 40);
  ExpectError(bad_string.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'strs'", "array element 1", "exceeds the limit"});
}

TEST(GgufMalformedTest, UnknownValueTypes) {
  RawGguf g;
  g.Header(3, 0, 1).Str("k").U32(13).U32(0);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'k' (entry at byte 24)", "at byte 33", "unknown value type 13"});
  RawGguf arr;
  arr.Header(3, 0, 1).Key("k", GgufValueType::kArray).U32(77).U64(0);
  ExpectError(arr.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'k'", "at byte 37", "unknown array element type 77"});
}

TEST(GgufMalformedTest, BoolMustBeZeroOrOne) {
  RawGguf g;
  g.Header(3, 0, 1).Key("flag", GgufValueType::kBool).U8(2);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'flag'", "at byte 40", "bool value 2"});
  RawGguf arr;
  arr.Header(3, 0, 1).Key("flags", GgufValueType::kArray).U32(7).U64(3).U8(1).U8(0).U8(9);
  ExpectError(arr.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'flags'", "array element 2", "bool value 9"});
}

TEST(GgufMalformedTest, NestedArraysParseUpToTheDepthLimit) {
  // [[1, 2], []] as an array of arrays of uint8.
  RawGguf g;
  g.Header(3, 0, 2).Key("nested", GgufValueType::kArray).U32(9).U64(2);
  g.U32(0).U64(2).U8(1).U8(2).U32(0).U64(0);
  g.KvU32("after", 5);
  auto file = Parse(g.bytes());
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufKeyValue* kv = (*file)->FindKey("nested");
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->value.array_type, GgufValueType::kArray);
  EXPECT_EQ(kv->value.array_size, 2u);
  EXPECT_EQ(kv->value.array_bytes.size(), 2u * 12u + 2u);
  EXPECT_EQ(*(*file)->GetUint("after"), 5u);
  EXPECT_THAT(std::string((*file)->GetIntArray("nested").status().message()),
              HasSubstr("got array of array"));

  // Caps apply inside: an inner array too large.
  RawGguf big;
  big.Header(3, 0, 1)
      .Key("nested", GgufValueType::kArray)
      .U32(9)
      .U64(1)
      .U32(0)
      .U64(uint64_t{1} << 30);
  ExpectError(big.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'nested'", "array element 0", "array size 1073741824 exceeds the limit"});

  // Depth: max_array_depth nested levels parse, one more does not.
  auto nest = [](int levels) {
    RawGguf d;
    d.Header(3, 0, 1).Key("deep", GgufValueType::kArray);
    for (int i = 1; i < levels; ++i) d.U32(9).U64(1);
    d.U32(0).U64(0);
    return d.bytes();
  };
  GgufLimits limits;
  EXPECT_TRUE(Parse(nest(static_cast<int>(limits.max_array_depth))).ok());
  ExpectError(nest(static_cast<int>(limits.max_array_depth) + 1),
              absl::StatusCode::kInvalidArgument, {"key 'deep'", "nested deeper than the limit 4"});
}

TEST(GgufMalformedTest, DuplicateKey) {
  RawGguf g;
  g.Header(3, 0, 3).KvU32("a", 1).KvU32("b", 2).KvU32("a", 3);
  // Entries are 8 + 1 + 4 + 4 = 17 bytes each.
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'a' (entry at byte 58)", "duplicate key (first at byte 24)"});
}

TEST(GgufMalformedTest, AlignmentKey) {
  RawGguf as_string;
  as_string.Header(3, 0, 1).Key("general.alignment", GgufValueType::kString).Str("32");
  ExpectError(as_string.bytes(), absl::StatusCode::kInvalidArgument,
              {"key 'general.alignment' (entry at byte 24)", "expected uint32, got string"});
  RawGguf as_u64;
  as_u64.Header(3, 0, 1).Key("general.alignment", GgufValueType::kUint64).U64(32);
  ExpectError(as_u64.bytes(), absl::StatusCode::kInvalidArgument,
              {"general.alignment", "expected uint32, got uint64"});
  for (uint32_t bad : {0u, 3u, 48u, 0xFFFFFFFFu}) {
    RawGguf g;
    g.Header(3, 0, 1).KvU32("general.alignment", bad);
    ExpectError(
        g.bytes(), absl::StatusCode::kInvalidArgument,
        {"general.alignment", moert::StrCat("alignment ", bad, " is not a nonzero power of two")});
  }
  RawGguf huge;
  huge.Header(3, 0, 1).KvU32("general.alignment", 1u << 20);
  ExpectError(huge.bytes(), absl::StatusCode::kInvalidArgument,
              {"general.alignment", "alignment 1048576 exceeds the limit 65536"});
}

TEST(GgufMalformedTest, AlignmentMovesTheDataSection) {
  RawGguf g;
  g.Header(3, 1, 1)
      .KvU32("general.alignment", 64)
      .TensorInfo("t", {4}, kF32, 0)
      .PadTo(64)
      .Zeros(16);
  auto file = Parse(g.bytes());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 64u);
  EXPECT_EQ((*file)->data_offset(), 128u);
  EXPECT_EQ((*file)->tensors()[0].file_offset, 128u);
  // With alignment 64, offset 32 is misaligned.
  RawGguf mis;
  mis.Header(3, 1, 1)
      .KvU32("general.alignment", 64)
      .TensorInfo("t", {4}, kF32, 32)
      .PadTo(64)
      .Zeros(64);
  ExpectError(mis.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor 't'", "data offset 32 is not a multiple of the alignment 64"});
}

// ---------------------------------------------------------------------------------
// Tensor infos.

TEST(GgufMalformedTest, TooManyDims) {
  ExpectError(OneTensor({2, 2, 2, 2, 2}, kF32, 0, 128), absl::StatusCode::kInvalidArgument,
              {"tensor 't' (info at byte 24)", "at byte 33", "5 dimensions exceed the limit 4"});
}

TEST(GgufMalformedTest, DimsProductOverflow) {
  ExpectError(
      OneTensor({uint64_t{1} << 32, uint64_t{1} << 32, 2}, kF32, 0, 0),
      absl::StatusCode::kInvalidArgument,
      {"tensor 't' (info at byte 24)", "dims[1] = 4294967296", "element count overflow int64"});
  ExpectError(OneTensor({~uint64_t{0}}, kF32, 0, 0), absl::StatusCode::kInvalidArgument,
              {"tensor 't'", "dims[0]"});
  // A zero dim does not hide the overflow of the others.
  ExpectError(OneTensor({0, uint64_t{1} << 40, uint64_t{1} << 40}, kF32, 0, 0),
              absl::StatusCode::kInvalidArgument, {"tensor 't'", "dims[2]"});
  // Elements fit int64 but f32 bytes do not.
  ExpectError(OneTensor({uint64_t{1} << 62}, kF32, 0, 0), absl::StatusCode::kInvalidArgument,
              {"tensor 't'", "data size", "overflows"});
}

TEST(GgufMalformedTest, UnknownTensorType) {
  for (uint32_t type : {4u, 5u, 31u, 40u, 1000u}) {
    SCOPED_TRACE(type);
    ExpectError(OneTensor({8}, type, 0, 32), absl::StatusCode::kInvalidArgument,
                {"tensor 't' (info at byte 24)", moert::StrCat("unknown ggml type id ", type)});
  }
}

TEST(GgufMalformedTest, PartialBlocks) {
  ExpectError(OneTensor({33, 2}, kQ8_0, 0, 128), absl::StatusCode::kInvalidArgument,
              {"tensor 't'", "row length 33 is not a multiple of the block size 32 of q8_0"});
  // A whole number of blocks overall is not enough: blocks may not straddle rows.
  ExpectError(OneTensor({16, 2}, kQ8_0, 0, 64), absl::StatusCode::kInvalidArgument,
              {"row length 16"});
  const std::vector<uint8_t> bytes = OneTensor({64, 3}, kQ8_0, 0, 6 * 34);
  auto ok = Parse(bytes);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->tensors()[0].n_bytes, 6u * 34u);
}

TEST(GgufMalformedTest, ZeroDimsAndEmptyTensors) {
  // n_dims 0 is a scalar: one element.
  const std::vector<uint8_t> scalar_bytes = OneTensor({}, kF32, 0, 4);
  auto scalar = Parse(scalar_bytes);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ((*scalar)->tensors()[0].n_elements, 1u);
  EXPECT_EQ((*scalar)->tensors()[0].n_bytes, 4u);
  // An empty tensor sharing an offset with a real one does not overlap it.
  RawGguf g;
  g.Header(3, 2, 0).TensorInfo("full", {8}, kF32, 0).TensorInfo("empty", {0, 5}, kF32, 0);
  g.PadTo(32).Zeros(32);
  auto file = Parse(g.bytes());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors()[1].n_bytes, 0u);
  EXPECT_TRUE((*file)->TensorData((*file)->tensors()[1]).empty());
}

TEST(GgufMalformedTest, TensorPastEndOfFile) {
  // 8 f32 = 32 bytes at offset 32, but the file holds only 32 data bytes.
  ExpectError(
      OneTensor({8}, kF32, 32, 32), absl::StatusCode::kDataLoss,
      {"tensor 't' (info at byte 24)", "data [96, 128) runs past the end of the file (size 96)"});
  ExpectError(OneTensor({8}, kF32, 0, 0), absl::StatusCode::kDataLoss,
              {"data [64, 96) runs past the end of the file (size 64)"});
}

TEST(GgufMalformedTest, OffsetOverflow) {
  ExpectError(OneTensor({8}, kF32, ~uint64_t{0} - 31, 32), absl::StatusCode::kInvalidArgument,
              {"tensor 't' (info at byte 24)", "overflows"});
  ExpectError(OneTensor({8}, kF32, uint64_t{1} << 63, 32), absl::StatusCode::kDataLoss,
              {"tensor 't'", "runs past the end of the file"});
}

TEST(GgufMalformedTest, MisalignedOffset) {
  ExpectError(OneTensor({8}, kF32, 4, 64), absl::StatusCode::kInvalidArgument,
              {"tensor 't' (info at byte 24)", "at byte 49",
               "data offset 4 is not a multiple of the alignment 32"});
}

TEST(GgufMalformedTest, OverlappingTensors) {
  RawGguf g;
  // "a" covers [0, 64) of the data section; "b" starts at 32.
  g.Header(3, 2, 0).TensorInfo("a", {16}, kF32, 0).TensorInfo("b", {8}, kF32, 32);
  g.PadTo(32).Zeros(64);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor 'b' (info at byte 57)", "overlaps tensor 'a' (info at byte 24)"});
  // Listed in reverse offset order, and the same offset twice.
  RawGguf same;
  same.Header(3, 2, 0).TensorInfo("x", {8}, kF32, 0).TensorInfo("y", {8}, kF32, 0);
  same.PadTo(32).Zeros(32);
  ExpectError(same.bytes(), absl::StatusCode::kInvalidArgument, {"overlaps tensor"});
  RawGguf reversed;
  reversed.Header(3, 2, 0).TensorInfo("late", {8}, kF32, 32).TensorInfo("early", {16}, kF32, 0);
  reversed.PadTo(32).Zeros(64);
  ExpectError(reversed.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor 'late'", "overlaps tensor 'early'"});
  // Adjacent is fine.
  RawGguf adjacent;
  adjacent.Header(3, 2, 0).TensorInfo("p", {8}, kF32, 32).TensorInfo("q", {8}, kF32, 0);
  adjacent.PadTo(32).Zeros(64);
  EXPECT_TRUE(Parse(adjacent.bytes()).ok());
}

TEST(GgufMalformedTest, DuplicateTensorName) {
  RawGguf g;
  g.Header(3, 2, 0).TensorInfo("w", {8}, kF32, 0).TensorInfo("w", {8}, kF32, 32);
  g.PadTo(32).Zeros(64);
  ExpectError(g.bytes(), absl::StatusCode::kInvalidArgument,
              {"tensor 'w' (info at byte 57)", "duplicate tensor name (first info at byte 24)"});
}

TEST(GgufMalformedTest, HostileNamesAreEscapedAndCut) {
  std::string name(300, 'x');
  name[0] = '\n';
  RawGguf g;
  g.Header(3, 1, 0).TensorInfo(name, {8}, 999, 0);
  auto file = Parse(g.bytes());
  ASSERT_FALSE(file.ok());
  std::string msg(file.status().message());
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_THAT(msg, AllOf(HasSubstr("'\\nxxx"), HasSubstr("...' (300 bytes)")));
}

// ---------------------------------------------------------------------------------
// Truncation.

// A small file with metadata of several types and two tensors whose sizes are
// multiples of the alignment, so that every strict prefix is missing something.
struct Sections {
  std::vector<uint8_t> bytes;
  std::vector<size_t> kv_ends;
  size_t infos_end = 0;
};

Sections SmallFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.expert_count", 8);
  w.SetFloat32("f", 1.0f);
  w.SetStringArray("tokens", {"a", "bb"});
  w.SetInt32Array("types", {1, 2, 3});
  std::vector<uint8_t> a(32 * 4, 1), b(64 * 4, 2);
  EXPECT_TRUE(w.AddTensor("a", GgmlType::kF32, {32}, a).ok());
  EXPECT_TRUE(w.AddTensor("b", GgmlType::kF32, {16, 4}, b).ok());
  Sections s;
  s.bytes = w.Serialize();
  auto file = GgufFile::FromBuffer(s.bytes, "small.gguf");
  EXPECT_TRUE(file.ok()) << file.status();
  for (size_t i = 1; i < (*file)->metadata().size(); ++i) {
    s.kv_ends.push_back((*file)->metadata()[i].file_offset);
  }
  s.kv_ends.push_back((*file)->tensors()[0].info_offset);
  s.infos_end = (*file)->data_offset();
  return s;
}

TEST(GgufTruncationTest, EveryPrefixFailsCleanly) {
  Sections s = SmallFile();
  ASSERT_TRUE(Parse(s.bytes).ok());
  for (size_t len = 0; len < s.bytes.size(); ++len) {
    // A copy of exactly `len` bytes, so that a sanitizer build catches any overread.
    std::vector<uint8_t> prefix(s.bytes.begin(), s.bytes.begin() + static_cast<ptrdiff_t>(len));
    auto file = GgufFile::FromBuffer(prefix, "cut.gguf");
    ASSERT_FALSE(file.ok()) << "prefix of " << len << " bytes parsed";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << len << ": " << file.status();
  }
}

TEST(GgufTruncationTest, AtSectionBoundaries) {
  Sections s = SmallFile();
  auto cut = [&](size_t len) {
    return std::vector<uint8_t>(s.bytes.begin(), s.bytes.begin() + static_cast<ptrdiff_t>(len));
  };
  ExpectError(cut(4), absl::StatusCode::kDataLoss, {"header", "at byte 4", "the version"});
  ExpectError(cut(8), absl::StatusCode::kDataLoss, {"header", "at byte 8", "the tensor count"});
  ExpectError(cut(16), absl::StatusCode::kDataLoss, {"at byte 16", "the metadata count"});
  ExpectError(cut(24), absl::StatusCode::kDataLoss,
              {"metadata entry #0 (at byte 24)", "the length of a key"});
  // After each complete entry, the next one is missing.
  for (size_t i = 0; i + 1 < s.kv_ends.size(); ++i) {
    ExpectError(cut(s.kv_ends[i]), absl::StatusCode::kDataLoss,
                {moert::StrCat("metadata entry #", i + 1, " (at byte ", s.kv_ends[i], ")")});
  }
  // Inside a value: the key is named.
  ExpectError(cut(s.kv_ends[0] - 2), absl::StatusCode::kDataLoss,
              {"key 'general.architecture' (entry at byte 24)", "a string value"});
  ExpectError(cut(s.kv_ends.back()), absl::StatusCode::kDataLoss,
              {"tensor info #0", "a tensor name"});
  ExpectError(cut(s.kv_ends.back() + 12), absl::StatusCode::kDataLoss,
              {"tensor 'a' (info at byte", "the dimension count"});
  // Infos complete, data missing.
  ExpectError(cut(s.infos_end), absl::StatusCode::kDataLoss,
              {"tensor 'a'", "runs past the end of the file"});
  ExpectError(cut(s.infos_end + 128), absl::StatusCode::kDataLoss,
              {"tensor 'b'",
               moert::StrCat("data [", s.infos_end + 128, ", ", s.infos_end + 384,
                             ") runs past the end of the file (size ", s.infos_end + 128, ")")});
}

TEST(GgufTruncationTest, FileWithoutTensorsMayEndAtTheHeader) {
  RawGguf g;
  g.Header(3, 0, 1).KvU32("a", 1);  // 41 bytes, no padding to the data section.
  auto file = Parse(g.bytes());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->data_offset(), 64u);
  EXPECT_TRUE((*file)->tensors().empty());
}

}  // namespace
}  // namespace moert::format
