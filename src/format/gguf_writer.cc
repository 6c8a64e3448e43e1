// Writes GGUF files in the layout of llama.cpp's gguf writer (and gguf-py's): header,
// metadata, tensor infos, zero padding to the data section, then each tensor's data
// zero-padded to the alignment. Tensor offsets are the running sum of padded sizes.
#include "format/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/status.h"
#include "core/strings.h"

namespace moert::format {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr size_t kMaxDims = 4;  // GGML_MAX_DIMS

template <typename T>
void PutLe(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void PutString(std::vector<uint8_t>& out, std::string_view s) {
  PutLe<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void PutArrayHeader(std::vector<uint8_t>& out, GgufValueType type, uint64_t count) {
  PutLe(out, static_cast<uint32_t>(type));
  PutLe<uint64_t>(out, count);
}

uint64_t PadTo(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

absl::Status FileError(std::string_view what, const std::string& path, int err) {
  std::string msg = moert::StrCat("cannot ", what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

std::vector<uint8_t> Encoded(uint64_t v, size_t bytes) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  return out;
}

}  // namespace

void GgufWriter::SetRaw(std::string_view key, GgufValueType type, std::vector<uint8_t> payload) {
  // Like llama.cpp's gguf_set_*: setting a key again removes it and appends it anew.
  std::erase_if(entries_, [&](const Entry& e) { return e.key == key; });
  entries_.push_back(Entry{std::string(key), type, std::move(payload)});
}

void GgufWriter::SetUint8(std::string_view key, uint8_t v) {
  SetRaw(key, GgufValueType::kUint8, Encoded(v, 1));
}
void GgufWriter::SetInt8(std::string_view key, int8_t v) {
  SetRaw(key, GgufValueType::kInt8, Encoded(static_cast<uint8_t>(v), 1));
}
void GgufWriter::SetUint16(std::string_view key, uint16_t v) {
  SetRaw(key, GgufValueType::kUint16, Encoded(v, 2));
}
void GgufWriter::SetInt16(std::string_view key, int16_t v) {
  SetRaw(key, GgufValueType::kInt16, Encoded(static_cast<uint16_t>(v), 2));
}
void GgufWriter::SetUint32(std::string_view key, uint32_t v) {
  SetRaw(key, GgufValueType::kUint32, Encoded(v, 4));
  if (key == kAlignmentKey && std::has_single_bit(v)) alignment_ = v;
}
void GgufWriter::SetInt32(std::string_view key, int32_t v) {
  SetRaw(key, GgufValueType::kInt32, Encoded(static_cast<uint32_t>(v), 4));
}
void GgufWriter::SetUint64(std::string_view key, uint64_t v) {
  SetRaw(key, GgufValueType::kUint64, Encoded(v, 8));
}
void GgufWriter::SetInt64(std::string_view key, int64_t v) {
  SetRaw(key, GgufValueType::kInt64, Encoded(static_cast<uint64_t>(v), 8));
}
void GgufWriter::SetFloat32(std::string_view key, float v) {
  SetRaw(key, GgufValueType::kFloat32, Encoded(std::bit_cast<uint32_t>(v), 4));
}
void GgufWriter::SetFloat64(std::string_view key, double v) {
  SetRaw(key, GgufValueType::kFloat64, Encoded(std::bit_cast<uint64_t>(v), 8));
}
void GgufWriter::SetBool(std::string_view key, bool v) {
  SetRaw(key, GgufValueType::kBool, Encoded(v ? 1 : 0, 1));
}

void GgufWriter::SetString(std::string_view key, std::string_view v) {
  std::vector<uint8_t> payload;
  PutString(payload, v);
  SetRaw(key, GgufValueType::kString, std::move(payload));
}

void GgufWriter::SetStringArray(std::string_view key, const std::vector<std::string>& v) {
  std::vector<uint8_t> payload;
  PutArrayHeader(payload, GgufValueType::kString, v.size());
  for (const std::string& s : v) PutString(payload, s);
  SetRaw(key, GgufValueType::kArray, std::move(payload));
}

void GgufWriter::SetFloat32Array(std::string_view key, const std::vector<float>& v) {
  std::vector<uint8_t> payload;
  PutArrayHeader(payload, GgufValueType::kFloat32, v.size());
  for (float f : v) PutLe(payload, std::bit_cast<uint32_t>(f));
  SetRaw(key, GgufValueType::kArray, std::move(payload));
}

void GgufWriter::SetInt32Array(std::string_view key, const std::vector<int32_t>& v) {
  std::vector<uint8_t> payload;
  PutArrayHeader(payload, GgufValueType::kInt32, v.size());
  for (int32_t i : v) PutLe(payload, static_cast<uint32_t>(i));
  SetRaw(key, GgufValueType::kArray, std::move(payload));
}

void GgufWriter::SetArray(std::string_view key, GgufValueType element_type, uint64_t count,
                          std::span<const uint8_t> element_bytes) {
  std::vector<uint8_t> payload;
  PutArrayHeader(payload, element_type, count);
  payload.insert(payload.end(), element_bytes.begin(), element_bytes.end());
  SetRaw(key, GgufValueType::kArray, std::move(payload));
}

void GgufWriter::Remove(std::string_view key) {
  std::erase_if(entries_, [&](const Entry& e) { return e.key == key; });
  if (key == kAlignmentKey) alignment_ = kDefaultAlignment;
}

absl::StatusOr<uint64_t> GgufWriter::CheckTensor(std::string_view name, GgmlType type,
                                                 const std::vector<uint64_t>& dims) const {
  const std::string context = moert::StrCat("GgufWriter: tensor '", name, "'");
  for (const Tensor& t : tensors_) {
    if (t.name == name)
      return absl::InvalidArgumentError(moert::StrCat(context, ": duplicate name"));
  }
  if (dims.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        moert::StrCat(context, ": ", dims.size(), " dimensions, at most ", kMaxDims));
  }
  uint64_t n_elements = 1;
  for (uint64_t d : dims) {
    if (d != 0 && n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d) {
      return absl::InvalidArgumentError(moert::StrCat(context, ": element count overflows"));
    }
    n_elements *= d;
  }
  const GgmlTypeTraits& traits = TraitsOf(type);
  uint64_t row = dims.empty() ? 1 : dims[0];
  std::optional<uint64_t> n_bytes = GgmlRowBytes(type, n_elements);
  if (row % traits.block_elements != 0 || !n_bytes) {
    return absl::InvalidArgumentError(moert::StrCat(context, ": row length ", row,
                                                    " is not a multiple of the block size ",
                                                    traits.block_elements, " of ", traits.name));
  }
  return *n_bytes;
}

absl::Status GgufWriter::AddTensor(std::string_view name, GgmlType type, std::vector<uint64_t> dims,
                                   std::span<const uint8_t> data) {
  absl::StatusOr<uint64_t> n_bytes = CheckTensor(name, type, dims);
  if (!n_bytes.ok()) return n_bytes.status();
  if (*n_bytes != data.size()) {
    uint64_t n_elements = 1;
    for (uint64_t d : dims) n_elements *= d;
    return absl::InvalidArgumentError(
        moert::StrCat("GgufWriter: tensor '", name, "': ", TraitsOf(type).name, " data of ",
                      n_elements, " elements is ", *n_bytes, " bytes, got ", data.size()));
  }
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), *n_bytes, false,
                            std::vector<uint8_t>(data.begin(), data.end())});
  return absl::OkStatus();
}

