// Device memory pressure: PSI, MemAvailable and the host's trim level (see device_memory.h).
#include "router/device_memory.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>
#include <utility>

namespace moert::router {
namespace {

// /proc/meminfo is about 1.5 KiB and MemAvailable sits near its top; the PSI file is two
// lines. A longer file is read only this far (what is cut off is not looked at).
constexpr size_t kMaxFileBytes = 16 << 10;

std::optional<std::string> ReadSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(kMaxFileBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return std::nullopt;
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// Calls `fn` with each line of `text` (without its '\n'), the last one even when unterminated.
template <typename Fn>
void ForEachLine(std::string_view text, Fn&& fn) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    fn(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// The next whitespace-separated token of `text` (removed from it); empty at the end.
std::string_view NextToken(std::string_view& text) {
  size_t begin = 0;
  while (begin < text.size() && IsSpace(text[begin])) ++begin;
  size_t end = begin;
  while (end < text.size() && !IsSpace(text[end])) ++end;
  const std::string_view token = text.substr(begin, end - begin);
  text.remove_prefix(end);
  return token;
}

// The whole of `s` as a number (no sign, spaces or trailing characters), else nullopt.
template <typename T>
std::optional<T> ParseNumber(std::string_view s) {
  T value{};
  if (s.empty() || s.front() == '-' || s.front() == '+') return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<float> ParsePercent(std::string_view s) {
  const std::optional<float> v = ParseNumber<float>(s);
  if (!v || !std::isfinite(*v) || *v < 0 || *v > 100) return std::nullopt;
  return v;
}

// "avg10=0.00 avg60=0.00 avg300=0.00 total=0" (after "some" or "full"). Keys the kernel
// may add later are skipped; a known key with a bad value, or no avg10, rejects the line.
std::optional<PsiLine> ParsePsiFields(std::string_view rest) {
  PsiLine line;
  bool has_avg10 = false;
  for (std::string_view token = NextToken(rest); !token.empty(); token = NextToken(rest)) {
    const size_t eq = token.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = token.substr(0, eq);
    const std::string_view value = token.substr(eq + 1);
    float* avg = key == "avg10"    ? &line.avg10
                 : key == "avg60"  ? &line.avg60
                 : key == "avg300" ? &line.avg300
                                   : nullptr;
    if (avg != nullptr) {
      const std::optional<float> v = ParsePercent(value);
      if (!v) return std::nullopt;
      *avg = *v;
      has_avg10 |= key == "avg10";
    } else if (key == "total") {
      const std::optional<uint64_t> v = ParseNumber<uint64_t>(value);
      if (!v) return std::nullopt;
      line.total_us = *v;
    }
  }
  if (!has_avg10) return std::nullopt;
  return line;
}

// 0 at or below `start`, 1 at or above `full`, linear between; NaN anywhere: 0.
float RampUp(float x, float start, float full) {
  if (!(x > start)) return 0.0f;
  if (!(full > start)) return 1.0f;
  return std::min(1.0f, (x - start) / (full - start));
}

float PsiPressure(const std::optional<PsiLine>& line, float start, float full) {
  return line ? RampUp(line->avg10, start, full) : 0.0f;
}

}  // namespace

TrimLevel TrimLevelFromAndroid(int android_level) {
  if (android_level >= 80) return TrimLevel::kComplete;
  if (android_level >= 40) return TrimLevel::kBackground;
  if (android_level >= 20) return TrimLevel::kUiHidden;
  if (android_level >= 15) return TrimLevel::kRunningCritical;
  if (android_level >= 10) return TrimLevel::kRunningLow;
  if (android_level >= 5) return TrimLevel::kRunningModerate;
  return TrimLevel::kNone;
}

std::optional<TrimLevel> TrimLevelFromInt(int value) {
  if (value < 0 || value >= kTrimLevelCount) return std::nullopt;
  return static_cast<TrimLevel>(value);
}

const char* TrimLevelName(TrimLevel level) {
  switch (level) {
    case TrimLevel::kNone: return "none";
    case TrimLevel::kRunningModerate: return "running-moderate";
    case TrimLevel::kRunningLow: return "running-low";
    case TrimLevel::kRunningCritical: return "running-critical";
    case TrimLevel::kUiHidden: return "ui-hidden";
    case TrimLevel::kBackground: return "background";
    case TrimLevel::kComplete: return "complete";
  }
  return "unknown";
}

float TrimLevelPressure(TrimLevel level) {
  switch (level) {
    case TrimLevel::kNone:
    case TrimLevel::kUiHidden: return 0.0f;
    case TrimLevel::kRunningModerate: return 0.25f;
    case TrimLevel::kRunningLow:
    case TrimLevel::kBackground: return 0.5f;
    case TrimLevel::kRunningCritical:
    case TrimLevel::kComplete: return 1.0f;
  }
  return 0.0f;
}

MemoryPsi ParseMemoryPsi(std::string_view text) {
  MemoryPsi psi;
  ForEachLine(text, [&](std::string_view rest) {
    const std::string_view kind = NextToken(rest);
    std::optional<PsiLine>* slot = kind == "some"   ? &psi.some
                                   : kind == "full" ? &psi.full
                                                    : nullptr;
    if (slot != nullptr && !slot->has_value()) *slot = ParsePsiFields(rest);
  });
  return psi;
}

MemInfo ParseMemInfo(std::string_view text) {
  MemInfo info;
  ForEachLine(text, [&](std::string_view line) {
    // "MemAvailable:    1234567 kB"
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    const std::string_view name = line.substr(0, colon);
    std::optional<uint64_t>* slot = name == "MemAvailable" ? &info.available_bytes
                                    : name == "MemTotal"   ? &info.total_bytes
                                                           : nullptr;
    if (slot == nullptr || slot->has_value()) return;
    std::string_view rest = line.substr(colon + 1);
    const std::optional<uint64_t> kib = ParseNumber<uint64_t>(NextToken(rest));
    if (!kib || NextToken(rest) != "kB" || !NextToken(rest).empty()) return;
    if (*kib > std::numeric_limits<uint64_t>::max() / 1024) return;
    *slot = *kib * 1024;
  });
  return info;
}

std::optional<float> DeviceMemoryReading::available_fraction() const {
  if (!meminfo.available_bytes || !meminfo.total_bytes || *meminfo.total_bytes == 0) {
    return std::nullopt;
  }
  const double f = static_cast<double>(*meminfo.available_bytes) /
                   static_cast<double>(*meminfo.total_bytes);
  return static_cast<float>(std::min(f, 1.0));
}

float DeviceMemoryPressure(const DeviceMemoryReading& reading, TrimLevel trim,
                           const DevicePressureThresholds& t) {
  float pressure = TrimLevelPressure(trim);
  pressure = std::max(pressure, PsiPressure(reading.psi.some, t.psi_some_start, t.psi_some_full));
  pressure = std::max(pressure, PsiPressure(reading.psi.full, t.psi_full_start, t.psi_full_full));
  if (const std::optional<float> f = reading.available_fraction()) {
    // Falling availability is rising pressure: the ramp on the negated fraction.
    pressure = std::max(pressure, RampUp(-*f, -t.available_start, -t.available_full));
  }
  return pressure;
}

DeviceMemoryReader::DeviceMemoryReader(std::string root, int poll_ms)
    : root_(std::move(root)), poll_(std::max(poll_ms, 0)) {}

const DeviceMemoryReading& DeviceMemoryReader::Read() {
  if (root_.empty()) return last_;
  const auto now = std::chrono::steady_clock::now();
  if (reads_ != 0 && now - last_read_ < poll_) return last_;
  const std::filesystem::path root(root_);
  const std::optional<std::string> psi = ReadSmallFile(root / "pressure" / "memory");
  const std::optional<std::string> meminfo = ReadSmallFile(root / "meminfo");
  last_.psi = psi ? ParseMemoryPsi(*psi) : MemoryPsi();
  last_.meminfo = meminfo ? ParseMemInfo(*meminfo) : MemInfo();
  last_read_ = now;
  ++reads_;
  return last_;
}

}  // namespace moert::router
