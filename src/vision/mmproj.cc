// Loading a MiniCPM-V mmproj (see mmproj.h).
#include "vision/mmproj.h"

#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "format/dequant.h"

namespace moert::vision {
namespace {

// Caps far above any real projector, low enough to refuse a corrupt header early.
constexpr int64_t kMaxWidth = 1 << 16;
constexpr int64_t kMaxLayers = 256;
// clip.cpp buckets positions onto a 70x70 grid.
constexpr int64_t kPositions = 70 * 70;

class Reader {
 public:
  explicit Reader(const format::GgufFile& file) : file_(file) {}

  absl::StatusOr<int64_t> Int(std::string_view key, int64_t lo, int64_t hi) const {
    const format::GgufKeyValue* kv = file_.FindKey(key);
    if (kv == nullptr) return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj key '", key, "' is missing"));
    absl::StatusOr<int64_t> v = file_.GetInt(key);
    if (!v.ok()) {
      absl::StatusOr<uint64_t> u = file_.GetUint(key);
      if (!u.ok()) return Bad(key, "is not an integer");
      v = static_cast<int64_t>(*u);
    }
    if (*v < lo || *v > hi) return Bad(key, StrCat("is ", *v, ", outside [", lo, ", ", hi, "]"));
    return *v;
  }
  absl::StatusOr<bool> Bool(std::string_view key, std::optional<bool> fallback = std::nullopt) const {
    if (file_.FindKey(key) == nullptr) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj key '", key, "' is missing"));
    }
    absl::StatusOr<bool> v = file_.GetBool(key);
    if (!v.ok()) return Bad(key, "is not a bool");
    return *v;
  }
  absl::StatusOr<std::array<float, 3>> Float3(std::string_view key) const {
    if (file_.FindKey(key) == nullptr) {
      return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj key '", key, "' is missing"));
    }
    absl::StatusOr<std::vector<float>> v = file_.GetFloatArray(key);
    if (!v.ok() || v->size() != 3) return Bad(key, "is not 3 floats");
    return std::array<float, 3>{(*v)[0], (*v)[1], (*v)[2]};
  }

  // Tensor `name` as `rows` x `cols` (ggml ne [cols, rows], or any shape of that many
  // values when `any_shape`); absent: InvalidArgument, or an empty matrix when optional.
  absl::Status Matrix(const std::string& name, int64_t rows, int64_t cols, backend::Matrix* out,
                      bool optional = false, bool any_shape = false) const {
    const format::GgufTensorInfo* t = file_.FindTensor(name);
    if (t == nullptr) {
      if (optional) return absl::OkStatus();
      return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj tensor '", name, "' is missing"));
    }
    const bool shape_ok =
        any_shape ? t->n_elements == static_cast<uint64_t>(rows * cols)
                  : (t->dims.size() == 2 && t->dims[0] == static_cast<uint64_t>(cols) &&
                     t->dims[1] == static_cast<uint64_t>(rows)) ||
                        (rows == 1 && t->dims.size() == 1 && t->dims[0] == static_cast<uint64_t>(cols));
    if (!shape_ok) {
      std::string dims;
      for (uint64_t d : t->dims) StrAppend(&dims, dims.empty() ? "" : ", ", d);
      return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj tensor '", name, "' has ne [",
                                               dims, "], expected [", cols, ", ", rows, "]"));
    }
    if (!format::CanDequantize(t->type)) {
      return absl::UnimplementedError(StrCat(file_.name(), ": mmproj tensor '", name, "' has type ",
                                             format::GgmlTypeName(t->type), ", which moert cannot read"));
    }
    out->rows = rows;
    out->cols = cols;
    out->data.assign(static_cast<size_t>(rows * cols), 0.0f);
    absl::Status s = format::Dequantize(t->type, file_.TensorData(*t), out->data);
    if (!s.ok()) {
      return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj tensor '", name, "': ", s.message()));
    }
    return absl::OkStatus();
  }
  absl::Status Vector(const std::string& name, int64_t n, std::vector<float>* out,
                      bool optional = false) const {
    backend::Matrix m;
    MOERT_RETURN_IF_ERROR(Matrix(name, 1, n, &m, optional));
    *out = std::move(m.data);
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(std::string_view key, std::string_view what) const {
    return absl::InvalidArgumentError(StrCat(file_.name(), ": mmproj key '", key, "' ", what));
  }
  const format::GgufFile& file_;
};

}  // namespace

