// The CUDA-only pieces of the GPU benchmarks (bench/gpu/cuda_device_bench.cu),
// behind a CUDA-free header so the host driver (cuda_attention_bench.cc) is
// compiled by the host compiler with spdlog and the client library.
//
//   QueryDeviceMemory     cudaMemGetInfo: what the whole device has free now
//                         (every process and context counts).
//   RunCopyAndMergeBench  h2d: host->device through Device::CopyHostToDevice
//                         (pinned staging, 4 MiB copies, one event per round)
//                         vs one plain cudaMemcpy of the same pinned bytes (the
//                         bus peak this machine reaches); merge:
//                         MergeAttentionStates throughput in GB/s of states
//                         read and written, vs the HBM bandwidth of a
//                         device-to-device cudaMemcpy (read + write).
//
// Benchmarks, not tests: they report figures and thresholds nothing. Thread
// safety: call from one thread.
#ifndef KVFABRIC_BENCH_GPU_CUDA_DEVICE_BENCH_H_
#define KVFABRIC_BENCH_GPU_CUDA_DEVICE_BENCH_H_

#include <cstdint>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::bench {

struct DeviceMemory {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes() const { return total_bytes - free_bytes; }
};

// Makes `device_index` current on this thread and asks cudaMemGetInfo.
StatusOr<DeviceMemory> QueryDeviceMemory(int device_index);

struct CopyAndMergeFigures {
  std::uint64_t copy_bytes = 0;    // bytes per h2d round
  std::uint64_t chunk_bytes = 0;   // bytes per Device::CopyHostToDevice
  double device_h2d_gbs = 0;       // through the Device
  double plain_h2d_gbs = 0;        // plain cudaMemcpy of the whole round
  std::uint32_t merge_states = 0;  // states merged per launch
  std::uint32_t merge_heads = 0;
  std::uint32_t merge_head_dim = 0;
  double merge_us = 0;   // per MergeAttentionStates launch
  double merge_gbs = 0;  // states read + result written, per second
  double hbm_gbs = 0;    // d2d cudaMemcpy, read + write
};

// Creates its own CUDA device (a 512 MiB arena) on `device_index`, measures,
// and frees everything it allocated. Errors as CreateCudaDevice, or Internal
// with CUDA's name for a failed call.
StatusOr<CopyAndMergeFigures> RunCopyAndMergeBench(int device_index);

}  // namespace kvfabric::bench

#endif  // KVFABRIC_BENCH_GPU_CUDA_DEVICE_BENCH_H_
