// XXH64 after the xxHash specification (doc/xxhash_spec.md in the xxHash repository):
// four 64-bit lanes over 32-byte stripes, then the tail, then the avalanche.
#include "experts/checksum.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace moert::experts {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

// The format is little-endian whatever the host.
uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}

uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = std::rotl(acc, 31);
  return acc * kPrime1;
}

uint64_t MergeRound(uint64_t acc, uint64_t lane) {
  acc ^= Round(0, lane);
  return acc * kPrime1 + kPrime4;
}

// The four lanes of a stream with `seed`.
void InitLanes(uint64_t seed, uint64_t* v) {
  v[0] = seed + kPrime1 + kPrime2;
  v[1] = seed + kPrime2;
  v[2] = seed;
  v[3] = seed - kPrime1;
}

// Consumes whole 32-byte stripes from p while at least 32 bytes are left before end;
// returns where it stopped.
const uint8_t* Stripes(uint64_t* v, const uint8_t* p, const uint8_t* end) {
  if (end - p < 32) return p;
  uint64_t v1 = v[0], v2 = v[1], v3 = v[2], v4 = v[3];
  const uint8_t* const limit = end - 32;
  do {
    v1 = Round(v1, Read64(p));
    v2 = Round(v2, Read64(p + 8));
    v3 = Round(v3, Read64(p + 16));
    v4 = Round(v4, Read64(p + 24));
    p += 32;
  } while (p <= limit);
  v[0] = v1;
  v[1] = v2;
  v[2] = v3;
  v[3] = v4;
  return p;
}

// The digest of `total` bytes: the lanes (when there were at least 32 bytes) or the
// seed, then the tail [p, end) of fewer than 32 bytes, then the avalanche.
uint64_t Finish(const uint64_t* v, uint64_t seed, uint64_t total, const uint8_t* p,
                const uint8_t* end) {
  uint64_t h;
  if (total >= 32) {
    h = std::rotl(v[0], 1) + std::rotl(v[1], 7) + std::rotl(v[2], 12) + std::rotl(v[3], 18);
    for (int i = 0; i < 4; ++i) h = MergeRound(h, v[i]);
  } else {
    h = seed + kPrime5;
  }
  h += total;
  for (; end - p >= 8; p += 8) {
    h ^= Round(0, Read64(p));
    h = std::rotl(h, 27) * kPrime1 + kPrime4;
  }
  if (end - p >= 4) {
    h ^= static_cast<uint64_t>(Read32(p)) * kPrime1;
    h = std::rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) {
    h ^= static_cast<uint64_t>(*p) * kPrime5;
    h = std::rotl(h, 11) * kPrime1;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t XxHash64(std::span<const uint8_t> data, uint64_t seed) {
  uint64_t v[4];
  InitLanes(seed, v);
  const uint8_t* const end = data.data() + data.size();
  const uint8_t* p = Stripes(v, data.data(), end);
  return Finish(v, seed, data.size(), p, end);
}

XxHash64Stream::XxHash64Stream(uint64_t seed) : seed_(seed) { InitLanes(seed, lanes_); }

void XxHash64Stream::Update(std::span<const uint8_t> data) {
  const uint8_t* p = data.data();
  const uint8_t* const end = p + data.size();
  total_ += data.size();
  if (buffered_ > 0) {
    const size_t take = std::min<size_t>(32 - buffered_, data.size());
    std::memcpy(stripe_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    if (buffered_ < 32) return;
    Stripes(lanes_, stripe_, stripe_ + 32);
    buffered_ = 0;
  }
  p = Stripes(lanes_, p, end);
  buffered_ = static_cast<size_t>(end - p);
  if (buffered_ > 0) std::memcpy(stripe_, p, buffered_);
}

uint64_t XxHash64Stream::Digest() const {
  return Finish(lanes_, seed_, total_, stripe_, stripe_ + buffered_);
}

uint64_t ExpertChecksum(std::span<const uint8_t> gate, std::span<const uint8_t> up,
                        std::span<const uint8_t> down) {
  return XxHash64(down, XxHash64(up, XxHash64(gate, 0)));
}

}  // namespace moert::experts
