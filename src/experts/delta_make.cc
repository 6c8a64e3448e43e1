// moert-delta make: diffing two model files into a delta package.
#include "experts/delta_make.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "core/status.h"
#include "core/strings.h"
#include "experts/checksum.h"
#include "experts/delta_codec.h"
#include "experts/expert_directory.h"

namespace moert::experts {
namespace {

constexpr std::array<std::string_view, kExpertParts> kPartSuffix = {
    ".ffn_gate_exps.weight", ".ffn_up_exps.weight", ".ffn_down_exps.weight"};

bool SameValue(const format::GgufValue& a, const format::GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case format::GgufValueType::kString: return a.str == b.str;
    case format::GgufValueType::kArray:
      return a.array_type == b.array_type && a.array_size == b.array_size &&
             std::equal(a.array_bytes.begin(), a.array_bytes.end(), b.array_bytes.begin(),
                        b.array_bytes.end());
    default: return a.u64 == b.u64 && a.i64 == b.i64 && a.f64 == b.f64;
  }
}

bool SameBytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// One routed expert's three parts: their offsets in the data section and byte counts.
struct ExpertSlices {
  std::array<uint64_t, kExpertParts> offset{};  // relative to the data section
  std::array<uint64_t, kExpertParts> bytes{};
};

}  // namespace

absl::StatusOr<std::vector<std::pair<int, int>>> ParseExpertList(std::string_view text) {
  std::vector<std::pair<int, int>> experts;
  std::istringstream items{std::string(text)};
  std::string item;
  while (std::getline(items, item, ',')) {
    int layer = -1, expert = -1;
    char colon = 0;
    std::istringstream fields(item);
    std::string rest;
    if (!(fields >> layer >> colon >> expert) || colon != ':' || (fields >> rest)) {
      return absl::InvalidArgumentError(StrCat("'", item, "' is not LAYER:EXPERT"));
    }
    experts.emplace_back(layer, expert);
  }
  if (experts.empty()) return absl::InvalidArgumentError("no experts listed (LAYER:EXPERT,...)");
  return experts;
}

