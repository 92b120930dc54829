// Log-sum-exp states and their exact merge, for host C++ and CUDA device code.
//
// A *state* of one attention head over a set of keys is (O, lse): O is the
// softmax-normalised output [head_dim] fp32 and lse = log(sum_t exp(s_t)) is
// the NATURAL log of the softmax denominator, where s_t = scale * q.k_t. An
// empty key set is the state (0, -inf).
//
// The merge of n states is the state of the union of their key sets:
//   m = max_i lse_i;  w_i = exp(lse_i - m);  S = sum_i w_i;
//   O = (sum_i w_i * O_i) / S;  lse = m + log(S)
// in FP32, sums taken in index order 0..n-1 (so the result is a deterministic
// function of the inputs and their order). Empty states (lse == -inf) take no
// part: their O is never read, so garbage there cannot leak in; if every state
// is empty the result is the empty state (O = 0, lse = -inf), never NaN.
// Merging a state with any number of empty states, in any positions, returns
// that state bit for bit, -0.0 included, provided its lse is not NaN: w and S
// are exactly 1, O * 1 / 1 is exact, every sum starts from -0 (the IEEE additive
// identity: -0 + x is x for every x, where +0 + -0 would be +0), and the
// merged lse is m itself when S == 1 (m + log(1) would turn an lse of -0 into
// +0). A NaN output element stays NaN, its payload is not promised (CUDA
// arithmetic returns a canonical NaN). Never average separately normalised
// outputs: that is not a merge.
//
// REQUIRES of every input lse: not +inf (convert FlashAttention-2's +inf empty
// markers with LseFromFlashAttention2 first; a +inf lse yields NaN). NaN in an
// input propagates to the output.
//
// Other conventions:
//   - FlashInfer keeps lse in base 2 (lse2 = lse / ln 2 = log2 sum 2^(s_t log2 e));
//     LseFromBase2 / LseToBase2 convert (-inf stays -inf).
//   - FlashAttention-2 marks an empty row with lse = +inf;
//     LseFromFlashAttention2 / LseToFlashAttention2 convert.
//
// Bit-for-bit promises hold for one compiled copy of this code: the CPU
// backend and the host reference both go through gpu/kernels/cpu_kernels.cc,
// and CUDA streamed and resident attention both go through the same kernels.
// CPU and CUDA results agree within rounding, not bit for bit (the device's
// expf/logf are not glibc's).
//
// Thread safety: pure functions.
#ifndef KVFABRIC_GPU_KERNELS_LSE_H_
#define KVFABRIC_GPU_KERNELS_LSE_H_

#include <math.h>

#include <cstddef>
#include <cstdint>

#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/host_device.h"

