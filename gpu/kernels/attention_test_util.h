// Test helpers shared by the CPU and CUDA attention kernel tests: random
// problems with adversarial logits, the FP64 comparison and the tolerance it
// asserts. For tests only (uses GoogleTest assertions).
#ifndef KVFABRIC_GPU_KERNELS_ATTENTION_TEST_UTIL_H_
#define KVFABRIC_GPU_KERNELS_ATTENTION_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/kernel_args.h"

namespace kvfabric::gpu::testing {

// Element conversion for test data (the kernels' own float_convert.h).
void Store(KvDtype dtype, float x, std::byte* dst);
float Load(KvDtype dtype, const std::byte* src);

enum class Logits { kNormal, kHuge, kTiny, kAllEqual };
const char* Name(Logits l);

// One query and a history of K/V, stored in the shape's dtype.
struct Problem {
  AttentionShape shape;
  float scale = 0;
  std::uint32_t tokens = 0;
  std::vector<float> q;
  std::vector<std::byte> k, v;

  std::size_t QElems() const { return std::size_t{shape.num_q_heads} * shape.head_dim; }
  std::size_t KvElems() const { return std::size_t{tokens} * shape.num_kv_heads * shape.head_dim; }
  float KAt(std::size_t i) const { return Load(shape.dtype, &k[i * KvDtypeSize(shape.dtype)]); }
  float VAt(std::size_t i) const { return Load(shape.dtype, &v[i * KvDtypeSize(shape.dtype)]); }
};

// Huge: logits spread over about ±1e4 (|scale * q.k| up to ~1e4), so exp
// without the maximum subtracted overflows. Tiny: logits ~1e-30. All-equal:
// every key is the same row, so every logit of a head is the same.
// scale = 1/sqrt(head_dim); values ~ N(0, 3^2).
Problem MakeProblem(std::mt19937_64& rng, KvDtype dtype, std::uint32_t q_heads,
                    std::uint32_t kv_heads, std::uint32_t head_dim, std::uint32_t tokens,
                    Logits logits);

// Output [num_q_heads, head_dim] and lse [num_q_heads] of one attention.
struct State {
  std::vector<float> out, lse;
};

void ExpectNoNaN(const State& s, const std::string& what);

// The tolerance asserted against FP64, from standard error analysis (first
// order in u = 2^-24; Higham ch. 3):
//   - each FP32 logit s_t = scale * dot is off from the exact one by at most
//       delta_t = scale * sum_d |q_d k_td| * gamma(head_dim / 8 + 4) + 2 u |s_t|
//     (Dot sums 8 lanes of head_dim/8 products then a 3-level tree; then the
//     scale multiply and the max subtraction);
//   - exponentials, the sums of p over a tile, the division and each of the
//     `tiles` merges add at most (tokens + 8 * tiles + 8) u relative error to
//     each normalised weight;
//   - so with eps = 2 * max_t delta_t + (tokens + 8 * tiles + 8) u every
//     weight is within a factor exp(±eps) of the exact one, the output (a
//     convex combination of v) within max|v| * expm1(2 eps), and lse within
//     eps + u |lse|.
// It is a worst-case bound, typically 10-100x above the observed error; with
// huge logits (|s| ~ 1e4) it is dominated by the logits' own FP32 rounding,
// which no FP32 kernel can avoid.
struct Tolerance {
  double out, lse;
};

// `tiles`: how many tile states were merged to produce the result (1 for one
// tile). Also covers the CUDA kernel's online softmax (its dot has depth
// head_dim / 32 + 5 <= head_dim / 8 + 4, and its rescalings are counted in
// the `tokens` term). `dot_roundings` replaces head_dim / 8 + 4 for a kernel
// whose logits take more roundings: the compact_int8 kernels over a Problem
// of their decoded fp32 values take head_dim + 3 (the query times the scale
// and the key's channel scale, times the code, then a sum that may run in
// sequence; the decoded keys code * scale are exact in fp32). 0: the default.
Tolerance BoundFor(const Problem& p, std::uint32_t tiles, std::uint32_t dot_roundings = 0);

// Asserts `s` is NaN-free and within BoundFor(p, tiles, dot_roundings) of
// NaiveAttentionFp64; returns the largest error as a fraction of the tolerance.
double ExpectNearFp64(const Problem& p, const State& s, std::uint32_t tiles,
                      const std::string& what, std::uint32_t dot_roundings = 0);

}  // namespace kvfabric::gpu::testing

#endif  // KVFABRIC_GPU_KERNELS_ATTENTION_TEST_UTIL_H_