absl::StatusOr<Mmproj> LoadMmproj(const format::GgufFile& file) {
  const Reader r(file);
  absl::StatusOr<std::string_view> arch = file.GetString("general.architecture");
  if (!arch.ok() || *arch != "clip") {
    return absl::InvalidArgumentError(StrCat(file.name(), ": not an mmproj (general.architecture is '",
                                             arch.ok() ? *arch : std::string_view("?"),
                                             "', expected 'clip')"));
  }
  MOERT_ASSIGN_OR_RETURN(bool has_text, r.Bool("clip.has_text_encoder", false));
  MOERT_ASSIGN_OR_RETURN(bool has_vision, r.Bool("clip.has_vision_encoder"));
  if (has_text || !has_vision) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": the mmproj must have a vision encoder and no text encoder"));
  }
  absl::StatusOr<std::string_view> projector = file.GetString("clip.projector_type");
  if (!projector.ok()) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj key 'clip.projector_type' is missing "
                                             "(MiniCPM-V's is \"resampler\")"));
  }
  if (*projector != "resampler") {
    return absl::UnimplementedError(StrCat(file.name(), ": projector type '", *projector,
                                           "' is not supported (moert runs MiniCPM-V's \"resampler\")"));
  }
  MOERT_ASSIGN_OR_RETURN(bool minicpmv, r.Bool("clip.has_minicpmv_projector", false));
  if (!minicpmv) {
    return absl::UnimplementedError(StrCat(file.name(), ": clip.has_minicpmv_projector is not set: "
                                           "only MiniCPM-V projectors are supported"));
  }
  Mmproj m;
  MmprojHparams& h = m.hparams;
  MOERT_ASSIGN_OR_RETURN(int64_t version, r.Int("clip.minicpmv_version", 0, 1 << 20));
  if (version < 2 || version > 4) {
    return absl::UnimplementedError(StrCat(file.name(), ": clip.minicpmv_version ", version,
                                           " is not supported (2: MiniCPM-V 2.5, 3: 2.6, 4: o 2.6)"));
  }
  h.minicpmv_version = static_cast<int>(version);
  h.resampler_width = version == 2 ? 4096 : 3584;
  h.n_query = version == 2 ? 96 : 64;
  if (file.FindKey("clip.minicpmv_query_num") != nullptr) {
    MOERT_ASSIGN_OR_RETURN(int64_t q, r.Int("clip.minicpmv_query_num", 1, 4096));
    h.n_query = static_cast<int>(q);
  }
  MOERT_ASSIGN_OR_RETURN(int64_t image_size, r.Int("clip.vision.image_size", 1, kMaxWidth));
  MOERT_ASSIGN_OR_RETURN(int64_t patch, r.Int("clip.vision.patch_size", 1, 1024));
  if (patch != 14) {
    return absl::UnimplementedError(StrCat(file.name(), ": clip.vision.patch_size is ", patch,
                                           "; MiniCPM-V's slicing is built for 14"));
  }
  MOERT_ASSIGN_OR_RETURN(int64_t n_embd, r.Int("clip.vision.embedding_length", 1, kMaxWidth));
  MOERT_ASSIGN_OR_RETURN(int64_t n_ff, r.Int("clip.vision.feed_forward_length", 1, kMaxWidth));
  MOERT_ASSIGN_OR_RETURN(int64_t n_layer, r.Int("clip.vision.block_count", 1, kMaxLayers));
  MOERT_ASSIGN_OR_RETURN(int64_t n_head, r.Int("clip.vision.attention.head_count", 1, kMaxWidth));
  MOERT_ASSIGN_OR_RETURN(int64_t proj_dim, r.Int("clip.vision.projection_dim", 0, kMaxWidth));
  if (n_embd % n_head != 0) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": clip.vision.embedding_length ", n_embd,
                                             " is not a multiple of the ", n_head, " heads"));
  }
  h.image_size = static_cast<int>(image_size);
  h.patch_size = static_cast<int>(patch);
  h.n_embd = static_cast<int>(n_embd);
  h.n_ff = static_cast<int>(n_ff);
  h.n_layer = static_cast<int>(n_layer);
  h.n_head = static_cast<int>(n_head);
  h.projection_dim = static_cast<int>(proj_dim);
  if (file.FindKey("clip.vision.attention.layer_norm_epsilon") != nullptr) {
    absl::StatusOr<double> eps = file.GetFloat("clip.vision.attention.layer_norm_epsilon");
    if (!eps.ok() || !(*eps > 0 && *eps < 1)) {
      return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj key "
                                               "'clip.vision.attention.layer_norm_epsilon' is not in (0, 1)"));
    }
    h.eps = static_cast<float>(*eps);
  }
  MOERT_ASSIGN_OR_RETURN(h.image_mean, r.Float3("clip.vision.image_mean"));
  MOERT_ASSIGN_OR_RETURN(h.image_std, r.Float3("clip.vision.image_std"));
  for (float s : h.image_std) {
    if (!(s > 0)) return absl::InvalidArgumentError(StrCat(file.name(), ": clip.vision.image_std has ", s));
  }
  MOERT_ASSIGN_OR_RETURN(h.use_gelu, r.Bool("clip.use_gelu"));
  MOERT_ASSIGN_OR_RETURN(h.use_silu, r.Bool("clip.use_silu", false));
  if (!h.use_gelu || h.use_silu) {
    return absl::UnimplementedError(StrCat(file.name(), ": only GELU vision FFNs are supported"));
  }
  if (file.FindTensor("v.pre_ln.weight") != nullptr || file.FindTensor("v.class_embd") != nullptr) {
    return absl::UnimplementedError(StrCat(file.name(), ": v.pre_ln / v.class_embd are not MiniCPM-V's "
                                           "(SigLIP has neither)"));
  }

  const int64_t d = n_embd, f = n_ff, rw = h.resampler_width;
  const int64_t kernel = 3 * patch * patch;
  MOERT_RETURN_IF_ERROR(r.Matrix("v.patch_embd.weight", d, kernel, &m.patch_embd, false, true));
  {
    const format::GgufTensorInfo* t = file.FindTensor("v.patch_embd.weight");
    if (t->dims.size() != 4 || t->dims[0] != static_cast<uint64_t>(patch) ||
        t->dims[1] != static_cast<uint64_t>(patch) || t->dims[2] != 3 ||
        t->dims[3] != static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj tensor 'v.patch_embd.weight' is not [",
                                               patch, ", ", patch, ", 3, ", d, "]"));
    }
  }
  MOERT_RETURN_IF_ERROR(r.Vector("v.patch_embd.bias", d, &m.patch_b, /*optional=*/true));
  {
    const format::GgufTensorInfo* t = file.FindTensor("v.position_embd.weight");
    if (t == nullptr) {
      return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj tensor 'v.position_embd.weight' is missing"));
    }
    if (t->dims.size() != 2 || t->dims[0] != static_cast<uint64_t>(d) || t->dims[1] < kPositions ||
        t->dims[1] > (uint64_t{1} << 20)) {
      return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj tensor 'v.position_embd.weight' must be [",
                                               d, ", >= ", kPositions, "] (70x70 bucketed positions)"));
    }
    MOERT_RETURN_IF_ERROR(r.Matrix("v.position_embd.weight", static_cast<int64_t>(t->dims[1]), d,
                                   &m.position_embd));
  }
  m.layers.resize(static_cast<size_t>(n_layer));
  for (int64_t il = 0; il < n_layer; ++il) {
    VisionLayer& l = m.layers[static_cast<size_t>(il)];
    const std::string blk = StrCat("v.blk.", il, ".");
    struct Proj {
      const char* name;
      backend::Matrix* w;
      std::vector<float>* b;
    };
    for (const Proj& p : {Proj{"attn_q", &l.q, &l.q_b}, Proj{"attn_k", &l.k, &l.k_b},
                          Proj{"attn_v", &l.v, &l.v_b}, Proj{"attn_out", &l.o, &l.o_b}}) {
      MOERT_RETURN_IF_ERROR(r.Matrix(blk + p.name + ".weight", d, d, p.w));
      MOERT_RETURN_IF_ERROR(r.Vector(blk + p.name + ".bias", d, p.b));
    }
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ln1.weight", d, &l.ln1_w));
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ln1.bias", d, &l.ln1_b));
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ln2.weight", d, &l.ln2_w));
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ln2.bias", d, &l.ln2_b));
    MOERT_RETURN_IF_ERROR(r.Matrix(blk + "ffn_down.weight", f, d, &l.fc1));
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ffn_down.bias", f, &l.fc1_b));
    MOERT_RETURN_IF_ERROR(r.Matrix(blk + "ffn_up.weight", d, f, &l.fc2));
    MOERT_RETURN_IF_ERROR(r.Vector(blk + "ffn_up.bias", d, &l.fc2_b));
  }
  MOERT_RETURN_IF_ERROR(r.Vector("v.post_ln.weight", d, &m.post_ln_w, true));
  MOERT_RETURN_IF_ERROR(r.Vector("v.post_ln.bias", d, &m.post_ln_b, true));
  if (m.post_ln_w.empty() != m.post_ln_b.empty()) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": v.post_ln needs both its weight and its bias"));
  }

  Resampler& s = m.resampler;
  MOERT_RETURN_IF_ERROR(r.Matrix("resampler.query", h.n_query, rw, &s.query));
  MOERT_RETURN_IF_ERROR(r.Matrix("resampler.kv.weight", rw, d, &s.kv));
  struct Attn {
    const char* name;
    backend::Matrix* w;
    std::vector<float>* b;
  };
  for (const Attn& a : {Attn{"q", &s.q, &s.q_b}, Attn{"k", &s.k, &s.k_b}, Attn{"v", &s.v, &s.v_b},
                        Attn{"out", &s.o, &s.o_b}}) {
    MOERT_RETURN_IF_ERROR(r.Matrix(StrCat("resampler.attn.", a.name, ".weight"), rw, rw, a.w));
    MOERT_RETURN_IF_ERROR(r.Vector(StrCat("resampler.attn.", a.name, ".bias"), rw, a.b));
  }
  for (const auto& [name, w, b] :
       {std::tuple{"ln_q", &s.ln_q_w, &s.ln_q_b}, std::tuple{"ln_kv", &s.ln_kv_w, &s.ln_kv_b},
        std::tuple{"ln_post", &s.ln_post_w, &s.ln_post_b}}) {
    MOERT_RETURN_IF_ERROR(r.Vector(StrCat("resampler.", name, ".weight"), rw, w));
    MOERT_RETURN_IF_ERROR(r.Vector(StrCat("resampler.", name, ".bias"), rw, b));
  }
  MOERT_RETURN_IF_ERROR(r.Matrix("resampler.proj.weight", rw, rw, &s.proj));
  // Required by llama.cpp's loader, never read by its graph (the resampler computes its
  // own 2D sincos positions): checked, not kept.
  if (file.FindTensor("resampler.pos_embed_k") == nullptr) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": mmproj tensor 'resampler.pos_embed_k' is missing"));
  }
  if (rw % h.resampler_head_dim != 0 || rw % 4 != 0) {
    return absl::InternalError("resampler width is not a multiple of its head size");
  }
  return m;
}

}  // namespace moert::vision
