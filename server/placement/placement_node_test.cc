#include "server/placement/placement_node.h"

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

namespace kvfabric::placement {
namespace {

// An Env whose clocks only move when the test says so; files go to the real Env.
class FakeClockEnv final : public Env {
 public:
  void Advance(std::uint64_t us) { now_us_ += us; }

  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override {
    return base_->NewRandomRWFile(path, options);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return base_->GetChildren(dir);
  }
  Status CreateDirIfMissing(const std::string& dir) override {
    return base_->CreateDirIfMissing(dir);
  }
  Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  Status DeleteDir(const std::string& dir) override { return base_->DeleteDir(dir); }
  Status RenameFile(const std::string& src, const std::string& target) override {
    return base_->RenameFile(src, target);
  }
  StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    return base_->GetFileSize(path);
  }
  Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }
  uint64_t NowMicros() override { return now_us_; }
  uint64_t WallMicros() override { return 1'700'000'000'000'000 + now_us_; }
  void SleepForMicros(uint64_t micros) override { now_us_ += micros; }

 private:
  Env* const base_ = Env::Default();
  std::atomic<std::uint64_t> now_us_{1'000'000};
};

constexpr std::uint32_t kTokens = 16;
constexpr std::uint64_t kBlockBytes = 1 << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

BlockKey Key(int i) {
  BlockKey::Bytes b{};
  b[0] = static_cast<std::uint8_t>(i);
  b[1] = static_cast<std::uint8_t>(i >> 8);
  b[2] = 0x5A;
  return BlockKey(b);
}

std::vector<BlockKey> Keys(int n) {
  std::vector<BlockKey> out;
  for (int i = 0; i < n; ++i) out.push_back(Key(i));
  return out;
}

MemberRecord Rec(std::string id, std::uint64_t inc, std::string node = "",
                 std::uint64_t free = 8 * kGiB) {
  MemberRecord r;
  r.host_id = std::move(id);
  r.incarnation = inc;
  r.grpc_address = "10.0.0.1:7000";
  r.transport_address = "10.0.0.1:7001";
  r.node_name = std::move(node);
  r.host_capacity_bytes = 16 * kGiB;
  r.host_free_bytes = free;
  r.nvme_capacity_bytes = 0;
  r.nvme_free_bytes = 0;
  return r;
}

BlockEvent Commit(int key, Tier tier = Tier::kHost, std::string ns = "t") {
  BlockEvent e;
  e.kind = BlockEventKind::kCommitted;
  e.ns = std::move(ns);
  e.key = Key(key);
  e.tier = tier;
  e.payload_bytes = kBlockBytes;
  e.representation = 1;
  return e;
}

std::vector<ChainBlockSpec> Chain(int n) {
  std::vector<ChainBlockSpec> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({Key(i), kTokens, static_cast<std::uint64_t>(i) * kTokens, kBlockBytes});
  }
  return out;
}

double Alternative(const kvfabric::Plan& p, PlanKind kind) {
  for (const auto& a : p.alternatives) {
    if (a.kind == kind) return a.predicted_us;
  }
  return std::numeric_limits<double>::infinity();
}

class PlacementNodeTest : public ::testing::Test {
 protected:
  PlacementNodeTest() {
    options_.maintenance_interval = std::chrono::milliseconds(0);
    options_.remote_to_local = {20.0, 10e9};
    options_.nvme_to_host = {100.0, 3e9};
    options_.host_to_device = {10.0, 25e9};
    options_.recompute = {1000.0, 100.0, 0.0};  // 1.6 ms per 16-token block: fetch wins
  }

  void Start() {
    auto node = PlacementNode::Create(options_, &store_, &env_);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    node_ = std::move(*node);
  }

  std::uint64_t Register(const MemberRecord& r, std::uint32_t ttl_ms = 3000) {
    auto res = node_->Register(r, ttl_ms);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? res->lease_id : 0;
  }

