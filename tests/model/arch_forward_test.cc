// The architectures without an oracle model (dense llama, qwen2, qwen2moe, qwen3,
// qwen3moe, olmoe, and llama's variants): tiny models with random weights written
// with GgufWriter, run through Model and compared with a plain double-precision
// transformer written here from the architectures' definitions; and the building
// blocks (RoPE, routing, RMSNorm, SwiGLU, the shared expert) against hand-computed
// values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/status.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "model/layers.h"
#include "model/model.h"
#include "pipeline/moe_scheduler.h"

namespace moert::model {
namespace {

using format::GgmlType;
using format::GgufWriter;
using ::testing::HasSubstr;

// A portable generator, so the weights are the same on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float Uniform(float lo, float hi) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * static_cast<float>(state_ >> 40) / 16777216.0f;
  }

 private:
  uint64_t state_;
};

struct TinyConfig {
  std::string arch = "llama";
  bool moe = true;
  uint32_t n_embd = 16, n_layer = 2, n_head = 4, n_head_kv = 2, n_vocab = 32, n_ff = 24;
  uint32_t n_expert = 4, n_used = 2, n_ff_shexp = 20;
  uint32_t n_rot = 0;        // 0: the head dimension
  float linear_scaling = 0;  // 0: none
  bool tied = false;         // no output.weight
  bool rope_freqs = false;   // a rope_freqs.weight tensor (llama 3's frequency factors)
  std::optional<bool> expert_weights_norm;
  uint64_t seed = 1;
};

// Facts of each architecture as its original code defines them, stated here without
// the architecture table so that the reference does not share the model's mistakes.
bool UsesNeox(const std::string& arch) { return arch != "llama"; }
bool HasBiases(const std::string& arch) { return arch == "qwen2" || arch == "qwen2moe"; }
bool PerHeadQkNorm(const std::string& arch) { return arch == "qwen3" || arch == "qwen3moe"; }
bool FullQkNorm(const std::string& arch) { return arch == "olmoe"; }
bool SharedExpert(const std::string& arch) { return arch == "qwen2moe"; }
bool RenormalizesByDefault(const std::string& arch) {
  return arch == "llama" || arch == "qwen3moe";
}

