#include "core/cost_fit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

constexpr PathParameters kNvme{85.0, 1.95e9};
constexpr RecomputeParameters kModel{2000.0, 10.0, 0.001};

std::vector<TransferSample> PathProbes(const PathParameters& truth, double noise,
                                       std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, noise);
  std::vector<TransferSample> out;
  for (uint64_t bytes = 64 << 10; bytes <= (256ull << 20); bytes *= 2) {
    for (int rep = 0; rep < 5; ++rep) {
      out.push_back({bytes, FetchMicros(truth, static_cast<double>(bytes)) * (1 + n(rng))});
    }
  }
  return out;
}

std::vector<RecomputeSample> RecomputeProbes(const RecomputeParameters& truth, double noise,
                                             std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, noise);
  std::vector<RecomputeSample> out;
  for (uint64_t n : {128, 512, 2048, 8192}) {
    for (uint64_t p : {0, 1024, 8192, 32768}) {
      for (int rep = 0; rep < 3; ++rep) {
        const double t = RecomputeMicros(truth, static_cast<double>(n), static_cast<double>(p));
        out.push_back({n, p, t * (1 + nd(rng))});
      }
    }
  }
  return out;
}

TEST(FitPathParametersTest, RecoversAlphaAndBetaExactlyWithoutNoise) {
  std::mt19937_64 rng(1);
  auto fit = FitPathParameters(PathProbes(kNvme, 0.0, rng));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->alpha_us, kNvme.alpha_us, 1e-6 * kNvme.alpha_us);
  EXPECT_NEAR(fit->beta_bytes_per_s, kNvme.beta_bytes_per_s, 1e-9 * kNvme.beta_bytes_per_s);
}

// Tolerances for 1% multiplicative noise over 65 probes from 64 KiB to 256 MiB, set from the
// worst case over 20,000 seeds (relative weighting: beta 0.65%, alpha 2.0%; absolute
// weighting, which the largest probes dominate: beta 1.39%) with headroom: beta within 1%
// (relative) or 2.5% (absolute), alpha within 10% (alpha is 85 µs against 118 µs for the
// smallest probe, so it is pinned only by the small sizes).
TEST(FitPathParametersTest, RecoversAlphaAndBetaFromNoisyProbes) {
  std::mt19937_64 rng(TestSeed("FitPathParametersTest.RecoversAlphaAndBetaFromNoisyProbes"));
  for (FitWeighting w : {FitWeighting::kRelative, FitWeighting::kAbsolute}) {
    auto fit = FitPathParameters(PathProbes(kNvme, 0.01, rng), {w});
    ASSERT_TRUE(fit.ok()) << fit.status();
    const double beta_tolerance = w == FitWeighting::kRelative ? 0.01 : 0.025;
    EXPECT_NEAR(fit->beta_bytes_per_s, kNvme.beta_bytes_per_s,
                beta_tolerance * kNvme.beta_bytes_per_s);
    if (w == FitWeighting::kRelative) {
      EXPECT_NEAR(fit->alpha_us, kNvme.alpha_us, 0.10 * kNvme.alpha_us);
    }
    EXPECT_GE(fit->alpha_us, 0);
  }
}

TEST(FitPathParametersTest, NeverReturnsNegativeAlpha) {
  // A path with no fixed cost and noise: an unconstrained fit would go negative about half the
  // time.
  std::mt19937_64 rng(TestSeed("FitPathParametersTest.NeverReturnsNegativeAlpha"));
  for (int trial = 0; trial < 50; ++trial) {
    auto fit = FitPathParameters(PathProbes({0.0, 10e9}, 0.02, rng));
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_GE(fit->alpha_us, 0);
    EXPECT_NEAR(fit->beta_bytes_per_s, 10e9, 0.02 * 10e9);
  }
}

TEST(FitPathParametersTest, RefusesOneDistinctSize) {
  std::vector<TransferSample> s(10, {1 << 20, 600.0});
  auto fit = FitPathParameters(s);
  ASSERT_EQ(fit.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("2 distinct sizes"), std::string_view::npos)
      << fit.status();
  EXPECT_NE(fit.status().message().find("got 1 distinct"), std::string_view::npos);
  EXPECT_EQ(FitPathParameters({}).status().code(), StatusCode::kFailedPrecondition);
}

