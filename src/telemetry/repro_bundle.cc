// The repro bundle container (see repro_bundle.h; the layout is docs/formats.md's).
#include "telemetry/repro_bundle.h"

#include <zstd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <utility>

#include "core/cache_dir.h"
#include "core/status.h"
#include "core/strings.h"

namespace moert::telemetry {

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'R', 'T', 'R', 'P', 'B'};
constexpr size_t kHeaderBytes = 32;
constexpr uint32_t kMaxSections = 64;
constexpr uint32_t kMaxNameBytes = 32;
constexpr int kZstdLevel = 3;

// Little-endian fields, byte by byte: the file reads the same on every host.
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutF32(std::string* out, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(out, v);
}

// Reads fields from a byte range, failing (never reading past it) once it runs out.
class Cursor {
 public:
  Cursor(std::string_view bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  absl::Status U32(uint32_t* v, std::string_view field) {
    MOERT_RETURN_IF_ERROR(Need(4, field));
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    pos_ += 4;
    return absl::OkStatus();
  }
  absl::Status U64(uint64_t* v, std::string_view field) {
    MOERT_RETURN_IF_ERROR(Need(8, field));
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    pos_ += 8;
    return absl::OkStatus();
  }
  absl::Status Bytes(uint64_t n, std::string_view field, std::string_view* out) {
    MOERT_RETURN_IF_ERROR(Need(n, field));
    *out = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return absl::OkStatus();
  }
  // `count` 4-byte values (int32 or float) into `out`.
  template <typename T>
  absl::Status Array(uint64_t count, std::string_view field, std::vector<T>* out) {
    static_assert(sizeof(T) == 4);
    if (count > remaining() / 4) return Short(count * 4, field);
    out->resize(static_cast<size_t>(count));
    for (auto& x : *out) {
      uint32_t v;
      MOERT_RETURN_IF_ERROR(U32(&v, field));
      std::memcpy(&x, &v, 4);
    }
    return absl::OkStatus();
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  bool done() const { return pos_ == bytes_.size(); }
  const std::string& what() const { return what_; }

 private:
  absl::Status Need(uint64_t n, std::string_view field) const {
    return n <= remaining() ? absl::OkStatus() : Short(n, field);
  }
  absl::Status Short(uint64_t n, std::string_view field) const {
    return absl::DataLossError(StrCat("repro bundle: ", what_, ": ", field, " needs ", n,
                                      " bytes at offset ", pos_, ", ", remaining(), " left"));
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  std::string what_;
};

struct Section {
  std::string name;
  std::string bytes;
};

std::string EncodeTokens(const std::vector<int32_t>& tokens) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) PutU32(&out, static_cast<uint32_t>(t));
  return out;
}

std::string EncodeRouterLogits(const ReproRouterLogits& r) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(r.layers.size()));
  PutU32(&out, static_cast<uint32_t>(r.width));
  for (int32_t l : r.layers) PutU32(&out, static_cast<uint32_t>(l));
  for (float f : r.logits) PutF32(&out, f);
  return out;
}

std::string EncodeKv(const ReproKv& kv) {
  std::string out;
  for (int32_t v : {kv.layers, kv.positions, kv.key_width, kv.value_width}) {
    PutU32(&out, static_cast<uint32_t>(v));
  }
  for (float f : kv.keys) PutF32(&out, f);
  for (float f : kv.values) PutF32(&out, f);
  return out;
}

std::string Meta(const ReproBundle& b, const std::vector<std::string>& dropped) {
  return StrCat("trigger=", b.trigger, "\ncreated_ns=", b.created_ns,
                "\ndropped=", StrJoin(dropped, ","), "\n");
}

