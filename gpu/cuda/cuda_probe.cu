#include "gpu/cuda/cuda_probe.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include "gpu/cuda/cuda_status.h"

namespace kvfabric::cuda {

namespace {

__global__ void AddKernel(const float* a, const float* b, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// Frees device buffers on every return path.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  Status Allocate(size_t bytes) {
    return StatusFromCudaError(static_cast<int>(cudaMalloc(&ptr_, bytes)), "cudaMalloc");
  }
  float* get() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

CudaProbeResult ProbeCuda() {
  // Built by initialisation rather than assignment: nvcc's front end treats
  // assigning a [[nodiscard]] Status as discarding operator='s result.
  int runtime_version = 0;
  int driver_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess) driver_version = 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  Status status = StatusFromCudaError(static_cast<int>(err), "cudaGetDeviceCount");
  if (!status.ok()) cudaGetLastError();  // clear the non-sticky error
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; status.ok() && i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back(CudaDeviceInfo{prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return CudaProbeResult{runtime_version, driver_version, std::move(devices), std::move(status),
                         "sm_80 sm_90"};
}

Status RunCudaSmokeKernel(int n) {
  if (n <= 0) return Status::InvalidArgument("RunCudaSmokeKernel: n must be positive");
  int count = 0;
  KVF_RETURN_IF_ERROR(
      StatusFromCudaError(static_cast<int>(cudaGetDeviceCount(&count)), "cudaGetDeviceCount"));
  if (count == 0) return Status::FailedPrecondition("no CUDA device");
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  std::vector<float> a(n), b(n), out(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = 3.0f - static_cast<float>(i % 7);
  }
  DeviceBuffer da, db, dout;
  KVF_RETURN_IF_ERROR(da.Allocate(bytes));
  KVF_RETURN_IF_ERROR(db.Allocate(bytes));
  KVF_RETURN_IF_ERROR(dout.Allocate(bytes));
  KVF_RETURN_IF_ERROR(StatusFromCudaError(
      static_cast<int>(cudaMemcpy(da.get(), a.data(), bytes, cudaMemcpyHostToDevice)), "H2D a"));
  KVF_RETURN_IF_ERROR(StatusFromCudaError(
      static_cast<int>(cudaMemcpy(db.get(), b.data(), bytes, cudaMemcpyHostToDevice)), "H2D b"));
  const int threads = 256;
  AddKernel<<<(n + threads - 1) / threads, threads>>>(da.get(), db.get(), dout.get(), n);
  KVF_RETURN_IF_ERROR(
      StatusFromCudaError(static_cast<int>(cudaGetLastError()), "AddKernel launch"));
  KVF_RETURN_IF_ERROR(StatusFromCudaError(
      static_cast<int>(cudaMemcpy(out.data(), dout.get(), bytes, cudaMemcpyDeviceToHost)),
      "D2H out"));
  for (int i = 0; i < n; ++i) {
    if (out[i] != a[i] + b[i]) {
      return Status::Internal("smoke kernel: element " + std::to_string(i) + " is " +
                              std::to_string(out[i]) + ", expected " +
                              std::to_string(a[i] + b[i]));
    }
  }
  return Status::OK();
}

}  // namespace kvfabric::cuda