class TinyModel {
 public:
  explicit TinyModel(const TinyConfig& c) : c_(c) {
    Random rng(c.seed);
    GgufWriter w;
    const std::string& a = c.arch;
    w.SetString("general.architecture", a);
    w.SetUint32(a + ".context_length", 64);
    w.SetUint32(a + ".embedding_length", c.n_embd);
    w.SetUint32(a + ".block_count", c.n_layer);
    w.SetUint32(a + ".attention.head_count", c.n_head);
    w.SetUint32(a + ".attention.head_count_kv", c.n_head_kv);
    w.SetFloat32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
    w.SetFloat32(a + ".rope.freq_base", 10000.0f);
    w.SetUint32(a + ".feed_forward_length", c.n_ff);
    if (c.n_rot != 0) w.SetUint32(a + ".rope.dimension_count", c.n_rot);
    if (c.linear_scaling != 0) {
      w.SetString(a + ".rope.scaling.type", "linear");
      w.SetFloat32(a + ".rope.scaling.factor", c.linear_scaling);
    }
    if (c.moe) {
      w.SetUint32(a + ".expert_count", c.n_expert);
      w.SetUint32(a + ".expert_used_count", c.n_used);
      if (a != "llama") w.SetUint32(a + ".expert_feed_forward_length", c.n_ff);
      if (SharedExpert(a)) w.SetUint32(a + ".expert_shared_feed_forward_length", c.n_ff_shexp);
      if (c.expert_weights_norm) w.SetBool(a + ".expert_weights_norm", *c.expert_weights_norm);
    }

    const uint64_t e = c.n_embd, hd = head_dim(), q = c.n_head * hd, kv = c.n_head_kv * hd;
    const uint64_t ff = c.n_ff, ne = c.n_expert, sff = c.n_ff_shexp;
    auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
      uint64_t n = 1;
      for (uint64_t d : dims) n *= d;
      std::vector<float>& v = tensors_[name];
      v.resize(n);
      const bool norm = name.find("norm") != std::string::npos;
      const bool bias = name.find(".bias") != std::string::npos;
      const float scale = 1.5f / std::sqrt(static_cast<float>(dims[0]));
      for (float& x : v) {
        x = name == "rope_freqs.weight"   ? rng.Uniform(1, 4)
            : norm                        ? rng.Uniform(0.6f, 1.4f)
            : bias                        ? rng.Uniform(-0.3f, 0.3f)
            : name == "token_embd.weight" ? rng.Uniform(-1, 1)
                                          : rng.Uniform(-scale, scale);
      }
      std::vector<uint8_t> bytes(n * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
      ASSERT_TRUE(w.AddTensor(name, GgmlType::kF32, dims, bytes).ok()) << name;
    };
    add("token_embd.weight", {e, c.n_vocab});
    add("output_norm.weight", {e});
    if (!c.tied) add("output.weight", {e, c.n_vocab});
    if (c.rope_freqs) add("rope_freqs.weight", {(c.n_rot != 0 ? c.n_rot : hd) / 2});
    for (uint32_t il = 0; il < c.n_layer; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      add(p + "attn_norm.weight", {e});
      add(p + "attn_q.weight", {e, q});
      add(p + "attn_k.weight", {e, kv});
      add(p + "attn_v.weight", {e, kv});
      add(p + "attn_output.weight", {q, e});
      if (HasBiases(a)) {
        add(p + "attn_q.bias", {q});
        add(p + "attn_k.bias", {kv});
        add(p + "attn_v.bias", {kv});
      }
      if (PerHeadQkNorm(a)) {
        add(p + "attn_q_norm.weight", {hd});
        add(p + "attn_k_norm.weight", {hd});
      }
      if (FullQkNorm(a)) {
        add(p + "attn_q_norm.weight", {q});
        add(p + "attn_k_norm.weight", {kv});
      }
      add(p + "ffn_norm.weight", {e});
      if (!c.moe) {
        add(p + "ffn_gate.weight", {e, ff});
        add(p + "ffn_up.weight", {e, ff});
        add(p + "ffn_down.weight", {ff, e});
        continue;
      }
      add(p + "ffn_gate_inp.weight", {e, ne});
      add(p + "ffn_gate_exps.weight", {e, ff, ne});
      add(p + "ffn_up_exps.weight", {e, ff, ne});
      add(p + "ffn_down_exps.weight", {ff, e, ne});
      if (SharedExpert(a)) {
        add(p + "ffn_gate_inp_shexp.weight", {e});
        add(p + "ffn_gate_shexp.weight", {e, sff});
        add(p + "ffn_up_shexp.weight", {e, sff});
        add(p + "ffn_down_shexp.weight", {sff, e});
      }
    }
    bytes_ = w.Serialize();
  }

  uint32_t head_dim() const { return c_.n_embd / c_.n_head; }