namespace kvfabric::gpu::lse {

KVF_HOST_DEVICE inline float NegativeInfinity() { return FloatFromBits(0xff800000u); }
KVF_HOST_DEVICE inline float PositiveInfinity() { return FloatFromBits(0x7f800000u); }
KVF_HOST_DEVICE inline bool IsEmpty(float lse) { return lse == NegativeInfinity(); }
// Where merge sums start: -0 + x is x, bit for bit, for every x (+0 is not:
// +0 + -0 is +0), so a sum of one term is that term.
KVF_HOST_DEVICE inline float NegativeZero() { return FloatFromBits(0x80000000u); }

// ln 2 and log2 e as doubles: conversions compute in FP64 and round once.
inline constexpr double kLn2 = 0.693147180559945309417232121458176568;
inline constexpr double kLog2e = 1.442695040888963407359924681001892137;

KVF_HOST_DEVICE inline float LseFromBase2(float lse2) {
  return static_cast<float>(static_cast<double>(lse2) * kLn2);
}
KVF_HOST_DEVICE inline float LseToBase2(float lse) {
  return static_cast<float>(static_cast<double>(lse) * kLog2e);
}
KVF_HOST_DEVICE inline float LseFromFlashAttention2(float fa2_lse) {
  return fa2_lse == PositiveInfinity() ? NegativeInfinity() : fa2_lse;
}
KVF_HOST_DEVICE inline float LseToFlashAttention2(float lse) {
  return IsEmpty(lse) ? PositiveInfinity() : lse;
}

// The scalar part of a merge of n states of one head: m and S.
struct MergeScale {
  float max_lse;     // m; -inf when every state is empty
  float weight_sum;  // S; 0 when every state is empty, else >= 1
};

// Weight of a state with `lse` in a merge whose maximum is `max_lse`: 0 for an
// empty state. REQUIRES: max_lse is finite or every state is empty.
KVF_HOST_DEVICE inline float StateWeight(float lse, float max_lse) {
  return IsEmpty(lse) ? 0.0f : expf(lse - max_lse);
}

// m and S of `n` lses at lse[0], lse[stride], ... (index order).
KVF_HOST_DEVICE inline MergeScale ComputeMergeScale(const float* lse, std::uint32_t n,
                                                    std::size_t stride) {
  float m = NegativeInfinity();
  for (std::uint32_t i = 0; i < n; ++i) {
    const float l = lse[i * stride];
    if (l > m || l != l) m = l;  // NaN sticks, so it reaches the output
  }
  if (IsEmpty(m)) return {m, 0.0f};
  float s = 0.0f;
  for (std::uint32_t i = 0; i < n; ++i) s += StateWeight(lse[i * stride], m);
  return {m, s};
}

// The merged lse: m + log(S), or -inf when every state was empty. S == 1
// gives m itself: m + log(1) is m except that it turns -0 into +0.
KVF_HOST_DEVICE inline float MergedLse(MergeScale scale) {
  if (scale.weight_sum == 0.0f) return NegativeInfinity();
  return scale.weight_sum == 1.0f ? scale.max_lse : scale.max_lse + logf(scale.weight_sum);
}

// One element of the merged output from its per-state values o[0], o[stride],
// ... : (sum_i w_i o_i) / S with the sum started from -0, or +0 when every
// state was empty.
KVF_HOST_DEVICE inline float MergedElement(const float* o, std::size_t o_stride, const float* lse,
                                           std::size_t lse_stride, std::uint32_t n,
                                           MergeScale scale) {
  if (scale.weight_sum == 0.0f) return 0.0f;
  float acc = NegativeZero();
  for (std::uint32_t i = 0; i < n; ++i) {
    const float l = lse[i * lse_stride];
    if (IsEmpty(l)) continue;
    acc += StateWeight(l, scale.max_lse) * o[i * o_stride];
  }
  return acc / scale.weight_sum;
}

// Merges the states of one head: `n` outputs of `head_dim` floats, state i at
// outputs + i * output_stride, its lse at lses[i * lse_stride]. Writes
// out[0, head_dim) and *out_lse. Element d of out equals
// MergedElement(outputs + d, output_stride, lses, lse_stride, n, scale) bit for
// bit (the same operations in the same order; weights are computed once per
// state here).
// REQUIRES: out does not overlap the inputs.
KVF_HOST_DEVICE inline void MergeHead(const float* outputs, std::size_t output_stride,
                                      const float* lses, std::size_t lse_stride, std::uint32_t n,
                                      std::uint32_t head_dim, float* out, float* out_lse) {
  const MergeScale scale = ComputeMergeScale(lses, n, lse_stride);
  const float start = scale.weight_sum == 0.0f ? 0.0f : NegativeZero();
  for (std::uint32_t d = 0; d < head_dim; ++d) out[d] = start;
  *out_lse = MergedLse(scale);
  if (scale.weight_sum == 0.0f) return;
  for (std::uint32_t i = 0; i < n; ++i) {
    const float l = lses[i * lse_stride];
    if (IsEmpty(l)) continue;
    const float w = StateWeight(l, scale.max_lse);
    const float* o = outputs + i * output_stride;
    for (std::uint32_t d = 0; d < head_dim; ++d) out[d] += w * o[d];
  }
  for (std::uint32_t d = 0; d < head_dim; ++d) out[d] = out[d] / scale.weight_sum;
}

// The merge of two states of one head (a, then b): the same as MergeHead with
// n = 2, bit for bit. REQUIRES: out does not overlap a or b.
KVF_HOST_DEVICE inline void MergeTwo(const float* out_a, float lse_a, const float* out_b,
                                     float lse_b, std::uint32_t head_dim, float* out,
                                     float* out_lse) {
  const float lses[2] = {lse_a, lse_b};
  const MergeScale scale = ComputeMergeScale(lses, 2, 1);
  *out_lse = MergedLse(scale);
  const float wa = IsEmpty(lse_a) ? 0.0f : StateWeight(lse_a, scale.max_lse);
  const float wb = IsEmpty(lse_b) ? 0.0f : StateWeight(lse_b, scale.max_lse);
  for (std::uint32_t d = 0; d < head_dim; ++d) {
    if (scale.weight_sum == 0.0f) {
      out[d] = 0.0f;
      continue;
    }
    float acc = NegativeZero();
    if (!IsEmpty(lse_a)) acc += wa * out_a[d];
    if (!IsEmpty(lse_b)) acc += wb * out_b[d];
    out[d] = acc / scale.weight_sum;
  }
}

}  // namespace kvfabric::gpu::lse

#endif  // KVFABRIC_GPU_KERNELS_LSE_H_
