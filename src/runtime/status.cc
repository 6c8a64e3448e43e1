// The public moert::Status and the names of the API's enums; the bridge from
// absl::Status that the library uses inside.
#include <string>

#include "moert/runtime.h"
#include "runtime/internal.h"

namespace moert {

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEndOfGeneration:
      return "end_of_generation";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kMaxTokens:
      return "max_tokens";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kContextFull:
      return "context_full";
  }
  return "unknown";
}

namespace runtime {

Status FromAbsl(const absl::Status& status) {
  StatusCode code = StatusCode::kInternal;
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return Status();
    case absl::StatusCode::kInvalidArgument:
      code = StatusCode::kInvalidArgument;
      break;
    case absl::StatusCode::kNotFound:
      code = StatusCode::kNotFound;
      break;
    case absl::StatusCode::kOutOfRange:
      code = StatusCode::kOutOfRange;
      break;
    case absl::StatusCode::kUnimplemented:
      code = StatusCode::kUnimplemented;
      break;
    case absl::StatusCode::kCancelled:
      code = StatusCode::kCancelled;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = StatusCode::kFailedPrecondition;
      break;
    case absl::StatusCode::kDataLoss:
      code = StatusCode::kDataLoss;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = StatusCode::kResourceExhausted;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = StatusCode::kPermissionDenied;
      break;
    default:
      break;
  }
  return Status(code, std::string(status.message()));
}

}  // namespace runtime
}  // namespace moert
