// CUDA kernels for gpu/kernel_args.h, in three layers: device helpers, then
// __global__ kernels (templates over the K/V dtype and head_dim), then (in
// attention_launchers.cu) host launchers with the one dispatch point.
//
// Layouts, units and the log base are gpu/kernel_args.h's: lse is the NATURAL
// log of the softmax denominator including the scale, -inf for an empty tile.
//
// DecodeAttentionTileKernel<kDtype, kHeadDim>: one block per query head,
// kDecodeWarps warps. Warp w takes tokens w, w + kDecodeWarps, ... and keeps an
// online-softmax state (running max m, sum S, acc[head_dim] split across its
// lanes: lane l holds elements l, l + 32, ...). Dot products are a per-lane
// sum then a fixed xor-butterfly (every lane ends with the same bits). The
// warps' states are then merged in warp order through shared memory with the
// exact merge of lse.h. Every reduction has a fixed order and no atomics, so
// the kernel is deterministic: the same tile gives the same bits run to run,
// which is what makes CUDA streamed == CUDA resident bit for bit. It is NOT
// bit-identical to cpu_kernels::DecodeAttentionTile (different reduction
// order, online rescaling, FMA contraction, CUDA's expf/logf); the two agree
// within the tolerance of gpu/kernels/attention_test_util.h.
//
// DecodeAttentionCompactTileKernel<kHeadDim>: the same structure over a tile
// of compact_int8 blocks (gpu/kernels/compact_int8.h), dequantised in the
// kernel, never in memory: a warp that enters a block folds that block's key
// channel scales into its query registers once (qs = scale * q * ks), so a
// logit is qs . kq (int8 codes widened to float); a token's value scale
// folds into its weight (w = p * vs), so the accumulator adds w * vq. Online
// softmax, warp merge and natural-log lse as above. It agrees with the CPU
// kernel (DecodeAttentionCompactInt8Blocks) to float rounding, not bit for
// bit (that kernel takes two passes: every score, then the weighted values).
//
// MergeStatesKernel: one block per head, threads over head_dim; every thread
// evaluates lse::ComputeMergeScale and lse::MergedElement (lse.h), the same
// source as the CPU merge, in index order.
//
// GatherPagesKernel: one block per page. A page whose source range lies
// outside the arena or overlaps the destination or the offset list (which a
// kernel cannot report) is zero-filled instead of copied; hosts check offsets
// with gpu::ValidateGatherSource before uploading them.
#ifndef KVFABRIC_GPU_CUDA_ATTENTION_KERNELS_CUH_
#define KVFABRIC_GPU_CUDA_ATTENTION_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "core/model_fingerprint.h"
#include "gpu/kernels/lse.h"

namespace kvfabric::cuda::kernels {

inline constexpr int kWarpSize = 32;
inline constexpr int kDecodeWarps = 4;
inline constexpr int kMergeThreads = 128;
inline constexpr int kGatherThreads = 256;

// ---- device helpers ----

template <KvDtype kDtype>
__device__ __forceinline__ float LoadKv(const void* base, std::size_t index) {
  if constexpr (kDtype == KvDtype::kFp32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kDtype == KvDtype::kFp16) {
    return __half2float(__ushort_as_half(static_cast<const unsigned short*>(base)[index]));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<const unsigned short*>(base)[index]));
  }
}

// Sum over the warp; every lane returns the same bits (a + b == b + a).
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// The half-precision bits at p[index] as float (compact_int8's scales).
__device__ __forceinline__ float LoadFp16(const unsigned short* p, std::size_t index) {
  return __half2float(__ushort_as_half(p[index]));
}

// One token into a warp's online-softmax state (running max m, sum s): the
// token's weight p = exp(logit - m') and the factor by which the state's
// accumulator must be rescaled, exp(m - m') (0 on the first token: exp(-inf)).
__device__ __forceinline__ void OnlineSoftmaxStep(float logit, float& m, float& s,
                                                  float& correction, float& p) {
  const float new_m = fmaxf(m, logit);
  correction = expf(m - new_m);
  p = expf(logit - new_m);
  s = s * correction + p;
  m = new_m;
}

// The decode kernels' per-warp states of one query head, in shared memory.
template <int kHeadDim>
struct WarpStates {
  float acc[kDecodeWarps][kHeadDim];
  float m[kDecodeWarps];
  float s[kDecodeWarps];
};

