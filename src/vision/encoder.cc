// The MiniCPM-V image encoder (see encoder.h).
#include "vision/encoder.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "telemetry/trace.h"

namespace moert::vision {

using backend::Buffer;
using backend::TensorRef;
using backend::Weight;

namespace {

// Scratch slots of one slice's pass.
enum Slot { kPatches, kX, kH, kQ, kK, kV, kAttn, kT, kF, kIdx, kPos, kV0, kKr, kKK, kVV, kO, kO2, kOut, kEntropy,
            kSlotCount };

// clip.cpp buckets patch positions onto a 70x70 grid of the position embedding.
constexpr int kGrid = 70;

size_t Bytes(int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); }

}  // namespace

struct VisionEncoder::Weights {
  struct Layer {
    std::unique_ptr<Weight> q, k, v, o, fc1, fc2;
    std::unique_ptr<Buffer> q_b, k_b, v_b, o_b, ln1_w, ln1_b, ln2_w, ln2_b, fc1_b, fc2_b;
  };
  std::unique_ptr<Weight> patch_embd;
  std::unique_ptr<Buffer> patch_b, position_embd, post_ln_w, post_ln_b;
  std::vector<Layer> layers;
  std::unique_ptr<Weight> kv, rk, rv, ro, proj;
  std::unique_ptr<Buffer> rk_b, rv_b, ro_b, ln_kv_w, ln_kv_b, ln_post_w, ln_post_b;
  std::unique_ptr<Buffer> queries;  // Wq LN_q(query) + bq: the same for every slice
};

VisionEncoder::VisionEncoder(const Mmproj& mmproj, backend::Backend& backend)
    : m_(mmproj), b_(backend), w_(std::make_unique<Weights>()), scratch_(backend, kSlotCount) {}

VisionEncoder::~VisionEncoder() = default;

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Create(const Mmproj& mmproj,
                                                                     backend::Backend& backend) {
  std::unique_ptr<VisionEncoder> e(new VisionEncoder(mmproj, backend));
  MOERT_RETURN_IF_ERROR(e->Upload());
  return e;
}

