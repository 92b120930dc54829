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
// Grouped-query attention: q head h reads kv head h / (num_q_heads / num_kv_heads).
#ifndef KVFABRIC_GPU_KERNEL_ARGS_H_
#define KVFABRIC_GPU_KERNEL_ARGS_H_

#include <cstdint>

#include "core/model_fingerprint.h"

namespace kvfabric::gpu {

struct DeviceRange {
  std::uint64_t offset = 0;  // bytes from the start of the arena
  std::uint64_t bytes = 0;
};

struct AttentionShape {
  std::uint32_t num_q_heads = 0;   // a multiple of num_kv_heads
  std::uint32_t num_kv_heads = 0;
  std::uint32_t head_dim = 0;
  KvDtype dtype = KvDtype::kFp16;  // of K and V
};

// One query against one tile of keys/values.
struct AttentionTileArgs {
  AttentionShape shape;
  float scale = 0.0f;          // usually 1/sqrt(head_dim)
  std::uint32_t tokens = 0;    // 0 is an empty tile: output 0, lse -inf
  DeviceRange query;           // [num_q_heads, head_dim] fp32
  DeviceRange keys;            // [tokens, num_kv_heads, head_dim] dtype
  DeviceRange values;          // [tokens, num_kv_heads, head_dim] dtype
  DeviceRange output;          // [num_q_heads, head_dim] fp32
  DeviceRange lse;             // [num_q_heads] fp32
};

// Exact merge of `num_states` partial states (softmax over the union of their
// keys): m = max lse_i; w_i = exp(lse_i - m); O = sum w_i O_i / sum w_i;
// lse = m + log(sum w_i). All -inf (empty) states merge to an empty state
// (output 0, lse -inf), never NaN. States are merged in index order.
struct MergeStatesArgs {
  std::uint32_t num_states = 0;
  std::uint32_t num_heads = 0;
  std::uint32_t head_dim = 0;
  DeviceRange outputs;    // [num_states, num_heads, head_dim] fp32
  DeviceRange lses;       // [num_states, num_heads] fp32
  DeviceRange output;     // [num_heads, head_dim] fp32
  DeviceRange lse;        // [num_heads] fp32
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

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_KERNEL_ARGS_H_
