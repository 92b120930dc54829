// The CUDA backend of Device (gpu/device.h).
//
// One device of the machine (DeviceOptions::device_index), one cudaMalloc of
// exactly arena_bytes made at creation (refused with the arithmetic when it
// exceeds the device's free memory), three non-blocking streams (host->device,
// device->host, compute), events created with cudaEventDisableTiming, copies
// with cudaMemcpyAsync from pinned memory (cudaHostAlloc), kernels through the
// launchers of gpu/cuda/attention_launchers.h on the compute stream, and
// QueueWaitEvent as cudaStreamWaitEvent (the host never blocks on it).
//
// Event::Wait polls cudaEventQuery until the deadline (never an unbounded
// cudaEventSynchronize); Synchronize polls cudaStreamQuery likewise. Device
// errors surface as Internal with CUDA's name for them (cuda_status.h): a
// sticky error leaves the context unusable, and every later call reports it.
//
// Kernels: the launchers validate their arguments (InvalidArgument at once).
// DecodeAttentionTile and DecodeAttentionCompactTile (compact_int8,
// dequantised in the kernel) support head_dim 64, 128 and 256 (see
// attention_launchers.h). GatherPages: the page offsets live in device memory,
// where a kernel cannot return a Status; an out-of-range page is zero-filled,
// so callers check each offset with ValidateGatherSource before copying the
// list up (gpu/kernel_args.h).
//
// This header is CUDA-free: host C++ code calls the factory without the CUDA
// headers. Threads: as gpu/device.h; the device makes itself current
// (cudaSetDevice) on whichever thread calls it.
#ifndef KVFABRIC_GPU_CUDA_CUDA_DEVICE_H_
#define KVFABRIC_GPU_CUDA_CUDA_DEVICE_H_

#include <memory>

#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::gpu {

// InvalidArgument for arena_bytes 0 (naming --device-arena-bytes);
// FailedPrecondition when there is no CUDA device or driver, or no device
// `device_index`; ResourceExhausted when the arena exceeds the device's free
// memory.
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_CUDA_CUDA_DEVICE_H_
