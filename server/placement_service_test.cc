// PlacementService over a real PlacementNode (in-process membership store, a clock that moves
// only when the test says so), its handlers called directly with a default
// grpc::ServerContext: no network.
//
// Blocks are of TestFingerprint(): 2 layers x 2 (K, V) x 16 tokens x 2 heads x 16 dims x bf16 =
// 4096 bytes. The cost model makes fetching a cached block far cheaper than recomputing it.
#include "server/placement_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/testing/fake_clock_env.h"
#include "proto/wire_limits.h"
#include "server/placement/membership_store.h"
#include "server/placement/placement_node.h"
#include "server/placement_convert.h"

namespace kvfabric {
namespace {

constexpr char kNs[] = "tenant-a";
constexpr std::uint64_t kBlockBytes = 4096;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string Key(int i) {
  std::string key(BlockKey::kSize, '\x5A');
  key[0] = static_cast<char>(i & 0xFF);
  key[1] = static_cast<char>((i >> 8) & 0xFF);
  key[2] = static_cast<char>((i >> 16) & 0xFF);
  return key;
}

v1::ModelFingerprint TestFingerprint() {
  v1::ModelFingerprint fp;
  fp.set_model_id("test/model@1");
  fp.set_layer_count(2);
  fp.set_dtype(v1::DTYPE_BF16);
  fp.set_kv_heads(2);
  fp.set_head_dim(16);
  fp.set_tokens_per_block(16);
  fp.set_tp_size(1);
  fp.set_layout_version(1);
  return fp;
}

v1::BlockEvent Committed(int key, v1::Tier tier = v1::TIER_HOST) {
  v1::BlockEvent e;
  e.set_kind(v1::BLOCK_EVENT_KIND_COMMITTED);
  e.set_namespace_(kNs);
  v1::BlockDescriptor* d = e.mutable_block();
  d->set_key(Key(key));
  d->set_payload_bytes(kBlockBytes);
  d->set_representation(v1::REPRESENTATION_EXACT);
  d->set_format_version(1);
  d->set_token_count(16);
  d->set_prefix_tokens(16 * static_cast<std::uint64_t>(key));
  e.set_tier(tier);
  return e;
}

v1::TierUsage Usage(v1::Tier tier, std::uint64_t capacity, std::uint64_t free) {
  v1::TierUsage t;
  t.set_tier(tier);
  t.set_capacity_bytes(capacity);
  t.set_free_bytes(free);
  return t;
}

v1::LocateRequest LocateOf(int keys) {
  v1::LocateRequest req;
  req.set_namespace_(kNs);
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  return req;
}

v1::PlanRequest PlanOf(int keys) {
  v1::PlanRequest req;
  req.set_namespace_(kNs);
  *req.mutable_fingerprint() = TestFingerprint();
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  req.set_client_node("client-node");
  return req;
}

// Host ids of each block's replicas, best first.
std::vector<std::vector<std::string>> Holders(const v1::ChainLocations& loc) {
  std::vector<std::vector<std::string>> out;
  for (const v1::BlockLocation& block : loc.blocks()) {
    std::vector<std::string>& ids = out.emplace_back();
    for (const v1::Replica& r : block.replicas())
      ids.push_back(loc.hosts(r.host_index()).host_id());
  }
  return out;
}

void ExpectInvalid(const grpc::Status& s, const std::string& message) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), message);
}

class PlacementServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    placement::PlacementOptions options;
    options.limits = PlacementLimitsFromProto(DefaultLimits());
    options.maintenance_interval = std::chrono::milliseconds(0);
    options.remote_to_local = {20.0, 10e9};
    options.nvme_to_host = {100.0, 3e9};
    options.host_to_device = {10.0, 25e9};
    options.recompute = {1000.0, 100.0, 0.0};  // 2.6 ms per 16-token block: fetch wins
    StatusOr<std::unique_ptr<placement::PlacementNode>> node =
        placement::PlacementNode::Create(options, &store_, &env_);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    health_ = std::make_unique<HealthReporter>(&env_, "placement-0", "0.0.0-test");
    health_->SetState(v1::SERVING_STATUS_SERVING, "");
    service_ =
        std::make_unique<PlacementService>(node_.get(), health_.get(), PlacementServiceOptions());
  }

  // Calls handler `method` of `service` (default: the fixture's) with a fresh context.
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (PlacementService::*method)(grpc::ServerContext*, const Req*,
                                                             Resp*),
                    const Req& request, Resp* response, PlacementService* service = nullptr) {
    grpc::ServerContext context;
    return ((service != nullptr ? service : service_.get())->*method)(&context, &request, response);
  }

  v1::RegisterRequest RegisterOf(const std::string& host_id, std::uint64_t incarnation = 1) {
    v1::RegisterRequest req;
    req.set_host_id(host_id);
    req.set_incarnation(incarnation);
    req.set_grpc_address(host_id + ".example:7000");
    req.set_transport_address(host_id + ".example:7001");
    req.set_node_name("node-" + host_id);
    *req.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 8 * kGiB);
    return req;
  }

  // Registers `host_id` and remembers its lease and incarnation.
  void Join(const std::string& host_id, std::uint64_t incarnation = 1) {
    v1::RegisterResponse resp;
    const grpc::Status s =
        Call(&PlacementService::Register, RegisterOf(host_id, incarnation), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_NE(resp.membership_lease_id(), 0u);
    leases_[host_id] = resp.membership_lease_id();
    tokens_[host_id] = resp.membership_token();
    incarnations_[host_id] = incarnation;
    sequences_[host_id] = 0;
  }

  v1::ReportBlocksRequest ReportOf(const std::string& host_id, std::vector<v1::BlockEvent> events) {
    v1::ReportBlocksRequest req;
    req.set_host_id(host_id);
    req.set_incarnation(incarnations_[host_id]);
    req.set_membership_lease_id(leases_[host_id]);
    req.set_membership_token(tokens_[host_id]);
    req.set_sequence(++sequences_[host_id]);
    for (v1::BlockEvent& e : events) *req.add_events() = std::move(e);
    return req;
  }

  void Report(const std::string& host_id, std::vector<v1::BlockEvent> events) {
    v1::ReportBlocksResponse resp;
    const grpc::Status s =
        Call(&PlacementService::ReportBlocks, ReportOf(host_id, std::move(events)), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.acked_sequence(), sequences_[host_id]);
  }

  static std::vector<v1::BlockEvent> Commits(int first, int end, v1::Tier tier = v1::TIER_HOST) {
    std::vector<v1::BlockEvent> out;
    for (int i = first; i < end; ++i) out.push_back(Committed(i, tier));
    return out;
  }

  // a and b hold blocks 0..3 in host memory; c holds 2 and 3 on NVMe and 5 in host memory.
  void JoinThreeHostsAndReport() {
    Join("a");
    Join("b");
    Join("c");
    Report("a", Commits(0, 4));
    Report("b", Commits(0, 4));
    std::vector<v1::BlockEvent> c = Commits(2, 4, v1::TIER_NVME);
    c.push_back(Committed(5));
    Report("c", c);
  }

  v1::HeartbeatRequest HeartbeatOf(const std::string& host_id) {
    v1::HeartbeatRequest req;
    req.set_host_id(host_id);
    req.set_incarnation(incarnations_[host_id]);
    req.set_membership_lease_id(leases_[host_id]);
    req.set_membership_token(tokens_[host_id]);
    return req;
  }

  v1::ListHostsResponse Hosts() {
    v1::ListHostsResponse resp;
    const grpc::Status s = Call(&PlacementService::ListHosts, v1::ListHostsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  FakeClockEnv env_;
  placement::MemoryMembershipStore store_{&env_};
  std::unique_ptr<placement::PlacementNode> node_;
  std::unique_ptr<HealthReporter> health_;
  std::unique_ptr<PlacementService> service_;
  std::map<std::string, std::uint64_t> leases_, incarnations_, sequences_;
  std::map<std::string, std::string> tokens_;  // membership tokens
};

// ---------------------------------------------------------------- membership

TEST_F(PlacementServiceTest, RegisterGrantsALeaseWithTheLimitsAndListHostsShowsTheTiers) {
  v1::RegisterRequest req = RegisterOf("a");
  *req.add_tiers() = Usage(v1::TIER_NVME, 100 * kGiB, 60 * kGiB);
  v1::RegisterResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Register, req, &resp).ok());
  EXPECT_NE(resp.membership_lease_id(), 0u);
  EXPECT_EQ(resp.ttl_ms(), 30000u);  // ttl_ms 0: default_ttl_ms
  EXPECT_EQ(resp.heartbeat_interval_ms(), 10000u);
  EXPECT_TRUE(resp.full_report_requested());
  EXPECT_EQ(resp.placement_incarnation(), node_->incarnation());
  EXPECT_EQ(resp.limits().max_chain_blocks(), 65536u);
  EXPECT_EQ(resp.limits().max_keys_per_batch(), 4096u);
  Join("c");
  Join("b");

  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 3);
  EXPECT_EQ(hosts.hosts(0).host().host_id(), "a");  // sorted by host_id
  EXPECT_EQ(hosts.hosts(1).host().host_id(), "b");
  EXPECT_EQ(hosts.hosts(2).host().host_id(), "c");
  const v1::HostStatus& a = hosts.hosts(0);
  EXPECT_EQ(a.host().incarnation(), 1u);
  EXPECT_EQ(a.host().grpc_address(), "a.example:7000");
  EXPECT_EQ(a.host().transport_address(), "a.example:7001");
  EXPECT_EQ(a.host().node_name(), "node-a");
  EXPECT_EQ(a.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(a.lease_remaining_ms(), 30000u);
  EXPECT_EQ(a.directory_blocks(), 0u);
  ASSERT_EQ(a.tiers_size(), 2);
  EXPECT_EQ(a.tiers(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(a.tiers(0).capacity_bytes(), 16 * kGiB);
  EXPECT_EQ(a.tiers(0).free_bytes(), 8 * kGiB);
  EXPECT_EQ(a.tiers(1).tier(), v1::TIER_NVME);
  EXPECT_EQ(a.tiers(1).capacity_bytes(), 100 * kGiB);
  EXPECT_EQ(a.tiers(1).free_bytes(), 60 * kGiB);
  EXPECT_EQ(hosts.hosts(1).tiers_size(), 1);  // no NVMe tier registered
}

TEST_F(PlacementServiceTest, HeartbeatUpdatesFreeBytesAndServingStateButKeepsAddresses) {
  Join("a");
  Join("b");
  env_.Advance(5'000'000);
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 1 * kGiB);
  beat.set_status(v1::SERVING_STATUS_DRAINING);
  v1::HeartbeatResponse resp;
  const grpc::Status s = Call(&PlacementService::Heartbeat, beat, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.ttl_ms(), 30000u);

  v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 2);
  const v1::HostStatus& a = hosts.hosts(0);
  EXPECT_EQ(a.status(), v1::SERVING_STATUS_DRAINING);
  EXPECT_EQ(a.tiers(0).free_bytes(), 1 * kGiB);
  EXPECT_EQ(a.host().grpc_address(), "a.example:7000");
  EXPECT_EQ(a.host().transport_address(), "a.example:7001");
  EXPECT_EQ(a.lease_remaining_ms(), 30000u);  // renewed
  EXPECT_EQ(hosts.hosts(1).lease_remaining_ms(), 25000u);

  // A draining host gets no new blocks.
  v1::PlaceRequest place;
  place.set_namespace_(kNs);
  place.add_keys(Key(1));
  place.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse placed;
  ASSERT_TRUE(Call(&PlacementService::Place, place, &placed).ok());
  ASSERT_EQ(placed.results_size(), 1);
  ASSERT_EQ(placed.results(0).host_indices_size(), 1);
  EXPECT_EQ(placed.hosts(placed.results(0).host_indices(0)).host_id(), "b");

  // Serving again; a heartbeat without tiers or status only renews the lease.
  beat.clear_tiers();
  beat.set_status(v1::SERVING_STATUS_SERVING);
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, beat, &resp).ok());
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, HeartbeatOf("a"), &resp).ok());
  hosts = Hosts();
  EXPECT_EQ(hosts.hosts(0).status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(hosts.hosts(0).tiers(0).free_bytes(), 1 * kGiB);
}