TEST(FitPathParametersTest, RefusesTimeThatShrinksWithSize) {
  std::vector<TransferSample> s = {{1 << 20, 600.0}, {8 << 20, 500.0}, {64 << 20, 400.0}};
  EXPECT_EQ(FitPathParameters(s).status().code(), StatusCode::kFailedPrecondition);
}

TEST(FitPathParametersTest, RejectsBadSamplesNamingTheIndex) {
  std::vector<TransferSample> s = {{1 << 20, 600.0}, {2 << 20, -1.0}};
  auto fit = FitPathParameters(s);
  ASSERT_EQ(fit.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fit.status().message().find("samples[1].observed_us"), std::string_view::npos);
  s[1] = {0, 5.0};
  EXPECT_NE(FitPathParameters(s).status().message().find("samples[1].bytes"),
            std::string_view::npos);
}

// 1% noise over 48 prefills: c1 and c2 within 5%, c0 (2 ms against 3.3 ms for the smallest
// prefill) within 15%.
TEST(FitRecomputeParametersTest, RecoversCoefficientsFromNoisyPrefills) {
  std::mt19937_64 rng(TestSeed("FitRecomputeParametersTest.RecoversCoefficientsFromNoisyPrefills"));
  auto fit = FitRecomputeParameters(RecomputeProbes(kModel, 0.01, rng));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->c0_us, kModel.c0_us, 0.15 * kModel.c0_us);
  EXPECT_NEAR(fit->c1_us_per_token, kModel.c1_us_per_token, 0.05 * kModel.c1_us_per_token);
  EXPECT_NEAR(fit->c2_us_per_token2, kModel.c2_us_per_token2, 0.05 * kModel.c2_us_per_token2);
}

// Exact data are fitted exactly, c3 (the per-call cost per prefix token, reading the prefix's K
// and V) included; a prefill without such a cost gets c3 = 0 (non-negative least squares).
TEST(FitRecomputeParametersTest, RecoversCoefficientsExactlyWithoutNoise) {
  RecomputeParameters with_prefix = kModel;
  with_prefix.c3_us_per_prefix_token = 0.5;
  for (const RecomputeParameters& truth : {kModel, with_prefix}) {
    SCOPED_TRACE(truth.c3_us_per_prefix_token);
    std::mt19937_64 rng(1);
    auto fit = FitRecomputeParameters(RecomputeProbes(truth, 0.0, rng));
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_NEAR(fit->c0_us, truth.c0_us, 1e-6 * truth.c0_us);
    EXPECT_NEAR(fit->c1_us_per_token, truth.c1_us_per_token, 1e-6 * truth.c1_us_per_token);
    EXPECT_NEAR(fit->c2_us_per_token2, truth.c2_us_per_token2, 1e-6 * truth.c2_us_per_token2);
    EXPECT_NEAR(fit->c3_us_per_prefix_token, truth.c3_us_per_prefix_token, 1e-6);
  }
}

// Prefills after no prefix cannot separate c3 (its column is 0): the three-term fit, c3 = 0.
TEST(FitRecomputeParametersTest, ShapesWithoutAPrefixFitThreeTerms) {
  std::vector<RecomputeSample> s;
  for (uint64_t n : {16, 64, 256, 1024}) {
    s.push_back({n, 0, RecomputeMicros(kModel, static_cast<double>(n), 0)});
  }
  auto fit = FitRecomputeParameters(s);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->c3_us_per_prefix_token, 0);
  EXPECT_NEAR(fit->c1_us_per_token, kModel.c1_us_per_token, 1e-6 * kModel.c1_us_per_token);
}

TEST(FitRecomputeParametersTest, RefusesFewerThanThreeShapes) {
  std::vector<RecomputeSample> s = {{128, 0, 3000}, {128, 0, 3010}, {512, 0, 7000}};
  auto fit = FitRecomputeParameters(s);
  ASSERT_EQ(fit.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("got 2"), std::string_view::npos) << fit.status();
}

TEST(FitRecomputeParametersTest, RefusesConstantTokenCount) {
  // Three shapes, but n never varies: c0 and c1 are the same column.
  std::vector<RecomputeSample> s = {{256, 0, 5000}, {256, 1024, 5300}, {256, 4096, 6200}};
  auto fit = FitRecomputeParameters(s);
  ASSERT_EQ(fit.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fit.status().message().find("every sample has n = 256"), std::string_view::npos)
      << fit.status();
}

