// Status and Result<T>: how every layer of mhckpt reports an error.
//
// Errors are values, never exceptions across the API. A Status carries a code
// and a message; the message names what failed (the array, the rank, the box).
// Status serializes to bytes so that the coordinator can broadcast one rank's
// error to every rank (see coordinator/agree.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace mhckpt {

/// The kind of an error. Tests assert on the code and on words of the message.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     ///< bad input from the caller (shape, box, name, dtype)
  kNotFound,            ///< no such step or array
  kAlreadyExists,       ///< the step is already committed
  kFailedPrecondition,  ///< the call is not valid in this state
  kDataLoss,            ///< a committed checkpoint is damaged or inconsistent
  kIoError,             ///< the operating system or HDF5 failed a read or write
  kInternal,            ///< a bug in mhckpt
};

/// Returns "INVALID_ARGUMENT" and so on.
const char* StatusCodeName(StatusCode code);

/// The code numbered `value`, or nullopt outside the enum. Every code that
/// arrives from another rank (a serialized Status, a description, a report)
/// goes through this before it is used.
std::optional<StatusCode> StatusCodeFromInt(int64_t value);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] bool ok() const { return code_ == StatusCode::kOk; }
  [[nodiscard]] StatusCode code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_; }
  /// "INVALID_ARGUMENT: array 'w' ...", or "OK".
  [[nodiscard]] std::string ToString() const;

  /// Byte form for broadcasting a status between ranks.
  [[nodiscard]] std::string Serialize() const;
  static Status Deserialize(const std::string& bytes);

  /// Explicitly discards a status (for best-effort cleanup paths).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return {}; }
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

namespace internal {
/// Prints "Result::value() on an error: <status>" to stderr and aborts.
[[noreturn]] void DieOnValueOfError(const Status* status);
}  // namespace internal

/// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool ok() const { return std::holds_alternative<T>(v_); }
  [[nodiscard]] Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  /// The value. Check ok() first: on an error, value() (and *, ->) prints
  /// the Status to stderr and aborts the process; it never throws.
  T& value() & {
    CheckOk();
    return *std::get_if<T>(&v_);
  }
  const T& value() const& {
    CheckOk();
    return *std::get_if<T>(&v_);
  }
  T&& value() && {
    CheckOk();
    return std::move(*std::get_if<T>(&v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) internal::DieOnValueOfError(std::get_if<Status>(&v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace mhckpt

#define MHCKPT_CONCAT_INNER(a, b) a##b
#define MHCKPT_CONCAT(a, b) MHCKPT_CONCAT_INNER(a, b)

/// Returns from the enclosing function if `expr` (a Status) is not OK.
#define MHCKPT_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::mhckpt::Status mhckpt_status_ = (expr);        \
    if (!mhckpt_status_.ok()) return mhckpt_status_; \
  } while (0)

#define MHCKPT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

/// `MHCKPT_ASSIGN_OR_RETURN(auto x, F());` — assigns the value or returns the error.
#define MHCKPT_ASSIGN_OR_RETURN(lhs, expr) \
  MHCKPT_ASSIGN_OR_RETURN_IMPL(MHCKPT_CONCAT(mhckpt_result_, __LINE__), lhs, expr)
