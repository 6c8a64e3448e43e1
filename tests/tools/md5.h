// MD5 (RFC 1321) for tests that check a written file against a published md5sum, such
// as the MiniCPM-V oracle pair of ../shared/mmproj/SPEC.md. Streams: a file is hashed a
// chunk at a time. Not for security.
#ifndef MOERT_TESTS_TOOLS_MD5_H_
#define MOERT_TESTS_TOOLS_MD5_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace moert::test_util {

class Md5 {
 public:
  void Update(std::span<const uint8_t> bytes) {
    length_ += bytes.size();
    while (!bytes.empty()) {
      if (fill_ == 0 && bytes.size() >= 64) {
        Transform(bytes.data());
        bytes = bytes.subspan(64);
        continue;
      }
      block_[fill_++] = bytes[0];
      bytes = bytes.subspan(1);
      if (fill_ == 64) {
        Transform(block_.data());
        fill_ = 0;
      }
    }
  }

  // The digest as 32 lowercase hex digits, as md5sum prints it. Call once.
  std::string HexDigest() {
    const uint64_t bits = length_ * 8;
    const uint8_t pad = 0x80;
    Update(std::span(&pad, 1));
    const uint8_t zero = 0;
    while (fill_ != 56) Update(std::span(&zero, 1));
    for (int i = 0; i < 8; ++i) block_[56 + i] = static_cast<uint8_t>(bits >> (8 * i));
    Transform(block_.data());
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    for (uint32_t word : state_) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t b = static_cast<uint8_t>(word >> (8 * i));
        out += kHex[b >> 4];
        out += kHex[b & 15];
      }
    }
    return out;
  }

 private:
  static uint32_t Rotl(uint32_t x, uint32_t c) { return (x << c) | (x >> (32 - c)); }

  // One 64-byte block.
  void Transform(const uint8_t* block) {
    static constexpr uint32_t kShift[64] = {
        7,  12, 17, 22, 7,  12, 17, 22, 7,  12, 17, 22, 7,  12, 17, 22, 5,  9,  14, 20, 5,  9,
        14, 20, 5,  9,  14, 20, 5,  9,  14, 20, 4,  11, 16, 23, 4,  11, 16, 23, 4,  11, 16, 23,
        4,  11, 16, 23, 6,  10, 15, 21, 6,  10, 15, 21, 6,  10, 15, 21, 6,  10, 15, 21};
    static constexpr uint32_t kSine[64] = {
        0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
        0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
        0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
        0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
        0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
        0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
        0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
        0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
        0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
        0xeb86d391};
    uint32_t m[16];
    for (int i = 0; i < 16; ++i) {
      m[i] = static_cast<uint32_t>(block[4 * i]) | (static_cast<uint32_t>(block[4 * i + 1]) << 8) |
             (static_cast<uint32_t>(block[4 * i + 2]) << 16) |
             (static_cast<uint32_t>(block[4 * i + 3]) << 24);
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    for (uint32_t i = 0; i < 64; ++i) {
      uint32_t f;
      uint32_t g;
      if (i < 16) {
        f = (b & c) | (~b & d);
        g = i;
      } else if (i < 32) {
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
      } else if (i < 48) {
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
      } else {
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
      }
      const uint32_t next = b + Rotl(a + f + kSine[i] + m[g], kShift[i]);
      a = d;
      d = c;
      c = b;
      b = next;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
  }

  std::array<uint32_t, 4> state_ = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  std::array<uint8_t, 64> block_{};
  size_t fill_ = 0;
  uint64_t length_ = 0;
};

// The md5 of the file at `path`, or nullopt when it cannot be read.
inline std::optional<std::string> Md5File(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (file == nullptr) return std::nullopt;
  Md5 md5;
  std::vector<uint8_t> buffer(size_t{1} << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) {
    md5.Update(std::span(buffer).first(n));
  }
  if (std::ferror(file.get())) return std::nullopt;
  return md5.HexDigest();
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_TOOLS_MD5_H_
