#include <cuda_runtime_api.h>

#include <string>

#include "gpu/cuda/attention_kernels.cuh"
#include "gpu/cuda/attention_launchers.h"
#include "gpu/cuda/cuda_status.h"

namespace kvfabric::cuda {
namespace {

Status CheckArena(const std::byte* arena, const char* launcher) {
  if (arena == nullptr) {
    return Status::InvalidArgument(std::string(launcher) + ": arena is null");
  }
  if (reinterpret_cast<std::uintptr_t>(arena) % 16 != 0) {
    return Status::InvalidArgument(std::string(launcher) + ": arena is not 16-byte aligned");
  }
  return Status::OK();
}

Status LaunchStatus(const char* kernel) {
  return StatusFromCudaError(static_cast<int>(cudaGetLastError()), kernel);
}

template <KvDtype kDtype, int kHeadDim>
Status LaunchDecode(const gpu::AttentionTileArgs& a, std::byte* arena, cudaStream_t stream) {
  kernels::DecodeAttentionTileKernel<kDtype, kHeadDim>
      <<<a.shape.num_q_heads, kernels::kDecodeWarps * kernels::kWarpSize, 0, stream>>>(
          reinterpret_cast<const float*>(arena + a.query.offset), arena + a.keys.offset,
          arena + a.values.offset, reinterpret_cast<float*>(arena + a.output.offset),
          reinterpret_cast<float*>(arena + a.lse.offset), a.scale, a.tokens, a.shape.num_kv_heads,
          a.shape.num_q_heads / a.shape.num_kv_heads);
  return LaunchStatus("DecodeAttentionTileKernel launch");
}

// The one dispatch point: every supported (dtype, head_dim) pair is listed
// here, and nothing else is launched. `launch` is null for a support check.
template <KvDtype kDtype>
Status DispatchHeadDim(std::uint32_t head_dim, const gpu::AttentionTileArgs* a, std::byte* arena,
                       cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return a ? LaunchDecode<kDtype, 64>(*a, arena, stream) : Status::OK();
    case 128:
      return a ? LaunchDecode<kDtype, 128>(*a, arena, stream) : Status::OK();
    case 256:
      return a ? LaunchDecode<kDtype, 256>(*a, arena, stream) : Status::OK();
    default:
      return Status::InvalidArgument("CUDA decode attention: head_dim=" + std::to_string(head_dim) +
                                     " is not supported (64, 128 or 256)");
  }
}

Status Dispatch(KvDtype dtype, std::uint32_t head_dim, const gpu::AttentionTileArgs* a,
                std::byte* arena, cudaStream_t stream) {
  switch (dtype) {
    case KvDtype::kFp16:
      return DispatchHeadDim<KvDtype::kFp16>(head_dim, a, arena, stream);
    case KvDtype::kBf16:
      return DispatchHeadDim<KvDtype::kBf16>(head_dim, a, arena, stream);
    case KvDtype::kFp32:
      return DispatchHeadDim<KvDtype::kFp32>(head_dim, a, arena, stream);
    default:
      return Status::InvalidArgument(
          "CUDA decode attention: dtype=" + std::string(KvDtypeName(dtype)) +
          " is not supported (fp16, bf16 or fp32)");
  }
}

}  // namespace

Status CheckDecodeAttentionSupported(KvDtype dtype, std::uint32_t head_dim) {
  return Dispatch(dtype, head_dim, nullptr, nullptr, nullptr);
}

Status LaunchDecodeAttentionTile(const gpu::AttentionTileArgs& args, std::byte* arena,
                                 std::uint64_t arena_bytes, CUstream_st* stream) {
  KVF_RETURN_IF_ERROR(gpu::ValidateAttentionTile(args, arena_bytes));
  KVF_RETURN_IF_ERROR(CheckDecodeAttentionSupported(args.shape.dtype, args.shape.head_dim));
  KVF_RETURN_IF_ERROR(CheckArena(arena, "LaunchDecodeAttentionTile"));
  return Dispatch(args.shape.dtype, args.shape.head_dim, &args, arena, stream);
}

Status LaunchMergeStates(const gpu::MergeStatesArgs& args, std::byte* arena,
                         std::uint64_t arena_bytes, CUstream_st* stream) {
  KVF_RETURN_IF_ERROR(gpu::ValidateMergeStates(args, arena_bytes));
  KVF_RETURN_IF_ERROR(CheckArena(arena, "LaunchMergeStates"));
  kernels::MergeStatesKernel<<<args.num_heads, kernels::kMergeThreads, 0, stream>>>(
      reinterpret_cast<const float*>(arena + args.outputs.offset),
      reinterpret_cast<const float*>(arena + args.lses.offset),
      reinterpret_cast<float*>(arena + args.output.offset),
      reinterpret_cast<float*>(arena + args.lse.offset), args.num_states, args.num_heads,
      args.head_dim);
  return LaunchStatus("MergeStatesKernel launch");
}

Status LaunchGatherPages(const gpu::GatherPagesArgs& args, std::byte* arena,
                         std::uint64_t arena_bytes, CUstream_st* stream) {
  KVF_RETURN_IF_ERROR(gpu::ValidateGatherPages(args, arena_bytes));
  KVF_RETURN_IF_ERROR(CheckArena(arena, "LaunchGatherPages"));
  if (args.num_pages == 0) return Status::OK();
  kernels::GatherPagesKernel<<<args.num_pages, kernels::kGatherThreads, 0, stream>>>(
      arena, arena_bytes, reinterpret_cast<const std::uint64_t*>(arena + args.page_offsets.offset),
      args.page_offsets.offset, args.page_bytes, args.destination.offset, args.num_pages);
  return LaunchStatus("GatherPagesKernel launch");
}

}  // namespace kvfabric::cuda