absl::Status CheckShapes(const ReproBundle& b) {
  const ReproRouterLogits& r = b.router_logits;
  if (r.width < 0 || r.logits.size() != r.layers.size() * static_cast<size_t>(r.width)) {
    return absl::InvalidArgumentError(
        StrCat("repro bundle: router_logits has ", r.logits.size(), " values for ",
               r.layers.size(), " layers of ", r.width));
  }
  const ReproKv& kv = b.kv;
  if (kv.layers < 0 || kv.positions < 0 || kv.key_width < 0 || kv.value_width < 0) {
    return absl::InvalidArgumentError("repro bundle: kv has a negative dimension");
  }
  const size_t rows = static_cast<size_t>(kv.layers) * static_cast<size_t>(kv.positions);
  if (kv.keys.size() != rows * static_cast<size_t>(kv.key_width) ||
      kv.values.size() != rows * static_cast<size_t>(kv.value_width)) {
    return absl::InvalidArgumentError("repro bundle: kv's keys or values do not match its shape");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pack(const std::vector<Section>& sections) {
  std::string payload;
  for (const Section& s : sections) {
    PutU32(&payload, static_cast<uint32_t>(s.name.size()));
    payload += s.name;
    PutU64(&payload, s.bytes.size());
    payload += s.bytes;
  }
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, kReproBundleVersion);
  PutU32(&out, static_cast<uint32_t>(sections.size()));
  PutU64(&out, payload.size());
  const size_t bound = ZSTD_compressBound(payload.size());
  std::string frame(bound, '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  if (cctx == nullptr) return absl::ResourceExhaustedError("repro bundle: no zstd context");
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kZstdLevel);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), payload.data(), payload.size());
  ZSTD_freeCCtx(cctx);
  if (ZSTD_isError(n)) {
    return absl::InternalError(StrCat("repro bundle: zstd: ", ZSTD_getErrorName(n)));
  }
  frame.resize(n);
  PutU64(&out, frame.size());
  out += frame;
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeReproBundle(const ReproBundle& bundle, uint64_t max_bytes) {
  MOERT_RETURN_IF_ERROR(CheckShapes(bundle));
  std::vector<std::string> dropped = bundle.dropped;
  const bool has_kv = bundle.kv.layers > 0 && bundle.kv.positions > 0;
  const bool has_trace = !bundle.trace.empty();
  // Optional sections in the order they go when the cap is hit.
  std::vector<std::string> optional;
  if (has_kv) optional.push_back("kv");
  if (has_trace) optional.push_back("trace");
  for (size_t drop = 0;; ++drop) {
    std::vector<std::string> now_dropped = dropped;
    for (size_t i = 0; i < drop; ++i) now_dropped.push_back(optional[i]);
    const auto kept = [&](std::string_view name) {
      for (const std::string& d : now_dropped) {
        if (d == name) return false;
      }
      return true;
    };
    std::vector<Section> sections;
    sections.push_back({"meta", Meta(bundle, now_dropped)});
    if (!bundle.error.empty()) sections.push_back({"error", bundle.error});
    sections.push_back({"fingerprint", bundle.fingerprint});
    sections.push_back({"model", bundle.model});
    sections.push_back({"options", bundle.options});
    sections.push_back({"tokens", EncodeTokens(bundle.tokens)});
    if (!bundle.router_logits.layers.empty()) {
      sections.push_back({"router_logits", EncodeRouterLogits(bundle.router_logits)});
    }
    if (!bundle.pool.empty()) sections.push_back({"pool", bundle.pool});
    if (has_trace && kept("trace")) sections.push_back({"trace", bundle.trace});
    if (has_kv && kept("kv")) sections.push_back({"kv", EncodeKv(bundle.kv)});
    MOERT_ASSIGN_OR_RETURN(std::string bytes, Pack(sections));
    if (max_bytes == 0 || bytes.size() <= max_bytes) return bytes;
    if (drop == optional.size()) {
      return absl::ResourceExhaustedError(
          StrCat("repro bundle: ", bytes.size(), " bytes without its optional sections, over the cap of ",
                 max_bytes, " bytes"));
    }
  }
}