TEST_F(PlacementServiceTest, HeartbeatUnderAnotherHostsLeaseIsRefused) {
  Join("a");
  Join("b");
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  beat.set_membership_lease_id(leases_["b"]);
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, 1 * kGiB);
  v1::HeartbeatResponse resp;
  // With a's token, b's lease is unknown; with b's, it is b's and not a's.
  EXPECT_EQ(Call(&PlacementService::Heartbeat, beat, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  beat.set_membership_token(tokens_["b"]);
  EXPECT_EQ(Call(&PlacementService::Heartbeat, beat, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Hosts().hosts(1).tiers(0).free_bytes(), 8 * kGiB);  // b unchanged
}

TEST_F(PlacementServiceTest, HeartbeatAndReportAfterDeregisterAreNotFound) {
  Join("a");
  Join("b");
  v1::DeregisterRequest leave;
  leave.set_host_id("a");
  leave.set_incarnation(1);
  leave.set_membership_lease_id(leases_["a"]);
  leave.set_membership_token(tokens_["a"]);
  v1::DeregisterResponse left;
  ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());
  ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());  // idempotent

  v1::HeartbeatResponse beat;
  const grpc::Status s = Call(&PlacementService::Heartbeat, HeartbeatOf("a"), &beat);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  v1::ReportBlocksResponse reported;
  EXPECT_EQ(
      Call(&PlacementService::ReportBlocks, ReportOf("a", Commits(0, 1)), &reported).error_code(),
      grpc::StatusCode::NOT_FOUND);
  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 1);
  EXPECT_EQ(hosts.hosts(0).host().host_id(), "b");
  EXPECT_EQ(node_->Snapshot().deregistrations, 2u);
  // The departed member and the cluster summary travel with the list.
  ASSERT_EQ(hosts.departed_size(), 1);
  EXPECT_EQ(hosts.departed(0).host().host_id(), "a");
  EXPECT_EQ(hosts.departed(0).reason(), "deregistered");
  EXPECT_GT(hosts.departed(0).departed_unix_us(), 0u);
  ASSERT_EQ(hosts.summary().plans_size(), 4);
  EXPECT_EQ(hosts.summary().plans(0).kind(), "recompute_all");
  EXPECT_EQ(hosts.summary().paths_size(), 0);  // nothing reported yet
}

