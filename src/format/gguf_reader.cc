// Parses GGUF v2/v3 files (format/gguf.h). Every byte is read through Cursor, which
// checks the bounds first, so a hostile file can only produce a Status; every count,
// length and size is capped before anything is allocated or multiplied with it.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/gguf.h"

namespace moert::format {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr uint32_t kLastValueType = static_cast<uint32_t>(GgufValueType::kFloat64);
// ggml keeps sizes in int64_t; nothing larger can be a valid dimension or count.
constexpr uint64_t kMaxSigned = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Encoded size of a fixed-size value type; 0 for string and array.
uint64_t FixedSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

// Names and keys come from the file: escape them so that a hostile name cannot put
// control bytes into a log line, and cut them short so it cannot flood one.
std::string Quoted(std::string_view s) {
  constexpr size_t kMaxShown = 96;
  const std::string escaped =
      absl::CHexEscape(absl::string_view(s.data(), std::min(s.size(), kMaxShown)));
  if (s.size() <= kMaxShown) return moert::StrCat("'", escaped, "'");
  return moert::StrCat("'", escaped, "...' (", s.size(), " bytes)");
}

// The file's bytes are little-endian whatever the host is.
template <typename T>
T LoadLe(const uint8_t* p) {
  static_assert(std::is_unsigned_v<T>);
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(p[i]) << (8 * i)));
  return v;
}

absl::Status WithContext(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), moert::StrCat(context, ": ", status.message()));
}

// Bounds-checked reader over the file. Its errors say where (byte offset) and what
// was being read; callers prefix the key or tensor.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::StatusOr<std::span<const uint8_t>> Take(uint64_t n, std::string_view what) {
    if (n > remaining()) {
      return absl::DataLossError(moert::StrCat("at byte ", pos_, ": file ends inside ", what,
                                               " (needs ", n, " bytes, ", remaining(), " left)"));
    }
    std::span<const uint8_t> out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    MOERT_ASSIGN_OR_RETURN(std::span<const uint8_t> b, Take(sizeof(T), what));
    return LoadLe<T>(b.data());
  }

  // A u64 length followed by that many bytes; the length is capped before the read.
  absl::StatusOr<std::string_view> String(uint64_t max_len, std::string_view what) {
    uint64_t at = pos_;
    // The "length of" message is built only on failure: this runs once per token.
    if (remaining() < sizeof(uint64_t)) {
      return Take(sizeof(uint64_t), moert::StrCat("the length of ", what)).status();
    }
    MOERT_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > max_len) {
      return absl::InvalidArgumentError(moert::StrCat("at byte ", at, ": ", what, " length ", len,
                                                      " exceeds the limit ", max_len));
    }
    MOERT_ASSIGN_OR_RETURN(std::span<const uint8_t> b, Take(len, what));
    return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufValueType> ReadValueType(Cursor& c, std::string_view what) {
  uint64_t at = c.pos();
  MOERT_ASSIGN_OR_RETURN(uint32_t t, c.Read<uint32_t>(what));
  if (t > kLastValueType) {
    return absl::InvalidArgumentError(moert::StrCat("at byte ", at, ": unknown ", what, " ", t));
  }
  return static_cast<GgufValueType>(t);
}

absl::Status ParseValue(Cursor& c, GgufValueType type, const GgufLimits& limits, uint32_t depth,
                        GgufValue& out);

// Validates `count` elements of `type` (the caller has capped `count`).
absl::Status ParseArrayElements(Cursor& c, GgufValueType type, uint64_t count,
                                const GgufLimits& limits, uint32_t depth) {
  if (uint64_t size = FixedSize(type); size != 0) {
    uint64_t begin = c.pos();
    // count <= max_array_elements, so the product cannot overflow.
    MOERT_ASSIGN_OR_RETURN(std::span<const uint8_t> whole,
                           c.Take(count * size, moert::StrCat("an array of ", count, " ",
                                                              GgufValueTypeName(type), " values")));
    if (type == GgufValueType::kBool) {
      for (uint64_t i = 0; i < count; ++i) {
        if (whole[i] > 1) {
          return absl::InvalidArgumentError(moert::StrCat("array element ", i, ": at byte ",
                                                          begin + i, ": bool value ", whole[i],
                                                          " is neither 0 nor 1"));
        }
      }
    }
    return absl::OkStatus();
  }
  GgufValue scratch;
  for (uint64_t i = 0; i < count; ++i) {
    absl::Status status = ParseValue(c, type, limits, depth, scratch);
    if (!status.ok()) return WithContext(status, moert::StrCat("array element ", i));
  }
  return absl::OkStatus();
}

