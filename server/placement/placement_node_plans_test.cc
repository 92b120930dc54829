// PlacementNode: plans (alternatives, path load, fallbacks, explanations,
// observations), split from placement_node_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "server/placement/placement_node.h"
#include "server/placement/placement_node_test_fixture.h"

namespace kvfabric::placement {
namespace {

// Issue 24: compact copies are offered to the planner only under a compact_after policy, only
// for blocks old enough, and only as what a daemon published with representation compact_int8.
TEST_F(PlacementNodeTest, ExactPolicyNeverPlansACompactCopyAndCompactAfterUsesOnlyOldBlocks) {
  options_.remote_to_local = {20.0, 1e8};   // a slow bus: compact copies pay
  options_.recompute = {1000.0, 1e5, 0.0};  // and recompute is dear
  Start();
  const std::uint64_t l0 = Register(Rec("h0", 1));
  const std::uint64_t l1 = Register(Rec("h1", 1));
  Report("h0", 1, l0, Commits(0, 4));  // exact copies of blocks 0..3 only
  std::vector<BlockEvent> compact;
  for (int i = 0; i < 8; ++i) {
    BlockEvent e = Commit(i);
    e.key = CompactInt8BlockKey(Key(i));
    e.representation = 2;
    e.payload_bytes = kBlockBytes * 9 / 16;
    compact.push_back(e);
  }
  Report("h1", 1, l1, compact);

  // exact (the default): blocks 4..7 have no exact copy and are recomputed.
  PlanRequest req;
  req.ns = "t";
  req.chain = Chain(8);
  req.client_id = "client-0";
  req.include_explanation = true;
  auto exact = node_->Plan(req);
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  for (const PlanRun& run : exact->plan.runs) EXPECT_FALSE(run.compact);
  for (const auto& block : exact->locations.blocks) {
    for (const LocatedReplica& r : block) EXPECT_NE(r.representation, 2);
  }
  EXPECT_EQ(exact->plan.runs.back().action, RunAction::kRecompute);
  EXPECT_EQ(exact->plan.runs.back().first_block, 4u);

  // A client that hands placement locations listing compact copies still gets none in exact.
  ChainLocations forged = exact->locations;
  forged.hosts.push_back(Rec("h1", 1));
  for (int i = 0; i < 8; ++i) {
    forged.blocks[i].push_back({static_cast<std::uint32_t>(forged.hosts.size() - 1), Tier::kHost,
                                kBlockBytes * 9 / 16, 2});
  }
  req.locations = forged;
  auto forged_plan = node_->Plan(req);
  ASSERT_TRUE(forged_plan.ok()) << forged_plan.status().ToString();
  for (const PlanRun& run : forged_plan->plan.runs) EXPECT_FALSE(run.compact);
  EXPECT_EQ(forged_plan->plan.runs.back().first_block, 4u);
  req.locations.reset();

  // compact_after = 2 blocks: blocks 0..5 may be compact (they end >= 32 tokens before the last
  // token), 6..7 may not, and have no exact copy: the plan recomputes from block 6.
  req.compact = PlanRequest::CompactPolicy{2 * kTokens, 0.5, 16};
  auto plan = node_->Plan(req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_NE(plan->plan.representation, RepresentationChoice::kExact) << plan->plan.explanation;
  std::uint32_t compact_blocks = 0;
  for (std::size_t i = 0; i < plan->plan.runs.size(); ++i) {
    const PlanRun& run = plan->plan.runs[i];
    if (run.action == RunAction::kRecompute) {
      EXPECT_EQ(run.first_block, 6u);
      continue;
    }
    EXPECT_LE(run.first_block + run.block_count, 6u);
    if (!run.compact) continue;
    compact_blocks += run.block_count;
    EXPECT_EQ(plan->locations.hosts[run.host_index].host_id, "h1");
    EXPECT_EQ(run.payload_bytes, run.block_count * (kBlockBytes * 9 / 16));
    EXPECT_TRUE(plan->fallback_host_indices[i].empty());  // no other host holds the copies
  }
  EXPECT_GE(compact_blocks, 2u);  // at least blocks 4..5, which have no exact copy
  EXPECT_EQ(compact_blocks, plan->plan.compact_blocks);
  // Pen = tokens x 0.5 µs x 16 steps per compact block.
  EXPECT_DOUBLE_EQ(plan->plan.compact_penalty_us, compact_blocks * kTokens * 0.5 * 16);
  EXPECT_NE(plan->plan.explanation.find("representation"), std::string::npos);

  req.compact->extra_decode_us_per_token = -1;
  EXPECT_EQ(node_->Plan(req).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PlacementNodeTest, PlanIsNeverPredictedSlowerThanRecomputeAllOrFetchAll) {
  const std::uint64_t seed =
      TestSeed("PlacementNodeTest.PlanIsNeverPredictedSlowerThanRecomputeAllOrFetchAll");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto log_uniform = [&](double lo, double hi) { return lo * std::pow(hi / lo, unit(rng)); };
  options_.remote_to_local = {log_uniform(1, 200), log_uniform(1e9, 50e9)};
  options_.local_memcpy = {log_uniform(1, 20), log_uniform(5e9, 50e9)};
  options_.nvme_to_host = {log_uniform(10, 500), log_uniform(1e9, 10e9)};
  options_.recompute = {log_uniform(100, 5000), log_uniform(1, 200), log_uniform(1e-5, 1e-2)};
  Start();
  const int hosts = 2 + static_cast<int>(rng() % 4);
  std::vector<std::uint64_t> leases;
  for (int h = 0; h < hosts; ++h) {
    leases.push_back(Register(Rec("h" + std::to_string(h), 1, h == 0 ? "node-0" : "node-x")));
  }
  constexpr int kBlocks = 40;
  for (int h = 0; h < hosts; ++h) {
    std::vector<BlockEvent> ev;
    for (int i = 0; i < kBlocks; ++i) {
      if (unit(rng) < 0.6) ev.push_back(Commit(i, unit(rng) < 0.5 ? Tier::kHost : Tier::kNvme));
    }
    Report("h" + std::to_string(h), 1, leases[h], ev);
  }
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng() % kBlocks);
    PlanRequest req;
    req.ns = "t";
    req.chain = Chain(n);
    req.client_id = "client-" + std::to_string(trial % 3);
    req.client_node = trial % 2 ? "node-0" : "elsewhere";
    req.suffix_tokens = rng() % 64;
    auto res = node_->Plan(req);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    const kvfabric::Plan& plan = res->plan;
    const double recompute_all = RecomputeMicros(
        options_.recompute, static_cast<double>(n * kTokens + req.suffix_tokens), 0);
    EXPECT_NEAR(Alternative(plan, PlanKind::kRecomputeAll), recompute_all, 1e-9 * recompute_all);
    const double bound = std::min(recompute_all, Alternative(plan, PlanKind::kFetchAll));
    EXPECT_LE(plan.predicted_total_us, bound * (1 + 1e-12)) << "trial " << trial;
    std::uint32_t covered = 0;
    for (const auto& run : plan.runs) {
      ASSERT_EQ(run.first_block, covered);
      if (run.action == RunAction::kFetch) {
        for (std::uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
          bool held = false;
          for (const auto& r : res->locations.blocks[b]) {
            held |= r.host_index == run.host_index && r.tier == run.tier;
          }
          EXPECT_TRUE(held) << "block " << b << " fetched from a host that does not hold it";
        }
      }
      covered += run.block_count;
    }
    EXPECT_EQ(covered, static_cast<std::uint32_t>(n));
    node_->ReportPlanFinished(res->plan_id);
  }
  EXPECT_EQ(node_->Snapshot().plans, 50u);
  EXPECT_EQ(node_->Snapshot().plans_admitted, 0u);
}

TEST_F(PlacementNodeTest, APlanLoadsItsPathsUntilFinishedOrPastItsDeadline) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 8));
  const PlanResult first = MakePlan(8);
  ASSERT_EQ(first.plan.kind, PlanKind::kFetchAll);
  EXPECT_EQ(node_->Snapshot().plans_admitted, 1u);
  // The second plan queues behind the first's bytes.
  const PlanResult second = MakePlan(8);
  EXPECT_GT(Alternative(second.plan, PlanKind::kFetchAll),
            Alternative(first.plan, PlanKind::kFetchAll));
  ObservationReport done;
  done.ns = "t";
  done.plan_id = first.plan_id;
  done.plan_finished = true;
  done.observed_total_us = first.plan.predicted_total_us * 1.5;
  ASSERT_TRUE(node_->ReportObservations(done).ok());
  ASSERT_TRUE(node_->ReportObservations(done).ok());  // idempotent
  EXPECT_EQ(node_->Snapshot().plans_admitted, 1u);
  EXPECT_EQ(node_->Snapshot().plans_finished, 1u);
  // The second expires by its deadline (predicted end x 2 + 100 ms).
  env_.Advance(static_cast<std::uint64_t>(second.plan.predicted_total_us * 2) + 100'001);
  node_->Maintain();
  EXPECT_EQ(node_->Snapshot().plans_admitted, 0u);
  EXPECT_EQ(node_->Snapshot().plans_expired, 1u);
  const PlanResult third = MakePlan(8);
  EXPECT_DOUBLE_EQ(Alternative(third.plan, PlanKind::kFetchAll),
                   Alternative(first.plan, PlanKind::kFetchAll));
  // Predicted vs observed of the finished plan.
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.plan_error.count, 1u);
  EXPECT_NEAR(s.plan_error.worst_abs, 0.5, 1e-9);
  auto x = node_->Explain(first.plan_id);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(x->observed_total_us.has_value());
  EXPECT_DOUBLE_EQ(*x->observed_total_us, done.observed_total_us);
  // The second plan, admitted at the same time on the same paths, took an equal share: the
  // first's end moved by what the second's fetch-all was predicted to wait for it.
  ASSERT_TRUE(x->later_plans_delay_us.has_value());
  EXPECT_NEAR(
      *x->later_plans_delay_us,
      Alternative(second.plan, PlanKind::kFetchAll) - Alternative(first.plan, PlanKind::kFetchAll),
      1e-6 * *x->later_plans_delay_us);
  // The inputs as the plan saw them: every path with its figures, provenance
  // and queue, and the recompute model.
  EXPECT_NE(x->text.find("inputs (as the plan was made)"), std::string::npos) << x->text;
  EXPECT_NE(x->text.find("nvme→host"), std::string::npos) << x->text;
  EXPECT_NE(x->text.find("queued"), std::string::npos) << x->text;
  EXPECT_NE(x->text.find("recompute"), std::string::npos) << x->text;
  bool alpha = false, queued = false;
  for (const ExplainTerm& term : x->terms) {
    alpha = alpha || term.name.rfind("alpha:remote_host_to_local_host[", 0) == 0;
    queued = queued || term.name.rfind("queued:", 0) == 0;
  }
  EXPECT_TRUE(alpha && queued);
}