TEST_F(PlacementServiceTest, DeregisterOfAnOlderIncarnationLeavesTheNewOne) {
  Join("a", 1);
  const std::uint64_t old_lease = leases_["a"];
  const std::string old_token = tokens_["a"];
  // Incarnation 1 went silent (more than two heartbeats of its 30 s TTL):
  // incarnation 2 may take its place before the lease ends.
  env_.Advance(20'001'000);
  Join("a", 2);
  // The old daemon quotes the new lease by mistake, or its own, now gone: neither removes the
  // new incarnation.
  for (std::uint64_t lease : {leases_["a"], old_lease}) {
    v1::DeregisterRequest leave;
    leave.set_host_id("a");
    leave.set_incarnation(1);
    leave.set_membership_lease_id(lease);
    leave.set_membership_token(old_token);
    v1::DeregisterResponse left;
    ASSERT_TRUE(Call(&PlacementService::Deregister, leave, &left).ok());
  }
  const v1::ListHostsResponse hosts = Hosts();
  ASSERT_EQ(hosts.hosts_size(), 1);
  EXPECT_EQ(hosts.hosts(0).host().incarnation(), 2u);
}

// ---------------------------------------------------------------- directory

TEST_F(PlacementServiceTest, LocateReturnsReportedReplicasBestFirstWithTheirHosts) {
  JoinThreeHostsAndReport();
  v1::LocateResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(6), &resp).ok());
  const v1::ChainLocations& loc = resp.locations();
  EXPECT_EQ(loc.cached_prefix_blocks(), 4u);
  ASSERT_EQ(loc.blocks_size(), 6);
  const auto holders = Holders(loc);
  EXPECT_EQ(holders[0], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(holders[2], (std::vector<std::string>{"a", "b", "c"}));  // host tier before NVMe
  EXPECT_TRUE(holders[4].empty());
  EXPECT_EQ(holders[5], (std::vector<std::string>{"c"}));  // cached after the gap: listed
  EXPECT_EQ(loc.blocks(2).replicas(2).tier(), v1::TIER_NVME);
  EXPECT_EQ(loc.blocks(0).replicas(0).tier(), v1::TIER_HOST);
  EXPECT_EQ(loc.blocks(0).replicas(0).payload_bytes(), kBlockBytes);
  EXPECT_EQ(loc.blocks(0).replicas(0).representation(), v1::REPRESENTATION_EXACT);
  ASSERT_EQ(loc.hosts_size(), 3);
  for (const v1::HostRef& h : loc.hosts()) {
    EXPECT_EQ(h.grpc_address(), h.host_id() + ".example:7000");
    EXPECT_EQ(h.transport_address(), h.host_id() + ".example:7001");
    EXPECT_EQ(h.incarnation(), 1u);
  }
  EXPECT_EQ(Hosts().hosts(0).directory_blocks(), 4u);
}

TEST_F(PlacementServiceTest, ReportBlocksAcksRepeatedSequencesAndAsksForASnapshotAfterAGap) {
  Join("a");
  v1::ReportBlocksRequest first = ReportOf("a", Commits(0, 2));
  v1::ReportBlocksResponse resp;
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, first, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 1u);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, first, &resp).ok());  // a retry
  EXPECT_EQ(resp.acked_sequence(), 1u);

  // A full snapshot of one chunk clears the full-report request.
  v1::ReportBlocksRequest snapshot = ReportOf("a", Commits(0, 1));
  snapshot.mutable_events(0)->set_kind(v1::BLOCK_EVENT_KIND_PRESENT);
  snapshot.set_snapshot_id(7);
  snapshot.set_snapshot_last(true);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, snapshot, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 2u);
  EXPECT_FALSE(resp.full_report_requested());
  EXPECT_EQ(Hosts().hosts(0).directory_blocks(), 1u);  // block 1 was not in the snapshot

  v1::ReportBlocksRequest gap = ReportOf("a", Commits(3, 4));
  gap.set_sequence(5);
  ASSERT_TRUE(Call(&PlacementService::ReportBlocks, gap, &resp).ok());
  EXPECT_EQ(resp.acked_sequence(), 5u);
  EXPECT_TRUE(resp.full_report_requested());
}

// ---------------------------------------------------------------- plans