absl::Status GgufWriter::DeclareTensor(std::string_view name, GgmlType type,
                                       std::vector<uint64_t> dims) {
  absl::StatusOr<uint64_t> n_bytes = CheckTensor(name, type, dims);
  if (!n_bytes.ok()) return n_bytes.status();
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), *n_bytes, true, {}});
  return absl::OkStatus();
}

void GgufWriter::SetAlignment(uint32_t alignment) {
  assert(std::has_single_bit(alignment) && "GGUF alignment must be a power of two");
  if (!std::has_single_bit(alignment)) return;
  alignment_ = alignment;
  if (alignment == kDefaultAlignment) {
    std::erase_if(entries_, [](const Entry& e) { return e.key == kAlignmentKey; });
  } else {
    SetRaw(kAlignmentKey, GgufValueType::kUint32, Encoded(alignment, 4));
  }
}

std::vector<uint8_t> GgufWriter::SerializeMetadata() const {
  // Built by value: GCC 12 mis-warns (stringop-overflow) on inserting into an empty one.
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
  PutLe(out, version_);
  PutLe<uint64_t>(out, tensors_.size());
  PutLe<uint64_t>(out, entries_.size());
  for (const Entry& e : entries_) {
    PutString(out, e.key);
    PutLe(out, static_cast<uint32_t>(e.type));
    out.insert(out.end(), e.payload.begin(), e.payload.end());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    // Dims are written as given, as gguf-py does (ggml's writer also drops trailing
    // 1s; both read back the same tensor).
    PutLe(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) PutLe(out, d);
    PutLe(out, static_cast<uint32_t>(t.type));
    PutLe(out, offset);
    offset += PadTo(t.n_bytes, alignment_);
  }
  out.resize(PadTo(out.size(), alignment_), 0);
  return out;
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out = SerializeMetadata();
  for (const Tensor& t : tensors_) {
    assert(!t.declared && "Serialize needs every tensor's data; stream declared tensors");
    if (t.declared) {
      out.resize(out.size() + t.n_bytes, 0);
    } else {
      out.insert(out.end(), t.data.begin(), t.data.end());
    }
    out.resize(PadTo(out.size(), alignment_), 0);
  }
  return out;
}

