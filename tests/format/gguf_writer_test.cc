// Tests of the GGUF writer: every value type and tensors round trip through the
// reader, the layout is byte-exact (by hand and against the real model files), and
// the fuzzer's seed corpus (tests/fuzz/corpus) is what SeedFiles() writes.
#include "format/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/strings.h"
#include "format/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moert::format {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kModelDir = std::string(MOERT_SHARED_DIR) + "/models/";

// A file parsed from bytes it owns (FromBuffer keeps views into the caller's bytes).
class Reparse {
 public:
  explicit Reparse(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {
    auto file = GgufFile::FromBuffer(bytes_, "written.gguf");
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) file_ = std::move(*file);
  }
  bool ok() const { return file_ != nullptr; }
  const GgufFile* operator->() const { return file_.get(); }

 private:
  std::vector<uint8_t> bytes_;  // Moving a vector keeps its buffer, so views stay valid.
  std::unique_ptr<GgufFile> file_;
};

template <typename T>
std::vector<uint8_t> LeBytes(const std::vector<T>& values) {
  std::vector<uint8_t> out;
  for (T v : values) {
    uint64_t bits;
    if constexpr (std::is_floating_point_v<T>) {
      bits = sizeof(T) == 4 ? std::bit_cast<uint32_t>(static_cast<float>(v))
                            : std::bit_cast<uint64_t>(static_cast<double>(v));
    } else {
      bits = static_cast<uint64_t>(v);
    }
    for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  }
  return out;
}

