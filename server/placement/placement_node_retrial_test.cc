// PlacementNode's retrials of slowed paths (placement_node.h, RETRIALS).
#include <gtest/gtest.h>

#include "server/placement/placement_node_test_fixture.h"

namespace kvfabric::placement {
namespace {

constexpr int kBlocks = 4;
constexpr std::uint64_t kChainBytes = kBlocks * kBlockBytes;

class RetrialTest : public PlacementNodeTest {
 protected:
  RetrialTest() {
    options_.retrial_interval = std::chrono::milliseconds(1000);
    options_.retrial_max_interval = std::chrono::milliseconds(4000);
  }

  // Host "a" holds the whole chain in its host pool; fetching it (0.4 ms at 10 GB/s) beats
  // recomputing it (7.4 ms). Four loads confirm its figures (a slowdown of figures nothing
  // confirmed is a correction, never retried: CalibratedCostModel, Retrials).
  void StartWithHostA() {
    Start();
    const std::uint64_t lease = Register(Rec("a", 1));
    Report("a", 1, lease, Commits(0, kBlocks));
    for (int i = 0; i < 4; ++i) ReportTransfer(10e9);
  }

  // A load's transfer of the chain from "a" at `beta`, reported for `plan_id` (0: none).
  void ReportTransfer(double beta, std::uint64_t plan_id = 0) {
    ObservationReport r;
    r.ns = "t";
    r.plan_id = plan_id;
    r.plan_finished = plan_id != 0;
    r.transfers.push_back({BusPath::kRemoteHostToLocalHost, "a", kChainBytes,
                           FetchMicros({20.0, beta}, static_cast<double>(kChainBytes))});
    ASSERT_TRUE(node_->ReportObservations(r).ok());
  }

  double BetaOfA() const {
    for (const auto& p : node_->Snapshot().paths) {
      if (p.path == BusPath::kRemoteHostToLocalHost && p.host_id == "a") {
        return p.parameters.beta_bytes_per_s;
      }
    }
    return 0;
  }

