// Loading an mmproj wrong: a small clip GGUF written here (the ViT of ../shared/mmproj's
// oracle shape; a resampler only where a test reaches it) and every way it can be
// wrong, each an error naming the key or tensor, never a crash. The oracle itself
// loads and encodes in encoder_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "vision/mmproj.h"

namespace moert::vision {
namespace {

using format::GgmlType;

struct Options {
  std::string arch = "clip";
  std::string projector = "resampler";
  int version = 3;
  bool minicpmv = true;
  int patch = 14;
  bool with_resampler = true;
  int resampler_width = 3584;
  uint64_t positions = 4900;
  std::string drop_tensor;  // a tensor left out
  bool pre_ln = false;
};

void AddZeros(format::GgufWriter& w, const std::string& name, std::vector<uint64_t> dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  std::vector<uint8_t> bytes(n * 4, 0);
  // Ones, so LayerNorm weights and the like are not degenerate.
  const float one = 1.0f;
  for (uint64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * 4, &one, 4);
  ASSERT_TRUE(w.AddTensor(name, GgmlType::kF32, std::move(dims), bytes).ok()) << name;
}

std::vector<uint8_t> Build(const Options& o) {
  format::GgufWriter w;
  w.SetString("general.architecture", o.arch);
  w.SetBool("clip.has_text_encoder", false);
  w.SetBool("clip.has_vision_encoder", true);
  w.SetBool("clip.has_minicpmv_projector", o.minicpmv);
  w.SetString("clip.projector_type", o.projector);
  w.SetInt32("clip.minicpmv_version", o.version);
  w.SetUint32("clip.vision.image_size", 448);
  w.SetUint32("clip.vision.patch_size", static_cast<uint32_t>(o.patch));
  w.SetUint32("clip.vision.embedding_length", 64);
  w.SetUint32("clip.vision.feed_forward_length", 128);
  w.SetUint32("clip.vision.projection_dim", 0);
  w.SetUint32("clip.vision.attention.head_count", 2);
  w.SetFloat32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
  w.SetUint32("clip.vision.block_count", 1);
  w.SetFloat32Array("clip.vision.image_mean", {0.5f, 0.5f, 0.5f});
  w.SetFloat32Array("clip.vision.image_std", {0.5f, 0.5f, 0.5f});
  w.SetBool("clip.use_gelu", true);
  const auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
    if (name != o.drop_tensor) AddZeros(w, name, std::move(dims));
  };
  const uint64_t d = 64, f = 128, r = static_cast<uint64_t>(o.resampler_width);
  add("v.patch_embd.weight", {14, 14, 3, d});
  add("v.patch_embd.bias", {d});
  add("v.position_embd.weight", {d, o.positions});
  if (o.pre_ln) add("v.pre_ln.weight", {d});
  for (const char* p : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
    add(std::string("v.blk.0.") + p + ".weight", {d, d});
    add(std::string("v.blk.0.") + p + ".bias", {d});
  }
  for (const char* p : {"ln1", "ln2"}) {
    add(std::string("v.blk.0.") + p + ".weight", {d});
    add(std::string("v.blk.0.") + p + ".bias", {d});
  }
  add("v.blk.0.ffn_down.weight", {d, f});
  add("v.blk.0.ffn_down.bias", {f});
  add("v.blk.0.ffn_up.weight", {f, d});
  add("v.blk.0.ffn_up.bias", {d});
  if (o.with_resampler) {
    add("resampler.query", {r, 64});
    add("resampler.kv.weight", {d, r});
    for (const char* p : {"q", "k", "v", "out"}) {
      add(std::string("resampler.attn.") + p + ".weight", {r, r});
      add(std::string("resampler.attn.") + p + ".bias", {r});
    }
    for (const char* p : {"ln_q", "ln_kv", "ln_post"}) {
      add(std::string("resampler.") + p + ".weight", {r});
      add(std::string("resampler.") + p + ".bias", {r});
    }
    add("resampler.proj.weight", {r, r});
    add("resampler.pos_embed_k", {r, 16});
  }
  return w.Serialize();
}

// The load's Status for `o` (the bytes kept alive for the file).
absl::Status LoadStatus(const Options& o) {
  const std::vector<uint8_t> bytes = Build(o);
  auto file = format::GgufFile::FromBuffer(bytes, "test-mmproj.gguf");
  if (!file.ok()) return file.status();
  return LoadMmproj(**file).status();
}

void ExpectError(const Options& o, absl::StatusCode code, const std::string& part) {
  const absl::Status s = LoadStatus(o);
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(part), std::string::npos) << s << " (wanted: " << part << ")";
}

TEST(Mmproj, BadFilesAreErrorsNamingWhatIsWrong) {
  using absl::StatusCode;
  Options o;
  o.with_resampler = false;  // every case below fails before the resampler
  {
    Options b = o;
    b.arch = "llama";
    ExpectError(b, StatusCode::kInvalidArgument, "expected 'clip'");
  }
  {
    Options b = o;
    b.projector = "mlp";
    ExpectError(b, StatusCode::kUnimplemented, "projector type 'mlp'");
  }
  {
    Options b = o;
    b.version = 5;
    ExpectError(b, StatusCode::kUnimplemented, "clip.minicpmv_version 5");
  }
  {
    Options b = o;
    b.minicpmv = false;
    ExpectError(b, StatusCode::kUnimplemented, "has_minicpmv_projector");
  }
  {
    Options b = o;
    b.patch = 16;
    ExpectError(b, StatusCode::kUnimplemented, "patch_size is 16");
  }
  {
    Options b = o;
    b.positions = 100;
    ExpectError(b, StatusCode::kInvalidArgument, "v.position_embd.weight");
  }
  {
    Options b = o;
    b.drop_tensor = "v.blk.0.ln2.bias";
    ExpectError(b, StatusCode::kInvalidArgument, "'v.blk.0.ln2.bias' is missing");
  }
  {
    Options b = o;
    b.pre_ln = true;
    ExpectError(b, StatusCode::kUnimplemented, "v.pre_ln");
  }
  // With the ViT whole: the first resampler tensor is missing.
  ExpectError(o, StatusCode::kInvalidArgument, "'resampler.query' is missing");
  {
    Options b;
    b.resampler_width = 64;  // not the 3584 version 3 needs
    ExpectError(b, StatusCode::kInvalidArgument, "resampler.query");
  }
}

}  // namespace
}  // namespace moert::vision