TEST(GgufWriterTest, RoundTripsEveryScalarType) {
  GgufWriter w;
  w.SetUint8("u8", 255);
  w.SetInt8("i8", -128);
  w.SetUint16("u16", 65535);
  w.SetInt16("i16", -32768);
  w.SetUint32("u32", 4294967295u);
  w.SetInt32("i32", std::numeric_limits<int32_t>::min());
  w.SetUint64("u64", std::numeric_limits<uint64_t>::max());
  w.SetInt64("i64", std::numeric_limits<int64_t>::min());
  w.SetFloat32("f32", -3.25f);
  w.SetFloat64("f64", 1e300);
  w.SetFloat32("nan", std::numeric_limits<float>::quiet_NaN());
  w.SetBool("t", true);
  w.SetBool("f", false);
  w.SetString("s", "h\xc3\xa9llo");
  w.SetString("empty", "");
  w.SetString("nul", std::string_view("a\0b", 3));
  std::vector<uint8_t> bytes = w.Serialize();
  auto f = Reparse(bytes);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 16u);

  auto type_of = [&](std::string_view key) { return f->FindKey(key)->value.type; };
  EXPECT_EQ(type_of("u8"), GgufValueType::kUint8);
  EXPECT_EQ(type_of("i8"), GgufValueType::kInt8);
  EXPECT_EQ(type_of("u16"), GgufValueType::kUint16);
  EXPECT_EQ(type_of("i16"), GgufValueType::kInt16);
  EXPECT_EQ(type_of("u32"), GgufValueType::kUint32);
  EXPECT_EQ(type_of("i32"), GgufValueType::kInt32);
  EXPECT_EQ(type_of("u64"), GgufValueType::kUint64);
  EXPECT_EQ(type_of("i64"), GgufValueType::kInt64);
  EXPECT_EQ(type_of("f32"), GgufValueType::kFloat32);
  EXPECT_EQ(type_of("f64"), GgufValueType::kFloat64);
  EXPECT_EQ(type_of("t"), GgufValueType::kBool);
  EXPECT_EQ(type_of("s"), GgufValueType::kString);

  EXPECT_EQ(*f->GetUint("u8"), 255u);
  EXPECT_EQ(*f->GetInt("i8"), -128);
  EXPECT_EQ(*f->GetUint("u16"), 65535u);
  EXPECT_EQ(*f->GetInt("i16"), -32768);
  EXPECT_EQ(*f->GetUint("u32"), 4294967295u);
  EXPECT_EQ(*f->GetInt("i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(*f->GetUint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f->GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f->GetFloat("f32"), -3.25);
  EXPECT_EQ(*f->GetFloat("f64"), 1e300);
  EXPECT_TRUE(std::isnan(*f->GetFloat("nan")));
  EXPECT_TRUE(*f->GetBool("t"));
  EXPECT_FALSE(*f->GetBool("f"));
  EXPECT_EQ(*f->GetString("s"), "h\xc3\xa9llo");
  EXPECT_EQ(*f->GetString("empty"), "");
  EXPECT_EQ(*f->GetString("nul"), std::string_view("a\0b", 3));
  // Metadata keeps the order it was set in.
  EXPECT_EQ(f->metadata().front().key, "u8");
  EXPECT_EQ(f->metadata().back().key, "nul");
}

TEST(GgufWriterTest, RoundTripsArraysOfEveryType) {
  GgufWriter w;
  w.SetStringArray("strs", {"<unk>", "", "\xe2\x96\x81the"});
  w.SetFloat32Array("f32s", {0.0f, -1.5f, 3e38f});
  w.SetInt32Array("i32s", {std::numeric_limits<int32_t>::min(), 0, 7});
  w.SetArray("u8s", GgufValueType::kUint8, 3, LeBytes<uint8_t>({0, 1, 255}));
  w.SetArray("i8s", GgufValueType::kInt8, 2, LeBytes<int8_t>({-128, 127}));
  w.SetArray("u16s", GgufValueType::kUint16, 2, LeBytes<uint16_t>({1, 65535}));
  w.SetArray("i16s", GgufValueType::kInt16, 2, LeBytes<int16_t>({-32768, 5}));
  w.SetArray("u32s", GgufValueType::kUint32, 2, LeBytes<uint32_t>({1, 4294967295u}));
  w.SetArray("u64s", GgufValueType::kUint64, 2, LeBytes<uint64_t>({0, uint64_t{1} << 62}));
  w.SetArray("i64s", GgufValueType::kInt64, 2,
             LeBytes<int64_t>({std::numeric_limits<int64_t>::min(), -1}));
  w.SetArray("f64s", GgufValueType::kFloat64, 2, LeBytes<double>({0.5, -2.0}));
  w.SetArray("bools", GgufValueType::kBool, 3, LeBytes<uint8_t>({1, 0, 1}));
  w.SetArray("none", GgufValueType::kUint32, 0, {});
  w.SetStringArray("no_strs", {});
  // [[7, 8], []]: arrays of arrays are written as raw nested encodings.
  std::vector<uint8_t> nested = LeBytes<uint32_t>({0});
  for (uint8_t b : LeBytes<uint64_t>({2})) nested.push_back(b);
  nested.push_back(7);
  nested.push_back(8);
  for (uint8_t b : LeBytes<uint32_t>({0})) nested.push_back(b);
  for (uint8_t b : LeBytes<uint64_t>({0})) nested.push_back(b);
  w.SetArray("nested", GgufValueType::kArray, 2, nested);

  std::vector<uint8_t> bytes = w.Serialize();
  auto f = Reparse(bytes);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(*f->GetStringArray("strs"), ElementsAre("<unk>", "", "\xe2\x96\x81the"));
  EXPECT_THAT(*f->GetFloatArray("f32s"), ElementsAre(0.0f, -1.5f, 3e38f));
  EXPECT_THAT(*f->GetIntArray("i32s"), ElementsAre(std::numeric_limits<int32_t>::min(), 0, 7));
  EXPECT_THAT(*f->GetIntArray("u8s"), ElementsAre(0, 1, 255));
  EXPECT_THAT(*f->GetIntArray("i8s"), ElementsAre(-128, 127));
  EXPECT_THAT(*f->GetIntArray("u16s"), ElementsAre(1, 65535));
  EXPECT_THAT(*f->GetIntArray("i16s"), ElementsAre(-32768, 5));
  EXPECT_THAT(*f->GetIntArray("u32s"), ElementsAre(1, 4294967295));
  EXPECT_THAT(*f->GetIntArray("u64s"), ElementsAre(0, int64_t{1} << 62));
  EXPECT_THAT(*f->GetIntArray("i64s"), ElementsAre(std::numeric_limits<int64_t>::min(), -1));
  EXPECT_TRUE(f->GetIntArray("none")->empty());
  EXPECT_TRUE(f->GetStringArray("no_strs")->empty());

  const GgufValue& f64s = f->FindKey("f64s")->value;
  EXPECT_EQ(f64s.type, GgufValueType::kArray);
  EXPECT_EQ(f64s.array_type, GgufValueType::kFloat64);
  EXPECT_EQ(f64s.array_size, 2u);
  EXPECT_EQ(std::vector<uint8_t>(f64s.array_bytes.begin(), f64s.array_bytes.end()),
            LeBytes<double>({0.5, -2.0}));
  const GgufValue& bools = f->FindKey("bools")->value;
  EXPECT_EQ(bools.array_type, GgufValueType::kBool);
  EXPECT_THAT(std::vector<uint8_t>(bools.array_bytes.begin(), bools.array_bytes.end()),
              ElementsAre(1, 0, 1));
  const GgufValue& n = f->FindKey("nested")->value;
  EXPECT_EQ(n.array_type, GgufValueType::kArray);
  EXPECT_EQ(n.array_size, 2u);
  EXPECT_EQ(std::vector<uint8_t>(n.array_bytes.begin(), n.array_bytes.end()), nested);
}

TEST(GgufWriterTest, RoundTripsTensorsWithAlignedPaddedData) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  std::vector<uint8_t> f32(3 * 4), q8(2 * 34 * 2), q4k(144), f16(5 * 2);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i + 1);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(3 * i);
  for (size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<uint8_t>(7 * i);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint8_t>(200 - i);
  ASSERT_TRUE(w.AddTensor("small", GgmlType::kF32, {3}, f32).ok());
  ASSERT_TRUE(w.AddTensor("q8", GgmlType::kQ8_0, {64, 2}, q8).ok());
  ASSERT_TRUE(w.AddTensor("q4k", GgmlType::kQ4_K, {256, 1, 1}, q4k).ok());
  ASSERT_TRUE(w.AddTensor("odd", GgmlType::kF16, {5}, f16).ok());
  std::vector<uint8_t> bytes = w.Serialize();
  auto f = Reparse(bytes);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->data_offset() % 32, 0u);

  struct Expect {
    const char* name;
    GgmlType type;
    std::vector<uint64_t> dims;
    uint64_t offset;
    const std::vector<uint8_t>* data;
  };
  // Offsets: running sum of sizes padded to 32 (12 -> 32, 136 -> 160, 144 -> 160).
  for (const Expect& e : {Expect{"small", GgmlType::kF32, {3}, 0, &f32},
                          Expect{"q8", GgmlType::kQ8_0, {64, 2}, 32, &q8},
                          Expect{"q4k", GgmlType::kQ4_K, {256, 1, 1}, 192, &q4k},
                          Expect{"odd", GgmlType::kF16, {5}, 352, &f16}}) {
    SCOPED_TRACE(e.name);
    const GgufTensorInfo* t = f->FindTensor(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, e.type);
    EXPECT_EQ(t->dims, e.dims);
    EXPECT_EQ(t->offset, e.offset);
    std::span<const uint8_t> data = f->TensorData(*t);
    EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), *e.data);
  }
  // Each tensor's data is zero-padded to the alignment, the last one included.
  EXPECT_EQ(bytes.size(), f->data_offset() + 352 + 32);
  for (uint64_t i = f->data_offset() + 12; i < f->data_offset() + 32; ++i) EXPECT_EQ(bytes[i], 0);
  for (uint64_t i = f->data_offset() + 362; i < bytes.size(); ++i) EXPECT_EQ(bytes[i], 0);
}