// A 1 MiB block fetches in ~105 us at 10 GB/s and its 16 tokens prefill in ~104 us at 6.5 us per
// token: a split is predicted to halve the load while the sides overlap (s = 0). Each split here
// runs its sides one after the other; after three finished splits the model has learned s ~ 1
// and the planner stops choosing splits.
TEST_F(PlacementNodeTest, FinishedSplitPlansTeachTheModelItsOverlap) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 32));
  PlanRequest req;
  req.ns = "t";
  req.chain = Chain(32);
  req.client_id = "client-0";
  req.model_id = "m";
  req.engine_prefill = RecomputeParameters{0.0, 6.5, 0.0};
  auto finish = [&](const PlanResult& res, bool fell_back) {
    const PlanAlternative* chosen = nullptr;
    for (const PlanAlternative& a : res.plan.alternatives) {
      if (a.chosen) chosen = &a;
    }
    EXPECT_NE(chosen, nullptr);
    if (fell_back) {
      ObservationReport partial;
      partial.ns = "t";
      partial.plan_id = res.plan_id;
      partial.fallback_runs = {1};
      EXPECT_TRUE(node_->ReportObservations(partial).ok());
    }
    ObservationReport done;
    done.ns = "t";
    done.plan_id = res.plan_id;
    done.plan_finished = true;
    done.observed_total_us = chosen->front_us + chosen->fetch_us + chosen->rest_us;
    EXPECT_TRUE(node_->ReportObservations(done).ok());
  };
  // A split that fell back did other work than planned: it teaches nothing.
  auto res = node_->Plan(req);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->plan.kind, PlanKind::kSplit);
  finish(*res, /*fell_back=*/true);
  EXPECT_EQ(node_->Snapshot().split_observations, 0u);
  for (int i = 0; i < 3; ++i) {
    res = node_->Plan(req);
    ASSERT_TRUE(res.ok()) << res.status();
    ASSERT_EQ(res->plan.kind, PlanKind::kSplit) << "plan " << i;
    finish(*res, /*fell_back=*/false);
  }
  EXPECT_EQ(node_->Snapshot().split_observations, 3u);
  bool found = false;
  for (const auto& m : node_->Snapshot().models) {
    if (m.model_id != "m") continue;
    found = true;
    EXPECT_GT(m.parameters.split_serial_fraction, 0.99);
    EXPECT_EQ(m.split_error.count, 3u);
  }
  EXPECT_TRUE(found);
  req.include_explanation = true;
  res = node_->Plan(req);
  ASSERT_TRUE(res.ok());
  EXPECT_NE(res->plan.kind, PlanKind::kSplit);
  auto x = node_->Explain(res->plan_id);
  ASSERT_TRUE(x.ok());
  EXPECT_NE(x->text.find("split overlap s 1.00"), std::string::npos) << x->text;
  EXPECT_NE(x->formula.find("s * min(A, B)"), std::string::npos) << x->formula;
}

