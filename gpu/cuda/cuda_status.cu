#include "gpu/cuda/cuda_status.h"

#include <cuda_runtime_api.h>

#include <string>

namespace kvfabric::cuda {

namespace {

StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorDevicesUnavailable:
      return StatusCode::kFailedPrecondition;
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidPitchValue:
      return StatusCode::kInvalidArgument;
    case cudaErrorNotReady:
      return StatusCode::kUnavailable;
    case cudaErrorLaunchTimeout:
      return StatusCode::kDeadlineExceeded;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
      return StatusCode::kInternal;
    default:
      return StatusCode::kUnknown;
  }
}

}  // namespace

Status StatusFromCudaError(int cuda_error, std::string_view context) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return Status::OK();
  std::string msg(context);
  msg += ": ";
  msg += cudaGetErrorName(err);
  msg += " (";
  msg += cudaGetErrorString(err);
  msg += ", cudaError_t ";
  msg += std::to_string(cuda_error);
  msg += ")";
  return Status(CodeFor(err), msg);
}

}  // namespace kvfabric::cuda