  std::unique_ptr<Model> Load(int threads = 1) {
    auto file = format::GgufFile::FromBuffer(bytes_, "tiny-" + c_.arch + ".gguf");
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return nullptr;
    ModelLoadOptions options;
    options.threads = threads;
    auto model = Model::Load(**file, options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // The logits of every token of `tokens` (positions 0 ..), [T][n_vocab], computed in
  // double with plain loops.
  std::vector<double> Reference(const std::vector<int32_t>& tokens) const {
    using Vec = std::vector<double>;
    const int n = static_cast<int>(tokens.size());
    const int e = static_cast<int>(c_.n_embd), hd = static_cast<int>(head_dim());
    const int nh = static_cast<int>(c_.n_head), nkv = static_cast<int>(c_.n_head_kv);
    const int n_rot = c_.n_rot != 0 ? static_cast<int>(c_.n_rot) : hd;
    const double eps = 1e-5;
    auto t = [&](const std::string& name) -> const std::vector<float>& {
      return tensors_.at(name);
    };
    // y = W x for W with `rows` rows of x.size() values starting at row `first`.
    auto matvec = [](const std::vector<float>& w, int rows, const Vec& x, int first = 0) {
      Vec y(rows, 0.0);
      const size_t cols = x.size();
      for (int r = 0; r < rows; ++r) {
        for (size_t i = 0; i < cols; ++i) y[r] += double{w[(first + r) * cols + i]} * x[i];
      }
      return y;
    };
    auto rmsnorm = [&](const Vec& x, size_t begin, size_t width, const std::vector<float>& w,
                       Vec* out) {
      double ss = 0;
      for (size_t i = 0; i < width; ++i) ss += x[begin + i] * x[begin + i];
      const double s = 1.0 / std::sqrt(ss / static_cast<double>(width) + eps);
      for (size_t i = 0; i < width; ++i) (*out)[begin + i] = x[begin + i] * s * w[i];
    };
    auto norm = [&](const Vec& x, const std::vector<float>& w) {
      Vec y(x.size());
      rmsnorm(x, 0, x.size(), w, &y);
      return y;
    };
    auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    auto swiglu = [&](const std::vector<float>& gate, const std::vector<float>& up,
                      const std::vector<float>& down, int ff, const Vec& x, int first_ff,
                      int first_e) {
      Vec g = matvec(gate, ff, x, first_ff), u = matvec(up, ff, x, first_ff);
      for (int i = 0; i < ff; ++i) g[i] = silu(g[i]) * u[i];
      return matvec(down, e, g, first_e);
    };
    const double scale = c_.linear_scaling != 0 ? c_.linear_scaling : 1.0;
    auto rope = [&](Vec* v, int heads, int pos) {
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < n_rot / 2; ++i) {
          const double factor = c_.rope_freqs ? t("rope_freqs.weight")[i] : 1.0;
          const double angle =
              pos / scale * std::pow(10000.0, -2.0 * i / static_cast<double>(n_rot)) / factor;
          const int a = h * hd + (UsesNeox(c_.arch) ? i : 2 * i);
          const int b = h * hd + (UsesNeox(c_.arch) ? i + n_rot / 2 : 2 * i + 1);
          const double x0 = (*v)[a], x1 = (*v)[b];
          (*v)[a] = x0 * std::cos(angle) - x1 * std::sin(angle);
          (*v)[b] = x0 * std::sin(angle) + x1 * std::cos(angle);
        }
      }
    };

    std::vector<Vec> x(n);
    for (int i = 0; i < n; ++i) {
      const std::vector<float>& embd = t("token_embd.weight");
      x[i].assign(embd.begin() + tokens[i] * e, embd.begin() + (tokens[i] + 1) * e);
    }
    for (uint32_t il = 0; il < c_.n_layer; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      std::vector<Vec> q(n), k(n), v(n);
      for (int i = 0; i < n; ++i) {
        const Vec in = norm(x[i], t(p + "attn_norm.weight"));
        q[i] = matvec(t(p + "attn_q.weight"), nh * hd, in);
        k[i] = matvec(t(p + "attn_k.weight"), nkv * hd, in);
        v[i] = matvec(t(p + "attn_v.weight"), nkv * hd, in);
        if (HasBiases(c_.arch)) {
          for (int j = 0; j < nh * hd; ++j) q[i][j] += t(p + "attn_q.bias")[j];
          for (int j = 0; j < nkv * hd; ++j) k[i][j] += t(p + "attn_k.bias")[j];
          for (int j = 0; j < nkv * hd; ++j) v[i][j] += t(p + "attn_v.bias")[j];
        }
        if (PerHeadQkNorm(c_.arch)) {
          for (int h = 0; h < nh; ++h)
            rmsnorm(q[i], h * hd, hd, t(p + "attn_q_norm.weight"), &q[i]);
          for (int h = 0; h < nkv; ++h)
            rmsnorm(k[i], h * hd, hd, t(p + "attn_k_norm.weight"), &k[i]);
        }
        if (FullQkNorm(c_.arch)) {
          q[i] = norm(q[i], t(p + "attn_q_norm.weight"));
          k[i] = norm(k[i], t(p + "attn_k_norm.weight"));
        }
        rope(&q[i], nh, i);
        rope(&k[i], nkv, i);
      }
      for (int i = 0; i < n; ++i) {
        Vec attn(nh * hd, 0.0);
        for (int h = 0; h < nh; ++h) {
          const int g = h / (nh / nkv);
          Vec s(i + 1);
          for (int j = 0; j <= i; ++j) {
            double d = 0;
            for (int c = 0; c < hd; ++c) d += q[i][h * hd + c] * k[j][g * hd + c];
            s[j] = d / std::sqrt(static_cast<double>(hd));
          }
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double& sj : s) sum += (sj = std::exp(sj - mx));
          for (int j = 0; j <= i; ++j) {
            for (int c = 0; c < hd; ++c) attn[h * hd + c] += s[j] / sum * v[j][g * hd + c];
          }
        }
        const Vec o = matvec(t(p + "attn_output.weight"), e, attn);
        for (int j = 0; j < e; ++j) x[i][j] += o[j];
      }
      for (int i = 0; i < n; ++i) {
        const Vec h = norm(x[i], t(p + "ffn_norm.weight"));
        Vec out(e, 0.0);
        if (!c_.moe) {
          out = swiglu(t(p + "ffn_gate.weight"), t(p + "ffn_up.weight"), t(p + "ffn_down.weight"),
                       c_.n_ff, h, 0, 0);
        } else {
          const int ne = static_cast<int>(c_.n_expert), ff = static_cast<int>(c_.n_ff);
          Vec prob = matvec(t(p + "ffn_gate_inp.weight"), ne, h);
          const double mx = *std::max_element(prob.begin(), prob.end());
          double sum = 0;
          for (double& pr : prob) sum += (pr = std::exp(pr - mx));
          for (double& pr : prob) pr /= sum;
          std::vector<int> order(ne);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int a, int b) { return prob[a] > prob[b]; });
          order.resize(c_.n_used);
          double total = 0;
          for (int ex : order) total += prob[ex];
          const bool renorm = c_.expert_weights_norm.value_or(RenormalizesByDefault(c_.arch));
          for (int ex : order) {
            const Vec y = swiglu(t(p + "ffn_gate_exps.weight"), t(p + "ffn_up_exps.weight"),
                                 t(p + "ffn_down_exps.weight"), ff, h, ex * ff, ex * e);
            const double wgt = renorm ? prob[ex] / total : prob[ex];
            for (int j = 0; j < e; ++j) out[j] += wgt * y[j];
          }
          if (SharedExpert(c_.arch)) {
            const Vec y = swiglu(t(p + "ffn_gate_shexp.weight"), t(p + "ffn_up_shexp.weight"),
                                 t(p + "ffn_down_shexp.weight"), c_.n_ff_shexp, h, 0, 0);
            const double gate =
                1.0 / (1.0 + std::exp(-matvec(t(p + "ffn_gate_inp_shexp.weight"), 1, h)[0]));
            for (int j = 0; j < e; ++j) out[j] += gate * y[j];
          }
        }
        for (int j = 0; j < e; ++j) x[i][j] += out[j];
      }
    }
    std::vector<double> logits;
    for (int i = 0; i < n; ++i) {
      const Vec h = norm(x[i], t("output_norm.weight"));
      const Vec l = matvec(t(c_.tied ? "token_embd.weight" : "output.weight"),
                           static_cast<int>(c_.n_vocab), h);
      logits.insert(logits.end(), l.begin(), l.end());
    }
    return logits;
  }

  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  TinyConfig c_;
  std::map<std::string, std::vector<float>> tensors_;
  std::vector<uint8_t> bytes_;
};