// `depth` counts the arrays enclosing this value.
absl::Status ParseValue(Cursor& c, GgufValueType type, const GgufLimits& limits, uint32_t depth,
                        GgufValue& out) {
  out.type = type;
  uint64_t at = c.pos();
  switch (type) {
    case GgufValueType::kUint8: {
      MOERT_ASSIGN_OR_RETURN(out.u64, c.Read<uint8_t>("a uint8 value"));
      return absl::OkStatus();
    }
    case GgufValueType::kInt8: {
      MOERT_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("an int8 value"));
      out.i64 = static_cast<int8_t>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kUint16: {
      MOERT_ASSIGN_OR_RETURN(out.u64, c.Read<uint16_t>("a uint16 value"));
      return absl::OkStatus();
    }
    case GgufValueType::kInt16: {
      MOERT_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>("an int16 value"));
      out.i64 = static_cast<int16_t>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kUint32: {
      MOERT_ASSIGN_OR_RETURN(out.u64, c.Read<uint32_t>("a uint32 value"));
      return absl::OkStatus();
    }
    case GgufValueType::kInt32: {
      MOERT_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>("an int32 value"));
      out.i64 = static_cast<int32_t>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kUint64: {
      MOERT_ASSIGN_OR_RETURN(out.u64, c.Read<uint64_t>("a uint64 value"));
      return absl::OkStatus();
    }
    case GgufValueType::kInt64: {
      MOERT_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>("an int64 value"));
      out.i64 = static_cast<int64_t>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32: {
      MOERT_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>("a float32 value"));
      out.f64 = std::bit_cast<float>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      MOERT_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>("a float64 value"));
      out.f64 = std::bit_cast<double>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      MOERT_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("a bool value"));
      if (v > 1) {
        return absl::InvalidArgumentError(
            moert::StrCat("at byte ", at, ": bool value ", v, " is neither 0 nor 1"));
      }
      out.u64 = v;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      MOERT_ASSIGN_OR_RETURN(out.str, c.String(limits.max_string_bytes, "a string value"));
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      break;
  }

  if (depth + 1 > limits.max_array_depth) {
    return absl::InvalidArgumentError(moert::StrCat(
        "at byte ", at, ": arrays nested deeper than the limit ", limits.max_array_depth));
  }
  MOERT_ASSIGN_OR_RETURN(out.array_type, ReadValueType(c, "array element type"));
  uint64_t count_at = c.pos();
  MOERT_ASSIGN_OR_RETURN(out.array_size, c.Read<uint64_t>("an array size"));
  if (out.array_size > limits.max_array_elements) {
    return absl::InvalidArgumentError(moert::StrCat("at byte ", count_at, ": array size ",
                                                    out.array_size, " exceeds the limit ",
                                                    limits.max_array_elements));
  }
  // A copy that stays at the first element, to view the validated bytes in place.
  Cursor elements = c;
  const uint64_t begin = c.pos();
  MOERT_RETURN_IF_ERROR(ParseArrayElements(c, out.array_type, out.array_size, limits, depth + 1));
  MOERT_ASSIGN_OR_RETURN(out.array_bytes, elements.Take(c.pos() - begin, "an array"));
  return absl::OkStatus();
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// Decode one element of an already validated integer array.
int64_t LoadSigned(GgufValueType type, const uint8_t* p) {
  switch (type) {
    case GgufValueType::kInt8:
      return static_cast<int8_t>(p[0]);
    case GgufValueType::kInt16:
      return static_cast<int16_t>(LoadLe<uint16_t>(p));
    case GgufValueType::kInt32:
      return static_cast<int32_t>(LoadLe<uint32_t>(p));
    default:
      return static_cast<int64_t>(LoadLe<uint64_t>(p));
  }
}

