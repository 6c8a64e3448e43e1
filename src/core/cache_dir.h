// Where moert writes the files it keeps between runs (the hot set, OpenCL program
// binaries; later repro bundles and metrics): one cache directory the app gives
// (RuntimeOptions::cache_dir; on Android the app's getCacheDir()), else the user's
// cache directory on a desktop. Never beside the model: a phone's model directory is
// read-only, and a shared model must not change under another user.
#ifndef MOERT_CORE_CACHE_DIR_H_
#define MOERT_CORE_CACHE_DIR_H_

#include <string>

#include "absl/status/status.h"

namespace moert::core {

// $XDG_CACHE_HOME/moert, else $HOME/.cache/moert; empty when neither is set (an
// Android app's process, where the app must give its cache directory).
std::string DefaultCacheDir();

// `dir` when given, else DefaultCacheDir().
std::string CacheDirOr(const std::string& dir);

// Creates `dir` and its parents when missing. FailedPrecondition naming the directory
// and the reason when it cannot be made or is not a directory.
absl::Status EnsureDirectory(const std::string& dir);

}  // namespace moert::core

#endif  // MOERT_CORE_CACHE_DIR_H_
