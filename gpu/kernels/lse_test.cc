#include "gpu/kernels/lse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/kernels/float_convert.h"

namespace kvfabric::gpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Distance in units in the last place between two finite floats of one sign.
std::int64_t UlpDistance(float a, float b) {
  auto key = [](float f) {
    const std::int64_t u = FloatBits(f);
    return (u & 0x80000000) ? -(u & 0x7fffffff) : u;
  };
  return std::llabs(key(a) - key(b));
}

TEST(Fp16ConvertTest, EveryHalfRoundTripsThroughFloat) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16BitsToFloat(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16BitsToFloat(FloatToFp16Bits(f)))) << h;
      continue;
    }
    ASSERT_EQ(FloatToFp16Bits(f), h) << "half bits " << h << " float " << f;
  }
}

TEST(Fp16ConvertTest, KnownValues) {
  EXPECT_EQ(Fp16BitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16BitsToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToFp16Bits(65519.0f), 0x7bff);          // below the halfway point
  EXPECT_EQ(FloatToFp16Bits(65520.0f), 0x7c00);          // ties to even: infinity
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -25)), 0);  // halfway to the smallest: even is 0
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.5f, -25)), 1);
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(3.0f, -25)), 2);              // 1.5 units: ties to even 2
  EXPECT_EQ(FloatToFp16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even
  EXPECT_EQ(FloatToFp16Bits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, up to even
  EXPECT_EQ(FloatToFp16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16Bits(-kInf), 0xfc00);
}

#if defined(__FLT16_MAX__)
TEST(Fp16ConvertTest, NarrowingMatchesTheCompilersFloat16) {
  std::mt19937_64 rng(TestSeed("Fp16ConvertTest.NarrowingMatchesTheCompilersFloat16"));
  for (int i = 0; i < 2'000'000; ++i) {
    // Bias exponents towards binary16's range so every path is exercised.
    std::uint32_t bits = static_cast<std::uint32_t>(rng());
    if (i % 2) bits = (bits & 0x807fffffu) | ((96u + (bits >> 24) % 48u) << 23);
    const float f = FloatFromBits(bits);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t expected;
    std::memcpy(&expected, &h, 2);
    ASSERT_EQ(FloatToFp16Bits(f), expected) << "float bits " << std::hex << bits;
  }
}
#endif

TEST(Bf16ConvertTest, EveryBf16RoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16BitsToFloat(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(f)))) << b;
      continue;
    }
    ASSERT_EQ(FloatToBf16Bits(f), b) << b;
  }
}

TEST(Bf16ConvertTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(FloatFromBits(0x3f808000)), 0x3f80);          // tie, even stays
  EXPECT_EQ(FloatToBf16Bits(FloatFromBits(0x3f818000)), 0x3f82);          // tie, up to even
  EXPECT_EQ(FloatToBf16Bits(FloatFromBits(0x3f808001)), 0x3f81);          // above the tie
  EXPECT_EQ(FloatToBf16Bits(FloatFromBits(0x3f807fff)), 0x3f80);          // below the tie
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);  // infinity
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(FloatFromBits(0x7f800001)))))
      << "a NaN whose payload sits in the low bits must not become infinity";
}

TEST(LseConventionTest, Base2RoundTripsWithinOneUlp) {
  std::mt19937_64 rng(TestSeed("LseConventionTest.Base2RoundTripsWithinOneUlp"));
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng);
    const float back = lse::LseFromBase2(lse::LseToBase2(x));
    ASSERT_LE(UlpDistance(x, back), 1) << x << " came back as " << back;
    ASSERT_NEAR(lse::LseToBase2(x), x / std::log(2.0), 1e-6 * std::abs(x) + 1e-30);
  }
  EXPECT_EQ(lse::LseFromBase2(-kInf), -kInf);
  EXPECT_EQ(lse::LseToBase2(-kInf), -kInf);
  EXPECT_EQ(lse::LseFromBase2(1.0f), static_cast<float>(std::log(2.0)));
}

TEST(LseConventionTest, FlashAttention2EmptyMarkerRoundTrips) {
  EXPECT_EQ(lse::LseFromFlashAttention2(kInf), -kInf);
  EXPECT_EQ(lse::LseToFlashAttention2(-kInf), kInf);
  for (float x : {0.0f, -1.5f, 3.25f, 1e4f, -1e4f}) {
    EXPECT_EQ(lse::LseFromFlashAttention2(x), x);
    EXPECT_EQ(lse::LseToFlashAttention2(lse::LseFromFlashAttention2(x)), x);
  }
  // A converted FA2 empty state merges as empty.
  const float o[2] = {7.0f, 8.0f}, garbage[2] = {NAN, NAN};
  float out[2], out_lse;
  lse::MergeTwo(o, 0.5f, garbage, lse::LseFromFlashAttention2(kInf), 2, out, &out_lse);
  EXPECT_EQ(out[0], 7.0f);
  EXPECT_EQ(out[1], 8.0f);
  EXPECT_EQ(out_lse, 0.5f);
}

