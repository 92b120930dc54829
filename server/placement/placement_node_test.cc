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

#include "server/placement/placement_node_test_fixture.h"

namespace kvfabric::placement {
namespace {

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
  r.token = Token(la);
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
  r.token = Token(la + 100);
  r.sequence = 1;
  r.events = {Commit(0)};
  EXPECT_EQ(node_->ReportBlocks(r).status().code(), StatusCode::kNotFound);
  r.lease_id = la;
  r.token = Token(la);
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
  // Old a crashed: two heartbeats missed (2/3 of its 3 s TTL), its lease not
  // yet over. The restarted daemon takes its place now.
  env_.Advance(std::chrono::milliseconds(2001));
  auto r = node_->Register(Rec("a", 2), 3000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->full_report_requested);
  tokens_[r->lease_id] = r->token;
  const std::vector<BlockKey> keys = Keys(4);
  EXPECT_EQ(Holders(*node_->Locate("t", keys)),
            (std::vector<std::vector<std::string>>{{"b"}, {"b"}, {}, {}}));
  // The old incarnation's late report is refused.
  BlockReport late;
  late.host_id = "a";
  late.incarnation = 1;
  late.lease_id = old_lease;
  late.token = Token(old_lease);
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

// Issue 17: Register was open to anyone and replaced a live member's record,
// redirecting every Place and Plan to whatever address the caller named. A
// live member (heartbeats arriving) keeps its record; only the member itself
// (same incarnation and addresses) may register again.
// Issue 17: etcd's membership lease ids are sequential; with an id alone a
// stranger could deregister a live daemon or report blocks in its name. Every
// call after Register quotes the token it issued; a wrong one answers exactly
// as an unknown lease does.
TEST_F(PlacementNodeTest, MembershipCallsNeedTheLeaseTokenAndAWrongOneLooksLikeAnUnknownLease) {
  Start();
  const std::uint64_t la = Register(Rec("a", 1));
  ASSERT_EQ(Token(la).size(), kMembershipTokenBytes);
  EXPECT_EQ(node_->ListHosts()[0].record.token_digest, MembershipTokenDigest(Token(la)));
  const std::string wrong(kMembershipTokenBytes, '\0');
  const Status hb = node_->Heartbeat(la, wrong, nullptr).status();
  const Status unknown = node_->Heartbeat(la + 1, Token(la), nullptr).status();
  EXPECT_EQ(hb.code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_EQ(hb.message().substr(hb.message().find(' ', 20)),
            unknown.message().substr(unknown.message().find(' ', 20)))
      << "a wrong token must read like an unknown lease";
  EXPECT_EQ(node_->Deregister(la, wrong).code(), StatusCode::kNotFound);
  EXPECT_EQ(node_->Deregister(la, "").code(), StatusCode::kNotFound);
  ASSERT_EQ(node_->ListHosts().size(), 1u) << "deregistered with a wrong token";
  BlockReport r;
  r.host_id = "a";
  r.incarnation = 1;
  r.lease_id = la;
  r.token = wrong;
  r.sequence = 1;
  r.events = {Commit(0)};
  EXPECT_EQ(node_->ReportBlocks(r).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(node_->Snapshot().directory.entries, 0u);
  r.token = Token(la);
  EXPECT_TRUE(node_->ReportBlocks(r).ok());
  EXPECT_TRUE(Heartbeat(la, nullptr).ok());
  EXPECT_TRUE(Deregister(la).ok());
  EXPECT_TRUE(node_->ListHosts().empty());
}

TEST_F(PlacementNodeTest, RegisterCannotDisplaceALiveMember) {
  Start();
  const MemberRecord real = Rec("a", 1);
  const std::uint64_t first = Register(real);
  MemberRecord hijack = real;
  hijack.grpc_address = "10.6.6.6:7440";
  hijack.transport_address = "10.6.6.6:7441";
  Status s = node_->Register(hijack, 3000).status();
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("is a live member (incarnation 1"), std::string::npos) << s;
  MemberRecord newer = real;
  newer.incarnation = 99;
  newer.grpc_address = "10.6.6.6:7440";
  EXPECT_EQ(node_->Register(newer, 3000).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(node_->ListHosts().size(), 1u);
  EXPECT_EQ(node_->ListHosts()[0].record.grpc_address, real.grpc_address);
  // Its incarnation and addresses are public (Health, ListHosts): repeating
  // them without the member's token is refused like any other displacement.
  EXPECT_EQ(node_->Register(real, 3000).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(node_->Register(real, 3000, std::string(16, 'x')).status().code(),
            StatusCode::kFailedPrecondition);
  // The member itself re-registers (a retry), quoting its token: fine, and it
  // gets a new one.
  auto again = node_->Register(real, 3000, Token(first));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->token, Token(first));
  tokens_[again->lease_id] = again->token;

  // It keeps heartbeating through the 2 s after which a silent member could be
  // replaced: still refused.
  env_.Advance(std::chrono::milliseconds(1500));
  ASSERT_TRUE(Heartbeat(node_->ListHosts()[0].lease_id, nullptr).ok());
  env_.Advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(node_->Register(newer, 3000).status().code(), StatusCode::kFailedPrecondition);
  // Silent for more than two heartbeat periods: a new incarnation may register.
  env_.Advance(std::chrono::milliseconds(600));
  EXPECT_TRUE(node_->Register(newer, 3000).ok());
  EXPECT_EQ(node_->ListHosts()[0].record.incarnation, 99u);
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
  ASSERT_TRUE(Heartbeat(lb, nullptr).ok());
  env_.Advance(600'000);
  node_->Maintain();
  EXPECT_EQ(node_->Snapshot().lease_expiries, 1u);
  ASSERT_EQ(node_->ListHosts().size(), 1u);
  EXPECT_EQ(node_->ListHosts()[0].record.host_id, "b");
  EXPECT_EQ(Heartbeat(la, nullptr).status().code(), StatusCode::kNotFound);
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
  // Both are listed as departed, newest first, with what they took along.
  const std::vector<DepartedHost> gone = node_->RecentlyDeparted();
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].record.host_id, "b");
  EXPECT_EQ(gone[1].record.host_id, "a");
  EXPECT_TRUE(gone[0].lease_expired);
  EXPECT_EQ(gone[1].directory_blocks_dropped, 8u);
  EXPECT_GT(gone[0].departed_unix_us, gone[1].departed_unix_us);
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
  ASSERT_TRUE(Deregister(la).ok());
  ASSERT_TRUE(Deregister(la).ok());  // idempotent
  EXPECT_TRUE(node_->ListHosts().empty());
  const PlacementSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.members_left, 1u);
  EXPECT_EQ(s.lease_expiries, 0u);
  EXPECT_EQ(s.directory.entries, 0u);
  const std::vector<DepartedHost> gone = node_->RecentlyDeparted();
  ASSERT_EQ(gone.size(), 1u);  // the repeated Deregister is not a second departure
  EXPECT_EQ(gone[0].record.host_id, "a");
  EXPECT_FALSE(gone[0].lease_expired);
  EXPECT_EQ(gone[0].directory_blocks_dropped, 3u);
}

TEST_F(PlacementNodeTest, TheDepartedListKeepsTheNewestOnly) {
  Start();
  for (std::size_t i = 0; i < PlacementNode::kMaxDeparted + 5; ++i) {
    const std::uint64_t lease = Register(Rec("h" + std::to_string(i), 1));
    ASSERT_TRUE(Deregister(lease).ok());
  }
  const std::vector<DepartedHost> gone = node_->RecentlyDeparted();
  ASSERT_EQ(gone.size(), PlacementNode::kMaxDeparted);
  EXPECT_EQ(gone.front().record.host_id, "h" + std::to_string(PlacementNode::kMaxDeparted + 4));
  EXPECT_EQ(gone.back().record.host_id, "h5");
}

// Random clusters, reports and cost parameters: the chosen plan is never predicted slower than
// recompute-all or fetch-all, its runs cover the chain once, and it fetches only what live
// members hold.

TEST_F(PlacementNodeTest, PlaceSkipsDrainingAndExcludedHostsAndReturnsTheReplicasAsked) {
  Start();
  std::vector<std::uint64_t> leases;
  for (int h = 0; h < 5; ++h) leases.push_back(Register(Rec("h" + std::to_string(h), 1)));
  MemberRecord drain = Rec("h1", 1);
  drain.draining = true;
  ASSERT_TRUE(Heartbeat(leases[1], &drain).ok());
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
    ASSERT_TRUE(Heartbeat(leases[h], &full).ok());
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
  r.token = Token(*lease);
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
        r.token = Token(leases[t]);
        r.sequence = static_cast<std::uint64_t>(i);
        r.events = {Commit(i % 16)};
        EXPECT_TRUE(node_->ReportBlocks(r).ok());
        EXPECT_TRUE(Heartbeat(leases[t], nullptr).ok());
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