TEST_F(PlacementServiceTest, PlanFetchesTheCachedPrefixWithFallbacksAndExplainGivesItsFormula) {
  JoinThreeHostsAndReport();
  v1::PlanRequest req = PlanOf(6);
  req.set_include_explanation(true);
  v1::PlanResponse plan;
  const grpc::Status s = Call(&PlacementService::Plan, req, &plan);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(plan.plan_id(), 0u);
  EXPECT_EQ(plan.kind(), v1::PLAN_KIND_FETCH_ALL);
  EXPECT_FALSE(plan.explanation().empty());
  EXPECT_EQ(plan.locations().cached_prefix_blocks(), 4u);
  ASSERT_EQ(plan.locations().hosts_size(), 3);

  // The runs cover the chain once, in order: the cached prefix fetched, the rest recomputed.
  std::uint32_t next = 0;
  for (const v1::PlanRun& run : plan.runs()) {
    EXPECT_EQ(run.first_block(), next);
    EXPECT_GE(run.block_count(), 1u);
    EXPECT_LE(run.predicted_start_us(), run.predicted_end_us());
    next += run.block_count();
  }
  EXPECT_EQ(next, 6u);
  ASSERT_EQ(plan.runs_size(), 2);
  const v1::PlanRun& fetch = plan.runs(0);
  EXPECT_EQ(fetch.action(), v1::RUN_ACTION_FETCH);
  EXPECT_EQ(fetch.block_count(), 4u);
  EXPECT_EQ(fetch.tier(), v1::TIER_HOST);
  EXPECT_EQ(fetch.payload_bytes(), 4 * kBlockBytes);
  const std::string source = plan.locations().hosts(fetch.host_index()).host_id();
  EXPECT_TRUE(source == "a" || source == "b") << source;
  // The other of a and b holds the whole run; c holds only part of it.
  ASSERT_EQ(fetch.fallback_host_indices_size(), 1);
  EXPECT_EQ(plan.locations().hosts(fetch.fallback_host_indices(0)).host_id(),
            source == "a" ? "b" : "a");
  EXPECT_EQ(plan.runs(1).action(), v1::RUN_ACTION_RECOMPUTE);
  EXPECT_EQ(plan.runs(1).fallback_host_indices_size(), 0);

  int chosen = 0;
  bool recompute_all = false;
  for (const v1::PlanAlternative& a : plan.alternatives()) {
    chosen += a.chosen() ? 1 : 0;
    if (a.kind() == v1::PLAN_KIND_RECOMPUTE_ALL) {
      recompute_all = true;
      EXPECT_GE(a.predicted_us(), plan.predicted_total_us());
    }
    if (a.chosen()) {
      EXPECT_EQ(a.predicted_us(), plan.predicted_total_us());
    }
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_TRUE(recompute_all);

  v1::ExplainRequest explain;
  explain.set_plan_id(plan.plan_id());
  v1::ExplainResponse why;
  ASSERT_TRUE(Call(&PlacementService::Explain, explain, &why).ok());
  EXPECT_EQ(why.kind(), v1::EXPLAIN_KIND_PLAN);
  EXPECT_NE(why.formula().find("t_fetch(path, bytes) = alpha_us + bytes / beta_bytes_per_s * 1e6"),
            std::string::npos)
      << why.formula();
  // The inputs as the plan saw them, then the plan's own explanation.
  EXPECT_EQ(why.text().rfind("inputs (as the plan was made):", 0), 0u) << why.text();
  ASSERT_GE(why.text().size(), plan.explanation().size());
  EXPECT_EQ(why.text().substr(why.text().size() - plan.explanation().size()), plan.explanation());
  EXPECT_EQ(why.decided_unix_us(), env_.WallMicros());
  bool predicted = false;
  for (const v1::ExplainTerm& t : why.terms()) {
    if (t.name() == "t_predicted") {
      predicted = true;
      EXPECT_EQ(t.value(), plan.predicted_total_us());
      EXPECT_EQ(t.unit(), "us");
    }
  }
  EXPECT_TRUE(predicted);
}

TEST_F(PlacementServiceTest, ListPlansGivesTheNewestPlansWithTheirIdsAndNamespaces) {
  JoinThreeHostsAndReport();
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    v1::PlanResponse plan;
    ASSERT_TRUE(Call(&PlacementService::Plan, PlanOf(6), &plan).ok());
    ids.push_back(plan.plan_id());
  }
  v1::ListPlansRequest req;
  req.set_limit(2);
  v1::ListPlansResponse list;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &list).ok());
  ASSERT_EQ(list.plans_size(), 2);
  EXPECT_EQ(list.plans(0).plan_id(), ids[2]);
  EXPECT_EQ(list.plans(1).plan_id(), ids[1]);
  EXPECT_EQ(list.plans(0).kind(), v1::PLAN_KIND_FETCH_ALL);
  EXPECT_EQ(list.plans(0).chain_blocks(), 6u);
  EXPECT_EQ(list.plans(0).cached_prefix_blocks(), 4u);
  EXPECT_GT(list.plans(0).predicted_total_us(), 0.0);
  EXPECT_FALSE(list.plans(0).finished());
  EXPECT_EQ(list.history_plans(), 3u);
  const std::string ns = list.plans(0).namespace_();

  req.set_namespace_(ns + "-other");
  v1::ListPlansResponse other;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &other).ok());
  EXPECT_EQ(other.plans_size(), 0);
  req.set_namespace_(ns);
  req.set_limit(0);  // the default, 20
  v1::ListPlansResponse mine;
  ASSERT_TRUE(Call(&PlacementService::ListPlans, req, &mine).ok());
  EXPECT_EQ(mine.plans_size(), 3);

  req.set_limit(kMaxListedDecisions + 1);
  const grpc::Status s = Call(&PlacementService::ListPlans, req, &list);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("kMaxListedDecisions 1000"), std::string::npos)
      << s.error_message();
}

