// Delta packages: the signed difference between two versions of a model file whose
// routed experts were retrained (docs/formats.md, "Delta packages"). A package turns
// the base file, byte for byte, into the target file: the target's header (its metadata:
// a changed modality bias, the experts' checksums) and each changed expert's three
// parts (a 2:4 sparse expert's mask lies in its W4S24 bytes) are zstd frames coded
// against the base's bytes of the same thing (zstd's --patch-from: the old bytes are
// the frame's prefix). The rest of the data section is copied from the base.
//
// Layout, little-endian: a 160-byte header, entry_count 144-byte entries, the payload,
// and a 64-byte Ed25519 signature over the BLAKE2b-512 of everything before it.
// Parse checks every field against the package's size and the base and target sizes
// before anything else reads them, so a truncated or crafted package is a Status.
#ifndef MOERT_EXPERTS_DELTA_PACKAGE_H_
#define MOERT_EXPERTS_DELTA_PACKAGE_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"

namespace moert::experts {

inline constexpr char kDeltaMagic[8] = {'M', 'O', 'E', 'R', 'T', 'D', 'L', 'T'};
inline constexpr uint32_t kDeltaVersion = 1;
inline constexpr size_t kDeltaHeaderBytes = 160;
inline constexpr size_t kDeltaEntryBytes = 144;
inline constexpr size_t kDeltaSignatureBytes = 64;
inline constexpr uint32_t kDeltaMaxEntries = 1u << 20;

using FileHash = std::array<uint8_t, 32>;      // BLAKE2b-256 of a whole file
using PublicKey = std::array<uint8_t, 32>;     // Ed25519
using SecretKey = std::array<uint8_t, 64>;     // Ed25519 (libsodium's seed + public key)

enum class DeltaKind : uint32_t {
  kHeader = 0,  // the target's bytes before its data section (one range)
  kExpert = 1,  // a routed expert's gate, up and down bytes (three ranges)
};
enum class DeltaEncoding : uint32_t {
  kZstdPatch = 1,  // a zstd frame whose prefix is the base's bytes of the same ranges
};

struct DeltaRange {
  uint64_t base_offset = 0;
  uint64_t base_bytes = 0;
  uint64_t target_offset = 0;
  uint64_t target_bytes = 0;
};

struct DeltaEntry {
  DeltaKind kind = DeltaKind::kExpert;
  DeltaEncoding encoding = DeltaEncoding::kZstdPatch;
  int32_t layer = -1;   // kExpert; -1 for kHeader
  int32_t expert = -1;
  // kExpert: ExpertChecksum (experts/checksum.h) of the base's and the target's parts;
  // kHeader: XXH64 of the ranges' bytes.
  uint64_t old_checksum = 0;
  uint64_t new_checksum = 0;
  std::array<DeltaRange, 3> ranges{};  // kHeader uses ranges[0] only
  int range_count() const { return kind == DeltaKind::kHeader ? 1 : 3; }
  uint64_t base_bytes() const;    // over the used ranges
  uint64_t target_bytes() const;
  // Where the entry's frame lies in the payload.
  uint64_t payload_offset = 0;
  uint64_t payload_bytes = 0;
};

struct DeltaManifest {
  uint64_t base_size = 0;
  FileHash base_hash{};
  uint64_t target_size = 0;
  FileHash target_hash{};
  uint64_t base_data_offset = 0;    // where the base's data section starts
  uint64_t target_data_offset = 0;  // and the target's (the data sections have one size)
  std::vector<DeltaEntry> entries;  // the header entry first, then experts by layer, index
};

// A parsed package: its manifest and a view of its payload (into the bytes parsed).
struct DeltaPackage {
  DeltaManifest manifest;
  std::span<const uint8_t> payload;
  std::span<const uint8_t> Frame(const DeltaEntry& entry) const {
    return payload.subspan(entry.payload_offset, entry.payload_bytes);
  }
};

// The package's bytes: header, entries, `payload` and the signature made with `key`.
std::vector<uint8_t> SerializeDeltaPackage(const DeltaManifest& manifest,
                                           std::span<const uint8_t> payload,
                                           const SecretKey& key);

// Checks and parses `bytes` (kept alive by the caller for the result's payload), in
// this order: InvalidArgument for a file that is not a delta package or has another
// version; DataLoss "truncated" when it is shorter than its header says;
// PermissionDenied when the signature does not verify with `key` (a package signed by
// someone else, or changed after signing); InvalidArgument naming the entry and field
// for an entry out of bounds (a range past the base or target, a frame past the
// payload, an unknown kind or encoding, ranges that overlap or leave the data sections
// unequal).
absl::StatusOr<DeltaPackage> ParseDeltaPackage(std::span<const uint8_t> bytes,
                                               const PublicKey& key);

// --- Keys and hashes (libsodium).
struct KeyPair {
  PublicKey public_key{};
  SecretKey secret_key{};
};
KeyPair GenerateKeyPair();
// Hex text of a key (64 or 128 digits); the inverse rejects anything else
// (InvalidArgument naming what was expected).
std::string ToHex(std::span<const uint8_t> bytes);
absl::StatusOr<PublicKey> ParsePublicKey(std::string_view hex);
absl::StatusOr<SecretKey> ParseSecretKey(std::string_view hex);
// The keys in files as moert-delta keygen writes them (hex and a newline); errors name
// the path.
absl::StatusOr<PublicKey> ReadPublicKeyFile(const std::string& path);
absl::StatusOr<SecretKey> ReadSecretKeyFile(const std::string& path);

// BLAKE2b-256 of `bytes`.
FileHash HashBytes(std::span<const uint8_t> bytes);
// BLAKE2b-256 of a mapped file's bytes, its pages dropped from the resident set as the
// hash passes them (core::MappedFile::DropPages), so hashing a model does not grow the
// process by the model's size.
FileHash HashMapped(const core::MappedFile& file);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_DELTA_PACKAGE_H_