TEST(GgufWriterTest, LayoutIsByteExact) {
  GgufWriter w;
  w.SetUint32("a", 0x01020304);
  w.SetStringArray("s", {"xy"});
  std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {2}, data).ok());
  std::vector<uint8_t> expected = {
      'G', 'G', 'U', 'F', 3, 0, 0, 0,                     // magic, version
      1,   0,   0,   0,   0, 0, 0, 0,                     // tensor count
      2,   0,   0,   0,   0, 0, 0, 0,                     // kv count
      1,   0,   0,   0,   0, 0, 0, 0, 'a', 4,   0, 0, 0,  // key "a", uint32
      4,   3,   2,   1,                                   // value
      1,   0,   0,   0,   0, 0, 0, 0, 's', 9,   0, 0, 0,  // key "s", array
      8,   0,   0,   0,   1, 0, 0, 0, 0,   0,   0, 0,     // of 1 string
      2,   0,   0,   0,   0, 0, 0, 0, 'x', 'y',           // "xy"
      1,   0,   0,   0,   0, 0, 0, 0, 't', 1,   0, 0, 0,  // tensor "t", 1 dim
      2,   0,   0,   0,   0, 0, 0, 0, 0,   0,   0, 0,     // dims[0] = 2, f32
      0,   0,   0,   0,   0, 0, 0, 0,                     // offset 0
  };
  ASSERT_EQ(expected.size(), 109u);
  expected.resize(128, 0);  // padding to the data section
  expected.insert(expected.end(), data.begin(), data.end());
  expected.resize(160, 0);  // the tensor's padding
  EXPECT_EQ(w.Serialize(), expected);

  GgufWriter v2(2);
  EXPECT_EQ(v2.Serialize()[4], 2);
  auto f = Reparse(v2.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(v2.Serialize().size(), 32u);  // 24-byte header padded to the alignment
}

