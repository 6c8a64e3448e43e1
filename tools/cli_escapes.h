// Backslash escapes in command-line text (\n, \t, \xHH, ...), processed as llama.cpp's
// string_process_escapes does, so a prompt means the same to moert's tools and llama.cpp's.
#ifndef MOERT_TOOLS_CLI_ESCAPES_H_
#define MOERT_TOOLS_CLI_ESCAPES_H_

#include <string>
#include <string_view>

namespace moert::tools {

std::string ProcessEscapes(std::string_view in);

}  // namespace moert::tools

#endif  // MOERT_TOOLS_CLI_ESCAPES_H_