uint64_t LoadUnsigned(GgufValueType type, const uint8_t* p) {
  switch (type) {
    case GgufValueType::kUint8:
      return p[0];
    case GgufValueType::kUint16:
      return LoadLe<uint16_t>(p);
    case GgufValueType::kUint32:
      return LoadLe<uint32_t>(p);
    default:
      return LoadLe<uint64_t>(p);
  }
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path,
                                                         const GgufLimits& limits) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<core::MappedFile> mapping, core::MappedFile::Open(path));
  return FromMapping(std::move(mapping), path, limits);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::OpenRange(const std::string& path,
                                                              uint64_t offset, uint64_t length,
                                                              const GgufLimits& limits) {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<core::MappedFile> mapping,
                         core::MappedFile::OpenRange(path, offset, length));
  return FromMapping(std::move(mapping), path, limits);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromMapping(
    std::unique_ptr<core::MappedFile> mapping, const std::string& path, const GgufLimits& limits) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = mapping->bytes();
  file->mapping_ = std::move(mapping);
  file->name_ = path;
  MOERT_RETURN_IF_ERROR(file->Parse(limits));
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(std::span<const uint8_t> bytes,
                                                               std::string name,
                                                               const GgufLimits& limits) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->bytes_ = bytes;
  file->name_ = std::move(name);
  MOERT_RETURN_IF_ERROR(file->Parse(limits));
  return file;
}