const std::vector<int32_t> kTokens = {1, 7, 30, 2, 2, 19, 11, 5, 28};

struct Case {
  std::string label;
  TinyConfig config;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, std::string arch, bool moe) {
    TinyConfig c;
    c.arch = std::move(arch);
    c.moe = moe;
    c.seed = cases.size() + 1;
    cases.push_back({std::move(label), c});
    return &cases.back().config;
  };
  add("llama dense", "llama", false);
  add("llama MoE (Mixtral)", "llama", true);
  add("qwen2", "qwen2", false);
  add("qwen2moe", "qwen2moe", true);
  add("qwen3", "qwen3", false);
  add("qwen3moe", "qwen3moe", true);
  add("olmoe", "olmoe", true);
  TinyConfig* c = add("llama, tied output, partial RoPE, linear scaling", "llama", false);
  c->tied = true;
  c->n_rot = 2;
  c->linear_scaling = 4;
  c = add("llama MoE with rope_freqs", "llama", true);
  c->rope_freqs = true;
  c = add("qwen2moe with expert_weights_norm", "qwen2moe", true);
  c->expert_weights_norm = true;
  c = add("qwen3moe without expert_weights_norm, 3 of 5 experts", "qwen3moe", true);
  c->expert_weights_norm = false;
  c->n_expert = 5;
  c->n_used = 3;
  c = add("olmoe, MHA, partial neox RoPE", "olmoe", true);
  c->n_head_kv = 4;
  c->n_rot = 2;
  return cases;
}

