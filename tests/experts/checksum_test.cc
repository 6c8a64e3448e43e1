// XXH64 against the reference implementation's published values, and the expert
// checksum's chaining of the three parts.
#include "experts/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string_view>
#include <vector>

namespace moert::experts {
namespace {

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(XxHash64, ReferenceValues) {
  EXPECT_EQ(XxHash64(Bytes("")), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(XxHash64(Bytes("a")), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(XxHash64(Bytes("abc")), 0x44BC2CF5AD770999ULL);
  // 39 bytes: the 32-byte stripe loop, then 8-, 4- and 1-byte tails.
  EXPECT_EQ(XxHash64(Bytes("Nobody inspects the spammish repetition")), 0xFBCEA83C8A378BF1ULL);
}

TEST(XxHash64, SeedAndEveryByteMatter) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  const uint64_t h = XxHash64(data);
  EXPECT_NE(XxHash64(data, 1), h);
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{500}, size_t{999}}) {
    data[i] ^= 1;
    EXPECT_NE(XxHash64(data), h) << "byte " << i;
    data[i] ^= 1;
  }
  EXPECT_EQ(XxHash64(data), h);
}

TEST(XxHash64Stream, ReferenceValuesFedByteByByte) {
  const std::string_view text = "Nobody inspects the spammish repetition";
  XxHash64Stream stream;
  for (char c : text) stream.Update(Bytes(std::string_view(&c, 1)));
  EXPECT_EQ(stream.Digest(), 0xFBCEA83C8A378BF1ULL);
  EXPECT_EQ(XxHash64Stream().Digest(), 0xEF46DB3751D8E999ULL);
}

// Any split of the bytes gives the one-shot digest: pieces shorter than, equal to and
// longer than a stripe, landing on and off stripe boundaries, with a seed, and the
// digest read part-way does not disturb the stream.
TEST(XxHash64Stream, AnySplitGivesTheOneShotDigest) {
  std::vector<uint8_t> data(5000);
  uint32_t x = 12345;
  for (uint8_t& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  for (const size_t piece :
       {size_t{1}, size_t{7}, size_t{31}, size_t{32}, size_t{33}, size_t{100}, size_t{4096}}) {
    for (const uint64_t seed : {uint64_t{0}, uint64_t{0x9E3779B97F4A7C15ULL}}) {
      XxHash64Stream stream(seed);
      size_t at = 0;
      for (size_t step = 0; at < data.size(); ++step) {
        // Alternate the piece with a piece of 3 so the stripe offsets wander.
        const size_t n = std::min(step % 2 == 0 ? piece : size_t{3}, data.size() - at);
        stream.Update(std::span<const uint8_t>(data).subspan(at, n));
        at += n;
        if (at == 1000 || at == 1001) {
          EXPECT_EQ(stream.Digest(), XxHash64(std::span<const uint8_t>(data).first(at), seed));
        }
      }
      EXPECT_EQ(stream.Digest(), XxHash64(data, seed)) << "pieces of " << piece;
    }
  }
}

TEST(ExpertChecksum, ChainsThePartsInOrder) {
  const std::vector<uint8_t> a = {1, 2, 3}, b = {4, 5}, c = {6};
  EXPECT_EQ(ExpertChecksum(a, b, c), XxHash64(c, XxHash64(b, XxHash64(a, 0))));
  EXPECT_NE(ExpertChecksum(a, b, c), ExpertChecksum(b, a, c));
}

}  // namespace
}  // namespace moert::experts