TEST(OnlinePathFitTest, ConvergesAndFollowsAChangedPath) {
  std::mt19937_64 rng(TestSeed("OnlinePathFitTest.ConvergesAndFollowsAChangedPath"));
  std::uniform_int_distribution<int> shift(16, 28);  // 64 KiB .. 256 MiB
  std::normal_distribution<double> noise(0.0, 0.01);
  OnlinePathFit fit;
  const PathParameters before{20.0, 12e9};
  const PathParameters after{40.0, 3e9};  // the link degraded
  for (int i = 0; i < 100000; ++i) {
    const PathParameters& truth = i < 50000 ? before : after;
    const uint64_t bytes = 1ull << shift(rng);
    ASSERT_TRUE(
        fit.Observe(bytes, FetchMicros(truth, static_cast<double>(bytes)) * (1 + noise(rng))));
    if (i == 49999 || i == 99999) {
      auto p = fit.Fit();
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_NEAR(p->beta_bytes_per_s, truth.beta_bytes_per_s, 0.02 * truth.beta_bytes_per_s);
      EXPECT_NEAR(p->alpha_us, truth.alpha_us, 0.15 * truth.alpha_us);
    }
  }
  // Bounded: the state does not grow, and the effective window is 1 / (1 - decay).
  static_assert(OnlinePathFit::MemoryBytes() == sizeof(OnlinePathFit));
  EXPECT_LE(fit.effective_observations(), 1000.0 + 1e-6);
  EXPECT_GT(fit.effective_observations(), 999.0);
}

TEST(OnlinePathFitTest, RefusesUntilSizesDiffer) {
  OnlinePathFit fit;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(fit.Observe(1 << 20, 100.0));
  EXPECT_EQ(fit.Fit().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fit.Observe(0, 1.0));
  EXPECT_FALSE(fit.Observe(1, std::nan("")));
  ASSERT_TRUE(fit.Observe(64 << 20, 100.0 + 63 * 50.0));
  EXPECT_TRUE(fit.Fit().ok());
}

// A path the line cannot follow, shaped like the memcpy and daemon-get probes of 2026-12-02:
// small copies run faster than the line through the large ones predicts (cache), and the
// largest slower again. The truth is the line times a curve.
PathParameters CurvedTruth() {
  PathParameters p{40.0, 10e9};
  p.size_factors = {0.70, 0.80, 0.95, 1.05, 1.10, 1.00, 0.90, 0.90};
  return p;
}

double WorstError(const PathParameters& model, const std::vector<TransferSample>& samples,
                  bool line_only) {
  double worst = 0;
  for (const TransferSample& s : samples) {
    const double b = static_cast<double>(s.bytes);
    const double predicted = line_only ? LineMicros(model, b) : FetchMicros(model, b);
    worst = std::max(worst, std::fabs(s.observed_us / predicted - 1));
  }
  return worst;
}

TEST(FitPathParametersTest, TheSizeCurveFollowsWhatTheLineCannot) {
  const PathParameters truth = CurvedTruth();
  std::vector<TransferSample> samples;
  for (int j = 0; j < 7; ++j) {  // the probe's sizes: 64 KiB .. 256 MiB
    const uint64_t bytes = SizeClassBytes(j);
    samples.push_back({bytes, FetchMicros(truth, static_cast<double>(bytes))});
  }
  FitOptions line_only;
  line_only.fit_size_curve = false;
  auto line = FitPathParameters(samples, line_only);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(HasFlatSizeCurve(*line));
  auto curved = FitPathParameters(samples);
  ASSERT_TRUE(curved.ok()) << curved.status();
  // The same line either way; the curve only corrects its residuals.
  EXPECT_DOUBLE_EQ(curved->alpha_us, line->alpha_us);
  EXPECT_DOUBLE_EQ(curved->beta_bytes_per_s, line->beta_bytes_per_s);
  const double line_worst = WorstError(*line, samples, /*line_only=*/true);
  const double curve_worst = WorstError(*curved, samples, /*line_only=*/false);
  EXPECT_GT(line_worst, 0.10);
  // Each knot moves 1 / (1 + 0.1) of the way (the prior of FitOptions): within 1% here.
  EXPECT_LT(curve_worst, 0.012) << "line alone: " << line_worst;
  // Between the knots it interpolates: half way (in log size) between 1 and 4 MiB.
  const double mid = 2.0 * (1 << 20);
  EXPECT_NEAR(FetchMicros(*curved, mid) / FetchMicros(truth, mid), 1.0, 0.03);
  // Beyond the largest size measured (256 MiB, knot 6), the factor measured there.
  EXPECT_DOUBLE_EQ(curved->size_factors[7], curved->size_factors[6]);
  EXPECT_NE(curved->size_factors[7], 1.0);
}