namespace {

absl::Status DecodeTokens(std::string_view bytes, std::vector<int32_t>* tokens) {
  Cursor c(bytes, "section tokens");
  uint32_t count;
  MOERT_RETURN_IF_ERROR(c.U32(&count, "count"));
  MOERT_RETURN_IF_ERROR(c.Array(count, "ids", tokens));
  if (!c.done()) return absl::InvalidArgumentError("repro bundle: section tokens: bytes after the ids");
  return absl::OkStatus();
}

absl::Status DecodeRouterLogits(std::string_view bytes, ReproRouterLogits* r) {
  Cursor c(bytes, "section router_logits");
  uint32_t rows, width;
  MOERT_RETURN_IF_ERROR(c.U32(&rows, "rows"));
  MOERT_RETURN_IF_ERROR(c.U32(&width, "width"));
  if (width > (1u << 16) || rows > (1u << 16)) {
    return absl::InvalidArgumentError(
        StrCat("repro bundle: section router_logits: ", rows, " rows of ", width, " is past the caps"));
  }
  r->width = static_cast<int32_t>(width);
  MOERT_RETURN_IF_ERROR(c.Array(rows, "layers", &r->layers));
  MOERT_RETURN_IF_ERROR(c.Array(uint64_t{rows} * width, "logits", &r->logits));
  if (!c.done()) {
    return absl::InvalidArgumentError("repro bundle: section router_logits: bytes after the logits");
  }
  return absl::OkStatus();
}

absl::Status DecodeKv(std::string_view bytes, ReproKv* kv) {
  Cursor c(bytes, "section kv");
  uint32_t dims[4];
  const char* names[4] = {"layers", "positions", "key_width", "value_width"};
  for (int i = 0; i < 4; ++i) {
    MOERT_RETURN_IF_ERROR(c.U32(&dims[i], names[i]));
    if (dims[i] > (1u << 24)) {
      return absl::InvalidArgumentError(
          StrCat("repro bundle: section kv: ", names[i], " ", dims[i], " is past the cap"));
    }
  }
  kv->layers = static_cast<int32_t>(dims[0]);
  kv->positions = static_cast<int32_t>(dims[1]);
  kv->key_width = static_cast<int32_t>(dims[2]);
  kv->value_width = static_cast<int32_t>(dims[3]);
  const uint64_t rows = uint64_t{dims[0]} * dims[1];
  // Checked against what is left before anything is allocated.
  if (rows * (uint64_t{dims[2]} + dims[3]) * 4 != c.remaining()) {
    return absl::InvalidArgumentError(
        StrCat("repro bundle: section kv: ", c.remaining(), " bytes of values for ", dims[0],
               " layers x ", dims[1], " positions x (", dims[2], " + ", dims[3], ") floats"));
  }
  MOERT_RETURN_IF_ERROR(c.Array(rows * dims[2], "keys", &kv->keys));
  return c.Array(rows * dims[3], "values", &kv->values);
}

absl::Status DecodeMeta(std::string_view meta, ReproBundle* b) {
  b->trigger = ReproValue(meta, "trigger");
  const std::string created = ReproValue(meta, "created_ns");
  b->created_ns = 0;
  for (char ch : created) {
    if (ch < '0' || ch > '9') {
      return absl::InvalidArgumentError(StrCat("repro bundle: meta: created_ns '", created, "'"));
    }
    b->created_ns = b->created_ns * 10 + static_cast<uint64_t>(ch - '0');
  }
  b->dropped.clear();
  const std::string dropped = ReproValue(meta, "dropped");
  size_t start = 0;
  while (start < dropped.size()) {
    size_t end = dropped.find(',', start);
    if (end == std::string::npos) end = dropped.size();
    if (end > start) b->dropped.push_back(dropped.substr(start, end - start));
    start = end + 1;
  }
  return absl::OkStatus();
}

// The crash variant (telemetry/crash_repro.h): uncompressed, written by a signal handler.
const char* SignalName(uint32_t signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "an unexpected signal";
  }
}