  // Reports `events` as host's next sequence.
  ReportResult Report(const std::string& host, std::uint64_t inc, std::uint64_t lease,
                      std::vector<BlockEvent> events) {
    BlockReport r;
    r.host_id = host;
    r.incarnation = inc;
    r.lease_id = lease;
    r.sequence = ++sequence_[host + "/" + std::to_string(inc)];
    r.events = std::move(events);
    auto res = node_->ReportBlocks(r);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res : ReportResult{};
  }

  std::vector<BlockEvent> Commits(int first, int end, Tier tier = Tier::kHost) {
    std::vector<BlockEvent> out;
    for (int i = first; i < end; ++i) out.push_back(Commit(i, tier));
    return out;
  }

  PlanResult MakePlan(int blocks, std::string client_node = "") {
    PlanRequest req;
    req.ns = "t";
    req.chain = Chain(blocks);
    req.client_id = "client-0";
    req.client_node = std::move(client_node);
    auto res = node_->Plan(req);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? std::move(*res) : PlanResult{};
  }

  // Host ids of the replicas of each block.
  static std::vector<std::vector<std::string>> Holders(const ChainLocations& loc) {
    std::vector<std::vector<std::string>> out;
    for (const auto& block : loc.blocks) {
      std::vector<std::string> ids;
      for (const auto& r : block) ids.push_back(loc.hosts[r.host_index].host_id);
      out.push_back(ids);
    }
    return out;
  }

  FakeClockEnv env_;
  MemoryMembershipStore store_{&env_};
  PlacementOptions options_;
  std::unique_ptr<PlacementNode> node_;
  std::map<std::string, std::uint64_t> sequence_;
};

TEST_F(PlacementNodeTest, LocateReturnsLiveReplicasBestFirstAndTheLongestCachedPrefix) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  const std::uint64_t lb = Register(Rec("b", 1));
  const std::uint64_t lc = Register(Rec("c", 1));
  Report("a", 1, la, Commits(0, 4));
  auto b_events = Commits(0, 2);
  b_events.push_back(Commit(5, Tier::kNvme));
  Report("b", 1, lb, b_events);
  Report("c", 1, lc, {Commit(2, Tier::kNvme), Commit(3, Tier::kNvme)});

  const std::vector<BlockKey> keys = Keys(6);
  auto loc = node_->Locate("t", keys);
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  EXPECT_EQ(loc->cached_prefix_blocks, 4u);
  const auto holders = Holders(*loc);
  EXPECT_EQ(holders[0], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(holders[1], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(holders[2], (std::vector<std::string>{"a", "c"}));  // host tier before NVMe
  EXPECT_EQ(holders[3], (std::vector<std::string>{"a", "c"}));
  EXPECT_TRUE(holders[4].empty());
  EXPECT_EQ(holders[5], (std::vector<std::string>{"b"}));  // cached after the gap: listed
  EXPECT_EQ(loc->blocks[2][1].tier, Tier::kNvme);
  EXPECT_EQ(loc->blocks[0][0].payload_bytes, kBlockBytes);
  EXPECT_EQ(loc->hosts.size(), 3u);
  // Another namespace sees nothing.
  auto other = node_->Locate("u", keys);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->cached_prefix_blocks, 0u);
  EXPECT_TRUE(other->hosts.empty());
  EXPECT_EQ(node_->Snapshot().locates, 2u);
}