absl::Status GgufFile::Parse(const GgufLimits& limits) {
  Cursor c(bytes_);
  auto fail = [&](const absl::Status& status, std::string_view context) {
    return WithContext(status, moert::StrCat(name_, ": ", context));
  };

  // Header.
  {
    auto magic = c.Take(4, "the magic");
    if (!magic.ok()) return fail(magic.status(), "header");
    if (std::memcmp(magic->data(), "GGUF", 4) != 0) {
      return fail(
          absl::InvalidArgumentError(moert::StrCat(
              "at byte 0: not a GGUF file (magic is '",
              absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(magic->data()), 4)),
              "', expected 'GGUF')")),
          "header");
    }
    auto version = c.Read<uint32_t>("the version");
    if (!version.ok()) return fail(version.status(), "header");
    version_ = *version;
    if (version_ == 1) {
      return fail(absl::InvalidArgumentError(
                      "at byte 4: GGUF version 1 is not supported (only v2 and v3 are)"),
                  "header");
    }
    if (version_ != 2 && version_ != 3) {
      // A big-endian file (gguf-py can write them) stores 3 as 0x03000000.
      if (version_ != 0 && (version_ & 0x00FFFFFFu) == 0) {
        return fail(absl::InvalidArgumentError(absl::StrFormat(
                        "at byte 4: GGUF version 0x%08x looks byte-swapped; the file may "
                        "be big-endian, which moert does not read",
                        version_)),
                    "header");
      }
      return fail(absl::InvalidArgumentError(moert::StrCat("at byte 4: unknown GGUF version ",
                                                           version_, " (v2 and v3 are read)")),
                  "header");
    }
  }
  auto n_tensors = c.Read<uint64_t>("the tensor count");
  if (!n_tensors.ok()) return fail(n_tensors.status(), "header");
  if (*n_tensors > limits.max_tensors) {
    return fail(
        absl::InvalidArgumentError(moert::StrCat("at byte 8: tensor count ", *n_tensors,
                                                 " exceeds the limit ", limits.max_tensors)),
        "header");
  }
  auto n_kv = c.Read<uint64_t>("the metadata count");
  if (!n_kv.ok()) return fail(n_kv.status(), "header");
  if (*n_kv > limits.max_metadata) {
    return fail(
        absl::InvalidArgumentError(moert::StrCat("at byte 16: metadata count ", *n_kv,
                                                 " exceeds the limit ", limits.max_metadata)),
        "header");
  }

  // Metadata. Each entry takes at least 13 bytes, so a count the file cannot hold
  // does not make us reserve memory for it.
  metadata_.clear();
  key_index_.clear();
  metadata_.reserve(std::min<uint64_t>(*n_kv, c.remaining() / 13));
  alignment_ = kDefaultAlignment;
  for (uint64_t i = 0; i < *n_kv; ++i) {
    GgufKeyValue kv;
    kv.file_offset = c.pos();
    auto key = c.String(limits.max_string_bytes, "a key");
    if (!key.ok()) {
      return fail(key.status(),
                  moert::StrCat("metadata entry #", i, " (at byte ", kv.file_offset, ")"));
    }
    kv.key = *key;
    const std::string context =
        moert::StrCat("key ", Quoted(kv.key), " (entry at byte ", kv.file_offset, ")");
    auto type = ReadValueType(c, "value type");
    if (!type.ok()) return fail(type.status(), context);
    absl::Status status = ParseValue(c, *type, limits, 0, kv.value);
    if (!status.ok()) return fail(status, context);

    auto [it, inserted] = key_index_.try_emplace(kv.key, metadata_.size());
    if (!inserted) {
      return fail(absl::InvalidArgumentError(moert::StrCat("duplicate key (first at byte ",
                                                           metadata_[it->second].file_offset, ")")),
                  context);
    }
    if (kv.key == kAlignmentKey) {
      if (kv.value.type != GgufValueType::kUint32) {
        return fail(absl::InvalidArgumentError(
                        moert::StrCat("expected uint32, got ", GgufValueTypeName(kv.value.type))),
                    context);
      }
      uint64_t a = kv.value.u64;
      if (!std::has_single_bit(a)) {
        return fail(absl::InvalidArgumentError(
                        moert::StrCat("alignment ", a, " is not a nonzero power of two")),
                    context);
      }
      if (a > limits.max_alignment) {
        return fail(absl::InvalidArgumentError(moert::StrCat("alignment ", a, " exceeds the limit ",
                                                             limits.max_alignment)),
                    context);
      }
      alignment_ = a;
    }
    metadata_.push_back(kv);
  }

  // Tensor infos. Each takes at least 24 bytes (see above for why this matters).
  tensors_.clear();
  tensor_index_.clear();
  tensors_.reserve(std::min<uint64_t>(*n_tensors, c.remaining() / 24));
  for (uint64_t i = 0; i < *n_tensors; ++i) {
    GgufTensorInfo t;
    t.info_offset = c.pos();
    auto name = c.String(limits.max_string_bytes, "a tensor name");
    if (!name.ok()) {
      return fail(name.status(),
                  moert::StrCat("tensor info #", i, " (at byte ", t.info_offset, ")"));
    }
    t.name = *name;
    const std::string context =
        moert::StrCat("tensor ", Quoted(t.name), " (info at byte ", t.info_offset, ")");
    auto [it, inserted] = tensor_index_.try_emplace(t.name, tensors_.size());
    if (!inserted) {
      return fail(
          absl::InvalidArgumentError(moert::StrCat("duplicate tensor name (first info at byte ",
                                                   tensors_[it->second].info_offset, ")")),
          context);
    }

    uint64_t at = c.pos();
    auto n_dims = c.Read<uint32_t>("the dimension count");
    if (!n_dims.ok()) return fail(n_dims.status(), context);
    if (*n_dims > limits.max_dims) {
      return fail(
          absl::InvalidArgumentError(moert::StrCat(
              "at byte ", at, ": ", *n_dims, " dimensions exceed the limit ", limits.max_dims)),
          context);
    }
    t.dims.resize(*n_dims);
    // Every partial product of the dims (zeros counted as 1) must fit int64_t, so
    // that row counts and strides computed from them later cannot overflow either.
    uint64_t bound = 1;
    t.n_elements = 1;
    for (uint32_t d = 0; d < *n_dims; ++d) {
      at = c.pos();
      auto dim = c.Read<uint64_t>("a dimension");
      if (!dim.ok()) return fail(dim.status(), context);
      t.dims[d] = *dim;
      uint64_t factor = std::max<uint64_t>(*dim, 1);
      if (factor > kMaxSigned / bound) {
        return fail(
            absl::InvalidArgumentError(moert::StrCat("at byte ", at, ": dims[", d, "] = ", *dim,
                                                     " makes the element count overflow int64")),
            context);
      }
      bound *= factor;
      t.n_elements *= *dim;
    }
    at = c.pos();
    auto type_id = c.Read<uint32_t>("the tensor type");
    if (!type_id.ok()) return fail(type_id.status(), context);
    std::optional<GgmlTypeTraits> traits = LookupGgmlType(*type_id);
    if (*type_id == kMoertW4S24FirstLayoutId) {
      return fail(absl::InvalidArgumentError(moert::StrCat(
                      "at byte ", at, ": ggml type id ", *type_id,
                      " is moert_w4s24 in its first layout (2-bit positions, 14 bytes a "
                      "row-block), which this build no longer reads: repack the source "
                      "GGUF with moert-pack --sparsity 2:4 (docs/formats.md)")),
                  context);
    }
    if (!traits) {
      return fail(absl::InvalidArgumentError(
                      moert::StrCat("at byte ", at, ": unknown ggml type id ", *type_id)),
                  context);
    }
    t.type = traits->type;
    // Quantized blocks never straddle rows, so the row length must be whole blocks.
    uint64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (row % traits->block_elements != 0) {
      return fail(absl::InvalidArgumentError(
                      moert::StrCat("row length ", row, " is not a multiple of the block size ",
                                    traits->block_elements, " of ", traits->name)),
                  context);
    }
    // moert's packed types hold whole 8-row tiles of each matrix (dims[1] rows;
    // outer dims stack matrices, each packed on its own), so that the size below
    // is the tiles' size.
    if (IsMoertPackedType(t.type) && (t.dims.size() < 2 || t.dims[1] % 8 != 0)) {
      return fail(absl::InvalidArgumentError(moert::StrCat(
                      "a ", traits->name, " tensor needs a multiple of 8 rows, got shape [",
                      moert::StrJoin(t.dims, ", "), "]")),
                  context);
    }
    std::optional<uint64_t> n_bytes = GgmlRowBytes(t.type, t.n_elements);
    if (!n_bytes || *n_bytes > kMaxSigned) {
      return fail(absl::InvalidArgumentError(moert::StrCat("the data size of ", t.n_elements, " ",
                                                           traits->name, " elements overflows")),
                  context);
    }
    t.n_bytes = *n_bytes;
    at = c.pos();
    auto offset = c.Read<uint64_t>("the data offset");
    if (!offset.ok()) return fail(offset.status(), context);
    t.offset = *offset;
    if (t.offset % alignment_ != 0) {
      return fail(absl::InvalidArgumentError(
                      moert::StrCat("at byte ", at, ": data offset ", t.offset,
                                    " is not a multiple of the alignment ", alignment_)),
                  context);
    }
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment. A file without
  // tensor data may end before it (llama.cpp accepts that), so it is not checked
  // against the size here; each tensor's range is.
  uint64_t header_end = c.pos();
  data_offset_ = AlignUp(header_end, alignment_);
  const uint64_t size = bytes_.size();
  for (GgufTensorInfo& t : tensors_) {
    const std::string context =
        moert::StrCat("tensor ", Quoted(t.name), " (info at byte ", t.info_offset, ")");
    if (t.offset > std::numeric_limits<uint64_t>::max() - data_offset_ ||
        t.n_bytes > std::numeric_limits<uint64_t>::max() - data_offset_ - t.offset) {
      return fail(absl::InvalidArgumentError(moert::StrCat(
                      "data offset ", t.offset, " + ", t.n_bytes,
                      " bytes overflows past the data section at byte ", data_offset_)),
                  context);
    }
    uint64_t begin = data_offset_ + t.offset;
    uint64_t end = begin + t.n_bytes;
    if (end > size) {
      return fail(
          absl::DataLossError(moert::StrCat("data [", begin, ", ", end,
                                            ") runs past the end of the file (size ", size, ")")),
          context);
    }
    t.file_offset = begin;
  }

  // Overlap: in offset order, each range must end before the next starts. Ties sort
  // the empty range first so that an empty tensor at another's start is not flagged.
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const GgufTensorInfo& x = tensors_[a];
    const GgufTensorInfo& y = tensors_[b];
    if (x.file_offset != y.file_offset) return x.file_offset < y.file_offset;
    if (x.n_bytes != y.n_bytes) return x.n_bytes < y.n_bytes;
    return a < b;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors_[order[k - 1]];
    const GgufTensorInfo& cur = tensors_[order[k]];
    if (prev.file_offset + prev.n_bytes > cur.file_offset) {
      return fail(
          absl::InvalidArgumentError(moert::StrCat(
              "data [", cur.file_offset, ", ", cur.file_offset + cur.n_bytes, ") overlaps tensor ",
              Quoted(prev.name), " (info at byte ", prev.info_offset, ") data [", prev.file_offset,
              ", ", prev.file_offset + prev.n_bytes, ")")),
          moert::StrCat("tensor ", Quoted(cur.name), " (info at byte ", cur.info_offset, ")"));
    }
  }
  return absl::OkStatus();
}

