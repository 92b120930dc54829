#include "core/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace kvfabric {

namespace {

StatusCode CodeForErrno(int err) {
  switch (err) {
    case 0: return StatusCode::kUnknown;  // a caller bug: failure reported without errno
    case ENOENT: return StatusCode::kNotFound;
    case EEXIST: return StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM: return StatusCode::kPermissionDenied;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EDQUOT: return StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR: return StatusCode::kInvalidArgument;
    case EIO: return StatusCode::kDataLoss;
    case ETIMEDOUT: return StatusCode::kDeadlineExceeded;
    case ECANCELED: return StatusCode::kCancelled;
    case EAGAIN:
    case EINTR:
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH: return StatusCode::kUnavailable;
    case ENOTSUP:
    case ENOSYS: return StatusCode::kUnimplemented;
    default: return StatusCode::kUnknown;
  }
}

}  // namespace

Status StatusFromErrno(int err, std::string_view context) {
  char buf[128];
  // GNU strerror_r returns a pointer that may or may not be `buf`.
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg(context);
  msg += ": ";
  msg += text;
  msg += " (errno ";
  msg += std::to_string(err);
  msg += ")";
  return Status(CodeForErrno(err), msg);
}

}  // namespace kvfabric