// Stores each warp's state (acc unnormalised: O_w = acc / s, lse_w = m +
// log(s); lane l holds elements l, l + 32, ...) and merges them in warp order
// with lse.h's formula on unnormalised accumulators: M = max m_w; S = sum s_w
// e^(m_w - M); O = sum acc_w e^(m_w - M) / S. Writes out_h[kHeadDim] and
// *lse_h (-inf and 0 when no warp saw a token). Every thread of the block
// calls it once.
template <int kHeadDim>
__device__ __forceinline__ void MergeWarpStates(WarpStates<kHeadDim>& shared,
                                                const float (&acc)[kHeadDim / kWarpSize], float m,
                                                float s, float* __restrict__ out_h,
                                                float* __restrict__ lse_h) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int i = 0; i < kHeadDim / kWarpSize; ++i) shared.acc[warp][lane + i * kWarpSize] = acc[i];
  if (lane == 0) {
    shared.m[warp] = m;
    shared.s[warp] = s;
  }
  __syncthreads();
  float big_m = gpu::lse::NegativeInfinity();
  for (int w = 0; w < kDecodeWarps; ++w) big_m = fmaxf(big_m, shared.m[w]);
  float big_s = 0.0f;
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (!gpu::lse::IsEmpty(shared.m[w])) big_s += shared.s[w] * expf(shared.m[w] - big_m);
  }
  for (int d = threadIdx.x; d < kHeadDim; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      if (!gpu::lse::IsEmpty(shared.m[w])) o += shared.acc[w][d] * expf(shared.m[w] - big_m);
    }
    out_h[d] = big_s == 0.0f ? 0.0f : o / big_s;
  }
  if (threadIdx.x == 0) {
    *lse_h = big_s == 0.0f ? gpu::lse::NegativeInfinity() : big_m + logf(big_s);
  }
}

// ---- kernels ----

// grid: num_q_heads blocks; block: kDecodeWarps * 32 threads.
// q [num_q_heads, kHeadDim] fp32; k, v [tokens, num_kv_heads, kHeadDim] kDtype;
// out [num_q_heads, kHeadDim] fp32; lse [num_q_heads] fp32.
template <KvDtype kDtype, int kHeadDim>
__global__ void __launch_bounds__(kDecodeWarps* kWarpSize)
    DecodeAttentionTileKernel(const float* __restrict__ q, const void* __restrict__ k,
                              const void* __restrict__ v, float* __restrict__ out,
                              float* __restrict__ lse, float scale, std::uint32_t tokens,
                              std::uint32_t num_kv_heads, std::uint32_t group) {
  static_assert(kHeadDim % kWarpSize == 0, "head_dim must be a multiple of 32");
  constexpr int kPerLane = kHeadDim / kWarpSize;
  __shared__ WarpStates<kHeadDim> shared;

  const std::uint32_t h = blockIdx.x;
  const std::uint32_t g = h / group;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  float q_reg[kPerLane];
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    q_reg[i] = q[std::size_t{h} * kHeadDim + lane + i * kWarpSize];
    acc[i] = 0.0f;
  }
  float m = gpu::lse::NegativeInfinity();
  float s = 0.0f;
  for (std::uint32_t t = warp; t < tokens; t += kDecodeWarps) {
    const std::size_t row = (std::size_t{t} * num_kv_heads + g) * kHeadDim;
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      partial += q_reg[i] * LoadKv<kDtype>(k, row + lane + i * kWarpSize);
    const float logit = scale * WarpSum(partial);
    float correction, p;
    OnlineSoftmaxStep(logit, m, s, correction, p);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      acc[i] = acc[i] * correction + p * LoadKv<kDtype>(v, row + lane + i * kWarpSize);
    }
  }
  MergeWarpStates(shared, acc, m, s, out + std::size_t{h} * kHeadDim, lse + h);
}