TEST_F(PlacementNodeTest, AHostOnTheClientsNodeIsReadOverTheMemcpyPath) {
  options_.remote_to_local = {20.0, 2e9};
  options_.local_memcpy = {2.0, 20e9};
  options_.client_ingest = {0.0, 100e9};  // not the limit here
  Start();
  const std::uint64_t la = Register(Rec("a", 1, "gpu-node-3"));
  Report("a", 1, la, Commits(0, 8));
  const PlanResult remote = MakePlan(8, "gpu-node-9");
  node_->ReportPlanFinished(remote.plan_id);
  const PlanResult local = MakePlan(8, "gpu-node-3");
  node_->ReportPlanFinished(local.plan_id);
  // 8 MiB at 2 GB/s vs (bottleneck host->device) 25 GB/s.
  const double bytes = 8.0 * kBlockBytes;
  const double want_remote = 10 + 20 + bytes / 2e9 * 1e6;
  const double want_local = 10 + 2 + bytes / 20e9 * 1e6;  // memcpy 20 GB/s is the bottleneck
  EXPECT_NEAR(Alternative(remote.plan, PlanKind::kFetchAll), want_remote, 1e-6 * want_remote);
  EXPECT_NEAR(Alternative(local.plan, PlanKind::kFetchAll), want_local, 1e-6 * want_local);
}