TEST_F(PlacementServiceTest, ExplainOfAnUnknownPlanIsNotFoundAndEvictionsPointAtTheDaemon) {
  v1::ExplainRequest explain;
  explain.set_plan_id(42);
  v1::ExplainResponse why;
  EXPECT_EQ(Call(&PlacementService::Explain, explain, &why).error_code(),
            grpc::StatusCode::NOT_FOUND);

  explain.mutable_eviction()->set_host_id("a");
  explain.mutable_eviction()->set_decision_id(3);
  grpc::Status s = Call(&PlacementService::Explain, explain, &why);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(s.error_message().find("kvfabric explain eviction"), std::string::npos)
      << s.error_message();
  explain.mutable_block()->set_key(Key(0));
  EXPECT_EQ(Call(&PlacementService::Explain, explain, &why).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  ExpectInvalid(Call(&PlacementService::Explain, v1::ExplainRequest(), &why),
                "target: unset; name a plan_id");
}

TEST_F(PlacementServiceTest, PlanOnTheClientsLocationsUsesOnlyThose) {
  JoinThreeHostsAndReport();
  v1::LocateResponse located;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(6), &located).ok());
  // The client saw only c's copy of blocks 2 and 3, and nothing before them.
  v1::PlanRequest req = PlanOf(6);
  v1::ChainLocations* loc = req.mutable_locations();
  *loc = located.locations();
  for (int i = 0; i < 6; ++i) {
    auto* replicas = loc->mutable_blocks(i)->mutable_replicas();
    for (int r = replicas->size() - 1; r >= 0; --r) {
      if (loc->hosts(replicas->Get(r).host_index()).host_id() != "c")
        replicas->DeleteSubrange(r, 1);
    }
  }
  v1::PlanResponse plan;
  ASSERT_TRUE(Call(&PlacementService::Plan, req, &plan).ok());
  EXPECT_EQ(plan.locations().cached_prefix_blocks(), 0u);
  EXPECT_EQ(plan.kind(), v1::PLAN_KIND_RECOMPUTE_ALL);

  // A replica naming a host outside the table is refused whole.
  loc->mutable_blocks(0)->add_replicas()->set_host_index(3);
  loc->mutable_blocks(0)->mutable_replicas(0)->set_tier(v1::TIER_HOST);
  ExpectInvalid(Call(&PlacementService::Plan, req, &plan),
                "locations.blocks[0].replicas[0].host_index: 3 >= 3 hosts");
}

TEST_F(PlacementServiceTest, ObservationsFinishThePlanAndDropStaleEntries) {
  JoinThreeHostsAndReport();
  v1::PlanResponse plan;
  ASSERT_TRUE(Call(&PlacementService::Plan, PlanOf(6), &plan).ok());
  EXPECT_EQ(node_->Snapshot().plans_admitted, 1u);

  v1::ReportObservationsRequest obs;
  obs.set_namespace_(kNs);
  obs.set_plan_id(plan.plan_id());
  *obs.mutable_fingerprint() = TestFingerprint();
  v1::TransferObservation* t = obs.add_transfers();
  t->set_path(v1::BUS_PATH_REMOTE_HOST_TO_LOCAL_HOST);
  t->set_host_id("a");
  t->set_bytes(4 * kBlockBytes);
  t->set_observed_us(30.0);
  v1::RecomputeObservation* r = obs.add_recomputes();
  r->set_tokens(32);
  r->set_prefix_tokens(64);
  r->set_observed_us(4000.0);
  v1::StaleEntry* stale = obs.add_stale_entries();
  stale->set_host_id("a");
  stale->set_key(Key(0));
  obs.add_fallback_runs(0);
  obs.set_plan_finished(true);
  obs.set_observed_total_us(1500.0);
  v1::ReportObservationsResponse done;
  const grpc::Status s = Call(&PlacementService::ReportObservations, obs, &done);
  ASSERT_TRUE(s.ok()) << s.error_message();

  const placement::PlacementSnapshot snap = node_->Snapshot();
  EXPECT_EQ(snap.plans_finished, 1u);
  EXPECT_EQ(snap.plans_admitted, 0u);
  EXPECT_EQ(snap.fallback_runs, 1u);
  EXPECT_EQ(snap.stale_reports, 1u);
  v1::LocateResponse located;
  ASSERT_TRUE(Call(&PlacementService::Locate, LocateOf(1), &located).ok());
  EXPECT_EQ(Holders(located.locations())[0], (std::vector<std::string>{"b"}));

  v1::ExplainRequest explain;
  explain.set_plan_id(plan.plan_id());
  v1::ExplainResponse why;
  ASSERT_TRUE(Call(&PlacementService::Explain, explain, &why).ok());
  bool observed = false;
  for (const v1::ExplainTerm& term : why.terms()) {
    if (term.name() == "t_observed") observed = term.value() == 1500.0;
  }
  EXPECT_TRUE(observed);
}

