// The fixture and helpers shared by placement_node_test.cc and
// placement_node_plans_test.cc: a fake-clock Env, keys, member records, block
// events, chains, and a PlacementNodeTest that starts a node on them.
#ifndef KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_TEST_FIXTURE_H_
#define KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_TEST_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/fake_clock_env.h"
#include "core/testing/test_seed.h"
#include "server/placement/placement_node.h"

namespace kvfabric::placement {

constexpr std::uint32_t kTokens = 16;
constexpr std::uint64_t kBlockBytes = 1 << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

inline BlockKey Key(int i) {
  BlockKey::Bytes b{};
  b[0] = static_cast<std::uint8_t>(i);
  b[1] = static_cast<std::uint8_t>(i >> 8);
  b[2] = 0x5A;
  return BlockKey(b);
}

inline std::vector<BlockKey> Keys(int n) {
  std::vector<BlockKey> out;
  for (int i = 0; i < n; ++i) out.push_back(Key(i));
  return out;
}

inline MemberRecord Rec(std::string id, std::uint64_t inc, std::string node = "",
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

inline BlockEvent Commit(int key, Tier tier = Tier::kHost, std::string ns = "t") {
  BlockEvent e;
  e.kind = BlockEventKind::kCommitted;
  e.ns = std::move(ns);
  e.key = Key(key);
  e.tier = tier;
  e.payload_bytes = kBlockBytes;
  e.representation = 1;
  return e;
}

inline std::vector<ChainBlockSpec> Chain(int n) {
  std::vector<ChainBlockSpec> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({Key(i), kTokens, static_cast<std::uint64_t>(i) * kTokens, kBlockBytes});
  }
  return out;
}

inline double Alternative(const kvfabric::Plan& p, PlanKind kind) {
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
    if (!res.ok()) return 0;
    tokens_[res->lease_id] = res->token;
    return res->lease_id;
  }

  // The membership token Register issued with `lease` ("" if none).
  std::string Token(std::uint64_t lease) const {
    auto it = tokens_.find(lease);
    return it == tokens_.end() ? "" : it->second;
  }
  StatusOr<HeartbeatResult> Heartbeat(std::uint64_t lease, const MemberRecord* updated) {
    return node_->Heartbeat(lease, Token(lease), updated);
  }
  Status Deregister(std::uint64_t lease) { return node_->Deregister(lease, Token(lease)); }

  // Reports `events` as host's next sequence.
  ReportResult Report(const std::string& host, std::uint64_t inc, std::uint64_t lease,
                      std::vector<BlockEvent> events) {
    BlockReport r;
    r.host_id = host;
    r.incarnation = inc;
    r.lease_id = lease;
    r.token = Token(lease);
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
  std::map<std::uint64_t, std::string> tokens_;  // lease -> membership token
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_TEST_FIXTURE_H_
