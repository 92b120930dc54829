// Cross-process test of the placement service with its cluster: a real etcd,
// kvfabric-placement over it, and three kvfabric-cached daemons registered
// with placement, all on loopback.
//
//   1. The daemons join (ListHosts shows three), a chain is written to daemon
//      A, and placement's directory learns it from A's reports: Locate and
//      Plan see the whole chain cached on A.
//   2. A is SIGKILLed: its membership lease expires, it leaves ListHosts, and
//      plans for the chain change to recompute (its blocks count as absent).
//   3. Placement crashes and restarts: membership comes back from etcd at once
//      (the daemons' leases live there and outlive placement for their TTL)
//      and the directory is rebuilt from the daemons' full reports (a chain
//      on daemon B is located again).
//
// Binaries: $KVF_CACHED, $KVF_PLACEMENT (set by the build) or beside this test;
// etcd from Debian's etcd-server (the test skips, saying so, without it).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "cli/status_command.h"
#include "core/testing/test_seed.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "server/placement/testing/etcd_process.h"
#include "tests/cache_host_test_client.h"
#include "tests/server_process.h"

namespace kvfabric {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `condition` every 50 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

class PlacementClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string skip = placement::testing::EtcdProcess::SkipReason();
    if (!skip.empty()) GTEST_SKIP() << skip;
    char tmpl[] = "/tmp/kvf_cluster_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto etcd = placement::testing::EtcdProcess::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(*etcd);
  }

  void TearDown() override {
    for (auto& d : daemons_) d.reset();
    placement_.reset();
    etcd_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // On `address` (the daemons know placement by its address: a restart keeps it).
  void StartPlacement(const std::string& address = "127.0.0.1:0") {
    auto p = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement", dir_,
        {"--insecure", "--grpc-address=" + address, "--metrics-address=off", "--log-level=warn",
         "--etcd-endpoint=" + etcd_->endpoint()});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    stub_ = v1::Placement::NewStub(
        grpc::CreateChannel(placement_->grpc(), grpc::InsecureChannelCredentials()));
  }

  // Daemon `i` ("cache-i"), registered with placement.
  void StartDaemon(int i) {
    auto d = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cache-" + std::to_string(i), dir_,
        {"--host-id=cache-" + std::to_string(i), "--insecure", "--grpc-address=127.0.0.1:0",
         "--transport-address=127.0.0.1:0", "--metrics-address=off", "--lock-memory=off",
         "--log-level=warn", "--host-pool-bytes=64MiB", "--host-page-bytes=2MiB",
         "--placement-address=" + placement_->grpc(), "--membership-ttl=3s"});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemons_[i] = std::move(*d);
  }

  std::vector<std::string> LiveHosts() {
    v1::ListHostsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!stub_->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return {};
    std::vector<std::string> out;
    for (const auto& h : resp.hosts()) out.push_back(h.host().host_id());
    std::sort(out.begin(), out.end());
    return out;
  }

  // Blocks of `client`'s chain [0, n) that placement locates, by host id.
  std::map<std::string, int> Located(testing::CacheHostTestClient& client, int n) {
    v1::LocateRequest req;
    for (int i = 0; i < n; ++i) req.add_keys(client.Key(i));
    v1::LocateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::map<std::string, int> out;
    if (!stub_->Locate(&ctx, req, &resp).ok()) return out;
    const v1::ChainLocations& loc = resp.locations();
    for (const auto& block : loc.blocks()) {
      for (const auto& r : block.replicas()) ++out[loc.hosts(r.host_index()).host_id()];
    }
    return out;
  }

  StatusOr<v1::PlanResponse> PlanChain(testing::CacheHostTestClient& client, int n) {
    v1::PlanRequest req;
    *req.mutable_fingerprint() = testing::CacheHostTestClient::Fingerprint();
    for (int i = 0; i < n; ++i) req.add_keys(client.Key(i));
    req.set_include_explanation(true);
    v1::PlanResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status g = stub_->Plan(&ctx, req, &resp);
    if (!g.ok()) return Status::Unavailable("Plan: " + g.error_message());
    return resp;
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  std::unique_ptr<placement::testing::EtcdProcess> etcd_;
  std::unique_ptr<testing::ServerProcess> placement_;
  std::unique_ptr<testing::ServerProcess> daemons_[3];
  std::unique_ptr<v1::Placement::Stub> stub_;
};

TEST_F(PlacementClusterTest, DaemonDeathChangesPlansAndPlacementRecoversFromEtcd) {
  StartPlacement();
  for (int i = 0; i < 3; ++i) StartDaemon(i);
  const std::vector<std::string> all = {"cache-0", "cache-1", "cache-2"};
  ASSERT_TRUE(WaitFor([&] { return LiveHosts() == all; }, std::chrono::seconds(20)));
  // `kvfabric status` reaches placement and every daemon it lists.
  cli::StatusArgs status;
  status.placement = placement_->grpc();
  status.security.insecure = true;
  EXPECT_TRUE(cli::RunStatus(status).ok());

  // A chain of 8 blocks on cache-0, another on cache-1.
  constexpr int kBlocks = 8;
  auto on_a = testing::CacheHostTestClient::Create(seed_, "sm,self,tcp");
  auto on_b = testing::CacheHostTestClient::Create(seed_ ^ 0x5555, "sm,self,tcp");
  ASSERT_TRUE(on_a.ok() && on_b.ok());
  ASSERT_TRUE((*on_a)->Attach(daemons_[0]->grpc(), daemons_[0]->transport()).ok());
  ASSERT_TRUE((*on_b)->Attach(daemons_[1]->grpc(), daemons_[1]->transport()).ok());
  ASSERT_TRUE((*on_a)->PutBatch(0, kBlocks).ok());
  ASSERT_TRUE((*on_b)->PutBatch(0, kBlocks).ok());
  ASSERT_TRUE(WaitFor([&] { return Located(**on_a, kBlocks)["cache-0"] == kBlocks; },
                      std::chrono::seconds(20)));
  auto plan = PlanChain(**on_a, kBlocks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->locations().cached_prefix_blocks(), static_cast<std::uint32_t>(kBlocks))
      << plan->explanation();
  EXPECT_FALSE(plan->explanation().empty());

  // cache-0 dies: its lease (3 s) expires, and its blocks count as absent.
  daemons_[0]->Kill(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return LiveHosts() == std::vector<std::string>{"cache-1", "cache-2"}; },
                      std::chrono::seconds(20)));
  plan = PlanChain(**on_a, kBlocks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->locations().cached_prefix_blocks(), 0u);
  EXPECT_EQ(plan->kind(), v1::PLAN_KIND_RECOMPUTE_ALL) << plan->explanation();

  // Placement restarts: membership is back from etcd at once, the directory
  // from the daemons' full reports.
  // (A crash: the daemons' leases in etcd outlive placement for their TTL.)
  const std::string address = placement_->grpc();
  placement_->Kill(SIGKILL);
  StartPlacement(address);
  EXPECT_EQ(LiveHosts(), (std::vector<std::string>{"cache-1", "cache-2"}));
  ASSERT_TRUE(WaitFor([&] { return Located(**on_b, kBlocks)["cache-1"] == kBlocks; },
                      std::chrono::seconds(20)));
  plan = PlanChain(**on_b, kBlocks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->locations().cached_prefix_blocks(), static_cast<std::uint32_t>(kBlocks));
}

}  // namespace
}  // namespace kvfabric
