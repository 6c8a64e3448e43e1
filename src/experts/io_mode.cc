// Names of the loader's I/O modes (command-line flags, stats).
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

}  // namespace moert::experts