TEST(OnlinePathFitTest, TheCurveIsFittedAgainstWhicheverLineIsInForce) {
  // Every transfer the same size (one source's stream per load): the line cannot be separated,
  // but the curve learns what transfers of that size take, against any line it is asked for.
  OnlinePathFit fit;
  const uint64_t bytes = 8 << 20;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(fit.Observe(bytes, 3000.0));
  EXPECT_FALSE(fit.Fit().ok());
  for (const PathParameters& line : {PathParameters{100.0, 4e9}, PathParameters{10.0, 2e9}}) {
    const PathParameters p = fit.WithCurve(line);
    EXPECT_EQ(p.alpha_us, line.alpha_us);
    EXPECT_NEAR(FetchMicros(p, static_cast<double>(bytes)), 3000.0, 3000.0 * 0.03)
        << ExplainFetch(BusPath::kRemoteHostToLocalHost, p, bytes);
    // Far from the sizes seen, the line stands.
    EXPECT_DOUBLE_EQ(SizeFactor(p, 64 << 10), 1.0);
  }
  // A prior's curve is where knots without observations start.
  OnlinePathFit seeded;
  PathParameters prior{100.0, 4e9};
  prior.size_factors[0] = 0.8;
  seeded.SeedPrior(prior, 0.1);
  EXPECT_DOUBLE_EQ(seeded.WithCurve(prior).size_factors[0], 0.8);
  OnlineFitOptions flat;
  flat.fit_size_curve = false;
  OnlinePathFit off(flat);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(off.Observe(bytes, 3000.0));
  EXPECT_TRUE(HasFlatSizeCurve(off.WithCurve(prior)));
}

// Feeds `fit` `count` prefills of `truth` with 1% noise, n in [16, max_n], p in [0, max_p].
void ObserveRandomPrefills(const RecomputeParameters& truth, uint64_t max_n, uint64_t max_p,
                           int count, std::mt19937_64& rng, OnlineRecomputeFit* fit) {
  std::uniform_int_distribution<uint64_t> n_dist(16, max_n);
  std::uniform_int_distribution<uint64_t> p_dist(0, max_p);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < count; ++i) {
    const uint64_t n = n_dist(rng), p = p_dist(rng);
    const double t = RecomputeMicros(truth, static_cast<double>(n), static_cast<double>(p));
    ASSERT_TRUE(fit->Observe(n, p, t * (1 + noise(rng))));
  }
}

TEST(OnlineRecomputeFitTest, ConvergesInBoundedMemory) {
  std::mt19937_64 rng(TestSeed("OnlineRecomputeFitTest.ConvergesInBoundedMemory"));
  OnlineRecomputeFit fit;
  ASSERT_NO_FATAL_FAILURE(ObserveRandomPrefills(kModel, 8192, 65536, 100000, rng, &fit));
  auto r = fit.Fit();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->c0_us, kModel.c0_us, 0.15 * kModel.c0_us);
  EXPECT_NEAR(r->c1_us_per_token, kModel.c1_us_per_token, 0.05 * kModel.c1_us_per_token);
  EXPECT_NEAR(r->c2_us_per_token2, kModel.c2_us_per_token2, 0.05 * kModel.c2_us_per_token2);
  EXPECT_LE(fit.effective_observations(), 1000.0 + 1e-6);
}

// Seeded with a three-term prior (c3 = 0, a calibration file from before c3), the online fit
// learns an engine's per-prefix-token cost from its prefills.
TEST(OnlineRecomputeFitTest, LearnsThePrefixTermAgainstAThreeTermPrior) {
  std::mt19937_64 rng(TestSeed("OnlineRecomputeFitTest.LearnsThePrefixTermAgainstAThreeTermPrior"));
  RecomputeParameters truth = kModel;
  truth.c3_us_per_prefix_token = 0.5;
  OnlineRecomputeFit fit;
  fit.SeedPrior(kModel, 2);
  ASSERT_NO_FATAL_FAILURE(ObserveRandomPrefills(truth, 1024, 16384, 2000, rng, &fit));
  auto r = fit.Fit();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->c3_us_per_prefix_token, 0.5, 0.1);
  EXPECT_NEAR(r->c2_us_per_token2, truth.c2_us_per_token2, 0.1 * truth.c2_us_per_token2);
}

}  // namespace
}  // namespace kvfabric