// The writer reproduces files written by llama.cpp (q8_0, q4_0: llama-quantize) and by
// gguf-py (f16) byte for byte from what the reader read out of them.
TEST(GgufWriterTest, ReproducesTheTinyModelsByteForByte) {
  for (const char* name : {"tiny-moe-shakespeare-q8_0.gguf", "tiny-moe-shakespeare-q4_0.gguf",
                           "tiny-moe-shakespeare-f16.gguf"}) {
    SCOPED_TRACE(name);
    auto file = GgufFile::Open(kModelDir + name);
    ASSERT_TRUE(file.ok()) << file.status();
    const GgufFile& f = **file;
    GgufWriter w(f.version());
    for (const GgufKeyValue& kv : f.metadata()) {
      const GgufValue& v = kv.value;
      switch (v.type) {
        case GgufValueType::kUint32:
          w.SetUint32(kv.key, static_cast<uint32_t>(v.u64));
          break;
        case GgufValueType::kFloat32:
          w.SetFloat32(kv.key, static_cast<float>(v.f64));
          break;
        case GgufValueType::kBool:
          w.SetBool(kv.key, v.u64 != 0);
          break;
        case GgufValueType::kString:
          w.SetString(kv.key, v.str);
          break;
        case GgufValueType::kArray:
          if (v.array_type == GgufValueType::kString) {
            auto strs = f.GetStringArray(kv.key);
            ASSERT_TRUE(strs.ok()) << strs.status();
            w.SetStringArray(kv.key, std::vector<std::string>(strs->begin(), strs->end()));
          } else {
            w.SetArray(kv.key, v.array_type, v.array_size, v.array_bytes);
          }
          break;
        default:
          FAIL() << "value type the tiny models do not use: " << GgufValueTypeName(v.type);
      }
    }
    for (const GgufTensorInfo& t : f.tensors()) {
      ASSERT_TRUE(w.AddTensor(t.name, t.type, t.dims, f.TensorData(t)).ok());
    }
    std::vector<uint8_t> out = w.Serialize();
    ASSERT_EQ(out.size(), f.bytes().size());
    EXPECT_TRUE(std::equal(out.begin(), out.end(), f.bytes().begin()));
  }
}