TEST(Architectures, EveryOneMatchesTheReferenceTransformer) {
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(c.label);
    TinyModel tiny(c.config);
    std::unique_ptr<Model> model = tiny.Load();
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->spec().arch->name, c.config.arch);
    auto cache = model->NewKvCache(static_cast<int>(kTokens.size()));
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    ASSERT_TRUE(model->Forward(kTokens, cache->get(), LogitsFor::kAll, &logits).ok());
    const std::vector<double> ref = tiny.Reference(kTokens);
    ASSERT_EQ(logits.size(), ref.size());
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(logits[i])) << i;
      worst = std::max(worst, std::abs(logits[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
    }
    EXPECT_LT(worst, 2e-5) << "worst relative logit error";

    // Token-by-token decode agrees bit for bit with the batch.
    auto step = model->NewKvCache(static_cast<int>(kTokens.size()));
    ASSERT_TRUE(step.ok());
    std::vector<float> one;
    for (size_t t = 0; t < kTokens.size(); ++t) {
      ASSERT_TRUE(model->Forward({&kTokens[t], 1}, step->get(), LogitsFor::kLast, &one).ok());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), logits.begin() + t * c.config.n_vocab))
          << "token " << t;
    }
  }
}

TEST(Architectures, ThreadsAndMicroBatchesDoNotChangeTheLogits) {
  TinyConfig config;
  config.arch = "qwen2moe";
  TinyModel tiny(config);
  std::unique_ptr<Model> one = tiny.Load(1);
  std::unique_ptr<Model> three = tiny.Load(3);
  ASSERT_TRUE(one && three);
  // 700 tokens: past the 512-token micro-batch, and past the 64 trained positions.
  std::vector<int32_t> tokens(700);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 32);
  auto c1 = one->NewKvCache(700);
  auto c3 = three->NewKvCache(700);
  ASSERT_TRUE(c1.ok() && c3.ok());
  std::vector<float> a, b, tail;
  ASSERT_TRUE(one->Forward(tokens, c1->get(), LogitsFor::kAll, &a).ok());
  ASSERT_TRUE(three->Forward(std::span(tokens).first(300), c3->get(), LogitsFor::kAll, &b).ok());
  ASSERT_TRUE(
      three->Forward(std::span(tokens).subspan(300), c3->get(), LogitsFor::kAll, &tail).ok());
  b.insert(b.end(), tail.begin(), tail.end());
  EXPECT_TRUE(a == b);
  const std::vector<double> ref = tiny.Reference(tokens);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
  }
  EXPECT_LT(worst, 1e-4);
}

TEST(Architectures, LoadReportsProgressUpToOne) {
  TinyConfig config;
  TinyModel tiny(config);
  auto file = format::GgufFile::FromBuffer(tiny.bytes(), "tiny.gguf");
  ASSERT_TRUE(file.ok());
  std::vector<float> seen;
  ModelLoadOptions options;
  options.progress = [&](float f) { seen.push_back(f); };
  ASSERT_TRUE(Model::Load(**file, options).ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), 1.0f);
}