absl::Status VisionEncoder::Upload() {
  const auto mat = [&](const backend::Matrix& m, const std::string& name,
                       std::unique_ptr<Weight>* out) -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(*out, b_.UploadWeight(m, 1, name));
    return absl::OkStatus();
  };
  const auto vec = [&](const std::vector<float>& v, std::unique_ptr<Buffer>* out) -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(*out, b_.UploadFloats(v));
    return absl::OkStatus();
  };
  Weights& w = *w_;
  MOERT_RETURN_IF_ERROR(mat(m_.patch_embd, "v.patch_embd.weight", &w.patch_embd));
  MOERT_RETURN_IF_ERROR(vec(m_.patch_b, &w.patch_b));
  MOERT_RETURN_IF_ERROR(vec(m_.position_embd.data, &w.position_embd));
  MOERT_RETURN_IF_ERROR(vec(m_.post_ln_w, &w.post_ln_w));
  MOERT_RETURN_IF_ERROR(vec(m_.post_ln_b, &w.post_ln_b));
  w.layers.resize(m_.layers.size());
  for (size_t il = 0; il < m_.layers.size(); ++il) {
    const VisionLayer& l = m_.layers[il];
    Weights::Layer& d = w.layers[il];
    const std::string blk = StrCat("v.blk.", il, ".");
    MOERT_RETURN_IF_ERROR(mat(l.q, blk + "attn_q.weight", &d.q));
    MOERT_RETURN_IF_ERROR(mat(l.k, blk + "attn_k.weight", &d.k));
    MOERT_RETURN_IF_ERROR(mat(l.v, blk + "attn_v.weight", &d.v));
    MOERT_RETURN_IF_ERROR(mat(l.o, blk + "attn_out.weight", &d.o));
    MOERT_RETURN_IF_ERROR(mat(l.fc1, blk + "ffn_down.weight", &d.fc1));
    MOERT_RETURN_IF_ERROR(mat(l.fc2, blk + "ffn_up.weight", &d.fc2));
    for (const auto& [src, dst] :
         {std::pair{&l.q_b, &d.q_b}, std::pair{&l.k_b, &d.k_b}, std::pair{&l.v_b, &d.v_b},
          std::pair{&l.o_b, &d.o_b}, std::pair{&l.ln1_w, &d.ln1_w}, std::pair{&l.ln1_b, &d.ln1_b},
          std::pair{&l.ln2_w, &d.ln2_w}, std::pair{&l.ln2_b, &d.ln2_b},
          std::pair{&l.fc1_b, &d.fc1_b}, std::pair{&l.fc2_b, &d.fc2_b}}) {
      MOERT_RETURN_IF_ERROR(vec(*src, dst));
    }
  }
  const Resampler& r = m_.resampler;
  MOERT_RETURN_IF_ERROR(mat(r.kv, "resampler.kv.weight", &w.kv));
  MOERT_RETURN_IF_ERROR(mat(r.k, "resampler.attn.k.weight", &w.rk));
  MOERT_RETURN_IF_ERROR(mat(r.v, "resampler.attn.v.weight", &w.rv));
  MOERT_RETURN_IF_ERROR(mat(r.o, "resampler.attn.out.weight", &w.ro));
  MOERT_RETURN_IF_ERROR(mat(r.proj, "resampler.proj.weight", &w.proj));
  for (const auto& [src, dst] :
       {std::pair{&r.k_b, &w.rk_b}, std::pair{&r.v_b, &w.rv_b}, std::pair{&r.o_b, &w.ro_b},
        std::pair{&r.ln_kv_w, &w.ln_kv_w}, std::pair{&r.ln_kv_b, &w.ln_kv_b},
        std::pair{&r.ln_post_w, &w.ln_post_w}, std::pair{&r.ln_post_b, &w.ln_post_b}}) {
    MOERT_RETURN_IF_ERROR(vec(*src, dst));
  }
  // The queries' projection does not depend on the image: Wq LN_q(query) + bq, once.
  const int64_t nq = m_.hparams.n_query, rw = m_.hparams.resampler_width;
  std::unique_ptr<Weight> rq;
  std::unique_ptr<Buffer> query, ln_q_w, ln_q_b, rq_b;
  MOERT_RETURN_IF_ERROR(mat(r.q, "resampler.attn.q.weight", &rq));
  MOERT_RETURN_IF_ERROR(vec(r.query.data, &query));
  MOERT_RETURN_IF_ERROR(vec(r.ln_q_w, &ln_q_w));
  MOERT_RETURN_IF_ERROR(vec(r.ln_q_b, &ln_q_b));
  MOERT_RETURN_IF_ERROR(vec(r.q_b, &rq_b));
  MOERT_RETURN_IF_ERROR(b_.LayerNorm(TensorRef(query), nq, rw, TensorRef(ln_q_w), TensorRef(ln_q_b),
                                     m_.hparams.eps, TensorRef(query)));
  MOERT_ASSIGN_OR_RETURN(w.queries, b_.Allocate(Bytes(nq * rw)));
  MOERT_RETURN_IF_ERROR(b_.MatMul(*rq, 0, TensorRef(query), nq, TensorRef(w.queries)));
  MOERT_RETURN_IF_ERROR(b_.AddBias(TensorRef(w.queries), TensorRef(rq_b), nq, rw));
  return b_.Finish();
}

