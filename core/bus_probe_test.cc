#include "core/bus_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr PathParameters kRemote{120.0, 9.5e9};

std::string TestName() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

// A run whose every repeat is the model's time times (1 + N(0, noise)).
ProbeRun SyntheticRun(const PathParameters& truth, const std::vector<uint64_t>& sizes, int repeats,
                      double noise, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, noise);
  ProbeRun run;
  for (uint64_t bytes : sizes) {
    SizeTiming t;
    t.bytes = bytes;
    for (int i = 0; i < repeats; ++i) {
      t.repeats_us.push_back(FetchMicros(truth, static_cast<double>(bytes)) * (1 + n(rng)));
    }
    t.median_us = MedianOf(t.repeats_us);
    run.push_back(t);
  }
  return run;
}

std::vector<uint64_t> DefaultLadder() { return *ProbeSizeLadder(64 * kKiB, 256 * kMiB); }

TEST(ProbeSizeLadderTest, DefaultsArePowersOfFourFrom64KiBTo256MiB) {
  auto sizes = ProbeSizeLadder(64 * kKiB, 256 * kMiB);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<uint64_t>{64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB, 16 * kMiB,
                                           64 * kMiB, 256 * kMiB}));
}

TEST(ProbeSizeLadderTest, EndsAtMaxEvenWhenTheLadderStepsOverIt) {
  EXPECT_EQ(*ProbeSizeLadder(64 * kKiB, 100 * kMiB),
            (std::vector<uint64_t>{64 * kKiB, 256 * kKiB, 1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB,
                                   100 * kMiB}));
  EXPECT_EQ(*ProbeSizeLadder(4 * kKiB, 8 * kKiB), (std::vector<uint64_t>{4 * kKiB, 8 * kKiB}));
}

TEST(ProbeSizeLadderTest, RefusesBadSizesNamingTheFlag) {
  struct Case {
    uint64_t min, max;
    const char* flag;
  };
  for (const Case& c :
       {Case{0, kMiB, "--min-bytes"}, Case{1000, kMiB, "--min-bytes"},
        Case{6 * kKiB, kMiB, "--min-bytes"}, Case{64 * kKiB, kMiB + 1, "--max-bytes"},
        Case{kMiB, kMiB, "--max-bytes"}, Case{kMiB, 64 * kKiB, "--max-bytes"},
        Case{kMiB, 8192 * kMiB, "--max-bytes"}}) {
    auto sizes = ProbeSizeLadder(c.min, c.max);
    ASSERT_TRUE(sizes.status().IsInvalidArgument()) << c.min << ".." << c.max;
    EXPECT_NE(sizes.status().message().find(c.flag), std::string_view::npos) << sizes.status();
  }
}

TEST(PlanProbeSizesTest, DefaultsMoveUnder4GiBPerPath) {
  auto sizes = PlanProbeSizes(64 * kKiB, 256 * kMiB, 5);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  // 2 x 5 x (64 KiB + ... + 256 MiB) + 256 MiB.
  EXPECT_EQ(ProbeBytesPerPath(*sizes, 5), 10 * (341 * kMiB + 320 * kKiB) + 256 * kMiB);
  EXPECT_LE(ProbeBytesPerPath(*sizes, 5), 4096 * kMiB);
}

TEST(PlanProbeSizesTest, RefusesBadRepeatsAndTooMuchTraffic) {
  EXPECT_NE(PlanProbeSizes(64 * kKiB, kMiB, 0).status().message().find("--repeats"),
            std::string_view::npos);
  EXPECT_TRUE(PlanProbeSizes(64 * kKiB, kMiB, 1001).status().IsInvalidArgument());
  auto big = PlanProbeSizes(64 * kKiB, 4096 * kMiB, 5);
  ASSERT_TRUE(big.status().IsInvalidArgument());
  EXPECT_NE(big.status().message().find("lower --max-bytes or --repeats"), std::string_view::npos)
      << big.status();
}

