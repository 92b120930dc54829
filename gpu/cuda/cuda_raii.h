// RAII owners of CUDA runtime handles: a stream, an event, a pinned host
// allocation and a device allocation. Each is created by a factory that
// returns StatusOr (errors through StatusFromCudaError) and released in its
// destructor; all are move-only.
//
// Destructors ignore errors on purpose: a release that fails means the context
// is already lost (a sticky error), which the owner has reported elsewhere.
// The caller makes the owning device current before creating them; releases
// do not depend on the current device.
//
// For .cu files and C++ files that include the CUDA runtime headers only.
// Thread safety: values; distinct objects may be used from different threads.
#ifndef KVFABRIC_GPU_CUDA_CUDA_RAII_H_
#define KVFABRIC_GPU_CUDA_CUDA_RAII_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "core/statusor.h"
#include "gpu/cuda/cuda_status.h"

namespace kvfabric::cuda {

// Owns one handle of type T released by Release(T).
template <typename T, cudaError_t (*Release)(T)>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(T handle) : handle_(handle) {}
  CudaHandle(CudaHandle&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, T{});
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { Reset(); }

  T get() const { return handle_; }

 private:
  void Reset() {
    if (handle_ != T{}) static_cast<void>(Release(handle_));  // see the file comment
    handle_ = T{};
  }
  T handle_{};
};

using CudaStream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using CudaEvent = CudaHandle<cudaEvent_t, cudaEventDestroy>;
using CudaPinnedHost = CudaHandle<void*, cudaFreeHost>;
using CudaDeviceMemory = CudaHandle<void*, cudaFree>;

// A stream that does not synchronise with the legacy default stream.
inline StatusOr<CudaStream> CreateNonBlockingStream() {
  cudaStream_t s = nullptr;
  KVF_RETURN_IF_ERROR(
      StatusFromCudaError(static_cast<int>(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)),
                          "cudaStreamCreateWithFlags(cudaStreamNonBlocking)"));
  return CudaStream(s);
}

// An event without timing (the cheapest to record and query).
inline StatusOr<CudaEvent> CreateFenceEvent() {
  cudaEvent_t e = nullptr;
  KVF_RETURN_IF_ERROR(
      StatusFromCudaError(static_cast<int>(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)),
                          "cudaEventCreateWithFlags(cudaEventDisableTiming)"));
  return CudaEvent(e);
}

inline StatusOr<CudaPinnedHost> AllocatePinnedHost(std::size_t bytes) {
  void* p = nullptr;
  KVF_RETURN_IF_ERROR(
      StatusFromCudaError(static_cast<int>(cudaHostAlloc(&p, bytes, cudaHostAllocDefault)),
                          "cudaHostAlloc(" + std::to_string(bytes) + " bytes)"));
  return CudaPinnedHost(p);
}

inline StatusOr<CudaDeviceMemory> AllocateDeviceMemory(std::size_t bytes) {
  void* p = nullptr;
  KVF_RETURN_IF_ERROR(StatusFromCudaError(static_cast<int>(cudaMalloc(&p, bytes)),
                                          "cudaMalloc(" + std::to_string(bytes) + " bytes)"));
  return CudaDeviceMemory(p);
}

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_CUDA_RAII_H_
