#include "base/status.h"

#include <cstdio>
#include <cstdlib>

namespace mhckpt {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kIoError: return "IO_ERROR";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::optional<StatusCode> StatusCodeFromInt(int64_t value) {
  if (value < 0 || value > static_cast<int64_t>(StatusCode::kInternal)) return std::nullopt;
  return static_cast<StatusCode>(value);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

std::string Status::Serialize() const {
  std::string out(1, static_cast<char>(code_));
  out += message_;
  return out;
}

Status Status::Deserialize(const std::string& bytes) {
  if (bytes.empty()) return Internal("empty serialized status");
  std::optional<StatusCode> code = StatusCodeFromInt(static_cast<uint8_t>(bytes[0]));
  if (!code) {
    return Internal("unknown status code " + std::to_string(static_cast<uint8_t>(bytes[0])) +
                    " in a serialized status");
  }
  return {*code, bytes.substr(1)};
}

namespace internal {

void DieOnValueOfError(const Status* status) {
  const std::string text = status != nullptr ? status->ToString() : "(no status)";
  std::fprintf(stderr, "mhckpt: Result::value() on an error: %s\n", text.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal
}  // namespace mhckpt