TEST_F(PlacementNodeTest, ALocalHostWithItsOwnMeasuredPathIsPlannedWithIt) {
  // The daemon on the client's node was calibrated over its real data plane
  // (kernel TCP here: 1 GB/s, not a 20 GB/s memcpy): that is what reading it costs.
  options_.local_memcpy = {2.0, 20e9};
  options_.calibration.paths.push_back(
      {BusPath::kRemoteHostToLocalHost, "a", {50.0, 1e9}, 10, 0, 0, 0, 0});
  Start();
  const std::uint64_t la = Register(Rec("a", 1, "gpu-node-3"));
  Report("a", 1, la, Commits(0, 8));
  const PlanResult local = MakePlan(8, "gpu-node-3");
  const double bytes = 8.0 * kBlockBytes;
  const double want = 10 + 50 + bytes / 1e9 * 1e6;
  EXPECT_NEAR(Alternative(local.plan, PlanKind::kFetchAll), want, 1e-6 * want);
}

TEST_F(PlacementNodeTest, ASizeCurveIsReadAtTheBytesEachSourceIsExpectedToMove) {
  options_.client_ingest = {0.0, 100e9};  // not the limit here
  options_.explain_every_plan = true;
  PathParameters curved{20.0, 2e9};
  curved.size_factors = {1, 1, 1, 3.0, 1, 1, 1, 1};  // slower around 4 MiB
  options_.calibration.paths.push_back(
      {BusPath::kRemoteHostToLocalHost, "", curved, 10, 0, 0, 0, 0});
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 8));
  // One source moves all 8 MiB: half way (in log size) between the 4 MiB knot (3) and the
  // 16 MiB one (1): k = 2.
  const PlanResult one = MakePlan(8);
  node_->ReportPlanFinished(one.plan_id);
  const double bytes = 8.0 * kBlockBytes;
  const double want = 10 + (20 + bytes / 2e9 * 1e6) * 2.0;
  EXPECT_NEAR(Alternative(one.plan, PlanKind::kFetchAll), want, 1e-6 * want);
  auto x = node_->Explain(one.plan_id);
  ASSERT_TRUE(x.ok());
  EXPECT_NE(x->text.find("(size curve × 2.000 at 8 MiB)"), std::string::npos) << x->text;
  auto term = [&](const PlanExplanation& e, const std::string& name) {
    for (const ExplainTerm& t : e.terms) {
      if (t.name == name) return t.value;
    }
    ADD_FAILURE() << "no term " << name;
    return 0.0;
  };
  EXPECT_DOUBLE_EQ(term(*x, "size_factor:remote_host_to_local_host[a]"), 2.0);
  EXPECT_DOUBLE_EQ(term(*x, "size_at:remote_host_to_local_host[a]"), bytes);
  // A second daemon holding the same blocks: each is expected to move half, 4 MiB, at k = 3.
  const std::uint64_t lb = Register(Rec("b", 1));
  Report("b", 1, lb, Commits(0, 8));
  const PlanResult two = MakePlan(8);
  auto y = node_->Explain(two.plan_id);
  ASSERT_TRUE(y.ok());
  EXPECT_DOUBLE_EQ(term(*y, "size_at:remote_host_to_local_host[b]"), bytes / 2);
  EXPECT_DOUBLE_EQ(term(*y, "size_factor:remote_host_to_local_host[b]"), 3.0);
}

