// The runtime tests' request: greedy decoding of max_tokens tokens after "ROMEO:", the
// prompt of the reference continuation (shared/models/REFERENCE.md).
#ifndef MOERT_TESTS_COMMON_GREEDY_REQUEST_H_
#define MOERT_TESTS_COMMON_GREEDY_REQUEST_H_

#include "moert/runtime.h"

namespace moert::test_util {

inline GenerateRequest Greedy(int max_tokens) {
  GenerateRequest request;
  request.prompt = "ROMEO:";
  request.max_tokens = max_tokens;
  request.temperature = 0.0f;
  return request;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_GREEDY_REQUEST_H_
