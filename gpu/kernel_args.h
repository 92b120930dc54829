// Arguments of the device kernels: shapes, layouts, units and the log base,
// shared by every backend (gpu/cpu, gpu/cuda, gpu/level_zero) and by the
// reference implementations in gpu/kernels/.
//
// Device memory is addressed by DeviceRange: a byte offset and length inside
// the device's arena. Every kernel validates its ranges against the arena and
// its shape arithmetic (overflow-checked) before doing anything, and returns
// InvalidArgument naming the field otherwise.
//
// Layouts (row-major, innermost last):
//   query      [num_q_heads, head_dim]                      fp32
//   K, V tile  [tokens, num_kv_heads, head_dim]             dtype (fp16, bf16 or fp32)
//              the same as one layer's K (or V) half of a block payload
//              (docs/block-format.md), so a block's layer slice is a tile.
//   output     [num_q_heads, head_dim]                      fp32, normalised
//   lse        [num_q_heads]                                fp32, NATURAL log of the
//              softmax denominator including the scale:
//              lse = log(sum_t exp(scale * q.k_t)); -inf for an empty tile.
//   compact    blocks x [K half, V half] of compact_int8 layer slices
//              (gpu/kernels/compact_int8.h, docs/compact.md): each half is
//              int8 codes [tokens, num_kv_heads, head_dim] then fp16 scales
//              (K per channel [num_kv_heads, head_dim], V per token and head
//              [tokens, num_kv_heads]), zero-padded to CompactHalfBytes.
// Grouped-query attention: q head h reads kv head h / (num_q_heads / num_kv_heads).
#ifndef KVFABRIC_GPU_KERNEL_ARGS_H_
#define KVFABRIC_GPU_KERNEL_ARGS_H_

#include <cstdint>

#include "core/model_fingerprint.h"
#include "core/status.h"