uint64_t GgufWriter::FileSize() const {
  uint64_t size = SerializeMetadata().size();
  for (const Tensor& t : tensors_) size += PadTo(t.n_bytes, alignment_);
  return size;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  auto error = [&](std::string_view what, int err) { return FileError(what, path, err); };
  for (const Tensor& t : tensors_) {
    if (t.declared) {
      return absl::FailedPreconditionError(
          moert::StrCat("cannot write '", path, "': tensor '", t.name,
                        "' was declared without data; write it with OpenStream"));
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"),
                                                       &std::fclose);
  if (file == nullptr) return error("create", errno);
  // Streamed tensor by tensor so that packing a large model needs no second copy.
  auto put = [&](std::span<const uint8_t> bytes) {
    return bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), file.get()) == bytes.size();
  };
  const std::vector<uint8_t> zeros(alignment_, 0);
  if (!put(SerializeMetadata())) return error("write", errno);
  for (const Tensor& t : tensors_) {
    uint64_t pad = PadTo(t.data.size(), alignment_) - t.data.size();
    if (!put(t.data) || !put(std::span(zeros).first(pad))) return error("write", errno);
  }
  if (std::fclose(file.release()) != 0) return error("close", errno);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GgufTensorStream>> GgufWriter::OpenStream(
    const std::string& path) const {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return FileError("create", path, errno);
  std::unique_ptr<GgufTensorStream> stream(new GgufTensorStream(*this, path, file));
  MOERT_RETURN_IF_ERROR(stream->WriteBytes(SerializeMetadata()));
  // Held tensors before the first declared one.
  MOERT_RETURN_IF_ERROR(stream->Advance());
  return stream;
}

GgufTensorStream::GgufTensorStream(const GgufWriter& writer, std::string path, std::FILE* file)
    : writer_(writer), path_(std::move(path)), file_(file) {
  for (const GgufWriter::Tensor& t : writer_.tensors_) {
    if (t.declared) declared_left_ += t.n_bytes;
  }
}

GgufTensorStream::~GgufTensorStream() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string_view GgufTensorStream::current_tensor() const {
  return index_ < writer_.tensors_.size() ? std::string_view(writer_.tensors_[index_].name) : "";
}

absl::Status GgufTensorStream::WriteBytes(std::span<const uint8_t> bytes) {
  if (!error_.ok()) return error_;
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(moert::StrCat("'", path_, "' is already closed"));
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    error_ = FileError("write", path_, errno);
  }
  return error_;
}