const GgufKeyValue* GgufFile::FindKey(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufKeyValue*> Lookup(const GgufFile& file, std::string_view key) {
  const GgufKeyValue* kv = file.FindKey(key);
  if (kv == nullptr) {
    return absl::NotFoundError(moert::StrCat(file.name(), ": key ", Quoted(key), " not found"));
  }
  return kv;
}

std::string Context(const GgufFile& file, const GgufKeyValue& kv) {
  return moert::StrCat(file.name(), ": key ", Quoted(kv.key), " (entry at byte ", kv.file_offset,
                       ")");
}

std::string ActualType(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return std::string(GgufValueTypeName(v.type));
  return moert::StrCat("array of ", GgufValueTypeName(v.array_type));
}

absl::Status TypeError(const GgufFile& file, const GgufKeyValue& kv, std::string_view expected) {
  return absl::InvalidArgumentError(
      moert::StrCat(Context(file, kv), ": expected ", expected, ", got ", ActualType(kv.value)));
}

}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (IsUnsigned(kv->value.type)) return kv->value.u64;
  if (IsSigned(kv->value.type)) {
    if (kv->value.i64 < 0) {
      return absl::InvalidArgumentError(moert::StrCat(
          Context(*this, *kv), ": expected an unsigned integer, got ",
          GgufValueTypeName(kv->value.type), " ", kv->value.i64, " which is negative"));
    }
    return static_cast<uint64_t>(kv->value.i64);
  }
  return TypeError(*this, *kv, "an unsigned integer");
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (IsSigned(kv->value.type)) return kv->value.i64;
  if (IsUnsigned(kv->value.type)) {
    if (kv->value.u64 > kMaxSigned) {
      return absl::InvalidArgumentError(moert::StrCat(
          Context(*this, *kv), ": expected an int64, got ", GgufValueTypeName(kv->value.type), " ",
          kv->value.u64, " which does not fit"));
    }
    return static_cast<int64_t>(kv->value.u64);
  }
  return TypeError(*this, *kv, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (kv->value.type == GgufValueType::kFloat32 || kv->value.type == GgufValueType::kFloat64) {
    return kv->value.f64;
  }
  return TypeError(*this, *kv, "float32 or float64");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (kv->value.type == GgufValueType::kBool) return kv->value.u64 != 0;
  return TypeError(*this, *kv, "bool");
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (kv->value.type == GgufValueType::kString) return kv->value.str;
  return TypeError(*this, *kv, "string");
}

