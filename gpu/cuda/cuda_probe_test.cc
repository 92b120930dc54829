#include "gpu/cuda/cuda_probe.h"

#include <gtest/gtest.h>

#include "gpu/cuda/cuda_status.h"

namespace kvfabric::cuda {
namespace {

// Numeric values of cudaError_t (stable across CUDA releases), so this test
// compiles without CUDA headers.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInsufficientDriver = 35;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorIllegalAddress = 700;

TEST(CudaStatusTest, SuccessIsOk) { EXPECT_TRUE(StatusFromCudaError(kCudaSuccess, "x").ok()); }

TEST(CudaStatusTest, MapsErrorsToWhatTheCallerCanDo) {
  EXPECT_EQ(StatusFromCudaError(kCudaErrorNoDevice, "x").code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusFromCudaError(kCudaErrorInsufficientDriver, "x").code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusFromCudaError(kCudaErrorMemoryAllocation, "x").code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromCudaError(kCudaErrorInvalidValue, "x").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromCudaError(kCudaErrorIllegalAddress, "x").code(), StatusCode::kInternal);
}

TEST(CudaStatusTest, MessageNamesTheErrorAndContext) {
  Status s = StatusFromCudaError(kCudaErrorNoDevice, "cudaSetDevice(0)");
  EXPECT_EQ(s.message().substr(0, 36), "cudaSetDevice(0): cudaErrorNoDevice ");
  EXPECT_NE(s.message().find("cudaError_t 100"), std::string_view::npos) << s;
}

TEST(CudaProbeTest, ReportsRuntimeAndEitherDevicesOrWhyNone) {
  CudaProbeResult r = ProbeCuda();
  EXPECT_GE(r.runtime_version, 12000) << "this build links a CUDA 12+ runtime";
  if (r.devices.empty()) {
    EXPECT_FALSE(r.status.ok()) << "no devices must come with a reason";
  } else {
    EXPECT_GE(r.devices[0].compute_capability_major, 7);
    EXPECT_GT(r.devices[0].total_memory_bytes, 0u);
  }
}

TEST(CudaProbeTest, SmokeKernelAddsVectorsOnTheGpu) {
  CudaProbeResult r = ProbeCuda();
  if (r.devices.empty()) GTEST_SKIP() << "no CUDA device: " << r.status;
  Status s = RunCudaSmokeKernel(1 << 20);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CudaProbeTest, SmokeKernelRejectsEmptyInput) {
  EXPECT_EQ(RunCudaSmokeKernel(0).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfabric::cuda