TEST_F(PlacementNodeTest, PlanNamesFallbackHostsThatHoldTheWholeRun) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  const std::uint64_t lb = Register(Rec("b", 1));
  const std::uint64_t lc = Register(Rec("c", 1));
  Report("a", 1, la, Commits(0, 4));
  Report("b", 1, lb, Commits(0, 4, Tier::kNvme));
  Report("c", 1, lc, Commits(0, 2));
  const PlanResult p = MakePlan(4);
  ASSERT_EQ(p.plan.kind, PlanKind::kFetchAll);
  // a's stream may share the prefix with c's (streams overlap): every run names as fallbacks
  // the other hosts that hold all of it (c holds only blocks 0 and 1).
  ASSERT_EQ(p.fallback_host_indices.size(), p.plan.runs.size());
  bool a_fetches = false;
  for (std::size_t r = 0; r < p.plan.runs.size(); ++r) {
    const PlanRun& run = p.plan.runs[r];
    ASSERT_EQ(run.action, RunAction::kFetch);
    const std::string source = p.locations.hosts[run.host_index].host_id;
    a_fetches |= source == "a";
    std::vector<std::string> fallbacks;
    for (std::uint32_t h : p.fallback_host_indices[r]) {
      fallbacks.push_back(p.locations.hosts[h].host_id);
    }
    std::sort(fallbacks.begin(), fallbacks.end());
    std::vector<std::string> want;
    for (const char* h : {"a", "b", "c"}) {
      if (h == source) continue;
      if (std::string(h) == "c" && run.first_block + run.block_count > 2) continue;
      want.push_back(h);
    }
    EXPECT_EQ(fallbacks, want) << "run " << r << " from " << source;
  }
  EXPECT_TRUE(a_fetches);
}