TEST(GgufWriterTest, AlignmentKey) {
  std::vector<uint8_t> four(4, 9);
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetAlignment(64);
  ASSERT_TRUE(w.AddTensor("a", GgmlType::kF32, {1}, four).ok());
  ASSERT_TRUE(w.AddTensor("b", GgmlType::kF32, {1}, four).ok());
  auto f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(*f->GetUint("general.alignment"), 64u);
  EXPECT_EQ(f->FindKey("general.alignment")->value.type, GgufValueType::kUint32);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->FindTensor("b")->offset, 64u);
  EXPECT_EQ(w.Serialize().size(), f->data_offset() + 128);

  // Back to the default: the key is dropped again.
  w.SetAlignment(32);
  f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->FindKey("general.alignment"), nullptr);
  EXPECT_EQ(f->FindTensor("b")->offset, 32u);

  // Setting the key directly changes the layout too.
  w.SetUint32("general.alignment", 128);
  f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->FindTensor("b")->offset, 128u);

  // A bad value is written as given, for malformed-file tests; the reader rejects it.
  GgufWriter bad;
  bad.SetUint32("general.alignment", 3);
  auto parsed = GgufFile::FromBuffer(bad.Serialize(), "bad.gguf");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  GgufWriter str;
  str.SetString("general.alignment", "32");
  parsed = GgufFile::FromBuffer(str.Serialize(), "str.gguf");
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("key 'general.alignment' (entry at byte 24): expected uint32, got string"));
}

TEST(GgufWriterTest, SettingAKeyAgainReplacesItAtTheEnd) {
  GgufWriter w;
  w.SetUint32("a", 1);
  w.SetUint32("b", 2);
  w.SetString("a", "again");
  auto f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].key, "b");
  EXPECT_EQ(f->metadata()[1].key, "a");
  EXPECT_EQ(*f->GetString("a"), "again");
}

TEST(GgufWriterTest, RemoveLeavesTheKeyOut) {
  GgufWriter w;
  w.SetUint32("a", 1);
  w.SetUint32("b", 2);
  w.Remove("a");
  w.Remove("not set");
  w.SetAlignment(64);
  w.Remove("general.alignment");  // and the layout is the default's again
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {3}, std::vector<uint8_t>(12, 1)).ok());
  auto f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->metadata().size(), 1u);
  EXPECT_EQ(f->metadata()[0].key, "b");
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
}

TEST(GgufWriterTest, AddTensorValidates) {
  GgufWriter w;
  std::vector<uint8_t> d(34);
  ASSERT_TRUE(w.AddTensor("ok", GgmlType::kQ8_0, {32}, d).ok());
  absl::Status dup = w.AddTensor("ok", GgmlType::kQ8_0, {32}, d);
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup.message()), HasSubstr("'ok': duplicate"));
  absl::Status size = w.AddTensor("size", GgmlType::kQ8_0, {64}, d);
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(size.message()), HasSubstr("is 68 bytes, got 34"));
  absl::Status block = w.AddTensor("block", GgmlType::kQ8_0, {16, 2}, d);
  EXPECT_THAT(std::string(block.message()), HasSubstr("row length 16"));
  std::vector<uint8_t> f32(4 * 32);
  absl::Status dims = w.AddTensor("dims", GgmlType::kF32, {2, 2, 2, 2, 2}, f32);
  EXPECT_THAT(std::string(dims.message()), HasSubstr("5 dimensions"));
  absl::Status overflow =
      w.AddTensor("big", GgmlType::kF32, {uint64_t{1} << 40, uint64_t{1} << 40}, f32);
  EXPECT_EQ(overflow.code(), absl::StatusCode::kInvalidArgument);
  auto f = Reparse(w.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->tensors().size(), 1u);
}

