// Host launchers for the CUDA kernels of attention_kernels.cuh.
//
// Each launcher validates its arguments (gpu/kernel_args.h: sizes, arena
// bounds, overflow, overlaps), picks the kernel instantiation at the one
// dispatch point, enqueues it on `stream` and returns the launch's Status
// (StatusFromCudaError). It never allocates device or host memory and never
// synchronises: completion is observed through an event recorded on the same
// stream. `arena` is the device pointer to the start of the arena (aligned to
// at least 16 bytes, as cudaMalloc returns), `arena_bytes` its size; the
// DeviceRange offsets in the arguments are relative to it.
//
// Supported decode shapes: dtype fp16, bf16 or fp32 with head_dim 64, 128 or
// 256 (any GQA ratio); compact tiles (int8 codes) with head_dim 64, 128 or
// 256. Anything else that passes validation is refused with InvalidArgument
// naming the supported set. Merge and gather take any valid arguments.
//
// This header needs no CUDA headers: a stream is passed as CUstream_st*
// (what cudaStream_t is).
//
// Thread safety: callers serialise launches on one stream; launches on
// different streams may come from different threads.
#ifndef KVFABRIC_GPU_CUDA_ATTENTION_LAUNCHERS_H_
#define KVFABRIC_GPU_CUDA_ATTENTION_LAUNCHERS_H_

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "gpu/kernel_args.h"

struct CUstream_st;

namespace kvfabric::cuda {

// OK if LaunchDecodeAttentionTile has a kernel for (dtype, head_dim);
// InvalidArgument naming the supported set otherwise. Needs no GPU.
Status CheckDecodeAttentionSupported(KvDtype dtype, std::uint32_t head_dim);

Status LaunchDecodeAttentionTile(const gpu::AttentionTileArgs& args, std::byte* arena,
                                 std::uint64_t arena_bytes, CUstream_st* stream);
// The compact_int8 tile kernel (attention_kernels.cuh): dequantises in the
// kernel; agrees with gpu::DecodeAttentionCompactInt8Blocks to float rounding.
Status LaunchDecodeAttentionCompactTile(const gpu::CompactAttentionTileArgs& args, std::byte* arena,
                                        std::uint64_t arena_bytes, CUstream_st* stream);
Status LaunchMergeStates(const gpu::MergeStatesArgs& args, std::byte* arena,
                         std::uint64_t arena_bytes, CUstream_st* stream);
// Out-of-range page offsets cannot be reported by the kernel: such a page is
// zero-filled (see attention_kernels.cuh). Check offsets on the host with
// gpu::ValidateGatherSource before uploading them.
Status LaunchGatherPages(const gpu::GatherPagesArgs& args, std::byte* arena,
                         std::uint64_t arena_bytes, CUstream_st* stream);

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_ATTENTION_LAUNCHERS_H_
