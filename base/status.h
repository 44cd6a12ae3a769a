// Status and StatusOr<T>: loom's recoverable-error values (pure C++).
//
// A Status is a code plus a human-readable message. Functions that can fail
// for reasons outside the caller's control (bad input files, driver errors,
// out of memory) return Status or StatusOr<T>; broken invariants abort through
// LOOM_CHECK (check.h) instead. Both types are [[nodiscard]]: ignoring a
// failure is a compile error under -Werror.
#ifndef LOOM_BASE_STATUS_H_
#define LOOM_BASE_STATUS_H_

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace loom {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // caller passed something malformed or misused an API
  kNotFound = 2,         // a file, symbol or entry does not exist
  kAlreadyExists = 3,    // e.g. a range is already mapped
  kFailedPrecondition =
      4,             // state forbids the call (e.g. release of a mapped handle)
  kOutOfRange = 5,   // a value lies outside what the format allows
  kOutOfMemory = 6,  // the device (or its simulation) has no memory left
  kDataLoss = 7,     // corrupt or truncated input
  kUnavailable = 8,  // e.g. no CUDA driver on this machine
  kUnimplemented = 9,  // the backend does not support the operation
  kInternal = 10,      // an unexpected failure of a lower layer
};

// Name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>".
  Status WithContext(std::string_view prefix) const;

  // Explicitly drops a status the caller has decided not to act on.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }

// Constructors with fmt-style messages: InvalidArgument("bad size {}", n).
#define LOOM_DEFINE_STATUS_CTOR(Name, Code)                          \
  template <typename... Args>                                        \
  Status Name(fmt::format_string<Args...> format, Args&&... args) {  \
    return Status(StatusCode::Code,                                  \
                  fmt::format(format, std::forward<Args>(args)...)); \
  }
LOOM_DEFINE_STATUS_CTOR(InvalidArgumentError, kInvalidArgument)
LOOM_DEFINE_STATUS_CTOR(NotFoundError, kNotFound)
LOOM_DEFINE_STATUS_CTOR(AlreadyExistsError, kAlreadyExists)
LOOM_DEFINE_STATUS_CTOR(FailedPreconditionError, kFailedPrecondition)
LOOM_DEFINE_STATUS_CTOR(OutOfRangeError, kOutOfRange)
LOOM_DEFINE_STATUS_CTOR(OutOfMemoryError, kOutOfMemory)
LOOM_DEFINE_STATUS_CTOR(DataLossError, kDataLoss)
LOOM_DEFINE_STATUS_CTOR(UnavailableError, kUnavailable)
LOOM_DEFINE_STATUS_CTOR(UnimplementedError, kUnimplemented)
LOOM_DEFINE_STATUS_CTOR(InternalError, kInternal)
#undef LOOM_DEFINE_STATUS_CTOR

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok().
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT: implicit
    LOOM_CHECK(!std::get<Status>(value_).ok(),
               "StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit

  bool ok() const { return std::holds_alternative<T>(value_); }

  // OK when a value is held. The reference lives as long as this StatusOr.
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(value_);
  }

  // REQUIRES: ok().
  const T& value() const& {
    CheckOk();
    return std::get<T>(value_);
  }
  T& value() & {
    CheckOk();
    return std::get<T>(value_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(value_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckOk() const {
    LOOM_CHECK(ok(), "StatusOr::value() on an error: {}",
               std::get<Status>(value_).ToString());
  }

  std::variant<Status, T> value_;
};

}  // namespace loom

// Returns from the enclosing function if `expr` yields a non-OK Status.
#define LOOM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::loom::Status loom_status_ = (expr);        \
    if (!loom_status_.ok()) return loom_status_; \
  } while (false)

#define LOOM_STATUS_CONCAT_INNER_(a, b) a##b
#define LOOM_STATUS_CONCAT_(a, b) LOOM_STATUS_CONCAT_INNER_(a, b)

// `LOOM_ASSIGN_OR_RETURN(auto x, F());` declares x from F()'s value, or
// returns F()'s status from the enclosing function.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr)                                     \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__), \
                              lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // LOOM_BASE_STATUS_H_
