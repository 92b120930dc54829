#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

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

template <int kHeadDim>
Status LaunchCompact(const gpu::CompactAttentionTileArgs& a, std::byte* arena,
                     cudaStream_t stream) {
  kernels::DecodeAttentionCompactTileKernel<kHeadDim>
      <<<a.shape.num_q_heads, kernels::kDecodeWarps * kernels::kWarpSize, 0, stream>>>(
          reinterpret_cast<const float*>(arena + a.query.offset), arena + a.slices.offset,
          reinterpret_cast<float*>(arena + a.output.offset),
          reinterpret_cast<float*>(arena + a.lse.offset), a.scale, a.block_tokens, a.blocks,
          gpu::CompactHalfBytes(a.block_tokens, a.shape.num_kv_heads, kHeadDim),
          a.shape.num_kv_heads, a.shape.num_q_heads / a.shape.num_kv_heads);
  return LaunchStatus("DecodeAttentionCompactTileKernel launch");
}

// The one dispatch point over head_dim: every supported value is listed here,
// and nothing else is launched. `launch(std::integral_constant<int, D>{})`
// runs for a supported D.
template <typename Launch>
Status DispatchHeadDim(std::uint32_t head_dim, Launch&& launch) {
  switch (head_dim) {
    case 64:
      return launch(std::integral_constant<int, 64>{});
    case 128:
      return launch(std::integral_constant<int, 128>{});
    case 256:
      return launch(std::integral_constant<int, 256>{});
    default:
      return Status::InvalidArgument("CUDA decode attention: head_dim=" + std::to_string(head_dim) +
                                     " is not supported (64, 128 or 256)");
  }
}

// Every supported (dtype, head_dim) pair of the exact kernel. `a` is null for
// a support check.
template <KvDtype kDtype>
Status DispatchExact(std::uint32_t head_dim, const gpu::AttentionTileArgs* a, std::byte* arena,
                     cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dim) {
    return a ? LaunchDecode<kDtype, decltype(dim)::value>(*a, arena, stream) : Status::OK();
  });
}

Status Dispatch(KvDtype dtype, std::uint32_t head_dim, const gpu::AttentionTileArgs* a,
                std::byte* arena, cudaStream_t stream) {
  switch (dtype) {
    case KvDtype::kFp16:
      return DispatchExact<KvDtype::kFp16>(head_dim, a, arena, stream);
    case KvDtype::kBf16:
      return DispatchExact<KvDtype::kBf16>(head_dim, a, arena, stream);
    case KvDtype::kFp32:
      return DispatchExact<KvDtype::kFp32>(head_dim, a, arena, stream);
    default:
      return Status::InvalidArgument(
          "CUDA decode attention: dtype=" + std::string(KvDtypeName(dtype)) +
          " is not supported (fp16, bf16 or fp32)");
  }
}

// The compact kernel's head dims (the exact kernel's); `a` null: a check.
Status DispatchCompact(std::uint32_t head_dim, const gpu::CompactAttentionTileArgs* a,
                       std::byte* arena, cudaStream_t stream) {
  return DispatchHeadDim(head_dim, [&](auto dim) {
    return a ? LaunchCompact<decltype(dim)::value>(*a, arena, stream) : Status::OK();
  });
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

Status LaunchDecodeAttentionCompactTile(const gpu::CompactAttentionTileArgs& args, std::byte* arena,
                                        std::uint64_t arena_bytes, CUstream_st* stream) {
  KVF_RETURN_IF_ERROR(gpu::ValidateCompactAttentionTile(args, arena_bytes));
  KVF_RETURN_IF_ERROR(DispatchCompact(args.shape.head_dim, nullptr, nullptr, nullptr));
  KVF_RETURN_IF_ERROR(CheckArena(arena, "LaunchDecodeAttentionCompactTile"));
  return DispatchCompact(args.shape.head_dim, &args, arena, stream);
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