TEST(SplitIntoBlocksTest, UsesTheFewestEqualBlocks) {
  struct Case {
    uint64_t bytes, block, blocks;
  };
  for (const Case& c : {Case{256 * kMiB, 64 * kMiB, 4}, Case{64 * kKiB, 64 * kKiB, 1},
                        Case{64 * kMiB, 64 * kMiB, 1}, Case{100 * kMiB, 50 * kMiB, 2},
                        Case{192 * kMiB, 64 * kMiB, 3}}) {
    auto split = SplitIntoBlocks(c.bytes, 64 * kMiB, 4096);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(split->block_bytes, c.block) << c.bytes;
    EXPECT_EQ(split->blocks, c.blocks) << c.bytes;
  }
  // 7 granules under a 2-granule limit: 7 blocks of one granule.
  auto odd = SplitIntoBlocks(7 * 4096, 8192, 4096);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->block_bytes, 4096u);
  EXPECT_EQ(odd->blocks, 7u);
  EXPECT_TRUE(SplitIntoBlocks(0, 8192, 4096).status().IsInvalidArgument());
  EXPECT_TRUE(SplitIntoBlocks(5000, 8192, 4096).status().IsInvalidArgument());
}

TEST(MedianOfTest, MiddleValueOrMeanOfTheMiddleTwo) {
  EXPECT_EQ(MedianOf({5, 1, 3}), 3);
  EXPECT_EQ(MedianOf({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(MedianOf({7}), 7);
}

TEST(FitAndJudgeTest, RecoversAlphaAndBetaFromNoisyRuns) {
  std::mt19937_64 rng(TestSeed(TestName()));
  const std::vector<uint64_t> sizes = DefaultLadder();
  const ProbeRun a = SyntheticRun(kRemote, sizes, 5, 0.005, rng);
  const ProbeRun b = SyntheticRun(kRemote, sizes, 5, 0.005, rng);
  auto fit = FitAndJudge(a, b, {});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->final_parameters.beta_bytes_per_s, kRemote.beta_bytes_per_s,
              0.01 * kRemote.beta_bytes_per_s);
  EXPECT_NEAR(fit->final_parameters.alpha_us, kRemote.alpha_us, 0.10 * kRemote.alpha_us);
  EXPECT_NEAR(fit->run_a.beta_bytes_per_s, kRemote.beta_bytes_per_s,
              0.015 * kRemote.beta_bytes_per_s);
  // 0.5% noise, medians of 5: every out-of-sample error far below 3%.
  EXPECT_TRUE(fit->target_met) << fit->worst_abs_error;
  EXPECT_LT(fit->worst_abs_error, 0.03);
  EXPECT_EQ(fit->samples, 2u * 5 * sizes.size());
  EXPECT_EQ(fit->min_bytes, 64 * kKiB);
  EXPECT_EQ(fit->max_bytes, 256 * kMiB);
  EXPECT_EQ(fit->judged_min_bytes, 256 * kKiB);
  EXPECT_EQ(fit->judged_max_bytes, 256 * kMiB);
}

TEST(FitAndJudgeTest, ScoresRunBAgainstTheRunAFitOnly) {
  const std::vector<uint64_t> sizes = DefaultLadder();
  std::mt19937_64 rng(1);
  const ProbeRun a = SyntheticRun(kRemote, sizes, 3, 0.0, rng);
  // Run B: the 64 KiB size 40% slow (not judged), 4 MiB 2% fast, 64 MiB 6% slow.
  const std::map<uint64_t, double> skew = {{64 * kKiB, 1.40}, {4 * kMiB, 0.98}, {64 * kMiB, 1.06}};
  ProbeRun b = a;
  for (SizeTiming& t : b) {
    if (auto it = skew.find(t.bytes); it != skew.end()) {
      for (double& us : t.repeats_us) us *= it->second;
      t.median_us *= it->second;
    }
  }
  auto fit = FitAndJudge(a, b, {});
  ASSERT_TRUE(fit.ok()) << fit.status();
  // Run A is exact, so its fit is the truth and each error is the skew.
  EXPECT_NEAR(fit->run_a.alpha_us, kRemote.alpha_us, 1e-6 * kRemote.alpha_us);
  ASSERT_EQ(fit->run_b.size(), sizes.size());
  std::vector<double> judged;
  for (const SizeError& e : fit->run_b) {
    const double predicted = FetchMicros(fit->run_a, static_cast<double>(e.bytes));
    EXPECT_DOUBLE_EQ(e.predicted_us, predicted);
    EXPECT_DOUBLE_EQ(e.error, e.observed_us / predicted - 1);
    const auto it = skew.find(e.bytes);
    EXPECT_NEAR(e.error, it == skew.end() ? 0.0 : it->second - 1, 1e-9) << e.bytes;
    EXPECT_EQ(e.judged, e.bytes >= 256 * kKiB);
    if (e.judged) judged.push_back(std::fabs(e.error));
  }
  EXPECT_NEAR(fit->worst_abs_error, 0.06, 1e-9);
  EXPECT_NEAR(fit->median_abs_error, MedianOf(judged), 1e-12);
  EXPECT_FALSE(fit->target_met);
  // The file gets the out-of-sample figures and the A+B parameters.
  const PathCalibration c = ToPathCalibration(BusPath::kNvmeToHost, "", *fit);
  EXPECT_EQ(c.path, BusPath::kNvmeToHost);
  EXPECT_EQ(c.worst_error_ratio, fit->worst_abs_error);
  EXPECT_EQ(c.median_error_ratio, fit->median_abs_error);
  EXPECT_EQ(c.parameters.beta_bytes_per_s, fit->final_parameters.beta_bytes_per_s);
  EXPECT_EQ(c.samples, 2u * 3 * sizes.size());
}

TEST(FitAndJudgeTest, KeepsTheSizeCurveOnlyWhereItRepeatsInRunB) {
  std::mt19937_64 rng(TestSeed(TestName()));
  const std::vector<uint64_t> sizes = DefaultLadder();
  // A path whose small transfers run fast (cache) and whose largest run slow: both runs show it.
  PathParameters curved = kRemote;
  curved.size_factors = {0.75, 0.85, 1.0, 1.05, 1.05, 1.0, 0.92, 0.92};
  const ProbeRun a = SyntheticRun(curved, sizes, 5, 0.002, rng);
  const ProbeRun b = SyntheticRun(curved, sizes, 5, 0.002, rng);
  auto fit = FitAndJudge(a, b, {});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(fit->size_curve_kept);
  EXPECT_GT(fit->line_worst_abs_error, 0.05);
  EXPECT_LT(fit->worst_abs_error, 0.02) << "line alone: " << fit->line_worst_abs_error;
  EXPECT_FALSE(HasFlatSizeCurve(fit->final_parameters));
  EXPECT_TRUE(fit->target_met);
  // Run A's structure that run B does not repeat is noise: the curve goes, the line stays.
  const ProbeRun plain = SyntheticRun(kRemote, sizes, 5, 0.002, rng);
  auto dropped = FitAndJudge(a, plain, {});
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_FALSE(dropped->size_curve_kept);
  EXPECT_TRUE(HasFlatSizeCurve(dropped->run_a));
  EXPECT_TRUE(HasFlatSizeCurve(dropped->final_parameters));
  EXPECT_EQ(dropped->worst_abs_error, dropped->line_worst_abs_error);
  for (const SizeError& e : dropped->run_b) {
    EXPECT_DOUBLE_EQ(e.predicted_us, LineMicros(dropped->run_a, static_cast<double>(e.bytes)));
  }
}

TEST(FitAndJudgeTest, JudgesTheLargestSizeWhenEverySizeIsBelowTheJudgedRange) {
  std::mt19937_64 rng(2);
  const std::vector<uint64_t> sizes = {4 * kKiB, 16 * kKiB, 64 * kKiB};
  auto fit = FitAndJudge(SyntheticRun(kRemote, sizes, 1, 0, rng),
                         SyntheticRun(kRemote, sizes, 1, 0, rng), {});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->judged_min_bytes, 64 * kKiB);
  EXPECT_EQ(fit->judged_max_bytes, 64 * kKiB);
}

TEST(FitAndJudgeTest, RefusesMismatchedRunsAndFlatTimes) {
  std::mt19937_64 rng(3);
  const ProbeRun a = SyntheticRun(kRemote, {64 * kKiB, kMiB}, 1, 0, rng);
  const ProbeRun b = SyntheticRun(kRemote, {64 * kKiB, 4 * kMiB}, 1, 0, rng);
  EXPECT_TRUE(FitAndJudge(a, b, {}).status().IsInvalidArgument());
  EXPECT_TRUE(FitAndJudge({}, {}, {}).status().IsInvalidArgument());
  ProbeRun flat = a;
  flat[0].median_us = 500;
  flat[1].median_us = 400;
  auto fit = FitAndJudge(flat, flat, {});
  EXPECT_EQ(fit.status().code(), StatusCode::kFailedPrecondition) << fit.status();
  EXPECT_NE(fit.status().message().find("run A"), std::string_view::npos);
}

// Returns the model's time times (1 + noise) and counts calls per size.
class FakeProbe final : public PathProbe {
 public:
  FakeProbe(PathParameters truth, double noise, uint64_t seed)
      : truth_(truth), n_(0, noise), rng_(seed) {}
  StatusOr<double> Measure(uint64_t bytes) override {
    ++calls_[bytes];
    if (bytes == fail_at_) return Status::Unavailable("link down");
    const double slowdown = 1 + drift_per_call_ * total_calls_++;
    return FetchMicros(truth_, static_cast<double>(bytes)) * (1 + n_(rng_)) * slowdown;
  }
  std::map<uint64_t, int> calls_;
  uint64_t fail_at_ = 0;
  // The machine slows down by this fraction per call (drift over time).
  double drift_per_call_ = 0;
  int total_calls_ = 0;

 private:
  PathParameters truth_;
  std::normal_distribution<double> n_;
  std::mt19937_64 rng_;
};

TEST(RunTwoProbeRunsTest, WarmsUpThenMeasuresEverySizeRepeatsTimesPerRun) {
  FakeProbe probe(kRemote, 0.003, TestSeed(TestName()));
  const std::vector<uint64_t> sizes = DefaultLadder();
  std::vector<std::string> lines;
  ProbeRunOptions o;
  o.repeats = 3;
  o.label = "remote→local h0";
  o.progress = [&](const std::string& line) { lines.push_back(line); };
  auto runs = RunTwoProbeRuns(probe, sizes, o);
  ASSERT_TRUE(runs.ok()) << runs.status();
  for (uint64_t s : sizes) EXPECT_EQ(probe.calls_[s], s == sizes.back() ? 7 : 6) << s;
  ASSERT_EQ(runs->a.size(), sizes.size());
  ASSERT_EQ(runs->b.size(), sizes.size());
  for (const ProbeRun* run : {&runs->a, &runs->b}) {
    for (const SizeTiming& t : *run) {
      ASSERT_EQ(t.repeats_us.size(), 3u);
      EXPECT_EQ(t.median_us, MedianOf(t.repeats_us));
    }
  }
  ASSERT_EQ(lines.size(), 2 * sizes.size());
  EXPECT_EQ(lines[0].rfind("remote→local h0 run A 64 KiB: median ", 0), 0u) << lines[0];
  EXPECT_NE(lines.back().find("run B 256 MiB"), std::string::npos) << lines.back();
  auto fit = FitAndJudge(runs->a, runs->b, {});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->final_parameters.beta_bytes_per_s, kRemote.beta_bytes_per_s,
              0.01 * kRemote.beta_bytes_per_s);
}

