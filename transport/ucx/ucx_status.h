// The one conversion from a UCX status (ucs_status_t) to Status.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_STATUS_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_STATUS_H_

#include <ucs/type/status.h>

#include <string_view>

#include "core/status.h"

namespace kvfabric::ucx {

// UCS_OK -> OK. Otherwise "<context>: <ucs_status_string> (ucs_status_t <n>)":
//   peer gone / unreachable / reset / rejected / endpoint timeout -> Unavailable
//   timed out -> DeadlineExceeded            canceled -> Cancelled
//   no memory / no resource / exceeds limit -> ResourceExhausted
//   invalid parameter -> InvalidArgument     unsupported -> Unimplemented
//   no element -> NotFound                   already exists -> AlreadyExists
//   buffer too small / truncated / out of range -> OutOfRange
//   no device -> FailedPrecondition          anything else -> Unknown
// REQUIRES: status is not UCS_INPROGRESS (that is not an outcome yet).
Status StatusFromUcs(ucs_status_t status, std::string_view context);

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_STATUS_H_
