#include "transport/ucx/ucx_status.h"

#include <string>

namespace kvfabric::ucx {

namespace {

StatusCode CodeFor(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_BUSY:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return StatusCode::kUnavailable;
    case UCS_ERR_TIMED_OUT:
      return StatusCode::kDeadlineExceeded;
    case UCS_ERR_CANCELED:
      return StatusCode::kCancelled;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return StatusCode::kResourceExhausted;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return StatusCode::kInvalidArgument;
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NOT_IMPLEMENTED:
      return StatusCode::kUnimplemented;
    case UCS_ERR_NO_ELEM:
      return StatusCode::kNotFound;
    case UCS_ERR_ALREADY_EXISTS:
      return StatusCode::kAlreadyExists;
    case UCS_ERR_BUFFER_TOO_SMALL:
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_OUT_OF_RANGE:
      return StatusCode::kOutOfRange;
    case UCS_ERR_NO_DEVICE:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kUnknown;
  }
}

}  // namespace

Status StatusFromUcs(ucs_status_t status, std::string_view context) {
  if (status == UCS_OK) return Status::OK();
  std::string msg(context);
  msg += ": ";
  msg += ucs_status_string(status);
  msg += " (ucs_status_t ";
  msg += std::to_string(static_cast<int>(status));
  msg += ")";
  return Status(CodeFor(status), msg);
}

}  // namespace kvfabric::ucx
