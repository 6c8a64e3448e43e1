// Delta packages: serialization, the checked parser, keys and signatures (libsodium).
#include "experts/delta_package.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/status.h"
#include "core/strings.h"

namespace moert::experts {
namespace {

// Where each header field lies (see the file comment of delta_package.h).
constexpr size_t kVersionAt = 8, kEntryCountAt = 12, kBaseSizeAt = 16, kBaseHashAt = 24,
                 kTargetSizeAt = 56, kTargetHashAt = 64, kBaseDataAt = 96, kTargetDataAt = 104,
                 kPayloadBytesAt = 112;
constexpr size_t kRangesAt = 32, kRangeBytes = 32, kFrameAt = 128;

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The digest the signature covers.
std::array<uint8_t, crypto_generichash_BYTES_MAX> SignedDigest(std::span<const uint8_t> bytes) {
  std::array<uint8_t, crypto_generichash_BYTES_MAX> digest{};
  crypto_generichash(digest.data(), digest.size(), bytes.data(), bytes.size(), nullptr, 0);
  return digest;
}

void InitSodium() {
  // sodium_init is idempotent and thread-safe; it fails only without an entropy source.
  static const int ok = sodium_init();
  (void)ok;
}

// a + b <= limit without overflow.
bool FitsIn(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

absl::Status CheckEntry(const DeltaEntry& e, size_t index, const DeltaManifest& m,
                        uint64_t payload_bytes) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(StrCat("delta package: entry ", index, ": ", what));
  };
  if (e.kind != DeltaKind::kHeader && e.kind != DeltaKind::kExpert) {
    return bad(StrCat("unknown kind ", static_cast<uint32_t>(e.kind)));
  }
  if (e.encoding != DeltaEncoding::kZstdPatch) {
    return bad(StrCat("unknown encoding ", static_cast<uint32_t>(e.encoding)));
  }
  if (!FitsIn(e.payload_offset, e.payload_bytes, payload_bytes)) {
    return bad(StrCat("frame [", e.payload_offset, ", +", e.payload_bytes,
                      ") lies past the payload's ", payload_bytes, " bytes"));
  }
  if ((index == 0) != (e.kind == DeltaKind::kHeader)) {
    return bad("the header entry must come first, and only once");
  }
  for (int r = e.range_count(); r < 3; ++r) {
    const DeltaRange& x = e.ranges[static_cast<size_t>(r)];
    if (x.base_offset != 0 || x.base_bytes != 0 || x.target_offset != 0 || x.target_bytes != 0) {
      return bad(StrCat("range ", r, " is set but unused"));
    }
  }
  if (e.kind == DeltaKind::kHeader) {
    const DeltaRange& x = e.ranges[0];
    if (x.base_offset != 0 || x.base_bytes != m.base_data_offset || x.target_offset != 0 ||
        x.target_bytes != m.target_data_offset) {
      return bad("the header range is not the files' bytes before their data sections");
    }
    return absl::OkStatus();
  }
  if (e.layer < 0 || e.expert < 0) return bad(StrCat("layer ", e.layer, ", expert ", e.expert));
  for (int r = 0; r < 3; ++r) {
    const DeltaRange& x = e.ranges[static_cast<size_t>(r)];
    if (x.base_bytes != x.target_bytes || x.base_bytes == 0) {
      return bad(StrCat("range ", r, ": ", x.base_bytes, " base bytes against ", x.target_bytes,
                        " target bytes"));
    }
    if (x.base_offset < m.base_data_offset || !FitsIn(x.base_offset, x.base_bytes, m.base_size)) {
      return bad(StrCat("range ", r, " [", x.base_offset, ", +", x.base_bytes,
                        ") lies outside the base's data section"));
    }
    if (x.target_offset < m.target_data_offset ||
        !FitsIn(x.target_offset, x.target_bytes, m.target_size)) {
      return bad(StrCat("range ", r, " [", x.target_offset, ", +", x.target_bytes,
                        ") lies outside the target's data section"));
    }
    if (x.base_offset - m.base_data_offset != x.target_offset - m.target_data_offset) {
      return bad(StrCat("range ", r, " moves within the data section"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t DeltaEntry::base_bytes() const {
  uint64_t n = 0;
  for (int r = 0; r < range_count(); ++r) n += ranges[static_cast<size_t>(r)].base_bytes;
  return n;
}

uint64_t DeltaEntry::target_bytes() const {
  uint64_t n = 0;
  for (int r = 0; r < range_count(); ++r) n += ranges[static_cast<size_t>(r)].target_bytes;
  return n;
}

std::vector<uint8_t> SerializeDeltaPackage(const DeltaManifest& m, std::span<const uint8_t> payload,
                                           const SecretKey& key) {
  InitSodium();
  std::array<uint8_t, kDeltaHeaderBytes> header{};
  uint8_t* h = header.data();
  std::memcpy(h, kDeltaMagic, sizeof(kDeltaMagic));
  Put32(h + kVersionAt, kDeltaVersion);
  Put32(h + kEntryCountAt, static_cast<uint32_t>(m.entries.size()));
  Put64(h + kBaseSizeAt, m.base_size);
  std::memcpy(h + kBaseHashAt, m.base_hash.data(), m.base_hash.size());
  Put64(h + kTargetSizeAt, m.target_size);
  std::memcpy(h + kTargetHashAt, m.target_hash.data(), m.target_hash.size());
  Put64(h + kBaseDataAt, m.base_data_offset);
  Put64(h + kTargetDataAt, m.target_data_offset);
  Put64(h + kPayloadBytesAt, payload.size());
  std::vector<uint8_t> out(header.begin(), header.end());
  out.reserve(kDeltaHeaderBytes + m.entries.size() * kDeltaEntryBytes + payload.size() +
              kDeltaSignatureBytes);
  for (const DeltaEntry& e : m.entries) {
    std::array<uint8_t, kDeltaEntryBytes> entry{};
    uint8_t* p = entry.data();
    Put32(p, static_cast<uint32_t>(e.kind));
    Put32(p + 4, static_cast<uint32_t>(e.encoding));
    Put32(p + 8, static_cast<uint32_t>(e.layer));
    Put32(p + 12, static_cast<uint32_t>(e.expert));
    Put64(p + 16, e.old_checksum);
    Put64(p + 24, e.new_checksum);
    for (size_t r = 0; r < 3; ++r) {
      uint8_t* q = p + kRangesAt + r * kRangeBytes;
      Put64(q, e.ranges[r].base_offset);
      Put64(q + 8, e.ranges[r].base_bytes);
      Put64(q + 16, e.ranges[r].target_offset);
      Put64(q + 24, e.ranges[r].target_bytes);
    }
    Put64(p + kFrameAt, e.payload_offset);
    Put64(p + kFrameAt + 8, e.payload_bytes);
    out.insert(out.end(), entry.begin(), entry.end());
  }
  out.insert(out.end(), payload.begin(), payload.end());
  const auto digest = SignedDigest(out);
  std::array<uint8_t, kDeltaSignatureBytes> signature{};
  crypto_sign_detached(signature.data(), nullptr, digest.data(), digest.size(), key.data());
  out.insert(out.end(), signature.begin(), signature.end());
  return out;
}

absl::StatusOr<DeltaPackage> ParseDeltaPackage(std::span<const uint8_t> bytes,
                                               const PublicKey& key) {
  InitSodium();
  if (bytes.size() < kDeltaHeaderBytes ||
      std::memcmp(bytes.data(), kDeltaMagic, sizeof(kDeltaMagic)) != 0) {
    if (bytes.size() >= sizeof(kDeltaMagic) &&
        std::memcmp(bytes.data(), kDeltaMagic, sizeof(kDeltaMagic)) == 0) {
      return absl::DataLossError(StrCat("delta package truncated: ", bytes.size(),
                                        " bytes, shorter than its ", kDeltaHeaderBytes,
                                        "-byte header"));
    }
    return absl::InvalidArgumentError("not a moert delta package (no MOERTDLT magic)");
  }
  const uint8_t* h = bytes.data();
  const uint32_t version = Get32(h + kVersionAt);
  if (version != kDeltaVersion) {
    return absl::InvalidArgumentError(StrCat("delta package version ", version,
                                             ", this build reads version ", kDeltaVersion));
  }
  const uint32_t n_entries = Get32(h + kEntryCountAt);
  const uint64_t payload_bytes = Get64(h + kPayloadBytesAt);
  if (n_entries == 0 || n_entries > kDeltaMaxEntries) {
    return absl::InvalidArgumentError(
        StrCat("delta package: ", n_entries, " entries (1 .. ", kDeltaMaxEntries, ")"));
  }
  const uint64_t fixed = kDeltaHeaderBytes + uint64_t{n_entries} * kDeltaEntryBytes +
                         kDeltaSignatureBytes;
  if (!FitsIn(fixed, payload_bytes, uint64_t{1} << 62) || bytes.size() < fixed + payload_bytes) {
    return absl::DataLossError(StrCat("delta package truncated: ", bytes.size(),
                                      " bytes, its header says ", fixed, " + ", payload_bytes));
  }
  if (bytes.size() > fixed + payload_bytes) {
    return absl::InvalidArgumentError(StrCat("delta package: ", bytes.size() - fixed - payload_bytes,
                                             " bytes past its signature"));
  }
  const size_t signed_bytes = bytes.size() - kDeltaSignatureBytes;
  const auto digest = SignedDigest(bytes.subspan(0, signed_bytes));
  if (crypto_sign_verify_detached(bytes.data() + signed_bytes, digest.data(), digest.size(),
                                  key.data()) != 0) {
    return absl::PermissionDeniedError(
        "delta package signature does not verify with the given public key (another signer, "
        "or the package was changed after signing)");
  }

  DeltaPackage package;
  DeltaManifest& m = package.manifest;
  m.base_size = Get64(h + kBaseSizeAt);
  std::memcpy(m.base_hash.data(), h + kBaseHashAt, m.base_hash.size());
  m.target_size = Get64(h + kTargetSizeAt);
  std::memcpy(m.target_hash.data(), h + kTargetHashAt, m.target_hash.size());
  m.base_data_offset = Get64(h + kBaseDataAt);
  m.target_data_offset = Get64(h + kTargetDataAt);
  if (m.base_data_offset > m.base_size || m.target_data_offset > m.target_size ||
      m.base_size - m.base_data_offset != m.target_size - m.target_data_offset) {
    return absl::InvalidArgumentError(StrCat(
        "delta package: data sections differ (base ", m.base_size, " bytes from ",
        m.base_data_offset, ", target ", m.target_size, " from ", m.target_data_offset, ")"));
  }
  m.entries.resize(n_entries);
  for (size_t i = 0; i < n_entries; ++i) {
    const uint8_t* p = h + kDeltaHeaderBytes + i * kDeltaEntryBytes;
    DeltaEntry& e = m.entries[i];
    e.kind = static_cast<DeltaKind>(Get32(p));
    e.encoding = static_cast<DeltaEncoding>(Get32(p + 4));
    e.layer = static_cast<int32_t>(Get32(p + 8));
    e.expert = static_cast<int32_t>(Get32(p + 12));
    e.old_checksum = Get64(p + 16);
    e.new_checksum = Get64(p + 24);
    for (size_t r = 0; r < 3; ++r) {
      const uint8_t* q = p + kRangesAt + r * kRangeBytes;
      e.ranges[r] = {Get64(q), Get64(q + 8), Get64(q + 16), Get64(q + 24)};
    }
    e.payload_offset = Get64(p + kFrameAt);
    e.payload_bytes = Get64(p + kFrameAt + 8);
    MOERT_RETURN_IF_ERROR(CheckEntry(e, i, m, payload_bytes));
    if (i > 1) {
      const DeltaEntry& prev = m.entries[i - 1];
      if (std::pair(prev.layer, prev.expert) >= std::pair(e.layer, e.expert)) {
        return absl::InvalidArgumentError(StrCat(
            "delta package: entry ", i, ": expert (", e.layer, ", ", e.expert,
            ") is not after (", prev.layer, ", ", prev.expert, ")"));
      }
    }
  }
  // No two ranges write the same target bytes.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (size_t i = 1; i < m.entries.size(); ++i) {
    for (const DeltaRange& x : m.entries[i].ranges) spans.emplace_back(x.target_offset, x.target_bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i - 1].first + spans[i - 1].second > spans[i].first) {
      return absl::InvalidArgumentError(
          StrCat("delta package: expert ranges overlap at target offset ", spans[i].first));
    }
  }
  package.payload = bytes.subspan(kDeltaHeaderBytes + size_t{n_entries} * kDeltaEntryBytes,
                                  payload_bytes);
  return package;
}

KeyPair GenerateKeyPair() {
  InitSodium();
  KeyPair pair;
  crypto_sign_keypair(pair.public_key.data(), pair.secret_key.data());
  return pair;
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

namespace {

template <size_t N>
absl::StatusOr<std::array<uint8_t, N>> FromHex(std::string_view hex, std::string_view what) {
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' ')) {
    hex.remove_suffix(1);
  }
  std::array<uint8_t, N> out{};
  if (hex.size() != 2 * N) {
    return absl::InvalidArgumentError(
        StrCat(what, ": expected ", 2 * N, " hex digits, got ", hex.size(), " characters"));
  }
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < N; ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(StrCat(what, ": not a hex digit at ", 2 * i));
    }
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return out;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open key file '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<PublicKey> ParsePublicKey(std::string_view hex) {
  return FromHex<32>(hex, "Ed25519 public key");
}

absl::StatusOr<SecretKey> ParseSecretKey(std::string_view hex) {
  return FromHex<64>(hex, "Ed25519 secret key");
}

absl::StatusOr<PublicKey> ReadPublicKeyFile(const std::string& path) {
  MOERT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path));
  auto key = ParsePublicKey(text);
  if (!key.ok()) return absl::InvalidArgumentError(StrCat(path, ": ", key.status().message()));
  return key;
}

absl::StatusOr<SecretKey> ReadSecretKeyFile(const std::string& path) {
  MOERT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path));
  auto key = ParseSecretKey(text);
  if (!key.ok()) return absl::InvalidArgumentError(StrCat(path, ": ", key.status().message()));
  return key;
}

FileHash HashBytes(std::span<const uint8_t> bytes) {
  InitSodium();
  FileHash hash{};
  crypto_generichash(hash.data(), hash.size(), bytes.data(), bytes.size(), nullptr, 0);
  return hash;
}

FileHash HashMapped(const core::MappedFile& file) {
  InitSodium();
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, sizeof(FileHash));
  constexpr uint64_t kChunk = uint64_t{8} << 20;
  for (uint64_t at = 0; at < file.size(); at += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk, file.size() - at);
    crypto_generichash_update(&state, file.data() + at, n);
    file.DropPages(at, n);
  }
  FileHash hash{};
  crypto_generichash_final(&state, hash.data(), hash.size());
  return hash;
}

}  // namespace moert::experts