TEST_F(PlacementNodeTest, RegisterAppliesTtlLimitsAndAsksANewHostForAFullReport) {
  Start();
  auto r = node_->Register(Rec("a", 1), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ttl_ms, 30000u);
  EXPECT_EQ(r->heartbeat_interval_ms, 10000u);
  EXPECT_TRUE(r->full_report_requested);
  EXPECT_EQ(r->placement_incarnation, node_->incarnation());
  EXPECT_NE(r->lease_id, 0u);

  auto too_long = node_->Register(Rec("b", 1), 600001);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("ttl_ms: 600001 > max_ttl_ms 600000"),
            std::string::npos)
      << too_long.status().ToString();
  EXPECT_EQ(node_->Register(Rec("b", 0), 1000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node_->Register(Rec("", 1), 1000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(node_->ListHosts().size(), 1u);
}

TEST_F(PlacementNodeTest, ReportBlocksIgnoresRepeatedSequencesAndAsksForASnapshotAfterAGap) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  BlockReport r;
  r.host_id = "a";
  r.incarnation = 1;
  r.lease_id = la;
  r.sequence = 1;
  r.events = {Commit(0), Commit(1)};
  ASSERT_TRUE(node_->ReportBlocks(r).ok());
  BlockReport evict = r;
  evict.sequence = 2;
  evict.events = {Commit(0)};
  evict.events[0].kind = BlockEventKind::kEvicted;
  ASSERT_TRUE(node_->ReportBlocks(evict).ok());
  // A retry of sequence 1 must not bring key 0 back.
  auto retry = node_->ReportBlocks(r);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->acked_sequence, 2u);
  const std::vector<BlockKey> keys = Keys(2);
  EXPECT_EQ(Holders(*node_->Locate("t", keys)), (std::vector<std::vector<std::string>>{{}, {"a"}}));
  EXPECT_EQ(node_->Snapshot().reports_duplicate, 1u);

  // Sequence 5 after 2: applied, but placement now wants a full snapshot.
  BlockReport gap = r;
  gap.sequence = 5;
  gap.events = {Commit(7)};
  auto g = node_->ReportBlocks(gap);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->acked_sequence, 5u);
  EXPECT_TRUE(g->full_report_requested);
  EXPECT_EQ(node_->Snapshot().reports_gap, 1u);

  // A complete snapshot (two chunks) clears the request and replaces the host's entries.
  BlockReport s1 = r;
  s1.sequence = 6;
  s1.snapshot_id = 99;
  s1.events = {Commit(1), Commit(3)};
  for (auto& e : s1.events) e.kind = BlockEventKind::kPresent;
  BlockReport s2 = s1;
  s2.sequence = 7;
  s2.snapshot_last = true;
  s2.events = {Commit(4, Tier::kNvme)};
  s2.events[0].kind = BlockEventKind::kPresent;
  ASSERT_TRUE(node_->ReportBlocks(s1).ok());
  auto done = node_->ReportBlocks(s2);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->full_report_requested);
  std::set<int> held;
  const std::vector<BlockKey> all = Keys(8);
  auto loc = node_->Locate("t", all);
  for (int i = 0; i < 8; ++i) {
    if (!loc->blocks[i].empty()) held.insert(i);
  }
  EXPECT_EQ(held, (std::set<int>{1, 3, 4}));  // 7 was not in the snapshot: dropped
  const auto hosts = node_->ListHosts();
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].directory_blocks, 3u);
  EXPECT_FALSE(hosts[0].full_report_requested);
  EXPECT_EQ(hosts[0].acked_sequence, 7u);
  EXPECT_EQ(node_->Snapshot().snapshots_completed, 1u);
}

TEST_F(PlacementNodeTest, ReportBlocksWithAStaleLeaseIsNotFoundAndAppliesNothing) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  BlockReport r;
  r.host_id = "a";
  r.incarnation = 1;
  r.lease_id = la + 100;
  r.sequence = 1;
  r.events = {Commit(0)};
  EXPECT_EQ(node_->ReportBlocks(r).status().code(), StatusCode::kNotFound);
  r.lease_id = la;
  r.incarnation = 2;
  EXPECT_EQ(node_->ReportBlocks(r).status().code(), StatusCode::kNotFound);
  r.host_id = "nobody";
  r.incarnation = 1;
  EXPECT_EQ(node_->ReportBlocks(r).status().code(), StatusCode::kNotFound);
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.reports_not_found, 3u);
  EXPECT_EQ(s.report_events_ignored, 3u);
  EXPECT_EQ(s.directory.entries, 0u);
}