// ---------------------------------------------------------------- place

TEST_F(PlacementServiceTest, PlaceChoosesLiveHostsAndNamesThoseHoldingTheKeyAlready) {
  JoinThreeHostsAndReport();
  v1::PlaceRequest req;
  req.set_namespace_(kNs);
  *req.mutable_fingerprint() = TestFingerprint();
  req.add_keys(Key(0));
  req.add_keys(Key(9));
  req.set_payload_bytes(kBlockBytes);
  req.set_replicas(2);
  v1::PlaceResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 2);
  for (const v1::PlaceResult& r : resp.results()) {
    EXPECT_FALSE(r.has_status() && r.status().code() != 0) << r.status().message();
    ASSERT_EQ(r.host_indices_size(), 2);
    ASSERT_EQ(r.scores_size(), 2);
    EXPECT_NE(r.host_indices(0), r.host_indices(1));
    EXPECT_GE(r.scores(0), r.scores(1));
    for (std::uint32_t h : r.host_indices())
      ASSERT_LT(h, static_cast<std::uint32_t>(resp.hosts_size()));
  }
  std::vector<std::string> existing;
  for (std::uint32_t h : resp.results(0).existing_host_indices()) {
    existing.push_back(resp.hosts(h).host_id());
  }
  std::sort(existing.begin(), existing.end());
  EXPECT_EQ(existing, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(resp.results(1).existing_host_indices_size(), 0);

  // Every host excluded: no live host, per key.
  for (const char* id : {"a", "b", "c"}) req.add_exclude_host_ids(id);
  v1::PlaceResponse none;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &none).ok());
  ASSERT_EQ(none.results_size(), 2);
  EXPECT_EQ(none.results(0).status().code(), static_cast<int>(StatusCode::kUnavailable));
  EXPECT_EQ(none.results(0).host_indices_size(), 0);
}