TEST(LseMergeTest, TwoEmptyStatesMergeToAnEmptyStateWithoutNaN) {
  const float a[3] = {0, 0, 0}, b[3] = {NAN, 1, 2};  // an empty state's output is never read
  float out[3] = {5, 5, 5}, out_lse = 5;
  lse::MergeTwo(a, -kInf, b, -kInf, 3, out, &out_lse);
  EXPECT_EQ(out_lse, -kInf);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  const float outs[6] = {NAN, NAN, NAN, 1, 2, 3}, lses[2] = {-kInf, -kInf};
  lse::MergeHead(outs, 3, lses, 1, 2, 3, out, &out_lse);
  EXPECT_EQ(out_lse, -kInf);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  lse::MergeHead(outs, 3, lses, 1, 0, 3, out, &out_lse);  // zero states
  EXPECT_EQ(out_lse, -kInf);
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

TEST(LseMergeTest, MergingWithAnEmptyStateIsExact) {
  std::mt19937_64 rng(TestSeed("LseMergeTest.MergingWithAnEmptyStateIsExact"));
  std::normal_distribution<float> dist(0.0f, 100.0f);
  const float empty[4] = {0, 0, 0, 0};
  for (int i = 0; i < 10000; ++i) {
    float o[4], out[4], out_lse;
    for (float& x : o) x = dist(rng);
    const float l = dist(rng);
    lse::MergeTwo(o, l, empty, -kInf, 4, out, &out_lse);
    ASSERT_EQ(std::memcmp(o, out, sizeof(o)), 0);
    ASSERT_EQ(FloatBits(out_lse), FloatBits(l));
    lse::MergeTwo(empty, -kInf, o, l, 4, out, &out_lse);
    ASSERT_EQ(std::memcmp(o, out, sizeof(o)), 0);
    ASSERT_EQ(FloatBits(out_lse), FloatBits(l));
  }
}

// Regression: sums that started from +0 turned a -0.0 output into +0.0
// (+0 + -0 is +0), and m + log(1) turned an lse of -0.0 into +0.0. Checked on
// every merge entry point, MergedElement/MergedLse included (the CUDA
// MergeStatesKernel's path), with the empty states before and after.
TEST(LseMergeTest, MergingWithAnEmptyStateKeepsNegativeZeroBits) {
  const float o[4] = {-0.0f, 0.0f, -0.0f, -1.5f};
  const float garbage[4] = {NAN, NAN, NAN, NAN};  // an empty state's output is never read
  for (const float l : {-0.0f, 0.0f, 0.75f, -3.0f}) {
    SCOPED_TRACE(::testing::Message() << "lse bits 0x" << std::hex << FloatBits(l));
    float out[4], out_lse;
    lse::MergeTwo(o, l, garbage, -kInf, 4, out, &out_lse);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(FloatBits(out[d]), FloatBits(o[d])) << "(o, empty) " << d;
    EXPECT_EQ(FloatBits(out_lse), FloatBits(l)) << "(o, empty)";
    lse::MergeTwo(garbage, -kInf, o, l, 4, out, &out_lse);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(FloatBits(out[d]), FloatBits(o[d])) << "(empty, o) " << d;
    EXPECT_EQ(FloatBits(out_lse), FloatBits(l)) << "(empty, o)";

    // MergeHead and the per-element path over 2 and 3 states, the non-empty
    // one at every position.
    for (std::uint32_t n : {2u, 3u}) {
      for (std::uint32_t at = 0; at < n; ++at) {
        SCOPED_TRACE(::testing::Message() << "state " << at << " of " << n);
        float outs[3][4], lses[3];
        for (std::uint32_t i = 0; i < n; ++i) {
          std::memcpy(outs[i], i == at ? o : garbage, sizeof(o));
          lses[i] = i == at ? l : -kInf;
        }
        lse::MergeHead(&outs[0][0], 4, lses, 1, n, 4, out, &out_lse);
        for (int d = 0; d < 4; ++d) EXPECT_EQ(FloatBits(out[d]), FloatBits(o[d])) << "MergeHead";
        EXPECT_EQ(FloatBits(out_lse), FloatBits(l)) << "MergeHead";
        const lse::MergeScale s = lse::ComputeMergeScale(lses, n, 1);
        for (int d = 0; d < 4; ++d) {
          EXPECT_EQ(FloatBits(lse::MergedElement(&outs[0][d], 4, lses, 1, n, s)), FloatBits(o[d]))
              << "MergedElement " << d;
        }
        EXPECT_EQ(FloatBits(lse::MergedLse(s)), FloatBits(l)) << "MergedLse";
      }
    }
  }
}

TEST(LseMergeTest, MergeTwoEqualsMergeHeadOfTwoBitForBit) {
  std::mt19937_64 rng(TestSeed("LseMergeTest.MergeTwoEqualsMergeHeadOfTwoBitForBit"));
  std::normal_distribution<float> dist(0.0f, 30.0f);
  for (int i = 0; i < 10000; ++i) {
    float outs[2][8], lses[2];
    for (auto& row : outs)
      for (float& x : row) x = dist(rng);
    lses[0] = dist(rng);
    lses[1] = i % 7 == 0 ? -kInf : dist(rng);
    float a[8], b[8], la, lb;
    lse::MergeTwo(outs[0], lses[0], outs[1], lses[1], 8, a, &la);
    lse::MergeHead(&outs[0][0], 8, lses, 1, 2, 8, b, &lb);
    ASSERT_EQ(std::memcmp(a, b, sizeof(a)), 0);
    ASSERT_EQ(FloatBits(la), FloatBits(lb));
    for (int d = 0; d < 8; ++d) {
      const lse::MergeScale s = lse::ComputeMergeScale(lses, 2, 1);
      ASSERT_EQ(FloatBits(b[d]), FloatBits(lse::MergedElement(&outs[0][d], 8, lses, 1, 2, s)));
    }
  }
}

// States built from known logits: merging the states of a split key set gives
// the state of the whole set (checked against FP64).
TEST(LseMergeTest, MergeOfSplitSoftmaxEqualsTheWholeWithinTolerance) {
  std::mt19937_64 rng(TestSeed("LseMergeTest.MergeOfSplitSoftmaxEqualsTheWholeWithinTolerance"));
  std::uniform_int_distribution<int> parts_dist(1, 12);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = parts_dist(rng);
    // Logit offsets up to ±1e4 between states: exp of their difference
    // underflows to 0 unless the merge subtracts the maximum first.
    const float spread = trial % 3 == 0 ? 1e4f : 10.0f;
    std::uniform_real_distribution<float> lse_dist(-spread, spread);
    std::normal_distribution<float> o_dist(0.0f, 1.0f);
    std::vector<float> outs(n * 2), lses(n);
    for (float& x : outs) x = o_dist(rng);
    for (float& x : lses) x = lse_dist(rng);
    if (trial % 5 == 0 && n > 1) lses[0] = -kInf;  // an empty state among others
    float out[2], out_lse;
    lse::MergeHead(outs.data(), 2, lses.data(), 1, n, 2, out, &out_lse);
    double m = -INFINITY;
    for (float l : lses) m = std::max<double>(m, l);
    double s = 0, acc[2] = {0, 0};
    for (int i = 0; i < n; ++i) {
      const double w = std::exp(double{lses[i]} - m);
      s += w;
      for (int d = 0; d < 2; ++d) acc[d] += w * outs[i * 2 + d];
    }
    const double ref_lse = m + std::log(s);
    // FP32 merge of n states: each weight carries ~2 ulp (exp of a rounded
    // difference whose magnitude is at most 2*spread: |error| <= 2 spread u),
    // sums n ulp. Bound: max|O| * (n + 4) u + 2 spread u.
    const double u = std::ldexp(1.0, -24);
    const double tol_o = 4.0 * ((n + 4) * u + 2 * spread * u);
    for (int d = 0; d < 2; ++d) {
      ASSERT_FALSE(std::isnan(out[d]));
      ASSERT_NEAR(out[d], acc[d] / s, tol_o) << "trial " << trial << " n " << n;
    }
    ASSERT_NEAR(out_lse, ref_lse, 4.0 * (std::abs(ref_lse) + n) * u) << "trial " << trial;
  }
}

TEST(LseMergeTest, NaNInAStateReachesTheOutput) {
  const float outs[4] = {1, 2, 3, 4};
  const float lses[2] = {0.0f, NAN};
  float out[2], out_lse;
  lse::MergeHead(outs, 2, lses, 1, 2, 2, out, &out_lse);
  EXPECT_TRUE(std::isnan(out_lse));
  EXPECT_TRUE(std::isnan(out[0]));
}

}  // namespace
}  // namespace kvfabric::gpu
