// Reference attention over a whole history, on the host, for tests and
// benchmarks. Not for the data path (both functions allocate).
//
// History layout: K and V are [tokens, num_kv_heads, head_dim] of shape.dtype
// (a concatenation of tiles in token order); q is [num_q_heads, head_dim] fp32.
//
// NaiveAttentionFp64: textbook softmax attention in FP64 over every token
// (inputs converted exactly to double; max-subtracted), for tolerance checks.
//
// TiledAttentionHost: the "fully resident" result the streaming path must match
// bit for bit. It cuts the history into consecutive tiles of `tile_tokens`
// tokens (the last may be shorter), runs cpu_kernels::DecodeAttentionTile on
// each and folds the tile states left to right into a running state:
//   state = tile 0;  for i >= 1: state = MergeStates(2, [state, tile i])
// (state first, then the tile). A streaming implementation that merges each
// tile into its running state with a 2-state MergeAttentionStates as the tile
// lands, in the same tile order, produces the same bits. Starting from the
// empty state instead of tile 0 gives the same bits too: merging with an empty
// state returns the other state bit for bit, signed zeros included (lse.h says
// when). Zero tokens give the empty state.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_GPU_KERNELS_REFERENCE_ATTENTION_H_
#define KVFABRIC_GPU_KERNELS_REFERENCE_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"
#include "gpu/kernel_args.h"

namespace kvfabric::gpu {

// Sizes the spans must have: q/out num_q_heads * head_dim, lse num_q_heads,
// k/v tokens * num_kv_heads * head_dim * KvDtypeSize(dtype). InvalidArgument
// (naming the span) for a bad shape or size.
Status NaiveAttentionFp64(const AttentionShape& shape, double scale, std::uint32_t tokens,
                          std::span<const float> q, std::span<const std::byte> k,
                          std::span<const std::byte> v, std::span<double> out,
                          std::span<double> lse);

// REQUIRES: tile_tokens > 0 (InvalidArgument otherwise).
Status TiledAttentionHost(const AttentionShape& shape, float scale, std::uint32_t tokens,
                          std::uint32_t tile_tokens, std::span<const float> q,
                          std::span<const std::byte> k, std::span<const std::byte> v,
                          std::span<float> out, std::span<float> lse);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_KERNELS_REFERENCE_ATTENTION_H_
