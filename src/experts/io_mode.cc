// Names of the loader's I/O modes and engines (command-line flags, stats).
#include "experts/io_mode.h"

namespace moert::experts {

std::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kDirect:
      return "direct";
    case IoMode::kBuffered:
      return "buffered";
    case IoMode::kMmap:
      return "mmap";
  }
  return "unknown";
}

std::optional<IoMode> ParseIoMode(std::string_view name) {
  for (IoMode mode : {IoMode::kDirect, IoMode::kBuffered, IoMode::kMmap}) {
    if (name == IoModeName(mode)) return mode;
  }
  return std::nullopt;
}

std::string_view IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kUring:
      return "io_uring";
    case IoEngine::kPread:
      return "pread";
  }
  return "unknown";
}

std::optional<IoEngine> ParseIoEngine(std::string_view name) {
  for (IoEngine engine : {IoEngine::kAuto, IoEngine::kUring, IoEngine::kPread}) {
    if (name == IoEngineName(engine)) return engine;
  }
  return std::nullopt;
}

}  // namespace moert::experts
