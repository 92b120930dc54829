// Status: the outcome of an operation, as a cheap value.
//
// A Status is either OK (no allocation, one pointer) or carries a code and a
// message that says what was wrong, with the numbers that explain it. Every
// fallible function in kvfabric returns a Status or a StatusOr<T>; exceptions do
// not cross module boundaries. Foreign errors (errno, grpc::Status,
// ucs_status_t, cudaError_t, ze_result_t, OpenSSL's error queue) are converted
// in exactly one function each, in the module that owns that dependency
// (core/errno_status.h, proto/grpc_status.h, transport/ucx/ucx_status.h,
// gpu/cuda/cuda_status.h, gpu/level_zero/ze_status.h, core/sha256.h).
//
// Thread safety: a Status is a value; distinct objects may be used from
// different threads, one object is not synchronised.
#ifndef KVFABRIC_CORE_STATUS_H_
#define KVFABRIC_CORE_STATUS_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

namespace kvfabric {

// Codes are numbered like gRPC's so that conversion to and from the wire is a
// cast, and they are never renumbered.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

// "OK", "NotFound", ... (the spelling used in logs and metrics labels).
std::string_view StatusCodeName(StatusCode code);


class [[nodiscard]] Status {
 public:
  // OK.
  Status() noexcept = default;
  Status(StatusCode code, std::string_view message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&& other) noexcept = default;
  Status& operator=(Status&& other) noexcept = default;
  ~Status() = default;

  static Status OK() { return Status(); }
  static Status Cancelled(std::string_view msg) { return {StatusCode::kCancelled, msg}; }
  static Status Unknown(std::string_view msg) { return {StatusCode::kUnknown, msg}; }
  static Status InvalidArgument(std::string_view msg) {
    return {StatusCode::kInvalidArgument, msg};
  }
  static Status DeadlineExceeded(std::string_view msg) {
    return {StatusCode::kDeadlineExceeded, msg};
  }
  static Status NotFound(std::string_view msg) { return {StatusCode::kNotFound, msg}; }
  static Status AlreadyExists(std::string_view msg) { return {StatusCode::kAlreadyExists, msg}; }
  static Status PermissionDenied(std::string_view msg) {
    return {StatusCode::kPermissionDenied, msg};
  }
  static Status ResourceExhausted(std::string_view msg) {
    return {StatusCode::kResourceExhausted, msg};
  }
  static Status FailedPrecondition(std::string_view msg) {
    return {StatusCode::kFailedPrecondition, msg};
  }
  static Status Aborted(std::string_view msg) { return {StatusCode::kAborted, msg}; }
  static Status OutOfRange(std::string_view msg) { return {StatusCode::kOutOfRange, msg}; }
  static Status Unimplemented(std::string_view msg) { return {StatusCode::kUnimplemented, msg}; }
  static Status Internal(std::string_view msg) { return {StatusCode::kInternal, msg}; }
  static Status Unavailable(std::string_view msg) { return {StatusCode::kUnavailable, msg}; }
  static Status DataLoss(std::string_view msg) { return {StatusCode::kDataLoss, msg}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }

  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsDataLoss() const { return code() == StatusCode::kDataLoss; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Explicitly ignores this status. Use only where failure truly does not
  // matter, and say why in a comment.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// The one conversion of a status code that arrived from outside the process
// (a gRPC status, a proto EntryStatus, a data-plane reply, a C caller's
// kvf_status) into a Status: 0 is OK (the message is dropped), 1..15 are the
// codes above with `message`, and any other value is Internal naming the
// value, so a peer can never make a code this process does not know.
Status StatusFromCode(std::int64_t code, std::string_view message);
// True for 0..15.
bool IsKnownStatusCode(std::int64_t code);

}  // namespace kvfabric

// Returns from the enclosing function if `expr` is not OK.
#define KVF_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::kvfabric::Status kvf_status_ = (expr);      \
    if (!kvf_status_.ok()) return kvf_status_;    \
  } while (0)

#endif  // KVFABRIC_CORE_STATUS_H_
