// Test helpers for the compact_int8 attention kernels on every backend: a
// random tile of compact blocks encoded from KV shaped like real KV, the
// arguments of one device call over it, and the FP64 problem of the values
// it decodes to (for attention_test_util.h's bound). For tests only.
#ifndef KVFABRIC_GPU_KERNELS_COMPACT_TEST_UTIL_H_
#define KVFABRIC_GPU_KERNELS_COMPACT_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu/kernel_args.h"
#include "gpu/kernels/attention_test_util.h"

namespace kvfabric::gpu::testing {

// `blocks` compact blocks of one layer each, back to back as a
// CompactAttentionTileArgs tile wants them.
struct CompactTile {
  std::uint32_t block_tokens = 0, blocks = 0, kv_heads = 0, head_dim = 0;
  std::vector<std::byte> slices;    // blocks x [K half, V half]
  std::vector<float> keys, values;  // decoded: [blocks * block_tokens, kv_heads, head_dim]

  std::uint64_t SliceBytes() const;  // 2 * CompactHalfBytes
};

// Encodes random fp16 KV with outlier key channels (20x) and values whose
// size varies by token (EncodeCompactInt8), and decodes it back.
CompactTile MakeCompactTile(std::mt19937_64& rng, std::uint32_t block_tokens, std::uint32_t blocks,
                            std::uint32_t kv_heads, std::uint32_t head_dim);

// One call's arguments, each range 256-byte aligned from offset 0: query,
// slices, output, lse; CompactTileArenaBytes is the arena they need.
CompactAttentionTileArgs CompactTileLayout(const CompactTile& tile, std::uint32_t q_heads,
                                           float scale);
std::uint64_t CompactTileArenaBytes(const CompactAttentionTileArgs& args);

// Query `q` over the tile's decoded values, as an fp32 Problem.
Problem DecodedProblem(const CompactTile& tile, std::uint32_t q_heads, float scale,
                       std::vector<float> q);

// BoundFor's `dot_roundings` for the compact kernels (attention_test_util.h).
inline std::uint32_t CompactDotRoundings(std::uint32_t head_dim) { return head_dim + 3; }

}  // namespace kvfabric::gpu::testing

#endif  // KVFABRIC_GPU_KERNELS_COMPACT_TEST_UTIL_H_
