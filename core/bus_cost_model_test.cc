// Tests of the cost formulas and their explanations, the prediction-error histogram, the
// calibration file and the calibrated model's online refit.
#include "core/bus_cost_model.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/bus_calibration.h"
#include "core/calibrated_cost_model.h"
#include "core/env.h"
#include "core/prediction_error.h"
#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

TEST(BusCostModelTest, FetchAndRecomputeFollowTheirFormulas) {
  const PathParameters p{85.0, 1.95e9};
  EXPECT_DOUBLE_EQ(FetchMicros(p, 4194304), 85.0 + 4194304 / 1.95e9 * 1e6);
  const RecomputeParameters r{2000, 10, 0.001};
  EXPECT_DOUBLE_EQ(RecomputeMicros(r, 4096, 1024), 2000 + 10 * 4096 + 0.001 * 4096 * (1024 + 2048));
  EXPECT_EQ(RecomputeMicros(r, 0, 1024), 0);
}

TEST(BusCostModelTest, ExplanationsFillInTheNumbers) {
  EXPECT_EQ(ExplainFetch(BusPath::kNvmeToHost, {85.0, 1.95e9}, 4 << 20),
            "t_fetch(nvme→host, 4 MiB) = 85.0 µs + 4194304 B / 1.95 GB/s = 2.24 ms");
  EXPECT_EQ(ExplainRecompute({2000, 10, 0.001}, 4096, 1024),
            "t_recompute(n=4096, p=1024) = 2.00 ms + 4096 × 10.0 µs + 4096 × (1024 + 2048) × "
            "1.00 ns = 55.5 ms");
  EXPECT_NE(ExplainRecompute({0, 1, 0}, 3, 0).find("(0 + 1.5)"), std::string::npos);
}

TEST(BusCostModelTest, FormatsDurationsAndRates) {
  EXPECT_EQ(FormatMicros(0.85), "850 ns");
  EXPECT_EQ(FormatMicros(999.96), "1.00 ms");
  EXPECT_EQ(FormatMicros(1.5e6), "1.50 s");
  EXPECT_EQ(FormatMicros(-2.5), "-2.50 µs");
  EXPECT_EQ(FormatRate(950e6), "950 MB/s");
  EXPECT_EQ(FormatRate(12.5e9), "12.5 GB/s");
}

TEST(BusCostModelTest, PathNamesRoundTrip) {
  for (int v = 1; v <= kMaxBusPath; ++v) {
    const auto path = static_cast<BusPath>(v);
    EXPECT_EQ(BusPathFromName(BusPathName(path)), path);
  }
  EXPECT_FALSE(BusPathFromName("unspecified").has_value());
  EXPECT_FALSE(BusPathFromName("nvme").has_value());
}

TEST(PredictionErrorHistogramTest, BucketsWorstAndMedian) {
  PredictionErrorHistogram h;
  for (double e : {-0.04, 0.001, 0.002, 0.004, 0.025, 0.5}) h.RecordError(e);
  h.Record(100, 0);  // unscorable
  const auto s = h.Get();
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.unscored, 1u);
  EXPECT_DOUBLE_EQ(s.worst_abs, 0.5);
  // -0.04 lands in (-0.05, -0.03]; three in (-0.005, 0.005]; 0.025 in (0.02, 0.03]; 0.5 in
  // (0.2, 0.5].
  EXPECT_EQ(s.counts[4], 1u);
  EXPECT_EQ(s.counts[8], 3u);
  EXPECT_EQ(s.counts[11], 1u);
  EXPECT_EQ(s.counts[15], 1u);
  EXPECT_GT(s.median, -0.005);
  EXPECT_LE(s.median, 0.005);
}

TEST(PredictionErrorHistogramTest, MedianIsWithinABucketOfTheTrueMedian) {
  std::mt19937_64 rng(
      TestSeed("PredictionErrorHistogramTest.MedianIsWithinABucketOfTheTrueMedian"));
  std::normal_distribution<double> n(0.012, 0.01);
  PredictionErrorHistogram h;
  for (int i = 0; i < 20000; ++i) h.Record(100 * (1 + n(rng)), 100);
  EXPECT_NEAR(h.Get().median, 0.012, 0.005);
}

BusCalibration Sample() {
  BusCalibration c;
  c.created_unix_us = 1764460800000000;
  c.machine = "node-17";
  c.paths.push_back({BusPath::kNvmeToHost, "", {85.0, 1.95e9}, 40, 65536, 268435456, 0.004, 0.021});
  c.paths.push_back({BusPath::kRemoteHostToLocalHost, "cache-1", {12.5, 2e9}, 30, 0, 0, 0, 0});
  c.recompute.push_back({"llama@1", {2000, 10, 0.001}, 30});
  return c;
}

