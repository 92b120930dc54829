// The compact_int8 codec (docs/compact.md): a block's layer slices as int8
// with keys scaled per channel and values scaled per token, and decode
// attention that reads them directly (dequantised inside the kernel).
//
// Encoding of one layer slice of an exact block (K half [T, H, D] then V half
// [T, H, D] of fp16, bf16 or fp32; T tokens, H kv heads, D head dim):
//
//   K half: int8 kq[T][H][D], then fp16 ks[H][D]      ks[h][d] = max_t |K[t][h][d]| / 127
//   V half: int8 vq[T][H][D], then fp16 vs[T][H]      vs[t][h] = max_d |V[t][h][d]| / 127
//   each half padded with zeros to CompactHalfBytes = T*H*D + 2*max(H*D, T*H),
//   rounded up to 8, so the slice has the block container's equal halves
//   (docs/block-format.md, representation 2).
//   kq = clamp(round_half_even(K / ks), -127, 127) with ks the fp16-rounded
//   scale (0 when the channel is all zero: kq = 0); likewise vq with vs.
//
// Keys vary mostly across channels (outlier channels), values across tokens,
// which is why their scales run along different axes (KIVI, 2024). The
// decode kernel folds both scales out of the inner loops:
//   s_t = scale * sum_d (q[d] * ks[g][d]) * kq[t][g][d]     (q scaled once per head)
//   out = sum_t (p_t * vs[t][g]) * vq[t][g][:] / sum_t p_t,  lse = m + log(sum_t p_t)
// so its output state (out, lse) merges with exact tiles' by LSE (lse.h).
//
// Errors: a value is off by at most half its scale step (|x| <= max/127/2 per
// element, plus the fp16 rounding of the scale, 2^-11 relative);
// compact_int8_test checks that bound, and docs/compact.md gives the measured
// attention error against exact.
//
// Thread safety: pure functions over the buffers they are given. Nothing here
// allocates. Decode uses AVX2 + FMA where cpu_kernels::BestKernelIsa() says
// so, else scalar; the two sum in different orders (both deterministic).
#ifndef KVFABRIC_GPU_KERNELS_COMPACT_INT8_H_
#define KVFABRIC_GPU_KERNELS_COMPACT_INT8_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/kernel_args.h"
#include "gpu/kernels/cpu_kernels.h"

namespace kvfabric::gpu {

// The codec's identity, hashed into a compact block's key, is
// kvfabric::kCompactInt8Codec / kCompactInt8Version (core/block_key.h).

// CompactHalfBytes (the bytes of one half of a layer slice) and
// kMaxCompactTileTokens are in gpu/kernel_args.h, beside the device op's
// arguments (CompactAttentionTileArgs) whose sizes they give.

// Bytes of a compact block: layers * 2 * CompactHalfBytes.
std::uint64_t CompactPayloadBytes(std::uint32_t layers, std::uint32_t tokens,
                                  std::uint32_t kv_heads, std::uint32_t head_dim);

struct CompactShape {
  KvDtype dtype = KvDtype::kFp16;  // of the exact block: fp16, bf16 or fp32
  std::uint32_t layers = 0;
  std::uint32_t tokens = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
};

// Encodes an exact payload (every layer) into `out` (CompactPayloadBytes).
// InvalidArgument for a dtype other than fp16/bf16/fp32, sizes that differ
// from the shape's, or a value that is not finite or whose scale does not fit
// fp16 (|x| > 127 * 65504): such a block stays exact only. `out` is
// unspecified after an error.
Status EncodeCompactInt8(const CompactShape& shape, std::span<const std::byte> exact,
                         std::span<std::byte> out);

// Decodes a compact payload back to the exact layout in fp32 ([layers][2][T][H][D]
// floats), for checks and for a device without the compact kernel.
Status DecodeCompactInt8(const CompactShape& shape, std::span<const std::byte> compact,
                         std::span<float> out);

// Decode attention of one query over one compact layer slice (`k_half` and
// `v_half`, CompactHalfBytes each, of `tokens` tokens): out [num_q_heads,
// head_dim] and natural-log lse [num_q_heads], as DecodeAttentionTile.
// REQUIRES: shape passes ValidateAttentionTile (head_dim <= kMaxHeadDim,
// num_q_heads a multiple of num_kv_heads); 1 <= tokens <= kMaxTokensPerBlock
// (a compact slice is one block's). The shape's dtype is not read (the
// device op passes kInt8, CompactAttentionTileArgs').
void DecodeAttentionCompactInt8(const AttentionShape& shape, float scale, std::uint32_t tokens,
                                const float* q, const std::byte* k_half, const std::byte* v_half,
                                float* out, float* lse);
// Decode attention over `blocks` compact layer slices of `block_tokens`
// tokens each, in order (slices[b]: block b's K half, its V half right
// after, as in the payload), into one state: an attention tile of several
// compact blocks, one (out, lse) to merge instead of one per block.
// REQUIRES: as above; 1 <= blocks and blocks * block_tokens <=
// kMaxCompactTileTokens.
void DecodeAttentionCompactInt8Blocks(const AttentionShape& shape, float scale,
                                      std::uint32_t block_tokens, std::uint32_t blocks,
                                      const float* q, const std::byte* const* slices, float* out,
                                      float* lse);
void DecodeAttentionCompactInt8BlocksWith(cpu_kernels::KernelIsa isa, const AttentionShape& shape,
                                          float scale, std::uint32_t block_tokens,
                                          std::uint32_t blocks, const float* q,
                                          const std::byte* const* slices, float* out, float* lse);

// The same with a given instruction set (BestKernelIsa() above): AVX2 + FMA
// widens eight int8 per step, scalar one. REQUIRES: KernelIsaSupported(isa).
void DecodeAttentionCompactInt8With(cpu_kernels::KernelIsa isa, const AttentionShape& shape,
                                    float scale, std::uint32_t tokens, const float* q,
                                    const std::byte* k_half, const std::byte* v_half, float* out,
                                    float* lse);

// The device op (Device::DecodeAttentionCompactTile) on an arena, as the CPU
// backend runs it: validates `args` (ValidateCompactAttentionTile against
// arena.size()), then DecodeAttentionCompactInt8BlocksWith(isa, ...) over the
// tile's slices, block b's at args.slices.offset + b * 2 * CompactHalfBytes.
// Its output is bit-identical to that direct call. REQUIRES: arena.data() is
// 8-byte aligned; KernelIsaSupported(isa).
Status DecodeAttentionCompactTileInArena(cpu_kernels::KernelIsa isa,
                                         const CompactAttentionTileArgs& args,
                                         std::span<std::byte> arena);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_KERNELS_COMPACT_INT8_H_