bool ParseExpertTensorName(std::string_view name, int* layer, int* part) {
  if (name.substr(0, 4) != "blk.") return false;
  name.remove_prefix(4);
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), *layer);
  if (ec != std::errc() || end == name.data() || *layer < 0) return false;
  const std::string_view rest(end, static_cast<size_t>(name.data() + name.size() - end));
  for (int p = 0; p < kExpertParts; ++p) {
    if (rest == kPartSuffix[static_cast<size_t>(p)]) {
      *part = p;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::vector<uint8_t>> MakeDeltaPackage(const format::GgufFile& base,
                                                      const format::GgufFile& target,
                                                      const SecretKey& key,
                                                      DeltaMakeStats* stats) {
  DeltaMakeStats local;
  DeltaMakeStats& st = stats != nullptr ? *stats : local;
  st = {};
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        StrCat("cannot make a delta from '", base.name(), "' to '", target.name(), "': ", what));
  };
  const std::span<const uint8_t> old_bytes = base.bytes(), new_bytes = target.bytes();
  const std::span<const uint8_t> old_data = old_bytes.subspan(base.data_offset());
  const std::span<const uint8_t> new_data = new_bytes.subspan(target.data_offset());
  if (old_data.size() != new_data.size()) {
    return bad(StrCat("their data sections differ in size (", old_data.size(), " and ",
                      new_data.size(), " bytes)"));
  }
  if (base.tensors().size() != target.tensors().size()) {
    return bad(StrCat(base.tensors().size(), " tensors against ", target.tensors().size()));
  }
  // (layer, expert) -> slices; the data-section ranges of every routed expert.
  std::map<std::pair<int, int>, ExpertSlices> experts;
  std::vector<std::pair<uint64_t, uint64_t>> expert_spans;
  for (size_t i = 0; i < base.tensors().size(); ++i) {
    const format::GgufTensorInfo& a = base.tensors()[i];
    const format::GgufTensorInfo& b = target.tensors()[i];
    if (a.name != b.name || a.type != b.type || a.dims != b.dims || a.offset != b.offset) {
      return bad(StrCat("tensor ", i, " ('", a.name, "' and '", b.name,
                        "') differs in name, type, shape or place"));
    }
    int layer = 0, part = 0;
    if (ParseExpertTensorName(a.name, &layer, &part) && a.dims.size() >= 2 && a.dims.back() > 0 &&
        a.n_bytes % a.dims.back() == 0) {
      const uint64_t n_expert = a.dims.back();
      const uint64_t each = a.n_bytes / n_expert;
      for (uint64_t e = 0; e < n_expert; ++e) {
        ExpertSlices& s = experts[{layer, static_cast<int>(e)}];
        s.offset[static_cast<size_t>(part)] = a.offset + e * each;
        s.bytes[static_cast<size_t>(part)] = each;
      }
      expert_spans.emplace_back(a.offset, a.n_bytes);
      continue;
    }
    if (!SameBytes(base.TensorData(a), target.TensorData(b))) {
      return bad(StrCat("tensor '", a.name,
                        "' differs; a delta package carries routed experts and metadata only"));
    }
  }
  // Bytes between tensors (alignment padding) must agree too: apply copies them.
  std::sort(expert_spans.begin(), expert_spans.end());
  {
    uint64_t at = 0;
    expert_spans.emplace_back(old_data.size(), 0);
    for (const auto& [offset, n] : expert_spans) {
      if (offset > at && !SameBytes(old_data.subspan(at, offset - at),
                                    new_data.subspan(at, offset - at))) {
        return bad(StrCat("the data sections differ outside the routed experts, in [",
                          at, ", ", offset, ")"));
      }
      at = std::max(at, offset + n);
    }
  }

  DeltaManifest m;
  m.base_size = old_bytes.size();
  m.base_hash = HashBytes(old_bytes);
  m.target_size = new_bytes.size();
  m.target_hash = HashBytes(new_bytes);
  m.base_data_offset = base.data_offset();
  m.target_data_offset = target.data_offset();
  std::vector<uint8_t> payload;
  const auto add_frame = [&](DeltaEntry& e, std::span<const uint8_t> from,
                             std::span<const uint8_t> to) -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(const std::vector<uint8_t> frame, EncodePatch(from, to));
    e.payload_offset = payload.size();
    e.payload_bytes = frame.size();
    payload.insert(payload.end(), frame.begin(), frame.end());
    return absl::OkStatus();
  };

  // The header: always an entry (a few bytes when unchanged), so apply writes it.
  DeltaEntry header;
  header.kind = DeltaKind::kHeader;
  const auto old_header = old_bytes.subspan(0, base.data_offset());
  const auto new_header = new_bytes.subspan(0, target.data_offset());
  header.old_checksum = XxHash64(old_header);
  header.new_checksum = XxHash64(new_header);
  header.ranges[0] = {0, old_header.size(), 0, new_header.size()};
  MOERT_RETURN_IF_ERROR(add_frame(header, old_header, new_header));
  st.header_frame_bytes = header.payload_bytes;
  st.header_changed = !SameBytes(old_header, new_header);
  for (const format::GgufKeyValue& kv : target.metadata()) {
    const format::GgufKeyValue* was = base.FindKey(kv.key);
    if (was == nullptr || !SameValue(was->value, kv.value)) st.changed_keys.emplace_back(kv.key);
  }
  for (const format::GgufKeyValue& kv : base.metadata()) {
    if (target.FindKey(kv.key) == nullptr) st.changed_keys.emplace_back(kv.key);
  }
  m.entries.push_back(header);

  // The target's stored expert checksums, when it has them, must be its bytes'.
  std::vector<uint64_t> stored;
  int n_expert = 0;
  for (const auto& [id, s] : experts) n_expert = std::max(n_expert, id.second + 1);
  if (const format::GgufKeyValue* kv = target.FindKey(kChecksumKey)) {
    if (kv->value.type != format::GgufValueType::kArray ||
        kv->value.array_type != format::GgufValueType::kUint64 ||
        kv->value.array_bytes.size() != kv->value.array_size * 8) {
      return bad(StrCat("the target's '", kChecksumKey, "' is not an array of uint64"));
    }
    for (uint64_t i = 0; i < kv->value.array_size; ++i) {
      uint64_t v = 0;
      for (int b = 7; b >= 0; --b) v = (v << 8) | kv->value.array_bytes[i * 8 + uint64_t(b)];
      stored.push_back(v);
    }
  }

  std::vector<uint8_t> old_expert, new_expert;
  for (const auto& [id, s] : experts) {
    if (s.bytes[0] == 0 || s.bytes[1] == 0 || s.bytes[2] == 0) {
      return bad(StrCat("layer ", id.first, " lacks one of its stacked expert tensors"));
    }
    std::array<std::span<const uint8_t>, kExpertParts> was, now;
    DeltaEntry e;
    e.kind = DeltaKind::kExpert;
    e.layer = id.first;
    e.expert = id.second;
    old_expert.clear();
    new_expert.clear();
    for (size_t p = 0; p < kExpertParts; ++p) {
      was[p] = old_data.subspan(s.offset[p], s.bytes[p]);
      now[p] = new_data.subspan(s.offset[p], s.bytes[p]);
      old_expert.insert(old_expert.end(), was[p].begin(), was[p].end());
      new_expert.insert(new_expert.end(), now[p].begin(), now[p].end());
      e.ranges[p] = {base.data_offset() + s.offset[p], s.bytes[p],
                     target.data_offset() + s.offset[p], s.bytes[p]};
    }
    st.all_expert_bytes += new_expert.size();
    if (SameBytes(old_expert, new_expert)) continue;
    e.old_checksum = ExpertChecksum(was[0], was[1], was[2]);
    e.new_checksum = ExpertChecksum(now[0], now[1], now[2]);
    const size_t index = static_cast<size_t>(id.first) * static_cast<size_t>(n_expert) +
                         static_cast<size_t>(id.second);
    if (!stored.empty() && (index >= stored.size() || stored[index] != e.new_checksum)) {
      return bad(StrCat("the target's ", kChecksumKey, " entry of layer ", id.first, ", expert ",
                        id.second, " is not the checksum of its bytes"));
    }
    MOERT_RETURN_IF_ERROR(add_frame(e, old_expert, new_expert));
    st.changed.push_back(id);
    st.changed_expert_bytes += new_expert.size();
    st.expert_frame_bytes += e.payload_bytes;
    m.entries.push_back(e);
  }
  std::vector<uint8_t> package = SerializeDeltaPackage(m, payload, key);
  st.package_bytes = package.size();
  return package;
}