TEST(Architectures, UndequantizableTensorIsNamed) {
  // A model whose blk.0.attn_q.weight is i32, a type with no dequantization.
  TinyConfig config;
  config.moe = false;
  TinyModel tiny(config);
  auto file = format::GgufFile::FromBuffer(tiny.bytes(), "tiny.gguf");
  ASSERT_TRUE(file.ok());
  GgufWriter w;
  for (const format::GgufKeyValue& kv : (*file)->metadata()) {
    if (kv.value.type == format::GgufValueType::kString) {
      w.SetString(kv.key, kv.value.str);
    } else if (kv.value.type == format::GgufValueType::kFloat32) {
      w.SetFloat32(kv.key, static_cast<float>(kv.value.f64));
    } else {
      w.SetUint32(kv.key, static_cast<uint32_t>(kv.value.u64));
    }
  }
  for (const format::GgufTensorInfo& t : (*file)->tensors()) {
    const GgmlType type = t.name == "blk.0.attn_q.weight" ? GgmlType::kI32 : t.type;
    ASSERT_TRUE(w.AddTensor(t.name, type, t.dims, (*file)->TensorData(t)).ok());
  }
  const std::vector<uint8_t> bytes = w.Serialize();
  auto broken = format::GgufFile::FromBuffer(bytes, "broken.gguf");
  ASSERT_TRUE(broken.ok()) << broken.status();
  auto model = Model::Load(**broken);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("'blk.0.attn_q.weight'"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("i32"));
}

