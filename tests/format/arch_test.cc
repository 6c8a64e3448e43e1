// Tests of the architecture table and ModelSpec: names, keys, tensor names, the
// oracle model's hyperparameters, and clear errors for broken model metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/arch.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/model_spec.h"

namespace moert::format {
namespace {

using ::testing::HasSubstr;

TEST(ArchTable, KnowsEverySupportedArchitecture) {
  for (const char* name : {"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "olmoe"}) {
    auto info = FindArch(name);
    ASSERT_TRUE(info.ok()) << name;
    EXPECT_EQ((*info)->name, name);
    EXPECT_EQ(&InfoOf((*info)->arch), *info);
  }
}

TEST(ArchTable, UnknownArchitectureNamesItAndTheSupportedOnes) {
  auto info = FindArch("gpt-neox");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("'gpt-neox'"));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("qwen3moe"));
}

TEST(ArchTable, KeyAndTensorNamesFollowLlamaCpp) {
  const ArchInfo& olmoe = InfoOf(Arch::kOlmoe);
  EXPECT_EQ(ArchKeyName(olmoe, ArchKey::kExpertCount), "olmoe.expert_count");
  EXPECT_EQ(ArchKeyName(olmoe, ArchKey::kRmsEpsilon), "olmoe.attention.layer_norm_rms_epsilon");
  EXPECT_EQ(TensorWeightName(TensorKind::kTokenEmbd), "token_embd.weight");
  EXPECT_EQ(TensorWeightName(TensorKind::kFfnGateExps, 3), "blk.3.ffn_gate_exps.weight");
  EXPECT_EQ(TensorBiasName(TensorKind::kAttnQ, 0), "blk.0.attn_q.bias");
  EXPECT_EQ(TensorWeightName(TensorKind::kFfnDownShexp, 11), "blk.11.ffn_down_shexp.weight");
  EXPECT_EQ(TensorWeightName(TensorKind::kFfnGateDenseFallback, 2),
            "blk.2.ffn_gate_dense_fallback.weight");
  EXPECT_EQ(TensorWeightName(TensorKind::kFfnUpDenseFallback, 0),
            "blk.0.ffn_up_dense_fallback.weight");
  EXPECT_EQ(TensorWeightName(TensorKind::kFfnDownDenseFallback, 3),
            "blk.3.ffn_down_dense_fallback.weight");
}

TEST(ArchTable, RoutingAndRopeFactsPerArchitecture) {
  EXPECT_EQ(InfoOf(Arch::kLlama).rope, RopeLayout::kNormal);
  EXPECT_EQ(InfoOf(Arch::kQwen2Moe).rope, RopeLayout::kNeox);
  EXPECT_TRUE(InfoOf(Arch::kLlama).renormalize_topk);     // Mixtral
  EXPECT_FALSE(InfoOf(Arch::kQwen2Moe).renormalize_topk);
  EXPECT_TRUE(InfoOf(Arch::kQwen3Moe).renormalize_topk);
  EXPECT_FALSE(InfoOf(Arch::kOlmoe).renormalize_topk);
  EXPECT_TRUE(InfoOf(Arch::kQwen2Moe).shared_expert);
  EXPECT_EQ(InfoOf(Arch::kOlmoe).qk_norm, QkNorm::kFullWidth);
  EXPECT_EQ(InfoOf(Arch::kQwen3Moe).qk_norm, QkNorm::kPerHead);
}

TEST(ModelSpec, ReadsTheOracleModel) {
  auto file = GgufFile::Open(std::string(MOERT_SHARED_DIR) +
                             "/models/tiny-moe-shakespeare-q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  auto spec = ReadModelSpec(**file);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->arch->arch, Arch::kLlama);
  EXPECT_EQ(spec->n_vocab, 2048u);
  EXPECT_EQ(spec->n_embd, 256u);
  EXPECT_EQ(spec->n_layer, 4u);
  EXPECT_EQ(spec->n_head, 8u);
  EXPECT_EQ(spec->n_head_kv, 4u);
  EXPECT_EQ(spec->head_dim_k, 32u);
  EXPECT_EQ(spec->n_rot, 32u);
  EXPECT_EQ(spec->n_ctx_train, 256u);
  EXPECT_EQ(spec->n_expert, 8u);
  EXPECT_EQ(spec->n_expert_used, 2u);
  EXPECT_EQ(spec->n_ff_expert, 512u);
  EXPECT_FLOAT_EQ(spec->rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(spec->rms_eps, 1e-5f);
  EXPECT_TRUE(spec->renormalize_topk);
  EXPECT_FALSE(spec->tied_embeddings);
}

// A minimal model of `arch` with F32 zero tensors; `edit` may change the writer's
// metadata or skip/reshape tensors before the file is serialized.
struct TinyModel {
  std::string arch = "llama";
  uint32_t n_embd = 16, n_layer = 2, n_head = 4, n_head_kv = 2, n_vocab = 32, n_ff = 24;
  uint32_t n_expert = 4, n_expert_used = 2, n_ff_shexp = 20;
  std::function<void(GgufWriter&)> edit_metadata;
  std::function<bool(std::string&, std::vector<uint64_t>&)> edit_tensor;  // false: skip
  std::string skip_key;      // a metadata key left out
  std::string written_arch;  // general.architecture as written, when not `arch`

  std::vector<uint8_t> Build() const {
    const ArchInfo& info = **FindArch(arch);
    GgufWriter w;
    w.SetString("general.architecture", written_arch.empty() ? arch : written_arch);
    auto set = [&](ArchKey k, uint32_t v) {
      std::string name = ArchKeyName(info, k);
      if (name != skip_key) w.SetUint32(name, v);
    };
    set(ArchKey::kContextLength, 64);
    set(ArchKey::kEmbeddingLength, n_embd);
    set(ArchKey::kBlockCount, n_layer);
    set(ArchKey::kHeadCount, n_head);
    set(ArchKey::kHeadCountKv, n_head_kv);
    w.SetFloat32(ArchKeyName(info, ArchKey::kRmsEpsilon), 1e-6f);
    set(ArchKey::kFeedForwardLength, n_ff);
    bool moe = n_expert > 0;
    if (moe) {
      set(ArchKey::kExpertCount, n_expert);
      set(ArchKey::kExpertUsedCount, n_expert_used);
      if (arch != "llama") set(ArchKey::kExpertFeedForwardLength, n_ff);
      if (info.shared_expert) set(ArchKey::kExpertSharedFeedForwardLength, n_ff_shexp);
    }
    if (edit_metadata) edit_metadata(w);

    const uint64_t hd = n_embd / n_head;
    const uint64_t q = n_head * hd, kv = n_head_kv * hd;
    auto add = [&](std::string name, std::vector<uint64_t> dims) {
      if (edit_tensor && !edit_tensor(name, dims)) return;
      uint64_t n = 1;
      for (uint64_t d : dims) n *= d;
      std::vector<uint8_t> zeros(n * 4, 0);
      ASSERT_TRUE(w.AddTensor(name, GgmlType::kF32, dims, zeros).ok()) << name;
    };
    add(TensorWeightName(TensorKind::kTokenEmbd), {n_embd, n_vocab});
    add(TensorWeightName(TensorKind::kOutputNorm), {n_embd});
    add(TensorWeightName(TensorKind::kOutput), {n_embd, n_vocab});
    for (int il = 0; il < static_cast<int>(n_layer); ++il) {
      add(TensorWeightName(TensorKind::kAttnNorm, il), {n_embd});
      add(TensorWeightName(TensorKind::kAttnQ, il), {n_embd, q});
      add(TensorWeightName(TensorKind::kAttnK, il), {n_embd, kv});
      add(TensorWeightName(TensorKind::kAttnV, il), {n_embd, kv});
      add(TensorWeightName(TensorKind::kAttnOut, il), {q, n_embd});
      if (info.qkv_bias) {
        add(TensorBiasName(TensorKind::kAttnQ, il), {q});
        add(TensorBiasName(TensorKind::kAttnK, il), {kv});
        add(TensorBiasName(TensorKind::kAttnV, il), {kv});
      }
      if (info.qk_norm == QkNorm::kPerHead) {
        add(TensorWeightName(TensorKind::kAttnQNorm, il), {hd});
        add(TensorWeightName(TensorKind::kAttnKNorm, il), {hd});
      } else if (info.qk_norm == QkNorm::kFullWidth) {
        add(TensorWeightName(TensorKind::kAttnQNorm, il), {q});
        add(TensorWeightName(TensorKind::kAttnKNorm, il), {kv});
      }
      add(TensorWeightName(TensorKind::kFfnNorm, il), {n_embd});
      if (!moe) {
        add(TensorWeightName(TensorKind::kFfnGate, il), {n_embd, n_ff});
        add(TensorWeightName(TensorKind::kFfnUp, il), {n_embd, n_ff});
        add(TensorWeightName(TensorKind::kFfnDown, il), {n_ff, n_embd});
        continue;
      }
      add(TensorWeightName(TensorKind::kFfnGateInp, il), {n_embd, n_expert});
      add(TensorWeightName(TensorKind::kFfnGateExps, il), {n_embd, n_ff, n_expert});
      add(TensorWeightName(TensorKind::kFfnUpExps, il), {n_embd, n_ff, n_expert});
      add(TensorWeightName(TensorKind::kFfnDownExps, il), {n_ff, n_embd, n_expert});
      if (info.shared_expert) {
        add(TensorWeightName(TensorKind::kFfnGateInpShexp, il), {n_embd});
        add(TensorWeightName(TensorKind::kFfnGateShexp, il), {n_embd, n_ff_shexp});
        add(TensorWeightName(TensorKind::kFfnUpShexp, il), {n_embd, n_ff_shexp});
        add(TensorWeightName(TensorKind::kFfnDownShexp, il), {n_ff_shexp, n_embd});
      }
    }
    return w.Serialize();
  }
};

absl::StatusOr<ModelSpec> SpecOf(const std::vector<uint8_t>& bytes) {
  auto file = GgufFile::FromBuffer(bytes, "tiny.gguf");
  if (!file.ok()) return file.status();
  return ReadModelSpec(**file);
}

TEST(ModelSpec, ReadsEveryArchitectureItsTensorsMatch) {
  struct Case { const char* arch; bool moe; };
  for (Case c : {Case{"llama", false}, Case{"llama", true}, Case{"qwen2", false},
                 Case{"qwen2moe", true}, Case{"qwen3", false}, Case{"qwen3moe", true},
                 Case{"olmoe", true}}) {
    TinyModel m;
    m.arch = c.arch;
    if (!c.moe) m.n_expert = 0;
    auto bytes = m.Build();
    auto spec = SpecOf(bytes);
    ASSERT_TRUE(spec.ok()) << c.arch << ": " << spec.status();
    EXPECT_EQ(spec->arch->name, c.arch);
    EXPECT_EQ(spec->is_moe(), c.moe) << c.arch;
    EXPECT_EQ(spec->head_dim_k, 4u);
    EXPECT_EQ(spec->n_vocab, 32u);
    if (c.moe) {
      EXPECT_EQ(spec->n_ff_expert, 24u) << c.arch;
    }
    if (std::string(c.arch) == "qwen2moe") {
      EXPECT_EQ(spec->n_ff_shared_expert, 20u);
    }
  }
}

TEST(ModelSpec, MissingKeyIsNamed) {
  TinyModel m;
  m.skip_key = "llama.block_count";
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("missing metadata key 'llama.block_count'"));
}

TEST(ModelSpec, UnsupportedArchitectureIsNamed) {
  TinyModel m;
  m.written_arch = "mamba";
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("'mamba'"));
}

TEST(ModelSpec, WrongTensorShapeNamesTensorAndShapes) {
  TinyModel m;
  m.edit_tensor = [](std::string& name, std::vector<uint64_t>& dims) {
    if (name == "blk.1.ffn_up_exps.weight") dims = {16, 23, 4};
    return true;
  };
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("'blk.1.ffn_up_exps.weight'"));
  EXPECT_THAT(msg, HasSubstr("[16, 23, 4]"));
  EXPECT_THAT(msg, HasSubstr("[16, 24, 4]"));
}