// Contexts of an engine plan their loads at the same moment. Each plan must see the bytes of
// every plan admitted before it, so eight plans of one chain made at once by eight threads are
// predicted eight different times, each later one queued behind the earlier ones (a plan made
// while another was between pricing and admission would price the paths as idle).
TEST_F(PlacementNodeTest, PlansMadeAtOnceEachSeeTheOthersLoad) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 8));
  constexpr int kPlans = 8;
  std::vector<double> predicted(kPlans, 0);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kPlans; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kPlans) std::this_thread::yield();
      const PlanResult p = MakePlan(8);
      predicted[t] = Alternative(p.plan, PlanKind::kFetchAll);
    });
  }
  for (std::thread& t : threads) t.join();
  std::sort(predicted.begin(), predicted.end());
  // 8 MiB at the default 10 GB/s per plan: each one waits for the ones before it.
  const double one = predicted[0];
  for (int i = 1; i < kPlans; ++i) {
    EXPECT_GT(predicted[i], predicted[i - 1] + 0.5 * (one - 100)) << "plan " << i;
  }
}

TEST_F(PlacementNodeTest, PlanUsesTheLocationsTheClientSawWhenGiven) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 4));
  const std::vector<BlockKey> keys = Keys(4);
  auto seen = node_->Locate("t", keys);
  ASSERT_TRUE(seen.ok());
  ASSERT_TRUE(Deregister(la).ok());
  PlanRequest req;
  req.ns = "t";
  req.chain = Chain(4);
  req.locations = *seen;
  auto p = node_->Plan(req);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->plan.kind, PlanKind::kFetchAll);
  EXPECT_EQ(p->locations.hosts[p->plan.runs[0].host_index].host_id, "a");
  req.locations->blocks.pop_back();
  auto bad = node_->Plan(req);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("locations.blocks: 3 != 4 keys"), std::string::npos);
  req.locations.reset();
  EXPECT_EQ(node_->Plan(req)->plan.kind, PlanKind::kRecomputeAll);
}

