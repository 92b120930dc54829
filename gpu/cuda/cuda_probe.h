// What CUDA can do on this machine, asked at run time.
//
// ProbeCuda() never fails: a machine without a driver or a device is a result
// (device_count 0 and `status` saying why), not an error. RunCudaSmokeKernel()
// launches a real kernel on device 0 and checks its output; it is what proves
// a build's device code loads on the GPU it runs on.
//
// Thread safety: both functions may be called from any thread.
#ifndef KVFABRIC_GPU_CUDA_CUDA_PROBE_H_
#define KVFABRIC_GPU_CUDA_CUDA_PROBE_H_

#include <string>
#include <vector>

#include "core/status.h"

namespace kvfabric::cuda {

struct CudaDeviceInfo {
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  unsigned long long total_memory_bytes = 0;  // NOLINT(google-runtime-int): CUDA's type
};

struct CudaProbeResult {
  int runtime_version = 0;  // e.g. 13000 for CUDA 13.0 (the runtime this build links)
  int driver_version = 0;   // 0 when no driver is installed
  std::vector<CudaDeviceInfo> devices;
  Status status;  // why `devices` is empty, when it is
  // The architectures this build's device code was compiled for, e.g. "sm_80 sm_90".
  std::string compiled_archs;
};

CudaProbeResult ProbeCuda();

// Adds two vectors of `n` floats on device 0 and compares with the host sum.
// FailedPrecondition when no device is usable (see cuda_status.h).
// REQUIRES: n > 0.
Status RunCudaSmokeKernel(int n);

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_CUDA_PROBE_H_