absl::Status GgufTensorStream::Advance() {
  const std::vector<GgufWriter::Tensor>& tensors = writer_.tensors_;
  const std::vector<uint8_t> zeros(writer_.alignment_, 0);
  while (index_ < tensors.size()) {
    const GgufWriter::Tensor& t = tensors[index_];
    if (!t.declared) {
      MOERT_RETURN_IF_ERROR(WriteBytes(t.data));
      written_ = t.n_bytes;
    }
    if (written_ < t.n_bytes) return absl::OkStatus();  // waiting for Write
    const uint64_t pad = PadTo(t.n_bytes, writer_.alignment_) - t.n_bytes;
    MOERT_RETURN_IF_ERROR(WriteBytes(std::span(zeros).first(pad)));
    ++index_;
    written_ = 0;
  }
  return absl::OkStatus();
}

absl::Status GgufTensorStream::Write(std::span<const uint8_t> bytes) {
  if (bytes.size() > declared_left_) {
    const std::string_view last = writer_.tensors_.empty()
                                      ? std::string_view()
                                      : std::string_view(writer_.tensors_.back().name);
    return absl::InvalidArgumentError(
        moert::StrCat("'", path_, "': ", bytes.size(), " bytes given, but only ", declared_left_,
                      " are left to write up to the end of tensor '", last, "'"));
  }
  const std::vector<GgufWriter::Tensor>& tensors = writer_.tensors_;
  while (!bytes.empty()) {
    const GgufWriter::Tensor& t = tensors[index_];
    const uint64_t take = std::min<uint64_t>(bytes.size(), t.n_bytes - written_);
    MOERT_RETURN_IF_ERROR(WriteBytes(bytes.first(take)));
    written_ += take;
    declared_left_ -= take;
    bytes = bytes.subspan(take);
    MOERT_RETURN_IF_ERROR(Advance());
  }
  return absl::OkStatus();
}

absl::Status GgufTensorStream::Finish() {
  if (!error_.ok()) return error_;
  if (index_ < writer_.tensors_.size()) {
    const GgufWriter::Tensor& t = writer_.tensors_[index_];
    return absl::FailedPreconditionError(moert::StrCat("'", path_, "': tensor '", t.name, "' has ",
                                                       written_, " of its ", t.n_bytes, " bytes"));
  }
  MOERT_RETURN_IF_ERROR(WriteBytes({}));
  std::FILE* file = std::exchange(file_, nullptr);
  if (std::fclose(file) != 0) return FileError("close", path_, errno);
  return absl::OkStatus();
}

void GgufWriter::CopyMetadata(const GgufFile& file,
                              const std::function<bool(std::string_view key)>& skip) {
  for (const GgufKeyValue& kv : file.metadata()) {
    if (skip && skip(kv.key)) continue;
    const GgufValue& v = kv.value;
    switch (v.type) {
      case GgufValueType::kUint8:
        SetUint8(kv.key, static_cast<uint8_t>(v.u64));
        break;
      case GgufValueType::kInt8:
        SetInt8(kv.key, static_cast<int8_t>(v.i64));
        break;
      case GgufValueType::kUint16:
        SetUint16(kv.key, static_cast<uint16_t>(v.u64));
        break;
      case GgufValueType::kInt16:
        SetInt16(kv.key, static_cast<int16_t>(v.i64));
        break;
      case GgufValueType::kUint32:
        SetUint32(kv.key, static_cast<uint32_t>(v.u64));
        break;
      case GgufValueType::kInt32:
        SetInt32(kv.key, static_cast<int32_t>(v.i64));
        break;
      case GgufValueType::kUint64:
        SetUint64(kv.key, v.u64);
        break;
      case GgufValueType::kInt64:
        SetInt64(kv.key, v.i64);
        break;
      case GgufValueType::kFloat32:
        SetFloat32(kv.key, static_cast<float>(v.f64));
        break;
      case GgufValueType::kFloat64:
        SetFloat64(kv.key, v.f64);
        break;
      case GgufValueType::kBool:
        SetBool(kv.key, v.u64 != 0);
        break;
      case GgufValueType::kString:
        SetString(kv.key, v.str);
        break;
      case GgufValueType::kArray:
        // The elements' bytes as the file holds them (strings length-prefixed, nested
        // arrays encoded): written back verbatim.
        SetArray(kv.key, v.array_type, v.array_size, v.array_bytes);
        break;
    }
  }
}

}  // namespace moert::format