// A machine that slows down steadily (1% per transfer here: ~40% over the
// two runs) moves runs A and B alike, because they are interleaved; run
// one after the other, B would be ~20% slower than A at every size.
TEST(RunTwoProbeRunsTest, InterleavesTheRunsSoThatDriftMovesBothAlike) {
  FakeProbe probe(kRemote, 0, 1);
  probe.drift_per_call_ = 0.01;
  ProbeRunOptions o;
  o.repeats = 3;
  auto runs = RunTwoProbeRuns(probe, DefaultLadder(), o);
  ASSERT_TRUE(runs.ok()) << runs.status();
  for (size_t k = 0; k < runs->a.size(); ++k) {
    EXPECT_NEAR(runs->b[k].median_us / runs->a[k].median_us, 1.0, 0.015)
        << runs->a[k].bytes << " bytes";
  }
}

TEST(RunTwoProbeRunsTest, ReportsTheProbesErrorWithPathAndSize) {
  FakeProbe probe(kRemote, 0, 1);
  probe.fail_at_ = 4 * kMiB;
  ProbeRunOptions o;
  o.repeats = 2;
  o.label = "local→remote h1";
  auto runs = RunTwoProbeRuns(probe, DefaultLadder(), o);
  ASSERT_TRUE(runs.status().IsUnavailable()) << runs.status();
  EXPECT_NE(runs.status().message().find("local→remote h1 run A 4 MiB: link down"),
            std::string_view::npos)
      << runs.status();
}