TEST_F(PlacementNodeTest, ANewIncarnationDropsTheOldOnesEntries) {
  Start();
  const std::uint64_t old_lease = Register(Rec("a", 1));
  const std::uint64_t lb = Register(Rec("b", 1));
  Report("a", 1, old_lease, Commits(0, 4));
  Report("b", 1, lb, Commits(0, 2));
  auto r = node_->Register(Rec("a", 2), 3000);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->full_report_requested);
  const std::vector<BlockKey> keys = Keys(4);
  EXPECT_EQ(Holders(*node_->Locate("t", keys)),
            (std::vector<std::vector<std::string>>{{"b"}, {"b"}, {}, {}}));
  // The old incarnation's late report is refused.
  BlockReport late;
  late.host_id = "a";
  late.incarnation = 1;
  late.lease_id = old_lease;
  late.sequence = 2;
  late.events = Commits(0, 4);
  EXPECT_EQ(node_->ReportBlocks(late).status().code(), StatusCode::kNotFound);
  // The new one reports from sequence 1.
  Report("a", 2, r->lease_id, Commits(2, 3));
  EXPECT_EQ(Holders(*node_->Locate("t", keys)),
            (std::vector<std::vector<std::string>>{{"b"}, {"b"}, {"a"}, {}}));
  EXPECT_EQ(node_->Snapshot().incarnations_replaced, 1u);
  EXPECT_EQ(node_->ListHosts().size(), 2u);
}

TEST_F(PlacementNodeTest, AnExpiredHostDisappearsAndPlanFallsBackToOtherReplicasThenRecompute) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1), 1000);
  const std::uint64_t lb = Register(Rec("b", 1), 1000);
  Report("a", 1, la, Commits(0, 8));
  Report("b", 1, lb, Commits(0, 4));

  PlanResult p = MakePlan(8);
  EXPECT_EQ(p.plan.kind, PlanKind::kFetchAll);
  EXPECT_EQ(p.plan.cached_prefix_blocks, 8u);

  // b keeps heartbeating; a goes silent past its TTL.
  env_.Advance(600'000);
  ASSERT_TRUE(node_->Heartbeat(lb, nullptr).ok());
  env_.Advance(600'000);
  node_->Maintain();
  EXPECT_EQ(node_->Snapshot().lease_expiries, 1u);
  ASSERT_EQ(node_->ListHosts().size(), 1u);
  EXPECT_EQ(node_->ListHosts()[0].record.host_id, "b");
  EXPECT_EQ(node_->Heartbeat(la, nullptr).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(node_->Snapshot().heartbeats_not_found, 1u);

  p = MakePlan(8);
  EXPECT_EQ(p.plan.cached_prefix_blocks, 4u);
  ASSERT_EQ(p.locations.hosts.size(), 1u);
  EXPECT_EQ(p.locations.hosts[0].host_id, "b");
  std::uint32_t covered = 0;
  for (const auto& run : p.plan.runs) {
    EXPECT_EQ(run.first_block, covered);
    covered += run.block_count;
    if (run.action == RunAction::kFetch) {
      EXPECT_EQ(p.locations.hosts[run.host_index].host_id, "b");
      EXPECT_LE(run.first_block + run.block_count, 4u);
    }
  }
  EXPECT_EQ(covered, 8u);
  EXPECT_EQ(p.plan.runs.back().action, RunAction::kRecompute);

  // b expires too: nothing is cached.
  env_.Advance(2'000'000);
  node_->Maintain();
  EXPECT_TRUE(node_->ListHosts().empty());
  p = MakePlan(8);
  EXPECT_EQ(p.plan.kind, PlanKind::kRecomputeAll);
  EXPECT_EQ(node_->Snapshot().lease_expiries, 2u);
  EXPECT_EQ(node_->Snapshot().directory.entries, 0u);
}

TEST_F(PlacementNodeTest, ExpiryHeardThroughTheWatchAloneDropsTheHost) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1), 1000);
  Report("a", 1, la, Commits(0, 2));
  env_.Advance(2'000'000);
  store_.ExpireNow();  // the watcher runs inside this call
  EXPECT_TRUE(node_->ListHosts().empty());
  EXPECT_EQ(node_->Snapshot().lease_expiries, 1u);
  EXPECT_EQ(node_->Snapshot().directory.replicas, 0u);
}

