#include "core/status.h"

namespace kvfabric {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnknown: return "Unknown";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDataLoss: return "DataLoss";
  }
  return "InvalidStatusCode";
}

bool IsKnownStatusCode(std::int64_t code) {
  return code >= static_cast<std::int64_t>(StatusCode::kOk) &&
         code <= static_cast<std::int64_t>(StatusCode::kDataLoss);
}

Status StatusFromCode(std::int64_t code, std::string_view message) {
  if (code == 0) return Status::OK();
  if (!IsKnownStatusCode(code)) {
    std::string m = "unknown status code " + std::to_string(code);
    if (!message.empty()) {
      m += ": ";
      m += message;
    }
    return Status::Internal(m);
  }
  return Status(static_cast<StatusCode>(code), message);
}

Status::Status(StatusCode code, std::string_view message) {
  // An OK code never carries a message: OK is the null representation.
  if (code != StatusCode::kOk) rep_.reset(new Rep{code, std::string(message)});
}

Status::Status(const Status& other)
    : rep_(other.rep_ ? new Rep(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_.reset(other.rep_ ? new Rep(*other.rep_) : nullptr);
  return *this;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  std::string msg(context);
  msg += ": ";
  msg += rep_->message;
  return Status(rep_->code, msg);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(rep_->code));
  out += ": ";
  out += rep_->message;
  return out;
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

}  // namespace kvfabric