// The first `flat_calls_` transfers take a time that shrinks with size (a
// noisy machine whose jitter swamps small probes); then the model's time.
class NoisyThenSteadyProbe final : public PathProbe {
 public:
  explicit NoisyThenSteadyProbe(int flat_calls) : flat_calls_(flat_calls) {}
  StatusOr<double> Measure(uint64_t bytes) override {
    if (calls_++ < flat_calls_) return 5000.0 - static_cast<double>(bytes) / 1e6;
    return FetchMicros(kRemote, static_cast<double>(bytes));
  }
  int calls_ = 0;

 private:
  const int flat_calls_;
};

TEST(MeasureAndFitTest, MeasuresAgainWhenNoiseHidesTheSlopeAndSaysSo) {
  const std::vector<uint64_t> sizes = {256 << 10, 1 << 20, 4 << 20};
  ProbeRunOptions o;
  o.repeats = 3;
  o.label = "remote→local h0";
  std::vector<std::string> lines;
  o.progress = [&](const std::string& line) { lines.push_back(line); };
  // One attempt is 1 warm-up + 2 runs x 3 sizes x 3 repeats = 19 transfers.
  NoisyThenSteadyProbe probe(19);
  int used = 0;
  auto fit = MeasureAndFit(probe, sizes, o, {}, 3, &used);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(used, 2);
  EXPECT_NEAR(fit->final_parameters.beta_bytes_per_s, kRemote.beta_bytes_per_s,
              0.01 * kRemote.beta_bytes_per_s);
  bool said = false;
  for (const std::string& l : lines)
    said |= l.find("measuring again (2 of 3)") != std::string::npos;
  EXPECT_TRUE(said);

  // Noise on every attempt: the fit's error after the last one.
  NoisyThenSteadyProbe always(1 << 20);
  auto bad = MeasureAndFit(always, sizes, o, {}, 3, &used);
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition) << bad.status();
  EXPECT_EQ(used, 3);
}

