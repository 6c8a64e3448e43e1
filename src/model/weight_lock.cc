// mlock of the dense weights, and the list of their byte ranges.
#include "model/weight_lock.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "core/strings.h"

namespace moert::model {
namespace {

using Ranges = std::vector<std::pair<const void*, size_t>>;

void AddVector(const std::vector<float>& v, Ranges* out) {
  if (!v.empty()) out->emplace_back(v.data(), v.size() * sizeof(float));
}

void AddMatrix(const backend::Matrix& m, Ranges* out) {
  AddVector(m.data, out);
  if (!m.packed.empty()) out->emplace_back(m.packed.group(0).data, m.packed.size_bytes());
}

void AddFfn(const backend::FfnWeights& f, Ranges* out) {
  AddMatrix(f.gate, out);
  AddMatrix(f.up, out);
  AddMatrix(f.down, out);
}

}  // namespace

Ranges DenseWeightRanges(const ModelWeights& w) {
  Ranges out;
  if (w.token_embd != nullptr) {
    AddMatrix(w.token_embd->dense(), &out);
    const std::span<const uint8_t> table = w.token_embd->quantized_bytes();
    if (!table.empty()) out.emplace_back(table.data(), table.size());
  }
  if (w.output_norm != nullptr) AddVector(*w.output_norm, &out);
  if (w.output != nullptr) AddMatrix(*w.output, &out);
  if (w.rope_freqs != nullptr) AddVector(*w.rope_freqs, &out);
  if (w.layers == nullptr) return out;
  for (const LayerWeights& l : *w.layers) {
    AddVector(l.attn_norm, &out);
    for (const backend::Matrix* m : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo}) {
      AddMatrix(*m, &out);
    }
    for (const std::vector<float>* v :
         {&l.attn.bq, &l.attn.bk, &l.attn.bv, &l.attn.q_norm, &l.attn.k_norm}) {
      AddVector(*v, &out);
    }
    AddVector(l.ffn_norm, &out);
    AddFfn(l.ffn, &out);
    AddMatrix(l.moe.router, &out);
    AddMatrix(l.moe.gate_exps, &out);
    AddMatrix(l.moe.up_exps, &out);
    AddMatrix(l.moe.down_exps, &out);
    AddFfn(l.moe.shared, &out);
    AddFfn(l.dense_fallback, &out);
    AddMatrix(l.moe.shared_gate, &out);
  }
  return out;
}

WeightLock::~WeightLock() { UnlockAll(); }

void WeightLock::Lock(Ranges ranges) {
  UnlockAll();
  error_.clear();
  for (const auto& [p, n] : ranges) {
    if (::mlock(p, n) != 0) {
      const int err = errno;
      struct rlimit limit {};
      std::string cap;
      if (::getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        cap = StrCat(" (RLIMIT_MEMLOCK ", static_cast<uint64_t>(limit.rlim_cur), " bytes)");
      }
      error_ = StrCat("mlock of ", static_cast<uint64_t>(n), " bytes failed after ",
                      locked_bytes_, " locked: ", std::strerror(err), cap,
                      "; the weights stay unlocked");
      UnlockAll();
      return;
    }
    locked_.emplace_back(p, n);
    locked_bytes_ += n;
  }
}

void WeightLock::UnlockAll() {
  for (const auto& [p, n] : locked_) ::munlock(p, n);
  locked_.clear();
  locked_bytes_ = 0;
}

}  // namespace moert::model