absl::StatusOr<std::vector<std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (kv->value.type != GgufValueType::kArray || kv->value.array_type != GgufValueType::kString) {
    return TypeError(*this, *kv, "array of string");
  }
  // Parse validated these bytes; they are still read through a checked cursor.
  Cursor c(kv->value.array_bytes);
  std::vector<std::string_view> out;
  out.reserve(kv->value.array_size);
  for (uint64_t i = 0; i < kv->value.array_size; ++i) {
    auto s = c.String(std::numeric_limits<uint64_t>::max(), "a string element");
    if (!s.ok()) return WithContext(s.status(), Context(*this, *kv));
    out.push_back(*s);
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  if (kv->value.type != GgufValueType::kArray || kv->value.array_type != GgufValueType::kFloat32) {
    return TypeError(*this, *kv, "array of float32");
  }
  const std::span<const uint8_t> b = kv->value.array_bytes;
  if (b.size() / 4 != kv->value.array_size) {
    return absl::InternalError(moert::StrCat(Context(*this, *kv), ": array bytes do not match"));
  }
  std::vector<float> out(kv->value.array_size);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = std::bit_cast<float>(LoadLe<uint32_t>(&b[4 * i]));
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  MOERT_ASSIGN_OR_RETURN(const GgufKeyValue* kv, Lookup(*this, key));
  const GgufValueType t = kv->value.array_type;
  if (kv->value.type != GgufValueType::kArray || !(IsSigned(t) || IsUnsigned(t))) {
    return TypeError(*this, *kv, "array of integers");
  }
  const uint64_t size = FixedSize(t);
  const std::span<const uint8_t> b = kv->value.array_bytes;
  if (b.size() / size != kv->value.array_size) {
    return absl::InternalError(moert::StrCat(Context(*this, *kv), ": array bytes do not match"));
  }
  std::vector<int64_t> out(kv->value.array_size);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = &b[size * i];
    if (IsSigned(t)) {
      out[i] = LoadSigned(t, p);
      continue;
    }
    uint64_t v = LoadUnsigned(t, p);
    if (v > kMaxSigned) {
      return absl::InvalidArgumentError(
          moert::StrCat(Context(*this, *kv), ": element ", i, " = ", v, " does not fit int64"));
    }
    out[i] = static_cast<int64_t>(v);
  }
  return out;
}

std::span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& tensor) const {
  if (tensor.file_offset > bytes_.size() || tensor.n_bytes > bytes_.size() - tensor.file_offset) {
    return {};
  }
  return bytes_.subspan(tensor.file_offset, tensor.n_bytes);
}

}  // namespace moert::format