absl::StatusOr<ReproBundle> DecodeCrashBundle(std::string_view bytes) {
  Cursor in(bytes.substr(sizeof(kReproCrashMagic)), "crash bundle");
  uint32_t version, signal;
  MOERT_RETURN_IF_ERROR(in.U32(&version, "version"));
  if (version != kReproCrashVersion) {
    return absl::InvalidArgumentError(StrCat("crash bundle: version ", version,
                                             ", this moert reads version ", kReproCrashVersion));
  }
  MOERT_RETURN_IF_ERROR(in.U32(&signal, "signal"));
  ReproBundle b;
  b.trigger = "crash";
  MOERT_RETURN_IF_ERROR(in.U64(&b.created_ns, "time"));
  std::string_view text;
  for (auto [out, field] : {std::pair{&b.fingerprint, "fingerprint"}, std::pair{&b.model, "model"},
                            std::pair{&b.options, "options"}}) {
    uint32_t n;
    MOERT_RETURN_IF_ERROR(in.U32(&n, field));
    MOERT_RETURN_IF_ERROR(in.Bytes(n, field, &text));
    out->assign(text);
  }
  uint32_t total, kept;
  MOERT_RETURN_IF_ERROR(in.U32(&total, "token count"));
  MOERT_RETURN_IF_ERROR(in.U32(&kept, "kept token count"));
  if (kept > total) {
    return absl::DataLossError(
        StrCat("crash bundle: ", kept, " token ids kept of a context of ", total));
  }
  MOERT_RETURN_IF_ERROR(in.Array(kept, "token ids", &b.tokens));
  if (!in.done()) {
    return absl::DataLossError(StrCat("crash bundle: ", in.remaining(), " bytes past its end"));
  }
  b.error = StrCat("signal ", signal, " (", SignalName(signal), ")");
  if (kept < total) StrAppend(&b.error, "; the first ", kept, " of ", total, " token ids kept");
  return b;
}

}  // namespace