TEST_F(PlacementNodeTest, DeregisterDropsTheHostsEntriesAndCountsALeave) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 3));
  ASSERT_TRUE(node_->Deregister(la).ok());
  ASSERT_TRUE(node_->Deregister(la).ok());  // idempotent
  EXPECT_TRUE(node_->ListHosts().empty());
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.members_left, 1u);
  EXPECT_EQ(s.lease_expiries, 0u);
  EXPECT_EQ(s.directory.entries, 0u);
}

// Random clusters, reports and cost parameters: the chosen plan is never predicted slower than
// recompute-all or fetch-all, its runs cover the chain once, and it fetches only what live
// members hold.
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
}

TEST_F(PlacementNodeTest, AHostOnTheClientsNodeIsReadOverTheMemcpyPath) {
  options_.remote_to_local = {20.0, 2e9};
  options_.local_memcpy = {2.0, 20e9};
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
  ASSERT_EQ(p.plan.runs.size(), 1u);
  EXPECT_EQ(p.locations.hosts[p.plan.runs[0].host_index].host_id, "a");
  ASSERT_EQ(p.fallback_host_indices.size(), 1u);
  std::vector<std::string> fallbacks;
  for (std::uint32_t h : p.fallback_host_indices[0]) {
    fallbacks.push_back(p.locations.hosts[h].host_id);
  }
  EXPECT_EQ(fallbacks, (std::vector<std::string>{"b"}));  // c lacks blocks 2 and 3
}

TEST_F(PlacementNodeTest, PlanUsesTheLocationsTheClientSawWhenGiven) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  Report("a", 1, la, Commits(0, 4));
  const std::vector<BlockKey> keys = Keys(4);
  auto seen = node_->Locate("t", keys);
  ASSERT_TRUE(seen.ok());
  ASSERT_TRUE(node_->Deregister(la).ok());
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
  auto hb = node_->Heartbeat(la, nullptr);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->ttl_ms, 3000u);
  EXPECT_EQ(node_->ListHosts()[0].lease_remaining_ms, 3000u);
  EXPECT_NE(node_->ListHosts()[0].last_heartbeat_unix_us, 0u);
  MemberRecord other = Rec("a", 2);
  EXPECT_EQ(node_->Heartbeat(la, &other).status().code(), StatusCode::kInvalidArgument);
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
  r.recomputes.push_back({64, 0, 2 * RecomputeMicros(options_.recompute, 64, 0)});
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
  EXPECT_EQ(s.observations_unscored, 1u);
  EXPECT_EQ(s.stale_reports, 1u);
  EXPECT_EQ(s.fallback_runs, 1u);
  EXPECT_EQ(s.directory.stale_replicas_removed, 1u);
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

