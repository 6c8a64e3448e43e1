// XXH64 (xxHash, 64-bit), written here so the expert checksums need no new
// dependency. An expert's checksum chains its three parts as they lie in the file:
// XXH64(down, seed = XXH64(up, seed = XXH64(gate, seed = 0))) (ExpertChecksum).
#ifndef MOERT_EXPERTS_CHECKSUM_H_
#define MOERT_EXPERTS_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace moert::experts {

// The XXH64 of `data` with `seed`, bit-identical to the reference implementation
// (xxhash.h's XXH64) on any byte order.
uint64_t XxHash64(std::span<const uint8_t> data, uint64_t seed = 0);

// XXH64 over bytes that arrive in pieces (an expert's chunks as its reads complete):
// Digest() is XxHash64 of everything Update was given so far, in order, however it was
// split.
class XxHash64Stream {
 public:
  explicit XxHash64Stream(uint64_t seed = 0);
  void Update(std::span<const uint8_t> data);
  uint64_t Digest() const;

 private:
  uint64_t seed_;
  uint64_t lanes_[4];
  uint64_t total_ = 0;   // bytes given so far
  uint8_t stripe_[32];   // the last stripe's bytes, not yet consumed
  size_t buffered_ = 0;  // how many of them
};

// The checksum of an expert whose gate, up and down bytes are the three spans.
uint64_t ExpertChecksum(std::span<const uint8_t> gate, std::span<const uint8_t> up,
                        std::span<const uint8_t> down);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_CHECKSUM_H_
