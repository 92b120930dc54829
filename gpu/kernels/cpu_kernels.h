// The device kernels of gpu/kernel_args.h as plain host functions: the CPU
// backend (gpu/cpu) runs them on its arena, and the host reference
// (reference_attention.h) runs them on ordinary buffers. Layouts, units and
// the log base are those of gpu/kernel_args.h.
//
// Numerics: FP32 throughout. DecodeAttentionTile computes, per query head h
// (kv head g = h / (num_q_heads / num_kv_heads)),
//   s_t = scale * dot(q_h, k_{t,g})       dot in 8 fixed partial sums by fma, combined as a tree
//   m   = max_t s_t                        first pass over the tile
//   p_t = exp(s_t - m), S = sum_t p_t      second pass, tokens in order
//   out = (sum_t p_t v_{t,g}) / S,  lse = m + log(S)
// where exp is the kernel's own (Cephes' polynomial, ~1 ulp; 0 below -87)
// and out accumulates by one fma per element per token. Every sum runs in a
// fixed order, so results are a deterministic function of the inputs (run to
// run, thread to thread, whichever query heads share a pass, and whichever
// instruction set ran it: the AVX2 path computes the scalar path's
// operations in the scalar path's order, lane j being partial sum j).
// MergeStates is lse::MergeHead per head (lse.h).
//
// Instruction sets: DecodeAttentionTile uses BestKernelIsa(), chosen once at
// run time: AVX2 + FMA + F16C where the CPU has all three, else scalar. A
// caller may ask for scalar (DeviceOptions::cpu_scalar_kernels, the binaries'
// --cpu-kernels=scalar) through the *With / isa forms. The scalar path calls
// fmaf, which is slow without hardware FMA; it is the fallback.
//
// The pointer forms do no validation (REQUIRES: the layout's sizes); the
// *InArena forms validate with gpu/kernel_args.h first and are what a backend
// calls. Nothing here allocates or logs.
//
// Thread safety: pure functions over the buffers they are given; callers
// serialise writers of the same output.
#ifndef KVFABRIC_GPU_KERNELS_CPU_KERNELS_H_
#define KVFABRIC_GPU_KERNELS_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"
#include "gpu/kernel_args.h"

namespace kvfabric::gpu::cpu_kernels {

enum class KernelIsa { kScalar, kAvx2 };
KernelIsa BestKernelIsa();
bool KernelIsaSupported(KernelIsa isa);
const char* KernelIsaName(KernelIsa isa);

// One query (q: [num_q_heads, head_dim] fp32) against a tile of `tokens` keys
// and values ([tokens, num_kv_heads, head_dim] of shape.dtype). Writes out
// [num_q_heads, head_dim] and lse [num_q_heads]; tokens == 0 writes 0 and -inf.
// REQUIRES: the shape passes ValidateAttentionTile; out and lse overlap no input.
void DecodeAttentionTile(const AttentionShape& shape, float scale, std::uint32_t tokens,
                         const float* q, const std::byte* k, const std::byte* v, float* out,
                         float* lse);

// DecodeAttentionTile with a given instruction set (tests, benchmarks).
// REQUIRES: KernelIsaSupported(isa).
void DecodeAttentionTileWith(KernelIsa isa, const AttentionShape& shape, float scale,
                             std::uint32_t tokens, const float* q, const std::byte* k,
                             const std::byte* v, float* out, float* lse);

// Merges num_states states (outputs [num_states, num_heads, head_dim], lses
// [num_states, num_heads]) into out [num_heads, head_dim] and lse [num_heads],
// in index order. num_states == 0 gives the empty state.
// REQUIRES: out and lse overlap no input.
void MergeStates(std::uint32_t num_states, std::uint32_t num_heads, std::uint32_t head_dim,
                 const float* outputs, const float* lses, float* out, float* lse);

// Copies page i (page_bytes from arena + page_offsets[i]) to
// destination + i * page_bytes, in list order.
// REQUIRES: every page lies in the arena and overlaps nothing written.
void GatherPages(std::uint32_t num_pages, std::uint64_t page_bytes,
                 const std::uint64_t* page_offsets, const std::byte* arena, std::byte* destination);

// Validate `args` against arena.size() and run the kernel on the arena.
// GatherPagesInArena also checks every page offset (ValidateGatherSource)
// before copying anything. REQUIRES: arena.data() is 8-byte aligned.
Status DecodeAttentionTileInArena(const AttentionTileArgs& args, std::span<std::byte> arena);
// The same with a given instruction set. REQUIRES: KernelIsaSupported(isa).
Status DecodeAttentionTileInArena(KernelIsa isa, const AttentionTileArgs& args,
                                  std::span<std::byte> arena);
Status MergeStatesInArena(const MergeStatesArgs& args, std::span<std::byte> arena);
Status GatherPagesInArena(const GatherPagesArgs& args, std::span<std::byte> arena);

}  // namespace kvfabric::gpu::cpu_kernels

#endif  // KVFABRIC_GPU_KERNELS_CPU_KERNELS_H_