  static bool FetchesFromA(const PlanResult& r) {
    for (const PlanRun& run : r.plan.runs) {
      if (run.action == RunAction::kFetch && r.locations.hosts[run.host_index].host_id == "a") {
        return true;
      }
    }
    return false;
  }
};

TEST_F(RetrialTest, ASlowedHostIsRetriedAfterAnIntervalAndRestoredWhenItRecovered) {
  StartWithHostA();
  ASSERT_TRUE(FetchesFromA(MakePlan(kBlocks)));
  // Capped to a hundredth: two misses far beyond noise are a change point.
  ReportTransfer(0.1e9);
  ReportTransfer(0.1e9);
  ASSERT_LT(BetaOfA(), 0.2e9);
  // Now recomputing wins; the first plan that sees the slowed host starts its interval.
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  EXPECT_EQ(node_->Snapshot().retrial_hosts, 1u);
  env_.Advance(999'999);
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  EXPECT_EQ(node_->Snapshot().retrials, 0u);
  // An interval later one plan prices "a" at its figures from before the cap, and says so.
  env_.Advance(1);
  const PlanResult first = MakePlan(kBlocks);
  EXPECT_TRUE(FetchesFromA(first));
  EXPECT_EQ(node_->Snapshot().retrials, 1u);
  StatusOr<PlanExplanation> e = node_->Explain(first.plan_id);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE(e->text.find("retrial of a:"), std::string::npos) << e->text;
  // One at a time: the next plan is made on the figures in force.
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  // Still capped: the next retrial waits twice as long.
  ReportTransfer(0.1e9, first.plan_id);
  PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.retrials_still_slow, 1u);
  EXPECT_EQ(s.retrials_restored, 0u);
  ASSERT_LT(BetaOfA(), 0.2e9);
  env_.Advance(1'999'999);
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  env_.Advance(1);
  const PlanResult second = MakePlan(kBlocks);
  ASSERT_TRUE(FetchesFromA(second));
  EXPECT_EQ(node_->Snapshot().retrials, 2u);
  // The cap is lifted: one transfer at the old rate restores the old figures.
  ReportTransfer(10e9, second.plan_id);
  s = node_->Snapshot();
  EXPECT_EQ(s.retrials_restored, 1u);
  EXPECT_EQ(s.retrial_hosts, 0u);
  EXPECT_EQ(BetaOfA(), 10e9);
  for (const auto& p : s.paths) {
    if (p.host_id == "a" && p.path == BusPath::kRemoteHostToLocalHost) {
      EXPECT_EQ(p.provenance.restores, 1u);
      EXPECT_FALSE(p.healthy.has_value());
    }
  }
  const PlanResult after = MakePlan(kBlocks);
  EXPECT_TRUE(FetchesFromA(after));
  EXPECT_EQ(node_->Snapshot().retrials, 2u);
  // A second report of the same plan judges nothing again.
  ReportTransfer(0.1e9, second.plan_id);
  EXPECT_EQ(node_->Snapshot().retrials_still_slow, 1u);
}

TEST_F(RetrialTest, AnotherNamespaceCannotJudgeARetrialOrFinishAPlan) {
  StartWithHostA();
  ReportTransfer(0.1e9);
  ReportTransfer(0.1e9);
  MakePlan(kBlocks);
  env_.Advance(1'000'000);
  const PlanResult retrial = MakePlan(kBlocks);
  ASSERT_TRUE(FetchesFromA(retrial));
  ObservationReport r;
  r.ns = "other";
  r.plan_id = retrial.plan_id;
  r.plan_finished = true;
  r.observed_total_us = 100;
  r.transfers.push_back({BusPath::kRemoteHostToLocalHost, "a", kChainBytes,
                         FetchMicros({20.0, 10e9}, static_cast<double>(kChainBytes))});
  ASSERT_TRUE(node_->ReportObservations(r).ok());
  PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.retrials_restored, 0u);
  EXPECT_EQ(s.plans_finished, 0u);
  EXPECT_EQ(s.observations_unknown_plan, 1u);
  EXPECT_LT(BetaOfA(), 10e9);
  // Its own namespace's report judges it.
  ReportTransfer(10e9, retrial.plan_id);
  s = node_->Snapshot();
  EXPECT_EQ(s.retrials_restored, 1u);
  EXPECT_EQ(s.plans_finished, 1u);
}

TEST_F(RetrialTest, AHostOrdinaryLoadsStillUseIsNotRetried) {
  StartWithHostA();
  ReportTransfer(0.1e9);
  ReportTransfer(0.1e9);
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  // Loads keep reporting transfers of "a" (planned before the change, or with no other
  // source): each pushes its retrial another interval away.
  for (int i = 0; i < 4; ++i) {
    env_.Advance(600'000);
    ReportTransfer(0.1e9);
    EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks))) << i;
  }
  EXPECT_EQ(node_->Snapshot().retrials, 0u);
}

TEST_F(RetrialTest, APlanThatWouldNotFetchAnywayIsMadeOnTheFiguresInForce) {
  StartWithHostA();
  ReportTransfer(0.1e9);
  ReportTransfer(0.1e9);
  MakePlan(kBlocks);
  env_.Advance(1'000'000);
  // Recompute given as free: not even the healthy figures win, so no retrial is spent.
  PlanRequest req;
  req.ns = "t";
  req.chain = Chain(kBlocks);
  req.client_id = "client-0";
  req.recompute = RecomputeParameters{0.0, 0.0, 0.0};
  StatusOr<PlanResult> r = node_->Plan(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(FetchesFromA(*r));
  EXPECT_EQ(node_->Snapshot().retrials, 0u);
  StatusOr<PlanExplanation> e = node_->Explain(r->plan_id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->text.find("retrial"), std::string::npos) << e->text;
  // The host's next try waits an interval (planning twice for every request would not).
  EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
  env_.Advance(1'000'000);
  EXPECT_TRUE(FetchesFromA(MakePlan(kBlocks)));
  EXPECT_EQ(node_->Snapshot().retrials, 1u);
}

TEST_F(RetrialTest, RetrialsCanBeTurnedOffAndBadIntervalsAreRefused) {
  options_.retrial_interval = std::chrono::milliseconds(0);
  StartWithHostA();
  ReportTransfer(0.1e9);
  ReportTransfer(0.1e9);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(FetchesFromA(MakePlan(kBlocks)));
    env_.Advance(10'000'000);
  }
  EXPECT_EQ(node_->Snapshot().retrials, 0u);
  PlacementOptions bad;
  bad.retrial_interval = std::chrono::milliseconds(2000);
  bad.retrial_max_interval = std::chrono::milliseconds(1000);
  const Status s = PlacementNode::ValidateOptions(bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("retrial_max_interval"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace kvfabric::placement