TEST(Architectures, YarnAndNegativeThreadsAreRefused) {
  TinyConfig config;
  TinyModel tiny(config);
  auto file = format::GgufFile::FromBuffer(tiny.bytes(), "tiny.gguf");
  ASSERT_TRUE(file.ok());
  ModelLoadOptions options;
  options.threads = -2;
  EXPECT_EQ(Model::Load(**file, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.threads = 1;
  options.poll = 101;
  EXPECT_EQ(Model::Load(**file, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.poll = 50;

  GgufWriter w;
  w.SetString("general.architecture", "llama");
  for (const format::GgufKeyValue& kv : (*file)->metadata()) {
    if (kv.key == "general.architecture") continue;
    if (kv.value.type == format::GgufValueType::kFloat32) {
      w.SetFloat32(kv.key, static_cast<float>(kv.value.f64));
    } else {
      w.SetUint32(kv.key, static_cast<uint32_t>(kv.value.u64));
    }
  }
  w.SetString("llama.rope.scaling.type", "yarn");
  w.SetFloat32("llama.rope.scaling.factor", 4.0f);
  for (const format::GgufTensorInfo& t : (*file)->tensors()) {
    ASSERT_TRUE(w.AddTensor(t.name, t.type, t.dims, (*file)->TensorData(t)).ok());
  }
  const std::vector<uint8_t> bytes = w.Serialize();
  auto yarn = format::GgufFile::FromBuffer(bytes, "yarn.gguf");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  auto model = Model::Load(**yarn);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("YaRN"));
}

// Building blocks against values worked out by hand.

TEST(Blocks, RopeNormalRotatesAdjacentPairsAndNeoxHalves) {
  // One head of 4 at position 1: pair 0 turns by 1 rad, pair 1 by 10000^(-1/2) rad.
  const double a0 = 1.0, a1 = 0.01;
  const float x[4] = {1, 2, 3, 4};
  RopeParams rope;
  rope.n_rot = 4;
  rope.theta_base = 10000;

  std::vector<float> normal(x, x + 4);
  rope.layout = format::RopeLayout::kNormal;
  ApplyRope(rope, /*pos0=*/1, 1, 1, 4, normal.data());
  const double expect_normal[4] = {
      1 * std::cos(a0) - 2 * std::sin(a0), 1 * std::sin(a0) + 2 * std::cos(a0),
      3 * std::cos(a1) - 4 * std::sin(a1), 3 * std::sin(a1) + 4 * std::cos(a1)};
  std::vector<float> neox(x, x + 4);
  rope.layout = format::RopeLayout::kNeox;
  ApplyRope(rope, 1, 1, 1, 4, neox.data());
  const double expect_neox[4] = {
      1 * std::cos(a0) - 3 * std::sin(a0), 2 * std::cos(a1) - 4 * std::sin(a1),
      1 * std::sin(a0) + 3 * std::cos(a0), 2 * std::sin(a1) + 4 * std::cos(a1)};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(normal[i], expect_normal[i], 1e-6) << i;
    EXPECT_NEAR(neox[i], expect_neox[i], 1e-6) << i;
  }

  // Linear scaling by 2 at position 2 is position 1; position 0 is the identity; with
  // n_rot 2 of 4 the last two dimensions stay.
  std::vector<float> scaled(x, x + 4);
  rope.layout = format::RopeLayout::kNormal;
  rope.freq_scale = 0.5f;
  ApplyRope(rope, 2, 1, 1, 4, scaled.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(scaled[i], expect_normal[i], 1e-6) << i;
  std::vector<float> partial(x, x + 4);
  rope.freq_scale = 1;
  rope.n_rot = 2;
  ApplyRope(rope, 1, 1, 1, 4, partial.data());
  EXPECT_NEAR(partial[0], expect_normal[0], 1e-6);
  EXPECT_NEAR(partial[1], expect_normal[1], 1e-6);
  EXPECT_EQ(partial[2], 3);
  EXPECT_EQ(partial[3], 4);
  std::vector<float> at_zero(x, x + 4);
  rope.n_rot = 4;
  ApplyRope(rope, 0, 1, 1, 4, at_zero.data());
  EXPECT_EQ(at_zero, std::vector<float>(x, x + 4));
}

TEST(Blocks, RoutingTakesTopKAndRenormalisesOnRequest) {
  const float logits[4] = {1, 3, 2, 0};
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0);
  int experts[2];
  float weights[2];
  RouteToken(logits, 4, 2, /*renormalize=*/false, experts, weights);
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_NEAR(weights[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(weights[1], std::exp(2.0) / z, 1e-7);
  RouteToken(logits, 4, 2, /*renormalize=*/true, experts, weights);
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_NEAR(weights[0], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-7);
  EXPECT_NEAR(weights[1], std::exp(2.0) / (std::exp(3.0) + std::exp(2.0)), 1e-7);
  // Ties go to the lower index.
  const float tied[3] = {5, 5, 5};
  int one[1];
  float w1[1];
  RouteToken(tied, 3, 1, true, one, w1);
  EXPECT_EQ(one[0], 0);
  EXPECT_FLOAT_EQ(w1[0], 1.0f);
}

TEST(Blocks, RmsNormPerHeadAndFullWidth) {
  const std::vector<float> x = {3, 4, 0, 2};
  const std::vector<float> w = {1, 2, 1, 2};
  std::vector<float> full(4), heads(4);
  RmsNorm(x.data(), 1, 4, w.data(), 0, full.data());
  const double s = 1 / std::sqrt(29.0 / 4);
  EXPECT_NEAR(full[0], 3 * s, 1e-6);
  EXPECT_NEAR(full[1], 8 * s, 1e-6);
  EXPECT_NEAR(full[3], 4 * s, 1e-6);
  RmsNorm(x.data(), 2, 2, w.data(), 0, heads.data());  // two heads of two, weight [1, 2]
  EXPECT_NEAR(heads[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(heads[1], 8 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(heads[2], 0, 1e-6);
  EXPECT_NEAR(heads[3], 4 / std::sqrt(2.0), 1e-6);
}

Matrix MakeMatrix(int64_t rows, int64_t cols, std::vector<float> values) {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data = std::move(values);
  return m;
}

double SiluD(double v) { return v / (1 + std::exp(-v)); }

TEST(Blocks, SwiGluFfnMatchesHandComputation) {
  ThreadPool pool(1);
  FfnWeights w;
  w.gate = MakeMatrix(2, 2, {1, 0, 0.5, -1});  // gate(x) = [x0, 0.5 x0 - x1]
  w.up = MakeMatrix(2, 2, {2, 1, 0, 3});       // up(x) = [2 x0 + x1, 3 x1]
  w.down = MakeMatrix(2, 2, {1, 1, -1, 2});    // down(h) = [h0 + h1, -h0 + 2 h1]
  const float x[2] = {0.5f, -2};
  float out[2];
  SwiGluFfn(pool, w, x, 1, out);
  const double h0 = SiluD(0.5) * (1 - 2), h1 = SiluD(0.25 + 2) * (-6);
  EXPECT_NEAR(out[0], h0 + h1, 1e-5);
  EXPECT_NEAR(out[1], -h0 + 2 * h1, 1e-5);
}

// The MoE block of `m` as the only layer, on the CPU backend.
absl::Status RunMoe(ThreadPool& pool, const MoeWeights& m, const float* x, int64_t n, float* out) {
  backend::cpu::CpuBackend cpu(pool);
  const pipeline::MoeServices services;
  pipeline::MoeScheduler scheduler(cpu, {&m}, &services);
  MOERT_RETURN_IF_ERROR(scheduler.Init());
  const size_t bytes = static_cast<size_t>(n * m.router.cols) * sizeof(float);
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<backend::Buffer> xb,
                         cpu.WrapHost(const_cast<float*>(x), bytes));
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<backend::Buffer> ob, cpu.WrapHost(out, bytes));
  return scheduler.Run(0, xb, n, ob);
}

TEST(Blocks, SharedExpertIsAddedScaledBySigmoidOfItsGate) {
  // Two experts of width 1 over n_embd 2, one used; the router prefers expert 1.
  ThreadPool pool(2);
  MoeWeights m;
  m.n_expert = 2;
  m.n_used = 1;
  m.n_ff = 1;
  m.renormalize = false;
  m.router = MakeMatrix(2, 2, {0, 0, 1, 1});
  m.gate_exps = MakeMatrix(2, 2, {1, 0, 0, 1});   // expert e: gate = x_e
  m.up_exps = MakeMatrix(2, 2, {1, 1, 2, 0});     // up: x0 + x1 | 2 x0
  m.down_exps = MakeMatrix(4, 1, {1, 0, 0, -1});  // down: [h, 0] | [0, -h]
  m.shared.gate = MakeMatrix(1, 2, {1, 1});
  m.shared.up = MakeMatrix(1, 2, {1, -1});
  m.shared.down = MakeMatrix(2, 1, {2, 3});
  m.shared_gate = MakeMatrix(1, 2, {0.5f, -1});
  const float x[2] = {1, 2};
  float out[2];
  ASSERT_TRUE(RunMoe(pool, m, x, 1, out).ok());
  // Router logits [0, 3]: expert 1 with weight softmax = e^3 / (1 + e^3), not renormalised.
  const double p1 = std::exp(3.0) / (1 + std::exp(3.0));
  const double routed = SiluD(2) * 2;  // expert 1: silu(x1) * 2 x0
  const double shared = SiluD(3) * (1 - 2);
  const double g = 1 / (1 + std::exp(-(0.5 - 2)));
  EXPECT_NEAR(out[0], 0 + g * 2 * shared, 1e-5);
  EXPECT_NEAR(out[1], p1 * -routed + g * 3 * shared, 1e-5);

  // Renormalised, a single expert has weight 1.
  m.renormalize = true;
  m.shared = FfnWeights();
  ASSERT_TRUE(RunMoe(pool, m, x, 1, out).ok());
  EXPECT_NEAR(out[0], 0, 1e-6);
  EXPECT_NEAR(out[1], -routed, 1e-5);
}

TEST(Blocks, MatMulHandlesEveryEdgeShape) {
  // Rows and tokens that are not multiples of the blocks, k with a tail, 1 and 3 threads.
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (int64_t rows : {1, 3, 17, 35}) {
      for (int64_t n : {1, 2, 5}) {
        for (int64_t k : {1, 7, 8, 19}) {
          Random rng(static_cast<uint64_t>(rows * 100 + n * 10 + k));
          Matrix w = MakeMatrix(rows, k, std::vector<float>(rows * k));
          std::vector<float> x(n * k), y(n * rows);
          for (float& v : w.data) v = rng.Uniform(-1, 1);
          for (float& v : x) v = rng.Uniform(-1, 1);
          MatMul(pool, w, x.data(), n, y.data());
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              double ref = 0;
              for (int64_t i = 0; i < k; ++i) ref += double{w.data[r * k + i]} * x[t * k + i];
              EXPECT_NEAR(y[t * rows + r], ref, 1e-5)
                  << "rows " << rows << " n " << n << " k " << k;
              // Any block shape gives the single dot product's value.
              EXPECT_EQ(y[t * rows + r], Dot(w.row(r), x.data() + t * k, k));
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moert::model