TEST(GgufWriterTest, WriteFileMatchesSerialize) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.expert_count", 8);
  std::vector<uint8_t> d(34 * 2, 5);
  ASSERT_TRUE(w.AddTensor("w", GgmlType::kQ8_0, {32, 2}, d).ok());
  ASSERT_TRUE(w.AddTensor("v", GgmlType::kF32, {3}, std::vector<uint8_t>(12, 1)).ok());
  const std::string path = ::testing::TempDir() + "/gguf_writer_test.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, w.Serialize());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetUint("llama.expert_count"), 8u);
  EXPECT_EQ((*f)->name(), path);
  std::filesystem::remove(path);

  absl::Status missing = w.WriteFile(::testing::TempDir() + "/no/such/dir/x.gguf");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("no/such/dir/x.gguf"));
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Declared tensors streamed in pieces (one piece spanning two tensors), mixed with
// held ones, give the same file as adding every tensor with its data.
TEST(GgufWriterTest, StreamMatchesSerialize) {
  std::vector<uint8_t> a(34 * 3), b(12), c(18 * 2), d(20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(200 - i);
  std::fill(b.begin(), b.end(), 7);
  std::fill(d.begin(), d.end(), 9);
  GgufWriter held, streamed;
  for (GgufWriter* w : {&held, &streamed}) {
    w->SetString("general.architecture", "llama");
    w->SetAlignment(64);
  }
  ASSERT_TRUE(held.AddTensor("held0", GgmlType::kF32, {5}, d).ok());
  ASSERT_TRUE(held.AddTensor("a", GgmlType::kQ8_0, {32, 3}, a).ok());
  ASSERT_TRUE(held.AddTensor("b", GgmlType::kF32, {3}, b).ok());
  ASSERT_TRUE(held.AddTensor("held1", GgmlType::kF32, {5}, d).ok());
  ASSERT_TRUE(held.AddTensor("c", GgmlType::kQ4_0, {32, 2}, c).ok());
  ASSERT_TRUE(streamed.AddTensor("held0", GgmlType::kF32, {5}, d).ok());
  ASSERT_TRUE(streamed.DeclareTensor("a", GgmlType::kQ8_0, {32, 3}).ok());
  ASSERT_TRUE(streamed.DeclareTensor("b", GgmlType::kF32, {3}).ok());
  ASSERT_TRUE(streamed.AddTensor("held1", GgmlType::kF32, {5}, d).ok());
  ASSERT_TRUE(streamed.DeclareTensor("c", GgmlType::kQ4_0, {32, 2}).ok());
  EXPECT_EQ(streamed.FileSize(), held.Serialize().size());
  EXPECT_EQ(held.FileSize(), held.Serialize().size());

  const std::string path = ::testing::TempDir() + "/gguf_writer_stream_test.gguf";
  auto stream = streamed.OpenStream(path);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->current_tensor(), "a");
  ASSERT_TRUE((*stream)->Write(std::span(a).first(50)).ok());
  std::vector<uint8_t> a_rest_and_b(a.begin() + 50, a.end());
  a_rest_and_b.insert(a_rest_and_b.end(), b.begin(), b.end());
  ASSERT_TRUE((*stream)->Write(a_rest_and_b).ok());
  EXPECT_EQ((*stream)->current_tensor(), "c");
  absl::Status early = (*stream)->Finish();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(early.message()), HasSubstr("'c' has 0 of its 36 bytes"));
  absl::Status too_much = (*stream)->Write(std::vector<uint8_t>(37, 0));
  EXPECT_EQ(too_much.code(), absl::StatusCode::kInvalidArgument);
  for (uint8_t byte : c) ASSERT_TRUE((*stream)->Write(std::span(&byte, 1)).ok());
  EXPECT_EQ((*stream)->current_tensor(), "");
  ASSERT_TRUE((*stream)->Finish().ok());
  EXPECT_EQ(ReadAll(path), held.Serialize());
  std::filesystem::remove(path);
}

