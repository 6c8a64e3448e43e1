// XXH64 (xxHash, 64-bit), written here so the expert checksums need no new
// dependency. An expert's checksum chains its three parts as they lie in the file:
// XXH64(down, seed = XXH64(up, seed = XXH64(gate, seed = 0))) (ExpertChecksum).
#ifndef MOERT_EXPERTS_CHECKSUM_H_
#define MOERT_EXPERTS_CHECKSUM_H_

#include <cstdint>
#include <span>

namespace moert::experts {

// The XXH64 of `data` with `seed`, bit-identical to the reference implementation
// (xxhash.h's XXH64) on any byte order.
uint64_t XxHash64(std::span<const uint8_t> data, uint64_t seed = 0);

// The checksum of an expert whose gate, up and down bytes are the three spans.
uint64_t ExpertChecksum(std::span<const uint8_t> gate, std::span<const uint8_t> up,
                        std::span<const uint8_t> down);

}  // namespace moert::experts

#endif  // MOERT_EXPERTS_CHECKSUM_H_
