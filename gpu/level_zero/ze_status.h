// The one conversion from a Level Zero result (ze_result_t) to Status, and a
// run-time probe of the Level Zero drivers (for `kvfabric version`).
#ifndef KVFABRIC_GPU_LEVEL_ZERO_ZE_STATUS_H_
#define KVFABRIC_GPU_LEVEL_ZERO_ZE_STATUS_H_

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace kvfabric::level_zero {

// ZE_RESULT_SUCCESS -> OK. Otherwise "<context>: <ZE_RESULT_NAME> (ze_result_t 0x<hex>)":
//   uninitialized (no driver / no Intel GPU) / unsupported version / device lost
//                                   -> FailedPrecondition
//   out of host or device memory    -> ResourceExhausted
//   invalid argument / size / enum / null pointer / handle -> InvalidArgument
//   not ready                       -> Unavailable
//   unsupported feature             -> Unimplemented
//   anything else                   -> Unknown
// The argument is the numeric ze_result_t so callers need not include ze_api.h.
Status StatusFromZeResult(std::uint32_t ze_result, std::string_view context);

struct ZeProbeResult {
  std::uint32_t driver_count = 0;
  std::uint32_t device_count = 0;
  Status status;  // why there are no drivers, when there are none
};

// Calls zeInit(ZE_INIT_FLAG_GPU_ONLY) and counts drivers and devices. Never
// fails: a machine without an Intel GPU reports ZE_RESULT_ERROR_UNINITIALIZED
// in `status`.
ZeProbeResult ProbeLevelZero();

}  // namespace kvfabric::level_zero

#endif  // KVFABRIC_GPU_LEVEL_ZERO_ZE_STATUS_H_
