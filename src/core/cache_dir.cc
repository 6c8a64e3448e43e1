// The default cache directory and making one.
#include "core/cache_dir.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/strings.h"

namespace moert::core {

std::string DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] != '\0') {
    return StrCat(xdg, "/moert");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return StrCat(home, "/.cache/moert");
  }
  return "";
}

std::string CacheDirOr(const std::string& dir) { return dir.empty() ? DefaultCacheDir() : dir; }

absl::Status EnsureDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        StrCat("cannot make the cache directory ", dir, ": ", error.message()));
  }
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::FailedPreconditionError(StrCat("the cache directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace moert::core
