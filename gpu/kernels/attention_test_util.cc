#include "gpu/kernels/attention_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/reference_attention.h"

namespace kvfabric::gpu::testing {
namespace {

constexpr double kU = 0x1p-24;  // FP32 unit roundoff

}  // namespace

void Store(KvDtype dtype, float x, std::byte* dst) {
  if (dtype == KvDtype::kFp32) {
    std::memcpy(dst, &x, 4);
    return;
  }
  const std::uint16_t bits = dtype == KvDtype::kFp16 ? FloatToFp16Bits(x) : FloatToBf16Bits(x);
  std::memcpy(dst, &bits, 2);
}

float Load(KvDtype dtype, const std::byte* src) {
  if (dtype == KvDtype::kFp32) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  std::uint16_t bits;
  std::memcpy(&bits, src, 2);
  return dtype == KvDtype::kFp16 ? Fp16BitsToFloat(bits) : Bf16BitsToFloat(bits);
}

const char* Name(Logits l) {
  switch (l) {
    case Logits::kNormal:
      return "normal";
    case Logits::kHuge:
      return "huge";
    case Logits::kTiny:
      return "tiny";
    case Logits::kAllEqual:
      return "all-equal";
  }
  return "?";
}

Problem MakeProblem(std::mt19937_64& rng, KvDtype dtype, std::uint32_t q_heads,
                    std::uint32_t kv_heads, std::uint32_t head_dim, std::uint32_t tokens,
                    Logits logits) {
  Problem p;
  p.shape = {q_heads, kv_heads, head_dim, dtype};
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.tokens = tokens;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float q_mult = 1.0f;
  if (logits == Logits::kHuge) q_mult = 5e3f;  // logits ~ N(0, 5e3): many beyond ±1e4
  if (logits == Logits::kTiny) q_mult = 1e-30f;
  p.q.resize(p.QElems());
  for (float& x : p.q) x = normal(rng) * q_mult;
  const std::size_t es = KvDtypeSize(dtype);
  p.k.resize(p.KvElems() * es);
  p.v.resize(p.KvElems() * es);
  const std::size_t row = std::size_t{kv_heads} * head_dim;
  for (std::size_t i = 0; i < p.KvElems(); ++i) {
    const float kx = logits == Logits::kAllEqual && i >= row ? p.KAt(i % row) : normal(rng);
    Store(dtype, kx, &p.k[i * es]);
    Store(dtype, normal(rng) * 3.0f, &p.v[i * es]);
  }
  return p;
}

void ExpectNoNaN(const State& s, const std::string& what) {
  for (float x : s.out) ASSERT_FALSE(std::isnan(x)) << what;
  for (float x : s.lse) ASSERT_FALSE(std::isnan(x)) << what;
}

Tolerance BoundFor(const Problem& p, std::uint32_t tiles, std::uint32_t dot_roundings) {
  const std::uint32_t dim = p.shape.head_dim;
  const std::uint32_t group = p.shape.num_q_heads / p.shape.num_kv_heads;
  const double n = dot_roundings != 0 ? dot_roundings : dim / 8 + 4;
  const double gamma = n * kU / (1 - n * kU);
  double delta = 0, vmax = 0;
  for (std::uint32_t h = 0; h < p.shape.num_q_heads; ++h) {
    for (std::uint32_t t = 0; t < p.tokens; ++t) {
      double abs_dot = 0, dot = 0;
      for (std::uint32_t d = 0; d < dim; ++d) {
        const std::size_t ki = (std::size_t{t} * p.shape.num_kv_heads + h / group) * dim + d;
        abs_dot += std::abs(double{p.q[std::size_t{h} * dim + d]} * p.KAt(ki));
        dot += double{p.q[std::size_t{h} * dim + d]} * p.KAt(ki);
      }
      delta = std::max(delta, p.scale * abs_dot * gamma + 2 * kU * std::abs(p.scale * dot));
    }
  }
  for (std::size_t i = 0; i < p.KvElems(); ++i) vmax = std::max(vmax, double{std::abs(p.VAt(i))});
  const double eps = 2 * delta + (p.tokens + 8.0 * tiles + 8) * kU;
  return {vmax * std::expm1(2 * eps) + 1e-30, eps};
}

// Asserts `s` is within BoundFor of FP64 and NaN-free; returns the largest
// error as a fraction of the tolerance.
double ExpectNearFp64(const Problem& p, const State& s, std::uint32_t tiles,
                      const std::string& what, std::uint32_t dot_roundings) {
  std::vector<double> out(p.QElems()), lse(p.shape.num_q_heads);
  Status st = NaiveAttentionFp64(p.shape, p.scale, p.tokens, p.q, p.k, p.v, out, lse);
  EXPECT_TRUE(st.ok()) << st;
  ExpectNoNaN(s, what);
  const Tolerance tol = BoundFor(p, tiles, dot_roundings);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double err = std::abs(s.out[i] - out[i]);
    EXPECT_LE(err, tol.out) << what << " out[" << i << "]=" << s.out[i] << " fp64 " << out[i];
    worst = std::max(worst, err / tol.out);
  }
  for (std::size_t h = 0; h < lse.size(); ++h) {
    const double tol_lse = tol.lse + kU * std::abs(lse[h]);
    const double err = std::abs(s.lse[h] - lse[h]);
    EXPECT_LE(err, tol_lse) << what << " lse[" << h << "]=" << s.lse[h] << " fp64 " << lse[h];
    worst = std::max(worst, err / tol_lse);
  }
  return worst;
}

}  // namespace kvfabric::gpu::testing