absl::StatusOr<std::vector<uint8_t>> PerturbExperts(const format::GgufFile& file,
                                                    const std::vector<std::pair<int, int>>& experts,
                                                    double fraction, uint64_t seed, int steps) {
  if (steps < 1 || steps > 100) {
    return absl::InvalidArgumentError(StrCat("perturb: steps ", steps, " is not in 1 .. 100"));
  }
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(StrCat("perturb: fraction ", fraction, " is not in (0, 1]"));
  }
  std::vector<uint8_t> out(file.bytes().begin(), file.bytes().end());
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> pick(0.0, 1.0);
  const auto hit = [&] { return pick(rng) < fraction; };
  const auto step = [&]() -> int { return (rng() & 1) != 0 ? steps : -steps; };
  for (const auto& [layer, expert] : experts) {
    for (size_t part = 0; part < kExpertParts; ++part) {
      const std::string name = StrCat("blk.", layer, kPartSuffix[part]);
      const format::GgufTensorInfo* t = file.FindTensor(name);
      if (t == nullptr || t->dims.empty() || expert < 0 ||
          static_cast<uint64_t>(expert) >= t->dims.back()) {
        return absl::InvalidArgumentError(
            StrCat("perturb: no expert ", expert, " in tensor '", name, "'"));
      }
      const uint64_t each = t->n_bytes / t->dims.back();
      uint8_t* p = out.data() + t->file_offset + static_cast<uint64_t>(expert) * each;
      switch (t->type) {
        case format::GgmlType::kQ8_0:  // blocks of a half scale and 32 int8
          for (uint64_t b = 0; b + 34 <= each; b += 34) {
            for (uint64_t i = 2; i < 34; ++i) {
              if (!hit()) continue;
              const int q = static_cast<int8_t>(p[b + i]) + step();
              p[b + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127, 127)));
            }
          }
          break;
        case format::GgmlType::kQ4_0:  // blocks of a half scale and 32 nibbles
          for (uint64_t b = 0; b + 18 <= each; b += 18) {
            for (uint64_t i = 2; i < 18; ++i) {
              for (int shift = 0; shift <= 4; shift += 4) {
                if (!hit()) continue;
                const int q = std::clamp(((p[b + i] >> shift) & 15) + step(), 0, 15);
                p[b + i] = static_cast<uint8_t>((p[b + i] & ~(15 << shift)) | (q << shift));
              }
            }
          }
          break;
        case format::GgmlType::kF16:
          for (uint64_t i = 0; i + 2 <= each; i += 2) {
            if (hit() && (p[i + 1] & 0x7C) != 0x7C) p[i] ^= 1;  // not inf / NaN
          }
          break;
        case format::GgmlType::kF32:
          for (uint64_t i = 0; i + 4 <= each; i += 4) {
            if (!hit()) continue;
            float v;
            std::memcpy(&v, p + i, 4);
            v *= 1.0f + 0.01f * static_cast<float>(steps);
            std::memcpy(p + i, &v, 4);
          }
          break;
        default:
          return absl::UnimplementedError(StrCat("perturb: tensor '", name, "' has type ",
                                                 format::GgmlTypeName(t->type)));
      }
    }
  }
  return out;
}

}  // namespace moert::experts