std::vector<float> VisionEncoder::SincosPositions(int patches_w, int patches_h, int width) {
  const int quarter = width / 4;
  std::vector<float> omega(static_cast<size_t>(quarter));
  for (int d = 0; d < quarter; ++d) {
    omega[static_cast<size_t>(d)] = static_cast<float>(
        1.0 / std::pow(10000.0, static_cast<double>(d) / static_cast<double>(quarter)));
  }
  std::vector<float> out(static_cast<size_t>(patches_w) * static_cast<size_t>(patches_h) *
                         static_cast<size_t>(width));
  for (int row = 0; row < patches_h; ++row) {
    for (int col = 0; col < patches_w; ++col) {
      float* p = out.data() + (static_cast<size_t>(row) * static_cast<size_t>(patches_w) +
                               static_cast<size_t>(col)) * static_cast<size_t>(width);
      for (int d = 0; d < quarter; ++d) {
        const float x = static_cast<float>(col) * omega[static_cast<size_t>(d)];
        const float y = static_cast<float>(row) * omega[static_cast<size_t>(d)];
        p[d] = std::sin(x);
        p[quarter + d] = std::cos(x);
        p[2 * quarter + d] = std::sin(y);
        p[3 * quarter + d] = std::cos(y);
      }
    }
  }
  return out;
}