// grid: num_q_heads blocks; block: kDecodeWarps * 32 threads.
// q [num_q_heads, kHeadDim] fp32; slices: `blocks` compact_int8 layer slices
// back to back, each a K half then a V half of `half_bytes` (int8 codes
// [block_tokens, num_kv_heads, kHeadDim], then fp16 scales: K [num_kv_heads,
// kHeadDim], V [block_tokens, num_kv_heads]); out [num_q_heads, kHeadDim]
// fp32; lse [num_q_heads] fp32. REQUIRES: slices 8-byte aligned and
// half_bytes a multiple of 8 (ValidateCompactAttentionTile), so the scales,
// which start kHeadDim-multiple bytes into a half, are 2-byte aligned.
template <int kHeadDim>
__global__ void __launch_bounds__(kDecodeWarps* kWarpSize)
    DecodeAttentionCompactTileKernel(const float* __restrict__ q,
                                     const std::byte* __restrict__ slices, float* __restrict__ out,
                                     float* __restrict__ lse, float scale,
                                     std::uint32_t block_tokens, std::uint32_t blocks,
                                     std::uint64_t half_bytes, std::uint32_t num_kv_heads,
                                     std::uint32_t group) {
  static_assert(kHeadDim % kWarpSize == 0, "head_dim must be a multiple of 32");
  constexpr int kPerLane = kHeadDim / kWarpSize;
  __shared__ WarpStates<kHeadDim> shared;

  const std::uint32_t h = blockIdx.x;
  const std::uint32_t g = h / group;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const std::size_t codes = std::size_t{block_tokens} * num_kv_heads * kHeadDim;  // per half

  float q_reg[kPerLane];  // scale * q
  float qs[kPerLane];     // scale * q * the current block's key channel scales
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    q_reg[i] = scale * q[std::size_t{h} * kHeadDim + lane + i * kWarpSize];
    qs[i] = 0.0f;
    acc[i] = 0.0f;
  }
  float m = gpu::lse::NegativeInfinity();
  float s = 0.0f;
  const std::int8_t* kq = nullptr;
  const std::int8_t* vq = nullptr;
  const unsigned short* vs = nullptr;
  std::uint32_t block = blocks;  // none yet
  const std::uint32_t tokens = block_tokens * blocks;
  for (std::uint32_t t = warp; t < tokens; t += kDecodeWarps) {
    const std::uint32_t b = t / block_tokens;
    const std::uint32_t tb = t - b * block_tokens;
    if (b != block) {
      // A new block: its keys' channel scales fold into the query.
      block = b;
      const std::byte* k_half = slices + 2 * half_bytes * b;
      const auto* ks = reinterpret_cast<const unsigned short*>(k_half + codes);
      kq = reinterpret_cast<const std::int8_t*>(k_half);
      vq = reinterpret_cast<const std::int8_t*>(k_half + half_bytes);
      vs = reinterpret_cast<const unsigned short*>(k_half + half_bytes + codes);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        qs[i] = q_reg[i] * LoadFp16(ks, std::size_t{g} * kHeadDim + lane + i * kWarpSize);
      }
    }
    const std::size_t row = (std::size_t{tb} * num_kv_heads + g) * kHeadDim;
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      partial += qs[i] * static_cast<float>(kq[row + lane + i * kWarpSize]);
    }
    float correction, p;
    OnlineSoftmaxStep(WarpSum(partial), m, s, correction, p);
    // The values' token scale folds into the weight.
    const float w = p * LoadFp16(vs, std::size_t{tb} * num_kv_heads + g);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      acc[i] = acc[i] * correction + w * static_cast<float>(vq[row + lane + i * kWarpSize]);
    }
  }
  MergeWarpStates(shared, acc, m, s, out + std::size_t{h} * kHeadDim, lse + h);
}

// grid: num_heads blocks; block: kMergeThreads threads.
// outputs [num_states, num_heads, head_dim], lses [num_states, num_heads],
// out [num_heads, head_dim], lse [num_heads], all fp32.
__global__ void __launch_bounds__(kMergeThreads)
    MergeStatesKernel(const float* __restrict__ outputs, const float* __restrict__ lses,
                      float* __restrict__ out, float* __restrict__ lse, std::uint32_t num_states,
                      std::uint32_t num_heads, std::uint32_t head_dim) {
  const std::uint32_t h = blockIdx.x;
  const std::size_t state_stride = std::size_t{num_heads} * head_dim;
  const gpu::lse::MergeScale merge = gpu::lse::ComputeMergeScale(lses + h, num_states, num_heads);
  for (std::uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    out[std::size_t{h} * head_dim + d] =
        gpu::lse::MergedElement(outputs + std::size_t{h} * head_dim + d, state_stride, lses + h,
                                num_heads, num_states, merge);
  }
  if (threadIdx.x == 0) lse[h] = gpu::lse::MergedLse(merge);
}

// grid: num_pages blocks; block: kGatherThreads threads. All offsets are bytes
// from `arena`.
__global__ void __launch_bounds__(kGatherThreads)
    GatherPagesKernel(std::byte* arena, std::uint64_t arena_bytes,
                      const std::uint64_t* __restrict__ page_offsets, std::uint64_t offsets_offset,
                      std::uint64_t page_bytes, std::uint64_t destination_offset,
                      std::uint64_t num_pages) {
  const std::uint64_t page = blockIdx.x;
  const std::uint64_t src = page_offsets[page];
  std::byte* dst = arena + destination_offset + page * page_bytes;
  const std::uint64_t dest_end = destination_offset + num_pages * page_bytes;
  const std::uint64_t offsets_end = offsets_offset + num_pages * 8;
  const bool ok = src <= arena_bytes && page_bytes <= arena_bytes - src &&
                  (src + page_bytes <= destination_offset || dest_end <= src) &&
                  (src + page_bytes <= offsets_offset || offsets_end <= src);
  if (!ok) {
    for (std::uint64_t i = threadIdx.x; i < page_bytes; i += blockDim.x) dst[i] = std::byte{0};
    return;
  }
  const std::byte* from = arena + src;
  const bool vec = ((reinterpret_cast<std::uintptr_t>(from) |
                     reinterpret_cast<std::uintptr_t>(dst) | page_bytes) %
                    16) == 0;
  if (vec) {
    const uint4* f = reinterpret_cast<const uint4*>(from);
    uint4* t = reinterpret_cast<uint4*>(dst);
    for (std::uint64_t i = threadIdx.x; i < page_bytes / 16; i += blockDim.x) t[i] = f[i];
  } else {
    for (std::uint64_t i = threadIdx.x; i < page_bytes; i += blockDim.x) dst[i] = from[i];
  }
}

}  // namespace kvfabric::cuda::kernels

#endif  // KVFABRIC_GPU_CUDA_ATTENTION_KERNELS_CUH_