TEST(GgufWriterTest, DeclaredTensorsAreCheckedAndNeedAStream) {
  GgufWriter w;
  absl::Status bad_row = w.DeclareTensor("x", GgmlType::kQ4_0, {48, 2});
  EXPECT_EQ(bad_row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_row.message()), HasSubstr("block size 32"));
  ASSERT_TRUE(w.DeclareTensor("x", GgmlType::kQ4_0, {64, 2}).ok());
  EXPECT_EQ(w.DeclareTensor("x", GgmlType::kF32, {1}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status write = w.WriteFile(::testing::TempDir() + "/never_written.gguf");
  EXPECT_EQ(write.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(write.message()), HasSubstr("'x'"));
  auto no_dir = w.OpenStream(::testing::TempDir() + "/no/such/dir/x.gguf");
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
}

// The fuzzer's seeds: small valid files that together reach every value type, nested
// arrays, several tensor types and a non-default alignment.
std::map<std::string, std::vector<uint8_t>> SeedFiles() {
  std::map<std::string, std::vector<uint8_t>> seeds;
  {
    GgufWriter w;
    w.SetString("general.architecture", "llama");
    w.SetUint32("llama.expert_count", 8);
    w.SetFloat32("llama.rope.freq_base", 10000.0f);
    w.SetBool("tokenizer.ggml.add_bos_token", true);
    w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "a"});
    w.SetFloat32Array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.0f});
    w.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 1});
    (void)w.AddTensor("token_embd.weight", GgmlType::kQ8_0, {32, 3}, std::vector<uint8_t>(102, 1));
    (void)w.AddTensor("output_norm.weight", GgmlType::kF32, {4}, std::vector<uint8_t>(16, 2));
    seeds["model.gguf"] = w.Serialize();
  }
  {
    GgufWriter w(2);
    w.SetUint8("u8", 1);
    w.SetInt8("i8", -1);
    w.SetUint16("u16", 2);
    w.SetInt16("i16", -2);
    w.SetInt32("i32", -3);
    w.SetUint64("u64", 4);
    w.SetInt64("i64", -5);
    w.SetFloat64("f64", 0.5);
    w.SetString("s", "");
    w.SetArray("u16s", GgufValueType::kUint16, 2, LeBytes<uint16_t>({1, 2}));
    w.SetArray("bools", GgufValueType::kBool, 2, LeBytes<uint8_t>({0, 1}));
    w.SetArray("u64s", GgufValueType::kUint64, 1, LeBytes<uint64_t>({7}));
    std::vector<uint8_t> nested = LeBytes<uint32_t>({8});
    for (uint8_t b : LeBytes<uint64_t>({1, 1})) nested.push_back(b);
    nested.push_back('z');
    w.SetArray("nested", GgufValueType::kArray, 1, nested);
    seeds["types_v2.gguf"] = w.Serialize();
  }
  {
    GgufWriter w;
    w.SetAlignment(64);
    (void)w.AddTensor("q4_k", GgmlType::kQ4_K, {256}, std::vector<uint8_t>(144, 3));
    (void)w.AddTensor("f16", GgmlType::kF16, {2, 2, 2, 2}, std::vector<uint8_t>(32, 4));
    (void)w.AddTensor("empty", GgmlType::kF32, {0}, {});
    seeds["tensors_align64.gguf"] = w.Serialize();
  }
  return seeds;
}

TEST(GgufWriterTest, FuzzSeedCorpusIsCurrent) {
  // MOERT_WRITE_FUZZ_CORPUS=<dir> (scripts/run-fuzz.sh sets it) rewrites the seeds.
  const char* out_dir = std::getenv("MOERT_WRITE_FUZZ_CORPUS");
  const std::string dir = out_dir != nullptr ? std::string(out_dir)
                                             : std::string(MOERT_SOURCE_DIR) + "/tests/fuzz/corpus";
  for (const auto& [name, bytes] : SeedFiles()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(Reparse(bytes).ok());
    const std::string path = dir + "/" + name;
    if (out_dir != nullptr) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      ASSERT_TRUE(out.good()) << path;
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in.good()) << path << " is missing; run with MOERT_WRITE_FUZZ_CORPUS=" << dir;
    std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
    EXPECT_EQ(on_disk, bytes) << path << " is stale; run with MOERT_WRITE_FUZZ_CORPUS=" << dir;
  }
}

}  // namespace
}  // namespace moert::format