TEST(MemcpyProbeTest, TimesCopiesUpToItsMaximum) {
  MemcpyProbeOptions o;
  o.max_bytes = kMiB;
  o.cache_scrub_bytes = 4 * kMiB;
  auto probe = CreateMemcpyProbe(o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  for (uint64_t bytes : {4 * kKiB, kMiB}) {
    auto us = (*probe)->Measure(bytes);
    ASSERT_TRUE(us.ok()) << us.status();
    EXPECT_GT(*us, 0);
  }
  EXPECT_TRUE((*probe)->Measure(2 * kMiB).status().IsInvalidArgument());
  EXPECT_TRUE(CreateMemcpyProbe({}).status().IsInvalidArgument());
}

TEST(NvmeReadProbeTest, ReadsAScratchFileWithODirectAndDeletesIt) {
  Env* env = Env::Default();
  const std::string dir = ::testing::TempDir() + "/bus_probe_nvme";
  ASSERT_TRUE(env->CreateDirIfMissing(dir).ok());
  NvmeReadProbeOptions o;
  o.dir = dir;
  o.max_bytes = 256 * kKiB;
  {
    auto probe = CreateNvmeReadProbe(env, o);
    if (probe.status().IsInvalidArgument()) {
      GTEST_SKIP() << "no O_DIRECT on " << dir << ": " << probe.status();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
    auto children = env->GetChildren(dir);
    ASSERT_TRUE(children.ok());
    ASSERT_EQ(children->size(), 1u);
    EXPECT_EQ(*env->GetFileSize(dir + "/" + children->front()), 4 * o.max_bytes);
    // More reads than fit in the file: the offset wraps.
    for (int i = 0; i < 12; ++i) {
      auto us = (*probe)->Measure(i % 2 == 0 ? 4 * kKiB : 256 * kKiB);
      ASSERT_TRUE(us.ok()) << us.status();
      EXPECT_GT(*us, 0);
    }
    EXPECT_TRUE((*probe)->Measure(6000).status().IsInvalidArgument());
  }
  EXPECT_TRUE(env->GetChildren(dir)->empty()) << "the scratch file must be deleted";
  EXPECT_TRUE(env->DeleteDir(dir).ok());
}

// An Env whose files hold every read until `readers` reads are in flight at once (or 10 s
// pass), and record where each read was.
class BarrierEnv final : public EnvWrapper {
 public:
  BarrierEnv(Env* target, size_t readers) : EnvWrapper(target), readers_(readers) {}
  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> f, target()->NewRandomRWFile(path, options));
    return std::unique_ptr<RandomRWFile>(new File(this, std::move(f)));
  }
  // Measure calls whose reads were all in flight together, and the offsets read.
  size_t gathered() {
    std::lock_guard<std::mutex> l(mu_);
    return gathered_;
  }
  std::vector<uint64_t> offsets() {
    std::lock_guard<std::mutex> l(mu_);
    return offsets_;
  }
  void Arm() { armed_ = true; }

 private:
  class File final : public RandomRWFile {
   public:
    File(BarrierEnv* env, std::unique_ptr<RandomRWFile> f) : env_(env), f_(std::move(f)) {}
    StatusOr<size_t> Read(uint64_t offset, std::span<std::byte> dst) override {
      if (env_->armed_) env_->Gather(offset);
      return f_->Read(offset, dst);
    }
    Status Write(uint64_t offset, std::span<const std::byte> src) override {
      return f_->Write(offset, src);
    }
    Status Sync() override { return f_->Sync(); }
    StatusOr<uint64_t> Size() override { return f_->Size(); }
    Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    Status Close() override { return f_->Close(); }

   private:
    BarrierEnv* const env_;
    std::unique_ptr<RandomRWFile> f_;
  };
  void Gather(uint64_t offset) {
    std::unique_lock<std::mutex> l(mu_);
    offsets_.push_back(offset);
    const uint64_t generation = generation_;
    if (++waiting_ == readers_) {
      waiting_ = 0;
      ++generation_;
      ++gathered_;
      cv_.notify_all();
      return;
    }
    cv_.wait_for(l, std::chrono::seconds(10), [&] { return generation_ != generation; });
    if (generation_ == generation) waiting_ = 0;  // timed out: the reads were not concurrent
  }
  const size_t readers_;
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  size_t waiting_ = 0;
  uint64_t generation_ = 0;
  size_t gathered_ = 0;
  std::vector<uint64_t> offsets_;
};