TEST(BusCalibrationTest, SavesAndLoadsExactly) {
  Env* env = Env::Default();
  const std::string path = ::testing::TempDir() + "/bus_calibration_test.json";
  ASSERT_TRUE(SaveBusCalibration(env, Sample(), path).ok());
  auto loaded = LoadBusCalibration(env, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(BusCalibrationToJson(*loaded), BusCalibrationToJson(Sample()));
  EXPECT_EQ(loaded->paths[0].parameters.beta_bytes_per_s, 1.95e9);
  EXPECT_EQ(loaded->recompute[0].parameters.c2_us_per_token2, 0.001);
  ASSERT_TRUE(env->DeleteFile(path).ok());
}

TEST(BusCalibrationTest, LoadNamesTheBadField) {
  auto json_with = [](const std::string& from, const std::string& to) {
    std::string j = BusCalibrationToJson(Sample());
    const size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return j.replace(at, from.size(), to);
  };
  struct Case {
    std::string from, to, field;
  } cases[] = {
      {"\"beta_bytes_per_s\": 1950000000.0", "\"beta_bytes_per_s\": -3",
       "paths[0].beta_bytes_per_s"},
      {"\"alpha_us\": 12.5", "\"alpha_us\": \"x\"", "paths[1].alpha_us"},
      {"\"nvme_to_host\"", "\"nvme\"", "paths[0].path"},
      {"\"version\": 1", "\"version\": 2", "version"},
      {"\"c1_us_per_token\": 10.0", "\"c1_us_per_token\": -1.0", "recompute[0].c1_us_per_token"},
      {"\"samples\": 30,\n      \"min", "\"samples\": -30,\n      \"min", "paths[1].samples"},
      {"\"host_id\": \"cache-1\"", "\"host_id\": \"\"",
       "paths[1]"},  // not a duplicate: paths differ
  };
  for (const Case& c : cases) {
    auto parsed = BusCalibrationFromJson(json_with(c.from, c.to));
    if (c.field == "paths[1]") {
      EXPECT_TRUE(parsed.ok()) << parsed.status();
      continue;
    }
    ASSERT_FALSE(parsed.ok()) << c.from;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.field), std::string_view::npos) << parsed.status();
  }
  BusCalibration dup = Sample();
  dup.paths.push_back(dup.paths[0]);
  auto parsed = BusCalibrationFromJson(BusCalibrationToJson(dup));
  EXPECT_NE(parsed.status().message().find("paths[2]: duplicate"), std::string_view::npos)
      << parsed.status();
  EXPECT_EQ(BusCalibrationFromJson("{not json").status().code(), StatusCode::kInvalidArgument);
  BusCalibration bad = Sample();
  bad.paths[0].parameters.beta_bytes_per_s = 0;
  EXPECT_EQ(SaveBusCalibration(Env::Default(), bad, ::testing::TempDir() + "/never.json").code(),
            StatusCode::kInvalidArgument);
}

TEST(CalibratedCostModelTest, FallsBackToThePathDefault) {
  CalibratedCostModel model;
  ASSERT_TRUE(model.Load(Sample()).ok());
  EXPECT_EQ(model.Path(BusPath::kNvmeToHost, "any-host")->alpha_us, 85.0);
  EXPECT_EQ(model.Path(BusPath::kRemoteHostToLocalHost, "cache-1")->alpha_us, 12.5);
  EXPECT_TRUE(model.Path(BusPath::kRemoteHostToLocalHost, "cache-2").status().IsNotFound());
  EXPECT_TRUE(model.Recompute("other").status().IsNotFound());
}

TEST(CalibratedCostModelTest, ScoresOutOfSampleAndRefitsPerHost) {
  std::mt19937_64 rng(TestSeed("CalibratedCostModelTest.ScoresOutOfSampleAndRefitsPerHost"));
  std::uniform_int_distribution<int> shift(16, 28);
  std::normal_distribution<double> noise(0.0, 0.005);
  CalibratedCostModel model;
  ASSERT_TRUE(model.Load(Sample()).ok());
  const PathParameters truth{60.0, 3.9e9};  // this host's NVMe is twice as fast as the default
  for (int i = 0; i < 5000; ++i) {
    const uint64_t bytes = 1ull << shift(rng);
    ASSERT_TRUE(
        model
            .ObserveTransfer(BusPath::kNvmeToHost, "cache-7", bytes,
                             FetchMicros(truth, static_cast<double>(bytes)) * (1 + noise(rng)))
            .ok());
  }
  auto fitted = model.Path(BusPath::kNvmeToHost, "cache-7");
  ASSERT_TRUE(fitted.ok());
  EXPECT_NEAR(fitted->beta_bytes_per_s, truth.beta_bytes_per_s, 0.02 * truth.beta_bytes_per_s);
  // The default is untouched.
  EXPECT_EQ(model.Path(BusPath::kNvmeToHost, "")->beta_bytes_per_s, 1.95e9);
  bool found = false;
  for (const auto& r : model.PathReports()) {
    if (r.host_id != "cache-7") continue;
    found = true;
    EXPECT_EQ(r.error.count, 5000u);
    // The first observations were scored against the wrong default (about -50%).
    EXPECT_GT(r.error.worst_abs, 0.3);
    EXPECT_LT(std::abs(r.error.median), 0.02);
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(model.ObserveTransfer(BusPath::kHostToDevice, "", 1, 1.0).IsNotFound());
  EXPECT_TRUE(model.ObserveTransfer(BusPath::kNvmeToHost, "", 0, 1.0).IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric
