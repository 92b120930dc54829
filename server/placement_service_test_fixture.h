// The fixture and helpers of the PlacementService tests
// (placement_service_test.cc, placement_service_plans_test.cc): PlacementService
// over a real PlacementNode (in-process membership store, a clock that moves
// only when the test says so), its handlers called directly with a default
// grpc::ServerContext: no network.
//
// Blocks are of TestFingerprint(): 2 layers x 2 (K, V) x 16 tokens x 2 heads x 16 dims x bf16 =
// 4096 bytes. The cost model makes fetching a cached block far cheaper than recomputing it.
#ifndef KVFABRIC_SERVER_PLACEMENT_SERVICE_TEST_FIXTURE_H_
#define KVFABRIC_SERVER_PLACEMENT_SERVICE_TEST_FIXTURE_H_

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
#include "server/placement_service.h"

namespace kvfabric::placement_service_test {

inline constexpr char kNs[] = "tenant-a";
inline constexpr std::uint64_t kBlockBytes = 4096;
inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

inline std::string Key(int i) {
  std::string key(BlockKey::kSize, '\x5A');
  key[0] = static_cast<char>(i & 0xFF);
  key[1] = static_cast<char>((i >> 8) & 0xFF);
  key[2] = static_cast<char>((i >> 16) & 0xFF);
  return key;
}

inline v1::ModelFingerprint TestFingerprint() {
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

inline v1::BlockEvent Committed(int key, v1::Tier tier = v1::TIER_HOST) {
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

inline v1::TierUsage Usage(v1::Tier tier, std::uint64_t capacity, std::uint64_t free) {
  v1::TierUsage t;
  t.set_tier(tier);
  t.set_capacity_bytes(capacity);
  t.set_free_bytes(free);
  return t;
}

inline v1::LocateRequest LocateOf(int keys) {
  v1::LocateRequest req;
  req.set_namespace_(kNs);
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  return req;
}

inline v1::PlanRequest PlanOf(int keys) {
  v1::PlanRequest req;
  req.set_namespace_(kNs);
  *req.mutable_fingerprint() = TestFingerprint();
  for (int i = 0; i < keys; ++i) req.add_keys(Key(i));
  req.set_client_node("client-node");
  return req;
}

// Host ids of each block's replicas, best first.
inline std::vector<std::vector<std::string>> Holders(const v1::ChainLocations& loc) {
  std::vector<std::vector<std::string>> out;
  for (const v1::BlockLocation& block : loc.blocks()) {
    std::vector<std::string>& ids = out.emplace_back();
    for (const v1::Replica& r : block.replicas())
      ids.push_back(loc.hosts(r.host_index()).host_id());
  }
  return out;
}

inline void ExpectInvalid(const grpc::Status& s, const std::string& message) {
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

}  // namespace kvfabric::placement_service_test

#endif  // KVFABRIC_SERVER_PLACEMENT_SERVICE_TEST_FIXTURE_H_
