#include "core/recompute_probe.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "core/bus_probe.h"
#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

TEST(RecomputeProbeTest, RecoversTheConstantsOfANoisyPrefill) {
  const uint64_t seed = TestSeed("RecomputeProbeTest");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> noise(-0.01, 0.01);
  const RecomputeParameters truth{1500.0, 40.0, 0.05};
  int calls = 0;
  auto probe = [&](uint64_t n, uint64_t p) -> StatusOr<double> {
    ++calls;
    return RecomputeMicros(truth, static_cast<double>(n), static_cast<double>(p)) *
           (1 + noise(rng));
  };
  RecomputeProbeOptions o;
  o.repeats = 3;
  auto r = ProbeRecompute(probe, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << " seed " << seed;
  EXPECT_EQ(calls, 1 + 2 * 3 * 12);  // warm-up + both runs of the 12-shape grid
  EXPECT_EQ(r->samples, 72u);
  EXPECT_NEAR(r->parameters.c0_us, truth.c0_us, 0.05 * truth.c0_us) << "seed " << seed;
  EXPECT_NEAR(r->parameters.c1_us_per_token, truth.c1_us_per_token, 0.05 * truth.c1_us_per_token);
  EXPECT_NEAR(r->parameters.c2_us_per_token2, truth.c2_us_per_token2,
              0.05 * truth.c2_us_per_token2);
  EXPECT_LE(r->worst_abs_error, 0.03) << "seed " << seed;
  // Repeats spread by +-1%: the floor is about that, never more than 2%.
  EXPECT_GT(r->noise_floor_ratio, 0.0);
  EXPECT_LE(r->noise_floor_ratio, 0.02);
  const RecomputeCalibration c = ToRecomputeCalibration("m", *r);
  EXPECT_EQ(c.model_id, "m");
  EXPECT_EQ(c.worst_error_ratio, r->worst_abs_error);
  EXPECT_EQ(c.noise_floor_ratio, r->noise_floor_ratio);
}

TEST(RecomputeProbeTest, PassesTheProbesErrorWithTheShape) {
  auto probe = [](uint64_t n, uint64_t) -> StatusOr<double> {
    if (n == 64) return Status::Unavailable("engine busy");
    return 100.0 * static_cast<double>(n);
  };
  auto r = ProbeRecompute(probe, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().ToString().find("n=64"), std::string::npos) << r.status().ToString();
}

TEST(RecomputeProbeTest, RefusesShapesThatCannotSeparateTheTerms) {
  RecomputeProbeOptions o;
  o.shapes = {{16, 0}, {16, 0}};
  auto probe = [](uint64_t, uint64_t) -> StatusOr<double> { return 1000.0; };
  auto r = ProbeRecompute(probe, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  o.shapes = {{0, 0}};
  EXPECT_EQ(ProbeRecompute(probe, o).status().code(), StatusCode::kInvalidArgument);
  o.shapes = {};
  o.repeats = 0;
  EXPECT_EQ(ProbeRecompute(probe, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(RecomputeShapesUpToTest, AddsShapesAtTheEnginesScaleOnlyWhenItIsLarger) {
  auto has = [](const std::vector<RecomputeShape>& v, uint64_t n, uint64_t p) {
    for (const RecomputeShape& s : v) {
      if (s.tokens == n && s.prefix_tokens == p) return true;
    }
    return false;
  };
  // 16K tokens: the whole default grid, plus (4096, 0) and (2048, 4096).
  const std::vector<RecomputeShape> big = RecomputeShapesUpTo(16384);
  EXPECT_EQ(big.size(), DefaultRecomputeShapes().size() + 2);
  EXPECT_TRUE(has(big, 4096, 0));
  EXPECT_TRUE(has(big, 2048, 4096));
  // 4K tokens: the grid's shapes that fit (n + p <= 4096), nothing added (1024 tokens at most
  // is no longer than the grid's prefills).
  const std::vector<RecomputeShape> small = RecomputeShapesUpTo(4096);
  for (const RecomputeShape& s : small) EXPECT_LE(s.tokens + s.prefix_tokens, 4096u);
  EXPECT_FALSE(has(small, 1024, 4096));
  EXPECT_TRUE(has(small, 1024, 1024));
  EXPECT_EQ(small.size(), 8u);
  // 10,000 tokens: rounded down to multiples of 16.
  const std::vector<RecomputeShape> odd = RecomputeShapesUpTo(10000);
  EXPECT_TRUE(has(odd, 2496, 0));
  EXPECT_TRUE(has(odd, 1248, 2496));
}

// Stand-ins that sleep: a prefill of 30 ms and transfers of 3 ms, sharing one resource (a mutex
// each holds while it works) or not.
struct SleepySides {
  bool shared = false;
  std::mutex resource;
  std::atomic<int> prefills{0}, fetches{0};
  void Work(std::chrono::milliseconds d) {
    if (shared) {
      std::lock_guard<std::mutex> l(resource);
      std::this_thread::sleep_for(d);
    } else {
      std::this_thread::sleep_for(d);
    }
  }
  PrefillProbe Prefill() {
    return [this](uint64_t n, uint64_t p) -> StatusOr<double> {
      EXPECT_EQ(n, 1024u);
      EXPECT_EQ(p, 0u);
      ++prefills;
      Work(std::chrono::milliseconds(30));
      return 30000.0;
    };
  }
  FetchProbe Fetch() {
    return [this] {
      ++fetches;
      Work(std::chrono::milliseconds(3));
      return Status::OK();
    };
  }
};

TEST(SplitOverlapProbeTest, SidesThatShareAResourceAreSerialAndOthersOverlap) {
  for (bool shared : {true, false}) {
    SleepySides sides;
    sides.shared = shared;
    SplitOverlapOptions o;
    auto r = ProbeSplitOverlap(sides.Prefill(), sides.Fetch(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("shared %d: %s\n", shared, FormatSplitOverlap(*r).c_str());
    // K balances the sides: about 30 ms / 3 ms.
    EXPECT_GE(r->fetches, 5u);
    EXPECT_LE(r->fetches, 20u);
    EXPECT_EQ(sides.prefills.load(), 2 + 2 * o.repeats);
    if (shared) {
      // Serialised by the mutex: T is A + B, s near 1 (sleeps only ever overshoot).
      EXPECT_GE(r->serial_fraction, 0.5);
    } else {
      EXPECT_LE(r->serial_fraction, 0.5);
    }
  }
}

TEST(SplitOverlapProbeTest, PassesTheCallbacksErrorsAndRefusesBadOptions) {
  SleepySides sides;
  const FetchProbe broken = [] { return Status::Unavailable("daemon gone"); };
  auto r = ProbeSplitOverlap(sides.Prefill(), broken, {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable());
  EXPECT_NE(r.status().message().find("split overlap probe: fetch"), std::string_view::npos);
  SplitOverlapOptions bad;
  bad.repeats = 0;
  EXPECT_TRUE(ProbeSplitOverlap(sides.Prefill(), sides.Fetch(), bad).status().IsInvalidArgument());
}

TEST(NoiseFloorTest, IsTheTenToNinetyPercentSpreadAroundEachMedian) {
  // Ten repeats 95 .. 104, median 99.5. Nearest rank: p10 is the 1st of 10
  // (95), p90 the 9th (103); 1 - 95 / 99.5 is the larger side.
  std::vector<std::vector<double>> groups(1);
  for (int k = -5; k < 5; ++k) groups[0].push_back(100.0 + k);
  EXPECT_NEAR(NoiseFloorRatio(groups), 1 - 95.0 / 99.5, 1e-12);
  // One outlier in twenty does not move it: p90 and p10 ignore the extremes.
  std::vector<std::vector<double>> quiet(1, std::vector<double>(19, 50.0));
  quiet[0].push_back(500.0);
  EXPECT_EQ(NoiseFloorRatio(quiet), 0.0);
  EXPECT_EQ(NoiseFloorRatio({}), 0.0);
  std::vector<std::vector<double>> single = {{5.0}};
  EXPECT_EQ(NoiseFloorRatio(single), 0.0);
}

}  // namespace
}  // namespace kvfabric
