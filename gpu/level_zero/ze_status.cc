#include "gpu/level_zero/ze_status.h"

#include <level_zero/ze_api.h>

#include <cstdio>
#include <string>
#include <vector>

namespace kvfabric::level_zero {

namespace {

struct Entry {
  ze_result_t result;
  const char* name;
  StatusCode code;
};

constexpr Entry kEntries[] = {
    {ZE_RESULT_NOT_READY, "ZE_RESULT_NOT_READY", StatusCode::kUnavailable},
    {ZE_RESULT_ERROR_DEVICE_LOST, "ZE_RESULT_ERROR_DEVICE_LOST", StatusCode::kFailedPrecondition},
    {ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY, "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
     StatusCode::kResourceExhausted},
    {ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
     StatusCode::kResourceExhausted},
    {ZE_RESULT_ERROR_UNINITIALIZED, "ZE_RESULT_ERROR_UNINITIALIZED",
     StatusCode::kFailedPrecondition},
    {ZE_RESULT_ERROR_UNSUPPORTED_VERSION, "ZE_RESULT_ERROR_UNSUPPORTED_VERSION",
     StatusCode::kFailedPrecondition},
    {ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
     StatusCode::kUnimplemented},
    {ZE_RESULT_ERROR_INVALID_ARGUMENT, "ZE_RESULT_ERROR_INVALID_ARGUMENT",
     StatusCode::kInvalidArgument},
    {ZE_RESULT_ERROR_INVALID_NULL_HANDLE, "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
     StatusCode::kInvalidArgument},
    {ZE_RESULT_ERROR_INVALID_NULL_POINTER, "ZE_RESULT_ERROR_INVALID_NULL_POINTER",
     StatusCode::kInvalidArgument},
    {ZE_RESULT_ERROR_INVALID_SIZE, "ZE_RESULT_ERROR_INVALID_SIZE", StatusCode::kInvalidArgument},
    {ZE_RESULT_ERROR_INVALID_ENUMERATION, "ZE_RESULT_ERROR_INVALID_ENUMERATION",
     StatusCode::kInvalidArgument},
};

}  // namespace

Status StatusFromZeResult(std::uint32_t ze_result, std::string_view context) {
  if (ze_result == ZE_RESULT_SUCCESS) return Status::OK();
  const char* name = "ZE_RESULT_ERROR_UNKNOWN";
  StatusCode code = StatusCode::kUnknown;
  for (const Entry& e : kEntries) {
    if (static_cast<std::uint32_t>(e.result) == ze_result) {
      name = e.name;
      code = e.code;
      break;
    }
  }
  char hex[16];
  std::snprintf(hex, sizeof(hex), "0x%08x", ze_result);
  std::string msg(context);
  msg += ": ";
  msg += name;
  msg += " (ze_result_t ";
  msg += hex;
  msg += ")";
  return Status(code, msg);
}

ZeProbeResult ProbeLevelZero() {
  ZeProbeResult r;
  r.status = StatusFromZeResult(zeInit(ZE_INIT_FLAG_GPU_ONLY), "zeInit");
  if (!r.status.ok()) return r;
  r.status = StatusFromZeResult(zeDriverGet(&r.driver_count, nullptr), "zeDriverGet");
  if (!r.status.ok() || r.driver_count == 0) return r;
  std::vector<ze_driver_handle_t> drivers(r.driver_count);
  r.status = StatusFromZeResult(zeDriverGet(&r.driver_count, drivers.data()), "zeDriverGet");
  if (!r.status.ok()) return r;
  for (ze_driver_handle_t d : drivers) {
    std::uint32_t n = 0;
    if (zeDeviceGet(d, &n, nullptr) == ZE_RESULT_SUCCESS) r.device_count += n;
  }
  return r;
}

}  // namespace kvfabric::level_zero
