// CalibratedCostModel's retrials (core/calibrated_cost_model.h, Retrials): the figures a
// slowdown keeps, and how a retrial's transfer judges them. Part of bus_cost_model_test.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/bus_cost_model.h"
#include "core/calibrated_cost_model.h"

namespace kvfabric {
namespace {

TEST(CalibratedCostModelTest, ARetrialRestoresTheFiguresFromBeforeASlowdown) {
  CalibratedCostModel model;
  const PathParameters healthy{20.0, 2e9};
  const PathParameters capped{400.0, 0.1e9};
  const PathParameters worse{4000.0, 0.01e9};  // ten times slower again
  ASSERT_TRUE(model.SetPath(BusPath::kRemoteHostToLocalHost, "a", healthy).ok());
  auto observe = [&](const PathParameters& truth) {
    ASSERT_TRUE(model
                    .ObserveTransfer(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                     FetchMicros(truth, 8 << 20))
                    .ok());
  };
  auto retrial = [&](const PathParameters& truth, uint64_t shared = 0) {
    const double b = 8 << 20;
    // With `shared` bytes beside it at gain 1, the transfer took (b + shared) / b of its time.
    return model
        .ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 8 << 20, shared,
                        FetchMicros(truth, b) * (b + static_cast<double>(shared)) / b)
        ->outcome;
  };
  auto confirm = [&](const PathParameters& truth) {
    for (int i = 0; i < 4; ++i) observe(truth);
  };
  // A change point on figures no transfer confirmed is a correction: nothing to retry.
  observe(capped);
  observe(capped);
  ASSERT_EQ(model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a")->change_points, 1u);
  EXPECT_FALSE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  ASSERT_TRUE(model.SetPath(BusPath::kRemoteHostToLocalHost, "a", healthy).ok());
  // Four transfers confirm the figures; two severe misses then are a slowdown, and the figures
  // before it are kept.
  confirm(healthy);
  observe(capped);
  observe(capped);
  ASSERT_EQ(model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a")->change_points, 1u);
  ASSERT_TRUE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  EXPECT_EQ(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a")->beta_bytes_per_s, 2e9);
  // A second slowdown keeps the first figures, not the slowed ones.
  observe(worse);
  observe(worse);
  ASSERT_EQ(model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a")->change_points, 2u);
  EXPECT_EQ(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a")->beta_bytes_per_s, 2e9);
  EXPECT_EQ(model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->healthy->beta_bytes_per_s,
            2e9);
  // A retrial that is still slow is an ordinary observation and keeps them.
  const uint64_t scored = model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count;
  EXPECT_EQ(retrial(worse), RetrialOutcome::kStillSlow);
  EXPECT_EQ(model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count, scored + 1);
  EXPECT_TRUE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  // One beside as many bytes of other loads, at the healthy rate: restored, gain untouched.
  EXPECT_EQ(retrial(healthy, 8 << 20), RetrialOutcome::kRestored);
  EXPECT_FALSE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  const PathParameters now = *model.Path(BusPath::kRemoteHostToLocalHost, "a");
  EXPECT_EQ(now.beta_bytes_per_s, 2e9);
  EXPECT_EQ(now.alpha_us, 20.0);
  EXPECT_EQ(now.concurrency_gain, 1.0);
  const ParameterProvenance p = *model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a");
  EXPECT_EQ(p.restores, 1u);
  EXPECT_EQ(p.source, ParameterSource::kOnlineFit);
  // Nothing to restore now: an ordinary observation.
  EXPECT_EQ(retrial(healthy), RetrialOutcome::kNotDegraded);
  // A speed-up learned from traffic forgets the remembered figures once it is back to them; a
  // partial one (from a hundredth to a fifth) does not. SetPath forgets them too.
  confirm(healthy);
  observe(worse);
  observe(worse);
  ASSERT_TRUE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  const PathParameters fifth{100.0, 0.4e9};
  const uint64_t before = model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a")->change_points;
  observe(fifth);
  observe(fifth);
  ASSERT_EQ(model.PathProvenance(BusPath::kRemoteHostToLocalHost, "a")->change_points, before + 1);
  EXPECT_TRUE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  for (int i = 0; i < 8; ++i) observe(healthy);  // 5x misses of 17 ms: the eight-miss rule
  EXPECT_FALSE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  confirm(healthy);
  observe(capped);
  observe(capped);
  ASSERT_TRUE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  ASSERT_TRUE(model.SetPath(BusPath::kRemoteHostToLocalHost, "a", healthy).ok());
  EXPECT_FALSE(model.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  EXPECT_EQ(model.ObserveRetrial(BusPath::kNvmeToHost, "a", 1, 0, 1.0).status().code(),
            StatusCode::kNotFound);
}

TEST(CalibratedCostModelTest, ARetrialJudgesSmallAndSplitTransfersByWhichFiguresTheyFit) {
  const PathParameters healthy{20.0, 2e9};
  const PathParameters capped{400.0, 0.1e9};
  auto slowed_model = [&](CalibratedCostModel* model) {
    ASSERT_TRUE(model->SetPath(BusPath::kRemoteHostToLocalHost, "a", healthy).ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(model
                      ->ObserveTransfer(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                        FetchMicros(healthy, 8 << 20))
                      .ok());
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(model
                      ->ObserveTransfer(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                        FetchMicros(capped, 8 << 20))
                      .ok());
    }
    ASSERT_TRUE(model->HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  };
  // 64 KiB: 52.8 us healthy, about 1.06 ms slowed (geometric mean about 236 us). 500 us is
  // nearer the slowed figures: still slow. A split's fetch side judges without being scored.
  CalibratedCostModel model;
  slowed_model(&model);
  const uint64_t scored = model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count;
  EXPECT_EQ(model
                .ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 64 << 10, 0, 500.0,
                                /*beside_prefill=*/true)
                ->outcome,
            RetrialOutcome::kStillSlow);
  EXPECT_EQ(model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count, scored);
  EXPECT_EQ(model.ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 64 << 10, 0, 500.0)->outcome,
            RetrialOutcome::kStillSlow);
  EXPECT_EQ(model.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count, scored + 1);
  // 200 us is almost 4x the healthy figure, but nearer it than the slowed one: restored, scaled
  // by that miss (later traffic refits it).
  EXPECT_EQ(model
                .ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 64 << 10, 0, 200.0,
                                /*beside_prefill=*/true)
                ->outcome,
            RetrialOutcome::kRestored);
  EXPECT_NEAR(model.Path(BusPath::kRemoteHostToLocalHost, "a")->beta_bytes_per_s,
              2e9 * FetchMicros(healthy, 64 << 10) / 200.0, 1e3);
  // 8 MiB: 4.2 ms healthy, 84 ms slowed (geometric mean 18.8 ms): 25 ms is still slow, 15 ms
  // recovered (to 3.6x the healthy figures).
  CalibratedCostModel big;
  slowed_model(&big);
  EXPECT_EQ(big.ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 8 << 20, 0, 25000.0)->outcome,
            RetrialOutcome::kStillSlow);
  EXPECT_EQ(big.ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 8 << 20, 0, 15000.0)->outcome,
            RetrialOutcome::kRestored);
  EXPECT_NEAR(FetchMicros(*big.Path(BusPath::kRemoteHostToLocalHost, "a"), 8 << 20), 15000.0, 1);
  // Partly recovered: the healthy figures stay remembered for the next retrial.
  EXPECT_TRUE(big.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
  // Slowed figures far slower than the link (learned from cut streams) put the geometric mean
  // high: a capped transfer 8.5x the healthy figure is below it, but a severe miss of them.
  CalibratedCostModel pessimistic;
  slowed_model(&pessimistic);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pessimistic
                    .ObserveTransfer(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                     20 * FetchMicros(capped, 8 << 20))
                    .ok());
  }
  const double healthy_us = FetchMicros(healthy, 8 << 20);
  ASSERT_GT(FetchMicros(*pessimistic.Path(BusPath::kRemoteHostToLocalHost, "a"), 8 << 20),
            100 * healthy_us);
  EXPECT_EQ(pessimistic
                .ObserveRetrial(BusPath::kRemoteHostToLocalHost, "a", 8 << 20, 0, 8.5 * healthy_us)
                ->outcome,
            RetrialOutcome::kStillSlow);
  // A split's fetch sides (never scored) confirm figures too.
  CalibratedCostModel split;
  ASSERT_TRUE(split.SetPath(BusPath::kRemoteHostToLocalHost, "a", healthy).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(split
                    .ObserveBesidePrefill(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                          1.2 * FetchMicros(healthy, 8 << 20))
                    .ok());
  }
  EXPECT_EQ(split.PathReportFor(BusPath::kRemoteHostToLocalHost, "a")->error.count, 0u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(split
                    .ObserveTransfer(BusPath::kRemoteHostToLocalHost, "a", 8 << 20,
                                     FetchMicros(capped, 8 << 20))
                    .ok());
  }
  EXPECT_TRUE(split.HealthyBefore(BusPath::kRemoteHostToLocalHost, "a"));
}

}  // namespace
}  // namespace kvfabric
