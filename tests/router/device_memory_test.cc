// Device memory pressure (router/device_memory.h): PSI and meminfo parsing of good,
// garbled and truncated text, the file reader's rate limit and tolerance of missing
// files, Android's trim levels, and the mapping of the readings to a pressure.
#include "router/device_memory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "router/temp_dir.h"

namespace moert::router {
namespace {

constexpr char kPsi[] =
    "some avg10=1.53 avg60=0.87 avg300=0.20 total=123456\n"
    "full avg10=0.50 avg60=0.10 avg300=0.00 total=4567\n";

constexpr char kMemInfo[] =
    "MemTotal:       16318480 kB\n"
    "MemFree:         1203004 kB\n"
    "MemAvailable:    8159240 kB\n"
    "Buffers:          402512 kB\n"
    "HugePages_Total:       0\n";

TEST(DeviceMemoryTest, ParsesTheKernelsPsiLines) {
  const MemoryPsi psi = ParseMemoryPsi(kPsi);
  ASSERT_TRUE(psi.some.has_value());
  EXPECT_FLOAT_EQ(psi.some->avg10, 1.53f);
  EXPECT_FLOAT_EQ(psi.some->avg60, 0.87f);
  EXPECT_FLOAT_EQ(psi.some->avg300, 0.20f);
  EXPECT_EQ(psi.some->total_us, 123456u);
  ASSERT_TRUE(psi.full.has_value());
  EXPECT_FLOAT_EQ(psi.full->avg10, 0.5f);
  EXPECT_EQ(psi.full->total_us, 4567u);

  // No "full" line, no final newline, a key a later kernel might add.
  const MemoryPsi some_only = ParseMemoryPsi("some avg10=12.00 avg60=3 avg300=1 total=9 new=x");
  ASSERT_TRUE(some_only.some.has_value());
  EXPECT_FLOAT_EQ(some_only.some->avg10, 12.0f);
  EXPECT_FALSE(some_only.full.has_value());
}

TEST(DeviceMemoryTest, GarbledPsiLinesAreUnknown) {
  for (const char* line : {
           "some avg10=abc avg60=0.00 avg300=0.00 total=0",
           "some avg10=150.00 avg60=0.00 avg300=0.00 total=0",  // above 100%
           "some avg10=-1.00 avg60=0.00 avg300=0.00 total=0",
           "some avg10=nan avg60=0.00 avg300=0.00 total=0",
           "some avg10=inf",
           "some avg10=1e3",
           "some avg10=",
           "some avg10=1.0x",
           "some avg10 1.0",
           "some avg60=1.00 avg300=0.00 total=0",  // no avg10
           "some",
           "some avg10=1.00 total=-5",
           "some avg10=1.00 total=99999999999999999999999",
           "some avg10=1.00 avg6",  // truncated inside a key
       }) {
    EXPECT_FALSE(ParseMemoryPsi(line).some.has_value()) << line;
  }
  EXPECT_FALSE(ParseMemoryPsi("").some.has_value());
  EXPECT_FALSE(ParseMemoryPsi("Some avg10=1.00\nfulll avg10=1.00").full.has_value());
  // A garbled line does not spoil the other.
  const MemoryPsi half = ParseMemoryPsi("some avg10=?\nfull avg10=2.5 avg60=0 avg300=0 total=1\n");
  EXPECT_FALSE(half.some.has_value());
  ASSERT_TRUE(half.full.has_value());
  EXPECT_FLOAT_EQ(half.full->avg10, 2.5f);
}

TEST(DeviceMemoryTest, ParsesMemInfoInBytes) {
  const MemInfo info = ParseMemInfo(kMemInfo);
  EXPECT_EQ(info.total_bytes, uint64_t{16318480} * 1024);
  EXPECT_EQ(info.available_bytes, uint64_t{8159240} * 1024);
  DeviceMemoryReading reading;
  reading.meminfo = info;
  ASSERT_TRUE(reading.available_fraction().has_value());
  EXPECT_NEAR(*reading.available_fraction(), 0.5f, 1e-6f);

  // Kernels before 3.14 have no MemAvailable: the fraction is unknown.
  reading.meminfo = ParseMemInfo("MemTotal:       16318480 kB\nMemFree: 100 kB\n");
  EXPECT_FALSE(reading.meminfo.available_bytes.has_value());
  EXPECT_FALSE(reading.available_fraction().has_value());
  reading.meminfo = ParseMemInfo("MemTotal: 0 kB\nMemAvailable: 0 kB\n");
  EXPECT_FALSE(reading.available_fraction().has_value());
  // More available than total (a racy kernel): capped at 1.
  reading.meminfo = ParseMemInfo("MemTotal: 10 kB\nMemAvailable: 20 kB\n");
  EXPECT_EQ(reading.available_fraction(), 1.0f);
}

TEST(DeviceMemoryTest, GarbledMemInfoLinesAreUnknown) {
  for (const char* line : {
           "MemAvailable: 12x kB",
           "MemAvailable: 123",  // no unit
           "MemAvailable: 123 MB",
           "MemAvailable: 123 kB extra",
           "MemAvailable: -5 kB",
           "MemAvailable: kB",
           "MemAvailable:",
           "MemAvailable 123 kB",
           "MemAvailable: 99999999999999999999999 kB",
           "MemAvailable: 18446744073709551615 kB",  // fits 64 bits, not in bytes
       }) {
    EXPECT_FALSE(ParseMemInfo(line).available_bytes.has_value()) << line;
  }
  // The first of two lines counts; a truncated file keeps what came before the cut.
  const MemInfo twice = ParseMemInfo("MemAvailable: 1 kB\nMemAvailable: 2 kB\nMemTotal:  16");
  EXPECT_EQ(twice.available_bytes, 1024u);
  EXPECT_EQ(twice.total_bytes, std::nullopt);
}

TEST(DeviceMemoryTest, MutatedFilesNeverYieldOutOfRangeReadings) {
  // A fuzz-style sweep: truncations, flipped and inserted bytes of both files.
  std::mt19937 rng(17);
  const std::string psi_text = kPsi;
  const std::string meminfo_text = kMemInfo;
  for (int trial = 0; trial < 4000; ++trial) {
    std::string psi = psi_text, meminfo = meminfo_text;
    for (std::string* text : {&psi, &meminfo}) {
      switch (rng() % 3) {
        case 0: text->resize(rng() % (text->size() + 1)); break;
        case 1: (*text)[rng() % text->size()] = static_cast<char>(rng()); break;
        default: text->insert(rng() % text->size(), 1, static_cast<char>(rng())); break;
      }
    }
    DeviceMemoryReading reading;
    reading.psi = ParseMemoryPsi(psi);
    reading.meminfo = ParseMemInfo(meminfo);
    for (const auto& line : {reading.psi.some, reading.psi.full}) {
      if (!line) continue;
      for (float v : {line->avg10, line->avg60, line->avg300}) {
        ASSERT_TRUE(v >= 0 && v <= 100) << psi;
      }
    }
    if (const std::optional<float> f = reading.available_fraction()) {
      ASSERT_TRUE(*f >= 0 && *f <= 1) << meminfo;
    }
    const float pressure =
        DeviceMemoryPressure(reading, static_cast<TrimLevel>(trial % kTrimLevelCount));
    ASSERT_TRUE(pressure >= 0 && pressure <= 1) << psi << meminfo;
  }
}

TEST(DeviceMemoryTest, AndroidTrimLevelsMapToTheNextLowerKnownLevel) {
  EXPECT_EQ(TrimLevelFromAndroid(-1), TrimLevel::kNone);
  EXPECT_EQ(TrimLevelFromAndroid(0), TrimLevel::kNone);
  EXPECT_EQ(TrimLevelFromAndroid(5), TrimLevel::kRunningModerate);
  EXPECT_EQ(TrimLevelFromAndroid(7), TrimLevel::kRunningModerate);
  EXPECT_EQ(TrimLevelFromAndroid(10), TrimLevel::kRunningLow);
  EXPECT_EQ(TrimLevelFromAndroid(15), TrimLevel::kRunningCritical);
  EXPECT_EQ(TrimLevelFromAndroid(20), TrimLevel::kUiHidden);
  EXPECT_EQ(TrimLevelFromAndroid(40), TrimLevel::kBackground);
  EXPECT_EQ(TrimLevelFromAndroid(60), TrimLevel::kBackground);
  EXPECT_EQ(TrimLevelFromAndroid(80), TrimLevel::kComplete);
  EXPECT_EQ(TrimLevelFromAndroid(1000), TrimLevel::kComplete);

  std::set<std::string> names;
  for (int i = 0; i < kTrimLevelCount; ++i) {
    ASSERT_EQ(TrimLevelFromInt(i), static_cast<TrimLevel>(i));
    names.insert(TrimLevelName(static_cast<TrimLevel>(i)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kTrimLevelCount));
  EXPECT_EQ(TrimLevelFromInt(-1), std::nullopt);
  EXPECT_EQ(TrimLevelFromInt(kTrimLevelCount), std::nullopt);
  EXPECT_EQ(TrimLevelName(TrimLevel::kRunningCritical), std::string("running-critical"));
}

DeviceMemoryReading Reading(std::optional<float> some, std::optional<float> full,
                            std::optional<float> available_fraction) {
  DeviceMemoryReading r;
  if (some) r.psi.some = PsiLine{*some, 0, 0, 0};
  if (full) r.psi.full = PsiLine{*full, 0, 0, 0};
  if (available_fraction) {
    r.meminfo.total_bytes = uint64_t{1} << 30;
    r.meminfo.available_bytes = static_cast<uint64_t>(*available_fraction * (1 << 30));
  }
  return r;
}

TEST(DeviceMemoryTest, PressureIsZeroOnTheQuietSideOfEveryThreshold) {
  constexpr TrimLevel kNone = TrimLevel::kNone;
  EXPECT_EQ(DeviceMemoryPressure(DeviceMemoryReading(), kNone), 0.0f);  // all unknown
  EXPECT_EQ(DeviceMemoryPressure(Reading(0, 0, 0.75f), kNone), 0.0f);
  EXPECT_EQ(DeviceMemoryPressure(Reading(10, 5, 0.10f), kNone), 0.0f);  // at the starts
  EXPECT_EQ(DeviceMemoryPressure(Reading(0, 0, 0.75f), TrimLevel::kUiHidden), 0.0f);
}

TEST(DeviceMemoryTest, EachSourceRampsToFullPressureAndTheLargestCounts) {
  constexpr TrimLevel kNone = TrimLevel::kNone;
  // PSI some: 10% -> 0, 50% -> 1.
  EXPECT_FLOAT_EQ(DeviceMemoryPressure(Reading(30, std::nullopt, std::nullopt), kNone), 0.5f);
  EXPECT_EQ(DeviceMemoryPressure(Reading(50, std::nullopt, std::nullopt), kNone), 1.0f);
  EXPECT_EQ(DeviceMemoryPressure(Reading(90, std::nullopt, std::nullopt), kNone), 1.0f);
  // PSI full: 5% -> 0, 25% -> 1.
  EXPECT_FLOAT_EQ(DeviceMemoryPressure(Reading(std::nullopt, 15, std::nullopt), kNone), 0.5f);
  // MemAvailable: 10% of MemTotal -> 0, 2% -> 1.
  EXPECT_NEAR(DeviceMemoryPressure(Reading(std::nullopt, std::nullopt, 0.06f), kNone), 0.5f,
              1e-5f);
  EXPECT_EQ(DeviceMemoryPressure(Reading(std::nullopt, std::nullopt, 0.01f), kNone), 1.0f);
  // Trim levels alone.
  EXPECT_EQ(DeviceMemoryPressure({}, TrimLevel::kRunningModerate), 0.25f);
  EXPECT_EQ(DeviceMemoryPressure({}, TrimLevel::kRunningLow), 0.5f);
  EXPECT_EQ(DeviceMemoryPressure({}, TrimLevel::kRunningCritical), 1.0f);
  EXPECT_EQ(DeviceMemoryPressure({}, TrimLevel::kBackground), 0.5f);
  EXPECT_EQ(DeviceMemoryPressure({}, TrimLevel::kComplete), 1.0f);
  // The largest of the sources.
  EXPECT_FLOAT_EQ(DeviceMemoryPressure(Reading(20, 15, 0.5f), TrimLevel::kRunningModerate), 0.5f);
  EXPECT_FLOAT_EQ(DeviceMemoryPressure(Reading(20, 0, 0.5f), TrimLevel::kRunningLow), 0.5f);
  EXPECT_FLOAT_EQ(DeviceMemoryPressure(Reading(20, 0, 0.5f), kNone), 0.25f);

  // Thresholds are the caller's; a start at or past its full point is a step.
  DevicePressureThresholds step;
  step.psi_some_start = step.psi_some_full = 20;
  EXPECT_EQ(DeviceMemoryPressure(Reading(20, std::nullopt, std::nullopt), kNone, step), 0.0f);
  EXPECT_EQ(DeviceMemoryPressure(Reading(20.5f, std::nullopt, std::nullopt), kNone, step), 1.0f);
  DevicePressureThresholds nan;
  nan.psi_some_start = std::nanf("");
  EXPECT_EQ(DeviceMemoryPressure(Reading(90, std::nullopt, std::nullopt), kNone, nan), 0.0f);
}

TEST(DeviceMemoryReaderTest, ReadsBothFilesAndToleratesMissingOnes) {
  TempDir dir;
  WriteFile(dir.path() / "pressure/memory", kPsi);
  WriteFile(dir.path() / "meminfo", kMemInfo);
  DeviceMemoryReader reader(dir.path().string(), 0);
  const DeviceMemoryReading& r = reader.Read();
  ASSERT_TRUE(r.psi.some.has_value());
  EXPECT_FLOAT_EQ(r.psi.some->avg10, 1.53f);
  EXPECT_EQ(r.meminfo.available_bytes, uint64_t{8159240} * 1024);

  // No PSI (a kernel without CONFIG_PSI), meminfo a folder (unreadable): both unknown.
  std::filesystem::remove(dir.path() / "pressure/memory");
  std::filesystem::remove(dir.path() / "meminfo");
  std::filesystem::create_directories(dir.path() / "meminfo");
  const DeviceMemoryReading& gone = reader.Read();
  EXPECT_FALSE(gone.psi.some.has_value());
  EXPECT_FALSE(gone.meminfo.available_bytes.has_value());
  EXPECT_EQ(reader.reads(), 2u);

  DeviceMemoryReader nowhere((dir.path() / "nothing").string(), 0);
  EXPECT_FALSE(nowhere.Read().psi.some.has_value());
  DeviceMemoryReader off("", 0);  // empty root: nothing is read at all
  EXPECT_FALSE(off.Read().meminfo.total_bytes.has_value());
  EXPECT_EQ(off.reads(), 0u);
}

TEST(DeviceMemoryReaderTest, ReadsTheFilesAtMostOncePerPollInterval) {
  TempDir dir;
  WriteFile(dir.path() / "pressure/memory", kPsi);
  DeviceMemoryReader hourly(dir.path().string(), 3600 * 1000);
  DeviceMemoryReader always(dir.path().string(), 0);
  EXPECT_FLOAT_EQ(hourly.Read().psi.some->avg10, 1.53f);
  EXPECT_FLOAT_EQ(always.Read().psi.some->avg10, 1.53f);
  WriteFile(dir.path() / "pressure/memory", "some avg10=42.00 avg60=0 avg300=0 total=1\n");
  for (int i = 0; i < 5; ++i) {
    EXPECT_FLOAT_EQ(hourly.Read().psi.some->avg10, 1.53f);  // the last reading, not the file
    EXPECT_FLOAT_EQ(always.Read().psi.some->avg10, 42.0f);
  }
  EXPECT_EQ(hourly.reads(), 1u);
  EXPECT_EQ(always.reads(), 6u);
}

}  // namespace
}  // namespace moert::router