TEST_F(PlacementNodeTest, ListHostsReportsTheLeaseTimeLeft) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1), 3000);
  env_.Advance(1'000'000);
  EXPECT_EQ(node_->ListHosts()[0].lease_remaining_ms, 2000u);
  auto hb = Heartbeat(la, nullptr);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->ttl_ms, 3000u);
  EXPECT_EQ(node_->ListHosts()[0].lease_remaining_ms, 3000u);
  EXPECT_NE(node_->ListHosts()[0].last_heartbeat_unix_us, 0u);
  MemberRecord other = Rec("a", 2);
  EXPECT_EQ(Heartbeat(la, &other).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PlacementNodeTest, ExplainKeepsABoundedHistory) {
  options_.plan_history = 2;
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 4));
  const PlanResult p1 = MakePlan(4);
  PlanRequest req;
  req.ns = "t";
  req.chain = Chain(4);
  req.include_explanation = true;
  auto p2 = node_->Plan(req);
  ASSERT_TRUE(p2.ok());
  EXPECT_TRUE(p1.plan.explanation.empty());  // not asked for
  EXPECT_FALSE(p2->plan.explanation.empty());
  EXPECT_NE(p2->plan_id, p1.plan_id);
  auto x1 = node_->Explain(p1.plan_id);
  ASSERT_TRUE(x1.ok()) << x1.status().ToString();
  EXPECT_FALSE(x1->text.empty());  // kept for Explain even though the response left it out
  EXPECT_EQ(x1->kind, p1.plan.kind);
  EXPECT_NE(x1->formula.find("t_recompute"), std::string::npos);
  bool has_term = false;
  for (const auto& t : x1->terms) has_term |= t.name == "t_recompute_all" && t.unit == "us";
  EXPECT_TRUE(has_term);
  const PlanResult p3 = MakePlan(4);
  auto gone = node_->Explain(p1.plan_id);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("plan_history 2"), std::string::npos);
  EXPECT_TRUE(node_->Explain(p3.plan_id).ok());
  EXPECT_EQ(node_->Explain(12345).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(node_->Snapshot().plan_history, 2u);
}

// The byte bound counts a plan the same going out as coming in: the history
// held under plan_history_bytes stays the same size however many plans pass
// (it used to subtract less than it added and shrink toward one plan).
TEST_F(PlacementNodeTest, ThePlanHistoryByteBoundDoesNotDrift) {
  options_.plan_history = 100000;
  options_.plan_history_bytes = 256 << 10;
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 4));
  for (int i = 0; i < 2000; ++i) MakePlan(4);
  const std::uint64_t kept = node_->Snapshot().plan_history;
  ASSERT_GT(kept, 10u);
  for (int i = 0; i < 20000; ++i) MakePlan(4);
  EXPECT_GE(node_->Snapshot().plan_history + 1, kept);
  // RecentPlans lists them newest first, filtered by namespace.
  const std::vector<PlanSummary> recent = node_->RecentPlans(3);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_GT(recent[0].plan_id, recent[1].plan_id);
  EXPECT_EQ(recent[0].ns, "t");
  EXPECT_EQ(recent[0].chain_blocks, 4u);
  const std::string other = "u";
  EXPECT_TRUE(node_->RecentPlans(3, &other).empty());
}

TEST_F(PlacementNodeTest, ATransferBesideOtherLoadsIsScoredAtItsShare) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 2));
  ObservationReport r;
  r.ns = "t";
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t bytes = kBlockBytes << i;
    const double alone = FetchMicros(options_.remote_to_local, static_cast<double>(bytes));
    // Beside loads that moved 1x, 3x and 7x its bytes: 2x, 4x and 8x the time alone.
    const std::uint64_t others = bytes * ((2u << i) - 1);
    TransferObservation t{BusPath::kRemoteHostToLocalHost, "a", bytes,
                          static_cast<double>(2u << i) * alone};
    t.shared_bytes = others;
    r.transfers.push_back(t);
  }
  // A claim of far more sharing counts as a share of 1/64 at most: 64x the
  // time alone, beside 1000x the bytes, scores as the model's own time.
  TransferObservation claim{
      BusPath::kRemoteHostToLocalHost, "a", kBlockBytes,
      64 * FetchMicros(options_.remote_to_local, static_cast<double>(kBlockBytes))};
  claim.shared_bytes = 1000 * kBlockBytes;
  r.transfers.push_back(claim);
  ASSERT_TRUE(node_->ReportObservations(r).ok());
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.observations_shared, 4u);
  bool found = false;
  for (const auto& p : s.paths) {
    if (p.path != BusPath::kRemoteHostToLocalHost || p.host_id != "a") continue;
    found = true;
    // Scored at their share, each is the default model's prediction.
    EXPECT_EQ(p.error.count, 4u);
    EXPECT_NEAR(p.error.worst_abs, 0.0, 1e-6);
  }
  EXPECT_TRUE(found);
}