absl::Status VisionEncoder::EncodeSlice(const Slice& slice, std::vector<float>* out,
                                        std::vector<float>* entropy) {
  MOERT_TRACE_SCOPE("vision slice");
  const MmprojHparams& hp = m_.hparams;
  const int patch = hp.patch_size;
  if (slice.width <= 0 || slice.height <= 0 || slice.width % patch != 0 ||
      slice.height % patch != 0 || slice.patches_w != slice.width / patch ||
      slice.patches_h != slice.height / patch ||
      slice.pixels.size() != static_cast<size_t>(slice.width) * static_cast<size_t>(slice.height) * 3) {
    return absl::InvalidArgumentError(StrCat("vision encoder: a slice of ", slice.width, "x",
                                             slice.height, " with ", slice.pixels.size(),
                                             " values is not whole ", patch, "-pixel patches"));
  }
  const int pw = slice.patches_w, ph = slice.patches_h;
  const int64_t n = int64_t{pw} * ph;
  const int64_t d = hp.n_embd, f = hp.n_ff, rw = hp.resampler_width, nq = hp.n_query;
  const int64_t kernel = int64_t{3} * patch * patch;
  const Weights& w = *w_;

  // im2col: patch p = row * pw + col (llava's reshape_by_patch order), its values in
  // the kernel's order (kx fastest, then ky, then the channel).
  std::vector<float> cols(static_cast<size_t>(n * kernel));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int row = 0; row < ph; ++row) {
    for (int col = 0; col < pw; ++col) {
      const int64_t p = int64_t{row} * pw + col;
      float* c = cols.data() + p * kernel;
      for (int ch = 0; ch < 3; ++ch) {
        for (int ky = 0; ky < patch; ++ky) {
          for (int kx = 0; kx < patch; ++kx) {
            const size_t y = static_cast<size_t>(row * patch + ky);
            const size_t x = static_cast<size_t>(col * patch + kx);
            c[kx + patch * (ky + patch * ch)] =
                slice.pixels[(y * static_cast<size_t>(slice.width) + x) * 3 + static_cast<size_t>(ch)];
          }
        }
      }
      // Bucketed onto the 70x70 position grid, in double as clip.cpp does.
      const int by = static_cast<int>(std::floor(kGrid * static_cast<double>(row) / ph));
      const int bx = static_cast<int>(std::floor(kGrid * static_cast<double>(col) / pw));
      pos[static_cast<size_t>(p)] = by * kGrid + bx;
    }
  }
  MOERT_ASSIGN_OR_RETURN(TensorRef patches, scratch_.Get(kPatches, Bytes(n * kernel)));
  MOERT_ASSIGN_OR_RETURN(TensorRef x, scratch_.Get(kX, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef h, scratch_.Get(kH, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef idx, scratch_.Get(kIdx, pos.size() * 4));
  MOERT_ASSIGN_OR_RETURN(TensorRef pe, scratch_.Get(kT, Bytes(n * std::max(d, f))));
  MOERT_RETURN_IF_ERROR(b_.Write(patches, cols.data(), Bytes(n * kernel)));
  MOERT_RETURN_IF_ERROR(b_.Write(idx, pos.data(), pos.size() * 4));
  MOERT_RETURN_IF_ERROR(b_.MatMul(*w.patch_embd, 0, patches, n, x));
  if (w.patch_b != nullptr) MOERT_RETURN_IF_ERROR(b_.AddBias(x, TensorRef(w.patch_b), n, d));
  const int64_t positions = m_.position_embd.rows;
  MOERT_RETURN_IF_ERROR(b_.GatherRows(TensorRef(w.position_embd), positions, idx, n, d, pe));
  MOERT_RETURN_IF_ERROR(b_.Add(x, pe, n * d));

  // The ViT: pre-norm blocks, unmasked attention.
  MOERT_ASSIGN_OR_RETURN(TensorRef q, scratch_.Get(kQ, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef k, scratch_.Get(kK, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef v, scratch_.Get(kV, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef attn, scratch_.Get(kAttn, Bytes(n * d)));
  MOERT_ASSIGN_OR_RETURN(TensorRef ff, scratch_.Get(kF, Bytes(n * f)));
  const TensorRef t = pe;
  backend::AttentionArgs self;
  self.n_head = hp.n_head;
  self.n_head_kv = hp.n_head;
  self.head_dim_k = self.head_dim_v = static_cast<int>(d / hp.n_head);
  self.scale = 1.0f / std::sqrt(static_cast<float>(self.head_dim_k));
  for (const Weights::Layer& l : w.layers) {
    MOERT_RETURN_IF_ERROR(b_.LayerNorm(x, n, d, TensorRef(l.ln1_w), TensorRef(l.ln1_b), hp.eps, h));
    const backend::MatMulArgs qkv[3] = {{l.q.get(), 0, h, n, q}, {l.k.get(), 0, h, n, k},
                                        {l.v.get(), 0, h, n, v}};
    MOERT_RETURN_IF_ERROR(b_.MatMuls(qkv));
    MOERT_RETURN_IF_ERROR(b_.AddBias(q, TensorRef(l.q_b), n, d));
    MOERT_RETURN_IF_ERROR(b_.AddBias(k, TensorRef(l.k_b), n, d));
    MOERT_RETURN_IF_ERROR(b_.AddBias(v, TensorRef(l.v_b), n, d));
    MOERT_RETURN_IF_ERROR(b_.FullAttention(self, q, n, k, v, n, attn));
    MOERT_RETURN_IF_ERROR(b_.MatMul(*l.o, 0, attn, n, t));
    MOERT_RETURN_IF_ERROR(b_.AddBias(t, TensorRef(l.o_b), n, d));
    MOERT_RETURN_IF_ERROR(b_.Add(x, t, n * d));
    MOERT_RETURN_IF_ERROR(b_.LayerNorm(x, n, d, TensorRef(l.ln2_w), TensorRef(l.ln2_b), hp.eps, h));
    MOERT_RETURN_IF_ERROR(b_.MatMul(*l.fc1, 0, h, n, ff));
    MOERT_RETURN_IF_ERROR(b_.AddBias(ff, TensorRef(l.fc1_b), n, f));
    MOERT_RETURN_IF_ERROR(b_.Gelu(ff, n * f, ff));
    MOERT_RETURN_IF_ERROR(b_.MatMul(*l.fc2, 0, ff, n, t));
    MOERT_RETURN_IF_ERROR(b_.AddBias(t, TensorRef(l.fc2_b), n, d));
    MOERT_RETURN_IF_ERROR(b_.Add(x, t, n * d));
  }
  if (w.post_ln_w != nullptr) {
    MOERT_RETURN_IF_ERROR(
        b_.LayerNorm(x, n, d, TensorRef(w.post_ln_w), TensorRef(w.post_ln_b), hp.eps, x));
  }

  // The resampler: the (precomputed) queries over the patches; keys carry the 2D sincos
  // positions, values do not.
  MOERT_ASSIGN_OR_RETURN(TensorRef v0, scratch_.Get(kV0, Bytes(n * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef kr, scratch_.Get(kKr, Bytes(n * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef kk, scratch_.Get(kKK, Bytes(n * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef vv, scratch_.Get(kVV, Bytes(n * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef o, scratch_.Get(kO, Bytes(nq * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef o2, scratch_.Get(kO2, Bytes(nq * rw)));
  MOERT_ASSIGN_OR_RETURN(TensorRef result, scratch_.Get(kOut, Bytes(nq * rw)));
  MOERT_RETURN_IF_ERROR(b_.MatMul(*w.kv, 0, x, n, v0));
  MOERT_RETURN_IF_ERROR(
      b_.LayerNorm(v0, n, rw, TensorRef(w.ln_kv_w), TensorRef(w.ln_kv_b), hp.eps, v0));
  const std::vector<float> sincos = SincosPositions(pw, ph, static_cast<int>(rw));
  MOERT_RETURN_IF_ERROR(b_.Write(kr, sincos.data(), Bytes(n * rw)));
  MOERT_RETURN_IF_ERROR(b_.Add(kr, v0, n * rw));
  const backend::MatMulArgs kv[2] = {{w.rk.get(), 0, kr, n, kk}, {w.rv.get(), 0, v0, n, vv}};
  MOERT_RETURN_IF_ERROR(b_.MatMuls(kv));
  MOERT_RETURN_IF_ERROR(b_.AddBias(kk, TensorRef(w.rk_b), n, rw));
  MOERT_RETURN_IF_ERROR(b_.AddBias(vv, TensorRef(w.rv_b), n, rw));
  backend::AttentionArgs cross;
  cross.n_head = cross.n_head_kv = static_cast<int>(rw / hp.resampler_head_dim);
  cross.head_dim_k = cross.head_dim_v = hp.resampler_head_dim;
  cross.scale = 1.0f / std::sqrt(static_cast<float>(hp.resampler_head_dim));
  MOERT_RETURN_IF_ERROR(b_.FullAttention(cross, TensorRef(w.queries), nq, kk, vv, n, o));
  if (entropy != nullptr) {
    // Per query and head, then the mean over heads.
    const int64_t heads = cross.n_head;
    MOERT_ASSIGN_OR_RETURN(TensorRef ent, scratch_.Get(kEntropy, Bytes(nq * heads)));
    MOERT_RETURN_IF_ERROR(b_.AttentionEntropy(cross, TensorRef(w.queries), nq, kk, n, ent));
    std::vector<float> per_head(static_cast<size_t>(nq * heads));
    MOERT_RETURN_IF_ERROR(b_.Read(ent, per_head.data(), Bytes(nq * heads)));
    entropy->assign(static_cast<size_t>(nq), 0.0f);
    for (int64_t qi = 0; qi < nq; ++qi) {
      double sum = 0;
      for (int64_t hd = 0; hd < heads; ++hd) sum += per_head[static_cast<size_t>(qi * heads + hd)];
      (*entropy)[static_cast<size_t>(qi)] = static_cast<float>(sum / static_cast<double>(heads));
    }
  }
  MOERT_RETURN_IF_ERROR(b_.MatMul(*w.ro, 0, o, nq, o2));
  MOERT_RETURN_IF_ERROR(b_.AddBias(o2, TensorRef(w.ro_b), nq, rw));
  MOERT_RETURN_IF_ERROR(
      b_.LayerNorm(o2, nq, rw, TensorRef(w.ln_post_w), TensorRef(w.ln_post_b), hp.eps, o2));
  MOERT_RETURN_IF_ERROR(b_.MatMul(*w.proj, 0, o2, nq, result));
  out->resize(static_cast<size_t>(nq * rw));
  MOERT_RETURN_IF_ERROR(b_.Read(result, out->data(), Bytes(nq * rw)));
  return b_.Finish();
}

}  // namespace moert::vision
