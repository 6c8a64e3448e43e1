// Backslash escapes in command-line text, shared by the tools.
#include "cli_escapes.h"

#include <cstdlib>
#include <string>

namespace moert::tools {

// llama.cpp's string_process_escapes, so prompts given to both tools agree.
std::string ProcessEscapes(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n':
        out += '\n';
        continue;
      case 'r':
        out += '\r';
        continue;
      case 't':
        out += '\t';
        continue;
      case '\'':
        out += '\'';
        continue;
      case '"':
        out += '"';
        continue;
      case '\\':
        out += '\\';
        continue;
      case 'x':
        // Two hex digits (read with strtol, quirks included, as llama.cpp does).
        if (i + 2 < in.size()) {
          const std::string hex(in.substr(i + 1, 2));
          char* end = nullptr;
          const long value = std::strtol(hex.c_str(), &end, 16);
          if (end == hex.c_str() + 2) {
            out += static_cast<char>(value);
            i += 2;
            continue;
          }
        }
        break;
      default:
        break;
    }
    out += '\\';
    out += c;
  }
  return out;
}

}  // namespace moert::tools