TEST_F(PlacementNodeTest, PlaceSkipsDrainingAndExcludedHostsAndReturnsTheReplicasAsked) {
  Start();
  std::vector<std::uint64_t> leases;
  for (int h = 0; h < 5; ++h) leases.push_back(Register(Rec("h" + std::to_string(h), 1)));
  MemberRecord drain = Rec("h1", 1);
  drain.draining = true;
  ASSERT_TRUE(node_->Heartbeat(leases[1], &drain).ok());
  PlaceRequest req;
  req.ns = "t";
  for (int i = 0; i < 300; ++i) req.keys.push_back(Key(i));
  req.payload_bytes = kBlockBytes;
  req.replicas = 3;
  req.exclude_host_ids = {"h4"};
  auto res = node_->Place(req);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->results.size(), 300u);
  std::map<std::string, int> firsts;
  for (const auto& r : res->results) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_EQ(r.host_indices.size(), 3u);
    ASSERT_EQ(r.scores.size(), 3u);
    std::set<std::string> chosen;
    for (std::uint32_t idx : r.host_indices) chosen.insert(res->hosts[idx].host_id);
    EXPECT_EQ(chosen, (std::set<std::string>{"h0", "h2", "h3"}));
    EXPECT_GE(r.scores[0], r.scores[1]);
    EXPECT_GE(r.scores[1], r.scores[2]);
    ++firsts[res->hosts[r.host_indices[0]].host_id];
    EXPECT_FALSE(r.hot);
  }
  EXPECT_EQ(firsts.size(), 3u);  // equal weights: every host is somebody's first choice
  // Deterministic: the same request gives the same answer.
  auto again = node_->Place(req);
  ASSERT_TRUE(again.ok());
  for (std::size_t i = 0; i < 300; ++i) {
    EXPECT_EQ(again->hosts[again->results[i].host_indices[0]].host_id,
              res->hosts[res->results[i].host_indices[0]].host_id);
  }

  req.replicas = 9;
  auto over = node_->Place(req);
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("replicas: 9 > max_replicas 8"), std::string::npos);

  req.replicas = 1;
  req.exclude_host_ids = {"h0", "h2", "h3", "h4"};
  auto none = node_->Place(req);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->results[0].status.code(), StatusCode::kUnavailable);

  req.exclude_host_ids.clear();
  req.payload_bytes = options_.limits.max_block_bytes;
  for (int h : {0, 2, 3, 4}) {
    MemberRecord full = Rec("h" + std::to_string(h), 1, "", kBlockBytes);
    ASSERT_TRUE(node_->Heartbeat(leases[h], &full).ok());
  }
  auto no_room = node_->Place(req);
  ASSERT_TRUE(no_room.ok());
  EXPECT_EQ(no_room->results[0].status.code(), StatusCode::kResourceExhausted);
}

TEST_F(PlacementNodeTest, HotKeysGetExtraReplicas) {
  options_.hot_threshold = 8;
  options_.hot_replicas = 3;
  Start();
  std::vector<std::uint64_t> leases;
  for (int h = 0; h < 4; ++h) leases.push_back(Register(Rec("h" + std::to_string(h), 1)));
  Report("h0", 1, leases[0], {Commit(0), Commit(1)});
  const std::vector<BlockKey> hot = {Key(0)};
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(node_->Locate("t", hot).ok());
  const std::vector<BlockKey> warm = {Key(1)};
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(node_->Locate("t", warm).ok());
  PlaceRequest req;
  req.ns = "t";
  req.keys = {Key(0), Key(1), Key(2)};
  req.payload_bytes = kBlockBytes;
  auto res = node_->Place(req);
  ASSERT_TRUE(res.ok());
  EXPECT_TRUE(res->results[0].hot);
  EXPECT_EQ(res->results[0].host_indices.size(), 3u);
  ASSERT_EQ(res->results[0].existing_host_indices.size(), 1u);
  EXPECT_EQ(res->hosts[res->results[0].existing_host_indices[0]].host_id, "h0");
  EXPECT_FALSE(res->results[1].hot);
  EXPECT_EQ(res->results[1].host_indices.size(), 1u);
  EXPECT_FALSE(res->results[2].hot);
  EXPECT_EQ(res->results[2].host_indices.size(), 1u);
  EXPECT_TRUE(res->results[2].existing_host_indices.empty());
  EXPECT_EQ(node_->Snapshot().place_hot_keys, 1u);
  // An explicit replica count wins over the policy.
  req.replicas = 2;
  res = node_->Place(req);
  ASSERT_TRUE(res.ok());
  for (const auto& r : res->results) EXPECT_EQ(r.host_indices.size(), 2u);
}