absl::StatusOr<ReproBundle> DecodeReproBundle(std::string_view bytes) {
  if (bytes.size() >= sizeof(kReproCrashMagic) &&
      std::memcmp(bytes.data(), kReproCrashMagic, sizeof(kReproCrashMagic)) == 0) {
    return DecodeCrashBundle(bytes);
  }
  if (bytes.size() < kHeaderBytes) {
    return absl::DataLossError(StrCat("repro bundle: ", bytes.size(),
                                      " bytes, shorter than its ", kHeaderBytes, "-byte header"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("repro bundle: bad magic (not a moert repro bundle)");
  }
  Cursor header(bytes.substr(sizeof(kMagic), kHeaderBytes - sizeof(kMagic)), "header");
  uint32_t version, count;
  uint64_t raw_bytes, frame_bytes;
  MOERT_RETURN_IF_ERROR(header.U32(&version, "version"));
  MOERT_RETURN_IF_ERROR(header.U32(&count, "section count"));
  MOERT_RETURN_IF_ERROR(header.U64(&raw_bytes, "uncompressed size"));
  MOERT_RETURN_IF_ERROR(header.U64(&frame_bytes, "compressed size"));
  if (version != kReproBundleVersion) {
    return absl::InvalidArgumentError(StrCat("repro bundle: version ", version,
                                             ", this moert reads version ", kReproBundleVersion));
  }
  if (count > kMaxSections) {
    return absl::InvalidArgumentError(
        StrCat("repro bundle: ", count, " sections, more than the cap of ", kMaxSections));
  }
  if (raw_bytes > kReproMaxUncompressedBytes) {
    return absl::InvalidArgumentError(StrCat("repro bundle: uncompressed size ", raw_bytes,
                                             " is past the cap of ", kReproMaxUncompressedBytes));
  }
  if (frame_bytes != bytes.size() - kHeaderBytes) {
    return absl::DataLossError(StrCat("repro bundle: the header says ", frame_bytes,
                                      " compressed bytes, the file has ",
                                      bytes.size() - kHeaderBytes, " (truncated?)"));
  }
  const std::string_view frame = bytes.substr(kHeaderBytes);
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
      content != raw_bytes) {
    return absl::DataLossError("repro bundle: the zstd frame is corrupt or its size is not the header's");
  }
  std::string payload(static_cast<size_t>(raw_bytes), '\0');
  const size_t n = ZSTD_decompress(payload.data(), payload.size(), frame.data(), frame.size());
  if (ZSTD_isError(n) || n != raw_bytes) {
    return absl::DataLossError(StrCat("repro bundle: zstd: ",
                                      ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short frame"));
  }
  ReproBundle b;
  b.version = version;
  Cursor c(payload, "payload");
  std::set<std::string, std::less<>> seen;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_bytes;
    MOERT_RETURN_IF_ERROR(c.U32(&name_bytes, "section name length"));
    if (name_bytes == 0 || name_bytes > kMaxNameBytes) {
      return absl::InvalidArgumentError(
          StrCat("repro bundle: section ", i, ": name of ", name_bytes, " bytes"));
    }
    std::string_view name, data;
    MOERT_RETURN_IF_ERROR(c.Bytes(name_bytes, "section name", &name));
    uint64_t size;
    MOERT_RETURN_IF_ERROR(c.U64(&size, "section size"));
    MOERT_RETURN_IF_ERROR(c.Bytes(size, StrCat("section ", name), &data));
    if (!seen.emplace(name).second) {
      return absl::InvalidArgumentError(StrCat("repro bundle: section ", name, " appears twice"));
    }
    if (name == "meta") {
      MOERT_RETURN_IF_ERROR(DecodeMeta(data, &b));
    } else if (name == "error") {
      b.error = std::string(data);
    } else if (name == "fingerprint") {
      b.fingerprint = std::string(data);
    } else if (name == "model") {
      b.model = std::string(data);
    } else if (name == "options") {
      b.options = std::string(data);
    } else if (name == "tokens") {
      MOERT_RETURN_IF_ERROR(DecodeTokens(data, &b.tokens));
    } else if (name == "router_logits") {
      MOERT_RETURN_IF_ERROR(DecodeRouterLogits(data, &b.router_logits));
    } else if (name == "kv") {
      MOERT_RETURN_IF_ERROR(DecodeKv(data, &b.kv));
    } else if (name == "pool") {
      b.pool = std::string(data);
    } else if (name == "trace") {
      b.trace = std::string(data);
    }
    // Sections a later version adds are skipped.
  }
  if (!c.done()) {
    return absl::InvalidArgumentError(
        StrCat("repro bundle: ", c.remaining(), " bytes after the last section"));
  }
  for (const char* required : {"meta", "tokens"}) {
    if (seen.find(std::string_view(required)) == seen.end()) {
      return absl::InvalidArgumentError(StrCat("repro bundle: no ", required, " section"));
    }
  }
  return b;
}

absl::StatusOr<std::vector<std::string>> WriteReproBundle(const std::string& path,
                                                          const ReproBundle& bundle,
                                                          uint64_t max_bytes) {
  MOERT_ASSIGN_OR_RETURN(const std::string bytes, EncodeReproBundle(bundle, max_bytes));
  const std::filesystem::path p(path);
  if (p.has_parent_path()) MOERT_RETURN_IF_ERROR(core::EnsureDirectory(p.parent_path().string()));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return absl::InternalError(StrCat("repro bundle: cannot write ", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(StrCat("repro bundle: cannot rename ", tmp, " to ", path));
  }
  MOERT_ASSIGN_OR_RETURN(ReproBundle written, DecodeReproBundle(bytes));
  return written.dropped;
}

absl::StatusOr<ReproBundle> ReadReproBundle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("repro bundle ", path, ": cannot open it"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > kReproMaxUncompressedBytes) {
    return absl::InvalidArgumentError(StrCat("repro bundle ", path, ": size ", size, " is past the cap"));
  }
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  if (!in) return absl::DataLossError(StrCat("repro bundle ", path, ": read failed"));
  absl::StatusOr<ReproBundle> b = DecodeReproBundle(bytes);
  if (!b.ok()) return absl::Status(b.status().code(), StrCat(path, ": ", b.status().message()));
  return b;
}

std::string ReproValue(std::string_view lines, std::string_view key) {
  size_t start = 0;
  while (start < lines.size()) {
    size_t end = lines.find('\n', start);
    if (end == std::string_view::npos) end = lines.size();
    const std::string_view line = lines.substr(start, end - start);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == '=') {
      return std::string(line.substr(key.size() + 1));
    }
    start = end + 1;
  }
  return "";
}

}  // namespace moert::telemetry
