// A small JSON reader for the input files of the tools (the MiniCPM-V oracle's
// vocab.json): objects, arrays, strings with every escape (\uXXXX and surrogate pairs
// become UTF-8), integers, true, false and null. Numbers with a fraction or an
// exponent are rejected, as no file a tool reads has them; nesting is capped. Errors
// name the byte offset where parsing stopped.
#ifndef MOERT_TOOLS_JSON_READER_H_
#define MOERT_TOOLS_JSON_READER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::tools {

struct JsonValue {
  enum class Kind { kNull, kBool, kInt, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in file order

  // The member named `key` of an object; nullptr when absent or not an object.
  const JsonValue* Find(std::string_view key) const;
};

// Parses one JSON value (surrounding whitespace allowed, nothing after it).
// InvalidArgument naming the byte offset for malformed text.
absl::StatusOr<JsonValue> ParseJson(std::string_view text);

}  // namespace moert::tools

#endif  // MOERT_TOOLS_JSON_READER_H_