TEST_F(PlacementNodeTest, LimitsNameTheLimitAndBothNumbers) {
  Start();
  const std::vector<BlockKey> chain(65537, Key(0));
  auto loc = node_->Locate("t", chain);
  EXPECT_EQ(loc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loc.status().message().find("keys: 65537 > max_chain_blocks 65536"), std::string::npos)
      << loc.status().ToString();
  PlanRequest plan;
  plan.chain = Chain(1);
  plan.chain.resize(65537, plan.chain[0]);
  EXPECT_NE(node_->Plan(plan).status().message().find("65537 > max_chain_blocks 65536"),
            std::string::npos);
  PlaceRequest place;
  place.keys.assign(4097, Key(0));
  place.payload_bytes = 1;
  EXPECT_NE(node_->Place(place).status().message().find("keys: 4097 > max_keys_per_batch 4096"),
            std::string::npos);
  BlockReport report;
  report.host_id = "a";
  report.sequence = 1;
  report.events.assign(4097, Commit(0));
  EXPECT_NE(
      node_->ReportBlocks(report).status().message().find("events: 4097 > max_keys_per_batch 4096"),
      std::string::npos);
  EXPECT_NE(node_->Locate(std::string(257, 'n'), chain)
                .status()
                .message()
                .find("257 > max_namespace_bytes 256"),
            std::string::npos);
  EXPECT_EQ(node_->Locate("t", {}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PlacementNodeTest, CreateRefusesOptionsThatCannotWork) {
  PlacementOptions bad = options_;
  bad.limits.max_replicas = 9;
  EXPECT_EQ(PlacementNode::Create(bad, &store_, &env_).status().code(),
            StatusCode::kInvalidArgument);
  bad = options_;
  bad.remote_to_local.beta_bytes_per_s = 0;
  EXPECT_EQ(PlacementNode::Create(bad, &store_, &env_).status().code(),
            StatusCode::kInvalidArgument);
  bad = options_;
  bad.hot_replicas = 0;
  EXPECT_EQ(PlacementNode::Create(bad, &store_, &env_).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(PlacementNodeTest, LearnsExistingMembersFromTheStoreAtStart) {
  // A placement restart: the store (etcd) still holds the members; the directory is empty and
  // every member is asked for a full report.
  auto lease = store_.Join(Rec("a", 1), std::chrono::milliseconds(5000));
  ASSERT_TRUE(lease.ok());
  Start();
  const auto hosts = node_->ListHosts();
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].lease_id, *lease);
  EXPECT_TRUE(hosts[0].full_report_requested);
  BlockReport r;
  r.host_id = "a";
  r.incarnation = 1;
  r.lease_id = *lease;
  r.sequence = 58;  // the daemon's sequence carried on; placement starts from nothing
  r.events = {Commit(0)};
  auto res = node_->ReportBlocks(r);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_TRUE(res->full_report_requested);
}

TEST_F(PlacementNodeTest, ConcurrentCallsWithTheMaintenanceThreadRunning) {
  options_.maintenance_interval = std::chrono::milliseconds(1);
  Start();
  std::vector<std::uint64_t> leases;
  for (int h = 0; h < 3; ++h) leases.push_back(Register(Rec("h" + std::to_string(h), 1)));
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::string host = "h" + std::to_string(t);
      for (int i = 1; i <= 200; ++i) {
        BlockReport r;
        r.host_id = host;
        r.incarnation = 1;
        r.lease_id = leases[t];
        r.sequence = static_cast<std::uint64_t>(i);
        r.events = {Commit(i % 16)};
        EXPECT_TRUE(node_->ReportBlocks(r).ok());
        EXPECT_TRUE(node_->Heartbeat(leases[t], nullptr).ok());
        PlanRequest req;
        req.ns = "t";
        req.chain = Chain(16);
        auto p = node_->Plan(req);
        EXPECT_TRUE(p.ok());
        if (p.ok() && i % 2 == 0) node_->ReportPlanFinished(p->plan_id);
        PlaceRequest place;
        place.keys = {Key(i)};
        place.payload_bytes = kBlockBytes;
        EXPECT_TRUE(node_->Place(place).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.plans, 600u);
  EXPECT_EQ(s.reports, 600u);
  EXPECT_EQ(s.live_hosts, 3u);
}

}  // namespace
}  // namespace kvfabric::placement
