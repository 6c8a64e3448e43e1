// Reading a mapping whose file changed underneath it: core::CopyFromMapping and
// MappedFile::CopyOut answer a truncated file's vanished pages with false / DataLoss
// instead of SIGBUS (from several threads at once too), a fault outside a guarded copy
// still goes to the handler that was there before (or kills the process), and
// CheckUnchanged names each kind of change.
#include "core/guarded_copy.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/file_identity.h"
#include "core/mapped_file.h"

namespace moert::core {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(getpid()) + "." +
           std::to_string(::testing::UnitTest::GetInstance()->random_seed())))
      .string();
}

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// A file of `pages` pages, page p filled with byte p + 1.
void WritePages(const std::string& path, size_t pages) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (size_t p = 0; p < pages; ++p) out << std::string(Page(), static_cast<char>(p + 1));
}

TEST(GuardedCopy, TruncatedMappingIsAnErrorNotSigbus) {
  const std::string path = TempPath("moert_guarded_truncated");
  WritePages(path, 4);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::filesystem::resize_file(path, Page());  // pages 1..3 are gone

  std::vector<uint8_t> buf(2 * Page());
  EXPECT_FALSE(CopyFromMapping(buf.data(), (*file)->data() + 2 * Page(), Page()));
  // The page that is still there reads as before, and so does the next copy.
  ASSERT_TRUE(CopyFromMapping(buf.data(), (*file)->data(), Page()));
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[Page() - 1], 1);

  const absl::Status s = (*file)->CopyOut(Page() / 2, {buf.data(), Page()});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("SIGBUS"), std::string::npos) << s;
  EXPECT_NE(s.message().find("file offset " + std::to_string(Page() / 2)), std::string::npos) << s;
  const absl::Status outside = (*file)->CopyOut(4 * Page() - 1, {buf.data(), 2});
  EXPECT_EQ(outside.code(), absl::StatusCode::kDataLoss) << outside;

  // Put back: the mapping's pages are the file's again.
  WritePages(path, 4);
  ASSERT_TRUE((*file)->CopyOut(3 * Page(), {buf.data(), Page()}).ok());
  EXPECT_EQ(buf[0], 4);
  std::remove(path.c_str());
}

TEST(GuardedCopy, ThreadsFaultingAtOnceEachGetTheirOwnAnswer) {
  const std::string path = TempPath("moert_guarded_threads");
  WritePages(path, 8);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::filesystem::resize_file(path, 4 * Page());
  std::vector<int> wrong(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> buf(Page());
      for (int i = 0; i < 200; ++i) {
        const size_t page = static_cast<size_t>((t + i) % 8);
        const bool ok = CopyFromMapping(buf.data(), (*file)->data() + page * Page(), Page());
        if (ok != (page < 4) || (ok && buf[0] != page + 1)) ++wrong[static_cast<size_t>(t)];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(wrong[static_cast<size_t>(t)], 0) << "thread " << t;
  std::remove(path.c_str());
}

// Maps a file of two pages, truncates it to one and returns the vanished page.
const volatile uint8_t* VanishedPage(const std::string& path, std::unique_ptr<MappedFile>* file) {
  WritePages(path, 2);
  *file = std::move(*MappedFile::Open(path));
  std::filesystem::resize_file(path, Page());
  return (*file)->data() + Page();
}

// A threadsafe death test's child execs the test binary again, which a user-mode
// emulator without binfmt_misc cannot (the aarch64 tests under qemu-aarch64: the
// toolchain file sets MOERT_TEST_EMULATED). The "fast" style would fork instead, but
// then a guard installed earlier in the process would stand before the child's handler.
#define SKIP_WHERE_A_CHILD_CANNOT_REEXEC()                                              \
  do {                                                                                  \
    if (const char* emulator = std::getenv("MOERT_TEST_EMULATED")) {                    \
      GTEST_SKIP() << "under " << emulator << " a death test's child cannot exec the " \
                   << "test binary again";                                              \
    }                                                                                   \
  } while (false)

void TouchAfterAGuardedCopy(const volatile uint8_t* gone) {
  std::vector<uint8_t> buf(Page());
  if (CopyFromMapping(buf.data(), const_cast<const uint8_t*>(gone), Page())) std::abort();
  (void)*gone;  // outside any guarded copy
}

TEST(GuardedCopyDeathTest, AFaultOutsideAGuardedCopyStillKills) {
  SKIP_WHERE_A_CHILD_CANNOT_REEXEC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TempPath("moert_guarded_death");
  std::unique_ptr<MappedFile> file;
  const volatile uint8_t* gone = VanishedPage(path, &file);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_DEATH(TouchAfterAGuardedCopy(gone), "");  // AddressSanitizer's handler reports it
#else
  EXPECT_EXIT(TouchAfterAGuardedCopy(gone), ::testing::KilledBySignal(SIGBUS), "");
#endif
  std::remove(path.c_str());
}

void ExitThree(int, siginfo_t*, void*) {
  static const char kSaid[] = "the previous handler\n";
  (void)!::write(2, kSaid, sizeof(kSaid) - 1);
  ::_exit(3);
}

TEST(GuardedCopyDeathTest, AFaultOutsideGoesToThePreviousHandler) {
  SKIP_WHERE_A_CHILD_CANNOT_REEXEC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TempPath("moert_guarded_chain");
  std::unique_ptr<MappedFile> file;
  const volatile uint8_t* gone = VanishedPage(path, &file);
  // In the child, before the first guarded copy installs the guard's handler.
  const auto run = [gone] {
    struct sigaction action {};
    action.sa_sigaction = ExitThree;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
    TouchAfterAGuardedCopy(gone);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(3), "the previous handler");
  std::remove(path.c_str());
}

TEST(FileIdentity, CheckUnchangedNamesWhatChanged) {
  const std::string path = TempPath("moert_identity");
  WritePages(path, 2);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const FileIdentity was = IdentityFromStat(st);
  EXPECT_TRUE(CheckUnchanged(path, was).ok());

  std::filesystem::resize_file(path, Page());
  absl::Status s = CheckUnchanged(path, was);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("is " + std::to_string(Page()) + " bytes now"), std::string::npos)
      << s;

  // Same size again, but written: the modification time says so.
  WritePages(path, 2);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  FileIdentity rewritten = IdentityFromStat(st);
  rewritten.mtime_ns = was.mtime_ns - 1;
  s = CheckUnchanged(path, rewritten);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("written to"), std::string::npos) << s;

  const std::string other = path + ".other";
  WritePages(other, 2);
  std::filesystem::rename(other, path);
  s = CheckUnchanged(path, was);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("another file"), std::string::npos) << s;

  std::remove(path.c_str());
  s = CheckUnchanged(path, was);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cannot be opened"), std::string::npos) << s;
}

}  // namespace
}  // namespace moert::core