TEST_F(PlacementServiceTest, PlaceWithoutRoomAnywhereIsResourceExhaustedPerKey) {
  Join("a");
  v1::HeartbeatRequest beat = HeartbeatOf("a");
  *beat.add_tiers() = Usage(v1::TIER_HOST, 16 * kGiB, kBlockBytes - 1);
  v1::HeartbeatResponse beaten;
  ASSERT_TRUE(Call(&PlacementService::Heartbeat, beat, &beaten).ok());
  v1::PlaceRequest req;
  req.add_keys(Key(1));
  req.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse resp;
  ASSERT_TRUE(Call(&PlacementService::Place, req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).status().code(), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_FALSE(resp.results(0).status().message().empty());
}

// ---------------------------------------------------------------- limits

TEST_F(PlacementServiceTest, RequestsOverALimitAreRefusedWholeNamingTheLimit) {
  JoinThreeHostsAndReport();
  v1::LocateResponse located;
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(70000), &located),
                "keys: 70000 > max_chain_blocks 65536");
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(0), &located),
                "keys: 0, a chain needs at least 1 key");
  v1::LocateRequest short_key = LocateOf(2);
  short_key.mutable_keys(1)->pop_back();
  ExpectInvalid(Call(&PlacementService::Locate, short_key, &located),
                "keys[1]: 31 bytes; a block key is exactly 32");
  v1::LocateRequest long_ns = LocateOf(1);
  long_ns.set_namespace_(std::string(257, 'n'));
  ExpectInvalid(Call(&PlacementService::Locate, long_ns, &located),
                "namespace: 257 bytes > max_namespace_bytes 256");
  EXPECT_EQ(node_->Snapshot().locates, 0u);  // none reached the node

  v1::PlanResponse plan;
  ExpectInvalid(Call(&PlacementService::Plan, PlanOf(70000), &plan),
                "keys: 70000 > max_chain_blocks 65536");
  v1::PlanRequest no_fingerprint = PlanOf(2);
  no_fingerprint.clear_fingerprint();
  EXPECT_EQ(Call(&PlacementService::Plan, no_fingerprint, &plan).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::PlanRequest other_path = PlanOf(2);
  other_path.add_client_paths()->set_path(v1::BUS_PATH_NVME_TO_HOST);
  ExpectInvalid(Call(&PlacementService::Plan, other_path, &plan),
                "client_paths[0].path: BUS_PATH_NVME_TO_HOST is not a path on the client's "
                "machine (host <-> device)");
  EXPECT_EQ(node_->Snapshot().plans, 0u);

  v1::PlaceRequest place;
  for (int i = 0; i < 4097; ++i) place.add_keys(Key(i));
  place.set_payload_bytes(kBlockBytes);
  v1::PlaceResponse placed;
  ExpectInvalid(Call(&PlacementService::Place, place, &placed),
                "keys: 4097 > max_keys_per_batch 4096");
  place.clear_keys();
  place.add_keys(Key(0));
  place.set_replicas(9);
  ExpectInvalid(Call(&PlacementService::Place, place, &placed), "replicas: 9 > max_replicas 8");
  place.set_replicas(1);
  place.set_payload_bytes((std::uint64_t{64} << 20) + 1);
  ExpectInvalid(Call(&PlacementService::Place, place, &placed),
                "payload_bytes: 67108865 > max_block_bytes 67108864");
  EXPECT_EQ(node_->Snapshot().places, 0u);

  v1::RegisterRequest reg = RegisterOf("d");
  reg.set_ttl_ms(600001);
  v1::RegisterResponse registered;
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "ttl_ms: 600001 > max_ttl_ms 600000");
  reg = RegisterOf(std::string(129, 'h'));
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "host_id: 129 bytes > max_host_id_bytes 128");
  reg = RegisterOf("d");
  reg.set_grpc_address(std::string(257, 'x'));
  ExpectInvalid(Call(&PlacementService::Register, reg, &registered),
                "grpc_address: 257 bytes > max_address_bytes 256");
  reg = RegisterOf("d", 0);
  EXPECT_EQ(Call(&PlacementService::Register, reg, &registered).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Hosts().hosts_size(), 3);

  v1::ReportBlocksResponse reported;
  ExpectInvalid(Call(&PlacementService::ReportBlocks, ReportOf("a", Commits(0, 4097)), &reported),
                "events: 4097 > max_keys_per_batch 4096");
  v1::ReportBlocksRequest big_block = ReportOf("a", Commits(0, 2));
  big_block.mutable_events(1)->mutable_block()->set_payload_bytes(std::uint64_t{1} << 30);
  ExpectInvalid(Call(&PlacementService::ReportBlocks, big_block, &reported),
                "events[1].block.payload_bytes: 1073741824 > max_block_bytes 67108864");

  v1::ReportObservationsRequest obs;
  for (int i = 0; i < 4097; ++i) obs.add_fallback_runs(0);
  v1::ReportObservationsResponse observed;
  ExpectInvalid(Call(&PlacementService::ReportObservations, obs, &observed),
                "fallback_runs: 4097 > max_keys_per_batch 4096");
}

TEST_F(PlacementServiceTest, LowerLimitsOfTheServiceAreEnforcedAndReported) {
  PlacementServiceOptions options;
  options.limits.set_max_chain_blocks(4);
  PlacementService service(node_.get(), health_.get(), options);
  v1::LocateResponse located;
  ExpectInvalid(Call(&PlacementService::Locate, LocateOf(5), &located, &service),
                "keys: 5 > max_chain_blocks 4");
  EXPECT_TRUE(Call(&PlacementService::Locate, LocateOf(4), &located, &service).ok());
  v1::HealthResponse health;
  ASSERT_TRUE(Call(&PlacementService::Health, v1::HealthRequest(), &health, &service).ok());
  EXPECT_EQ(health.limits().max_chain_blocks(), 4u);
  EXPECT_EQ(health.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(health.server_id(), "placement-0");
}

TEST_F(PlacementServiceTest, WithoutANodeOnlyHealthIsServed) {
  PlacementService starting(nullptr, health_.get(), PlacementServiceOptions());
  v1::LocateResponse located;
  EXPECT_EQ(Call(&PlacementService::Locate, LocateOf(1), &located, &starting).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  v1::ListHostsResponse hosts;
  EXPECT_EQ(
      Call(&PlacementService::ListHosts, v1::ListHostsRequest(), &hosts, &starting).error_code(),
      grpc::StatusCode::UNAVAILABLE);
  v1::RegisterResponse registered;
  EXPECT_EQ(Call(&PlacementService::Register, RegisterOf("a"), &registered, &starting).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Whole-request checks come first.
  EXPECT_EQ(Call(&PlacementService::Locate, LocateOf(0), &located, &starting).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::HealthResponse health;
  EXPECT_TRUE(Call(&PlacementService::Health, v1::HealthRequest(), &health, &starting).ok());
}

}  // namespace
}  // namespace kvfabric
