// The one conversion from a CUDA runtime error to Status.
//
// The interface takes the numeric value of a cudaError_t so that host code
// compiled by the C++ compiler can use it without CUDA headers; only .cu files
// (compiled by nvcc) see cudaError_t itself, and they pass
// static_cast<int>(err).
#ifndef KVFABRIC_GPU_CUDA_CUDA_STATUS_H_
#define KVFABRIC_GPU_CUDA_CUDA_STATUS_H_

#include <string_view>

#include "core/status.h"

namespace kvfabric::cuda {

// cudaSuccess -> OK. Otherwise the message is
// "<context>: <cudaGetErrorName> (<cudaGetErrorString>, cudaError_t <n>)" and
// the code says what the caller can do about it:
//   no device / no or old driver       -> FailedPrecondition (this machine cannot run it)
//   out of memory                      -> ResourceExhausted
//   invalid value / configuration      -> InvalidArgument
//   not ready                          -> Unavailable (poll again)
//   launch timeout                     -> DeadlineExceeded
//   illegal address, ECC, hardware and any sticky launch failure
//                                      -> Internal (the context is unusable; the
//                                         caller must quarantine every buffer)
//   anything else                      -> Unknown
Status StatusFromCudaError(int cuda_error, std::string_view context);

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_CUDA_STATUS_H_