namespace kvfabric::gpu {

struct DeviceRange {
  std::uint64_t offset = 0;  // bytes from the start of the arena
  std::uint64_t bytes = 0;
};

struct AttentionShape {
  std::uint32_t num_q_heads = 0;  // a multiple of num_kv_heads
  std::uint32_t num_kv_heads = 0;
  std::uint32_t head_dim = 0;
  KvDtype dtype = KvDtype::kFp16;  // of K and V
};

// One query against one tile of keys/values.
struct AttentionTileArgs {
  AttentionShape shape;
  float scale = 0.0f;        // usually 1/sqrt(head_dim)
  std::uint32_t tokens = 0;  // 0 is an empty tile: output 0, lse -inf
  DeviceRange query;         // [num_q_heads, head_dim] fp32
  DeviceRange keys;          // [tokens, num_kv_heads, head_dim] dtype
  DeviceRange values;        // [tokens, num_kv_heads, head_dim] dtype
  DeviceRange output;        // [num_q_heads, head_dim] fp32
  DeviceRange lse;           // [num_q_heads] fp32
};

// One query against one tile of `blocks` compact_int8 blocks (one layer's
// slice of each), in order, into one state: the same output and lse as
// AttentionTileArgs (the state merges with exact tiles' states by LSE), with
// K and V dequantised inside the kernel (codes x scales).
struct CompactAttentionTileArgs {
  AttentionShape shape;  // dtype must be KvDtype::kInt8 (the codes' type; scales are fp16)
  float scale = 0.0f;    // usually 1/sqrt(head_dim)
  std::uint32_t block_tokens = 0;  // tokens per block (every block is full)
  std::uint32_t blocks = 0;        // >= 1; blocks * block_tokens <= kMaxCompactTileTokens
  DeviceRange query;               // [num_q_heads, head_dim] fp32
  // blocks x 2 x CompactHalfBytes(block_tokens, num_kv_heads, head_dim):
  // block b's K half, then its V half, then block b + 1's.
  DeviceRange slices;
  DeviceRange output;  // [num_q_heads, head_dim] fp32
  DeviceRange lse;     // [num_q_heads] fp32
};

// Exact merge of `num_states` partial states (softmax over the union of their
// keys): m = max lse_i; w_i = exp(lse_i - m); O = sum w_i O_i / sum w_i;
// lse = m + log(sum w_i). All -inf (empty) states merge to an empty state
// (output 0, lse -inf), never NaN. States are merged in index order.
struct MergeStatesArgs {
  std::uint32_t num_states = 0;
  std::uint32_t num_heads = 0;
  std::uint32_t head_dim = 0;
  DeviceRange outputs;  // [num_states, num_heads, head_dim] fp32
  DeviceRange lses;     // [num_states, num_heads] fp32
  DeviceRange output;   // [num_heads, head_dim] fp32
  DeviceRange lse;      // [num_heads] fp32
};

// Copies `num_pages` pages of `page_bytes` each from arena offsets listed in
// `page_offsets` (a [num_pages] uint64 array in the arena) into one
// contiguous destination, in list order: how a tile is assembled from pages
// scattered through the arena.
struct GatherPagesArgs {
  std::uint32_t num_pages = 0;
  std::uint64_t page_bytes = 0;
  DeviceRange page_offsets;  // [num_pages] uint64
  DeviceRange destination;   // num_pages * page_bytes
};

// Largest head_dim any backend accepts (the CPU kernel keeps one K row of
// head_dim floats on the stack; the CUDA kernels support a subset, see
// gpu/cuda/attention_kernels.cuh).
inline constexpr std::uint32_t kMaxHeadDim = 512;

// Most tokens one compact tile attends over (the CPU kernel keeps a tile's
// scores on the stack).
inline constexpr std::uint32_t kMaxCompactTileTokens = 4096;

// Bytes of one half (K or V) of a compact_int8 layer slice of `tokens` tokens:
// tokens * kv_heads * head_dim codes plus 2 * max(kv_heads * head_dim,
// tokens * kv_heads) bytes of scales, rounded up to 8. Not overflow-checked:
// ValidateCompactAttentionTile bounds its arguments first.
std::uint64_t CompactHalfBytes(std::uint32_t tokens, std::uint32_t kv_heads,
                               std::uint32_t head_dim);

// Validation shared by every backend, called before any kernel touches memory.
// Each returns OK or InvalidArgument naming the field and the numbers:
//   - shape products are overflow-checked (64-bit);
//   - every range lies inside [0, arena_bytes) and its size equals the layout
//     exactly (an empty range, bytes == 0, may sit anywhere up to arena_bytes);
//   - offsets are aligned to the element size (fp32: 4, fp16/bf16: 2, uint64: 8);
//   - ranges a kernel writes overlap no range it reads and no other range it
//     writes (kernels are not in-place);
//   - AttentionTileArgs: dtype fp16, bf16 or fp32; num_kv_heads > 0;
//     num_q_heads a positive multiple of num_kv_heads; head_dim in
//     [1, kMaxHeadDim]; scale finite.
//   - CompactAttentionTileArgs: the shape rules of AttentionTileArgs but
//     dtype int8; block_tokens > 0, blocks > 0 and blocks * block_tokens <=
//     kMaxCompactTileTokens; slices 8-byte aligned (each half is a multiple
//     of 8 bytes, so every half of the tile is too).
//   - MergeStatesArgs: num_heads > 0, head_dim > 0 (num_states may be 0: the
//     merge of nothing is the empty state).
//   - GatherPagesArgs: page_bytes > 0. The page offsets themselves live in the
//     arena; ValidateGatherSource checks one of them.
Status ValidateAttentionTile(const AttentionTileArgs& args, std::uint64_t arena_bytes);
Status ValidateCompactAttentionTile(const CompactAttentionTileArgs& args,
                                    std::uint64_t arena_bytes);
Status ValidateMergeStates(const MergeStatesArgs& args, std::uint64_t arena_bytes);
Status ValidateGatherPages(const GatherPagesArgs& args, std::uint64_t arena_bytes);

// Page `index` of a gather starts at `page_offset`: OK if [page_offset,
// page_offset + page_bytes) lies in the arena and does not overlap
// args.destination or args.page_offsets. Hosts call it on an offset list before
// copying it to the device (a GPU kernel cannot return a Status); the CPU
// kernel calls it for every page before copying any.
// REQUIRES: ValidateGatherPages(args, arena_bytes).ok().
Status ValidateGatherSource(const GatherPagesArgs& args, std::uint32_t index,
                            std::uint64_t page_offset, std::uint64_t arena_bytes);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_KERNEL_ARGS_H_