TEST(NvmeReadProbeTest, SeveralReadersReadTheirOwnRegionsAtOnce) {
  constexpr uint32_t kReaders = 3;
  BarrierEnv env(Env::Default(), kReaders);
  const std::string dir = ::testing::TempDir() + "/bus_probe_nvme_readers";
  ASSERT_TRUE(env.CreateDirIfMissing(dir).ok());
  NvmeReadProbeOptions o;
  o.dir = dir;
  o.max_bytes = 64 * kKiB;
  o.readers = kReaders;
  {
    auto probe = CreateNvmeReadProbe(&env, o);
    if (probe.status().IsInvalidArgument()) {
      GTEST_SKIP() << "no O_DIRECT on " << dir << ": " << probe.status();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
    auto children = env.GetChildren(dir);
    ASSERT_TRUE(children.ok());
    ASSERT_EQ(children->size(), 1u);
    const uint64_t region = 4 * o.max_bytes;
    EXPECT_EQ(*env.GetFileSize(dir + "/" + children->front()), kReaders * region);
    env.Arm();
    constexpr int kMeasures = 6;  // wraps within each region
    for (int i = 0; i < kMeasures; ++i) {
      auto us = (*probe)->Measure(i % 2 == 0 ? 4 * kKiB : 64 * kKiB);
      ASSERT_TRUE(us.ok()) << us.status();
      EXPECT_GT(*us, 0);
    }
    // Every Measure had all its readers in flight together, each in its own region.
    EXPECT_EQ(env.gathered(), static_cast<size_t>(kMeasures));
    const std::vector<uint64_t> offsets = env.offsets();
    ASSERT_EQ(offsets.size(), kReaders * kMeasures);
    for (int i = 0; i < kMeasures; ++i) {
      std::set<uint64_t> regions;
      for (uint32_t r = 0; r < kReaders; ++r) regions.insert(offsets[i * kReaders + r] / region);
      EXPECT_EQ(regions, (std::set<uint64_t>{0, 1, 2})) << "measure " << i;
    }
  }
  EXPECT_TRUE(env.GetChildren(dir)->empty()) << "the scratch file must be deleted";
  EXPECT_TRUE(env.DeleteDir(dir).ok());
}

TEST(NvmeReadProbeTest, RefusesReaderCountsOutOfRangeNamingTheFlag) {
  for (uint32_t readers : {0u, kMaxNvmeProbeReaders + 1}) {
    NvmeReadProbeOptions o;
    o.dir = ::testing::TempDir();
    o.max_bytes = 64 * kKiB;
    o.readers = readers;
    auto probe = CreateNvmeReadProbe(Env::Default(), o);
    ASSERT_TRUE(probe.status().IsInvalidArgument()) << probe.status();
    EXPECT_NE(probe.status().message().find("--nvme-readers"), std::string_view::npos);
  }
}

TEST(NvmeReadProbeTest, NamesTheDirectoryWhenItCannotCreateTheFile) {
  NvmeReadProbeOptions o;
  o.dir = ::testing::TempDir() + "/no/such/dir";
  o.max_bytes = 64 * kKiB;
  auto probe = CreateNvmeReadProbe(Env::Default(), o);
  ASSERT_FALSE(probe.ok());
  EXPECT_NE(probe.status().message().find("--nvme-dir " + o.dir), std::string_view::npos)
      << probe.status();
}

// Four transfers at once that take what 4 x bytes take on the line at 1.6x beta: a gain of 1.6,
// from the median of interleaved repeats (one outlier each side does not move it); clamped to
// [1, 16]; the probes' errors and bad arguments are returned.
TEST(ConcurrencyGainProbeTest, TheGainIsTheLineOverTheMedianOfTransfersAtOnce) {
  const PathParameters line{10.0, 1e9};
  const uint64_t bytes = 16 << 20;
  const double t4 = FetchMicros(line, 4.0 * bytes) / 1.6;
  std::vector<double> together = {t4, 3 * t4, t4, t4 / 3, t4};
  std::vector<int> order;
  size_t next = 0;
  auto alone = [&]() -> StatusOr<double> {
    order.push_back(1);
    return FetchMicros(line, static_cast<double>(bytes));
  };
  auto at_once = [&]() -> StatusOr<double> {
    order.push_back(4);
    return together[next++];
  };
  auto r = ProbeConcurrencyGain(line, bytes, 4, 5, alone, at_once);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->together_us, t4);
  EXPECT_NEAR(r->gain, 1.6, 1e-12);
  EXPECT_DOUBLE_EQ(r->alone_us, FetchMicros(line, static_cast<double>(bytes)));
  EXPECT_EQ(order, (std::vector<int>{1, 4, 1, 4, 1, 4, 1, 4, 1, 4}));
  EXPECT_NE(FormatConcurrencyGain(*r).find("4 at once of 16 MiB"), std::string::npos)
      << FormatConcurrencyGain(*r);
  EXPECT_NE(FormatConcurrencyGain(*r).find("gain 1.60"), std::string::npos);
  // Slower together than the line: no gain (1), never below.
  auto slow =
      ProbeConcurrencyGain(line, bytes, 4, 1, alone, [&]() -> StatusOr<double> { return 2 * t4; });
  EXPECT_DOUBLE_EQ(slow->gain, 1);
  auto fast =
      ProbeConcurrencyGain(line, bytes, 4, 1, alone, [&]() -> StatusOr<double> { return 1.0; });
  EXPECT_DOUBLE_EQ(fast->gain, kMaxConcurrencyGain);
  auto failing = ProbeConcurrencyGain(line, bytes, 4, 3, alone, [&]() -> StatusOr<double> {
    return Status::Unavailable("daemon went away");
  });
  EXPECT_TRUE(failing.status().IsUnavailable());
  EXPECT_TRUE(ProbeConcurrencyGain(line, bytes, 1, 3, alone, at_once).status().IsInvalidArgument());
  EXPECT_TRUE(ProbeConcurrencyGain(line, 0, 4, 3, alone, at_once).status().IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric
