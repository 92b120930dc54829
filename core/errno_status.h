// The one conversion from errno to Status.
#ifndef KVFABRIC_CORE_ERRNO_STATUS_H_
#define KVFABRIC_CORE_ERRNO_STATUS_H_

#include <string_view>

#include "core/status.h"

namespace kvfabric {

// Maps `err` (an errno value) to the closest StatusCode; the message is
// "<context>: <strerror(err)> (errno <err>)".
//   ENOENT -> NotFound            EEXIST -> AlreadyExists
//   EACCES, EPERM -> PermissionDenied
//   ENOSPC, ENOMEM, EMFILE, ENFILE, EDQUOT -> ResourceExhausted
//   EINVAL, ENAMETOOLONG, ENOTDIR, EISDIR -> InvalidArgument
//   EIO -> DataLoss (the medium failed: what was asked for cannot be read back)
//   ETIMEDOUT -> DeadlineExceeded  ECANCELED -> Cancelled
//   EAGAIN, EINTR, EBUSY, ECONNREFUSED, ECONNRESET, EPIPE, EHOSTUNREACH -> Unavailable
//   ENOTSUP, EOPNOTSUPP, ENOSYS -> Unimplemented
//   anything else -> Unknown
Status StatusFromErrno(int err, std::string_view context);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_ERRNO_STATUS_H_