TEST_F(PlacementNodeTest, ObservationsScorePathsAndDropStaleEntries) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  const std::uint64_t lb = Register(Rec("b", 1));
  Report("a", 1, la, Commits(0, 2));
  Report("b", 1, lb, Commits(0, 2));
  ObservationReport r;
  r.ns = "t";
  r.model_id = "m";
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t bytes = kBlockBytes << i;
    // Twice the default model's prediction: error +1.
    r.transfers.push_back({BusPath::kRemoteHostToLocalHost, "a", bytes,
                           2 * FetchMicros(options_.remote_to_local, static_cast<double>(bytes))});
  }
  r.transfers.push_back({BusPath::kRemoteHostToLocalHost, "not-a-member", kBlockBytes, 10.0});
  // A split's fetch side, ten times slower beside its prefill: neither scored nor fitted, but
  // its bytes are traffic.
  r.transfers.push_back(
      {BusPath::kRemoteHostToLocalHost, "a", kBlockBytes,
       10 * FetchMicros(options_.remote_to_local, static_cast<double>(kBlockBytes)),
       /*beside_prefill=*/true});
  r.recomputes.push_back({64, 0, 2 * RecomputeMicros(options_.recompute, 64, 0)});
  // A split's front, ten times slower beside its fetch: neither scored nor fitted.
  r.recomputes.push_back(
      {64, 0, 10 * RecomputeMicros(options_.recompute, 64, 0), /*beside_fetch=*/true});
  r.stale_entries.push_back({"a", Key(0)});
  r.fallback_runs = {0};
  ASSERT_TRUE(node_->ReportObservations(r).ok());
  const PlacementSnapshot s = node_->Snapshot();
  bool found = false;
  for (const auto& p : s.paths) {
    if (p.path == BusPath::kRemoteHostToLocalHost && p.host_id == "a") {
      found = true;
      EXPECT_EQ(p.error.count, 4u);
      EXPECT_NEAR(p.error.worst_abs, 1.0, 1e-9);
    }
    EXPECT_NE(p.host_id, "not-a-member");
  }
  EXPECT_TRUE(found);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].model_id, "m");
  EXPECT_EQ(s.models[0].error.count, 1u);
  EXPECT_NEAR(s.models[0].error.worst_abs, 1.0, 1e-9);
  EXPECT_EQ(s.observations_beside_fetch, 1u);
  EXPECT_EQ(s.observations_beside_prefill, 1u);
  EXPECT_EQ(s.observations_unscored, 1u);
  EXPECT_EQ(s.stale_reports, 1u);
  EXPECT_EQ(s.fallback_runs, 1u);
  EXPECT_EQ(s.directory.stale_replicas_removed, 1u);
  // Traffic per path counts the member's five transfers, not the stranger's.
  const PathTraffic& t = s.traffic[static_cast<std::size_t>(BusPath::kRemoteHostToLocalHost)];
  EXPECT_EQ(t.transfers, 5u);
  EXPECT_EQ(t.bytes, kBlockBytes * (1 + 2 + 4 + 8 + 1));
  EXPECT_GT(t.observed_us, 0.0);
  const std::vector<BlockKey> keys = Keys(2);
  EXPECT_EQ(Holders(*node_->Locate("t", keys)),
            (std::vector<std::vector<std::string>>{{"b"}, {"a", "b"}}));

  ObservationReport bad;
  bad.transfers.push_back({BusPath::kRemoteHostToLocalHost, "a", 0, 5.0});
  EXPECT_EQ(node_->ReportObservations(bad).code(), StatusCode::kInvalidArgument);
  ObservationReport unknown_plan;
  unknown_plan.plan_id = 777;
  unknown_plan.plan_finished = true;
  EXPECT_TRUE(node_->ReportObservations(unknown_plan).ok());
  EXPECT_EQ(node_->Snapshot().observations_unknown_plan, 1u);
}

}  // namespace
}  // namespace kvfabric::placement