TEST(ModelSpec, MissingTensorIsNamed) {
  TinyModel m;
  m.edit_tensor = [](std::string& name, std::vector<uint64_t>&) {
    return name != "blk.0.attn_k.weight";
  };
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("missing tensor 'blk.0.attn_k.weight'"));
}

TEST(ModelSpec, OutputTensorIsOptionalAndThenTied) {
  TinyModel m;
  m.edit_tensor = [](std::string& name, std::vector<uint64_t>&) { return name != "output.weight"; };
  auto spec = SpecOf(m.Build());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->tied_embeddings);
}

TEST(ModelSpec, RejectsInconsistentHyperparameters) {
  {
    TinyModel m;
    m.n_expert_used = 5;  // more than the 4 experts
    auto spec = SpecOf(m.Build());
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("expert_used_count 5"));
  }
  {
    TinyModel m;
    m.n_head_kv = 3;  // 4 heads are not a multiple of 3
    auto spec = SpecOf(m.Build());
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("head_count_kv 3"));
  }
  {
    TinyModel m;
    m.arch = "qwen3moe";
    m.n_expert = 0;  // a MoE-only architecture without experts
    auto spec = SpecOf(m.Build());
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("qwen3moe.expert_count"));
  }
  {
    TinyModel m;
    m.n_layer = 0;
    auto spec = SpecOf(m.Build());
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("must be positive"));
  }
}

TEST(ModelSpec, KnownKeyWithWrongTypeIsNamed) {
  TinyModel m;
  m.arch = "qwen3";
  m.n_expert = 0;
  m.edit_metadata = [](GgufWriter& w) { w.SetString("qwen3.rope.freq_base", "ten thousand"); };
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("qwen3.rope.freq_base"));
}

TEST(ModelSpec, OldPerExpertLayoutIsUnimplementedWithAHint) {
  TinyModel m;
  m.edit_tensor = [](std::string& name, std::vector<uint64_t>& dims) {
    if (name == "blk.0.ffn_norm.weight") return true;
    if (name == "blk.0.attn_norm.weight") {
      name = "blk.0.ffn_gate.0.weight";
      dims = {16, 24};
    }
    return true;
  };
  auto spec = SpecOf(m.Build());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("ffn_*_exps"));
}

}  // namespace
}  // namespace moert::format
