#include "server/embedded_cluster.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "tests/http_client.h"

namespace kvfabric::server {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

EmbeddedClusterOptions TwoDaemons(std::chrono::milliseconds membership_ttl) {
  EmbeddedClusterOptions o;
  for (const char* id : {"test-a", "test-b"}) {
    EmbeddedDaemonOptions d;
    d.host_id = id;
    d.host_pool_bytes = 64 * kMiB;
    d.host_page_bytes = 1 * kMiB;
    o.daemons.push_back(d);
  }
  o.membership_ttl = membership_ttl;
  return o;
}

std::unique_ptr<v1::Placement::Stub> PlacementStub(const std::string& address) {
  return v1::Placement::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<v1::CacheHost::Stub> CacheHostStub(const std::string& address) {
  return v1::CacheHost::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// ListHosts' host ids; fails the test if the call fails.
std::set<std::string> ListedHosts(v1::Placement::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListHostsResponse resp;
  grpc::Status g = stub->ListHosts(&ctx, v1::ListHostsRequest(), &resp);
  EXPECT_TRUE(g.ok()) << g.error_message();
  std::set<std::string> ids;
  for (const v1::HostStatus& h : resp.hosts()) ids.insert(h.host().host_id());
  return ids;
}

grpc::Status Stats(v1::CacheHost::Stub* stub, v1::StatsResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return stub->Stats(&ctx, v1::StatsRequest(), resp);
}

TEST(EmbeddedClusterTest, DaemonsServeRegisterAndAKilledOneStopsAnswering) {
  // A long membership lease: the killed daemon must still be listed after the kill.
  auto cluster = EmbeddedCluster::StartDaemons(TwoDaemons(std::chrono::seconds(60)));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  EmbeddedCluster& c = **cluster;
  EXPECT_EQ(c.placement_address(), "");
  ASSERT_TRUE(c.StartPlacement(BusCalibration()).ok());
  EXPECT_NE(c.placement_address(), "");
  EXPECT_NE(c.placement_metrics_url(), "");
  // Every process of the cluster answers /metrics (what `kvfabric demo
  // --keep-running` tells Prometheus to scrape).
  {
    StatusOr<testing::HttpResponse> page =
        testing::HttpRequest(testing::HostPort(c.placement_metrics_url()), "GET", "/metrics");
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_EQ(page->status, 200);
    EXPECT_NE(page->body.find("kvfabric_placement_hosts"), std::string::npos);
  }

  auto placement = PlacementStub(c.placement_address());
  EXPECT_EQ(ListedHosts(placement.get()), (std::set<std::string>{"test-a", "test-b"}));

  const std::vector<EmbeddedCluster::DaemonInfo> daemons = c.daemons();
  ASSERT_EQ(daemons.size(), 2u);
  for (const EmbeddedCluster::DaemonInfo& d : daemons) {
    SCOPED_TRACE(d.host_id);
    EXPECT_FALSE(d.killed);
    EXPECT_NE(d.transport_address, "");
    EXPECT_NE(d.metrics_url, "");
    StatusOr<testing::HttpResponse> page =
        testing::HttpRequest(testing::HostPort(d.metrics_url), "GET", "/metrics");
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_EQ(page->status, 200);
    EXPECT_NE(page->body.find("kvfabric_cache_host_"), std::string::npos);
    auto stub = CacheHostStub(d.grpc_address);
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::HealthResponse resp;
      ASSERT_TRUE(stub->Health(&ctx, v1::HealthRequest(), &resp).ok());
      EXPECT_EQ(resp.status(), v1::SERVING_STATUS_SERVING);
      EXPECT_EQ(resp.server_id(), d.host_id);
    }
    v1::StatsResponse stats;
    ASSERT_TRUE(Stats(stub.get(), &stats).ok());
    ASSERT_GE(stats.tiers_size(), 1);
    EXPECT_EQ(stats.tiers(0).capacity_bytes(), 64 * kMiB);
    EXPECT_FALSE(stats.memory_locked());
  }

  ASSERT_TRUE(c.KillDaemon(0).ok());
  EXPECT_TRUE(c.daemons()[0].killed);
  EXPECT_EQ(c.KillDaemon(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.KillDaemon(2).code(), StatusCode::kInvalidArgument);
  auto dead = CacheHostStub(daemons[0].grpc_address);
  v1::StatsResponse ignored;
  EXPECT_FALSE(Stats(dead.get(), &ignored).ok());
  auto alive = CacheHostStub(daemons[1].grpc_address);
  EXPECT_TRUE(Stats(alive.get(), &ignored).ok());
  // Not deregistered: placement keeps it until its 60 s lease expires.
  EXPECT_EQ(ListedHosts(placement.get()), (std::set<std::string>{"test-a", "test-b"}));
  cluster->reset();  // the orderly stop of the survivor and placement
}

TEST(EmbeddedClusterTest, KilledDaemonLeavesPlacementWhenItsLeaseExpires) {
  auto cluster = EmbeddedCluster::StartDaemons(TwoDaemons(std::chrono::milliseconds(600)));
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  ASSERT_TRUE((*cluster)->StartPlacement(BusCalibration()).ok());
  auto placement = PlacementStub((*cluster)->placement_address());
  ASSERT_TRUE((*cluster)->KillDaemon(1).ok());
  // Bounded wait, not a timing assertion: expiry takes ~600 ms.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::set<std::string> listed = ListedHosts(placement.get());
  while (listed.count("test-b") > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    listed = ListedHosts(placement.get());
  }
  EXPECT_EQ(listed, std::set<std::string>{"test-a"});
}

TEST(EmbeddedClusterTest, DaemonWithNvmeDirReportsBothTiers) {
  char tmpl[] = "/tmp/kvf_embedded_cluster_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    EmbeddedClusterOptions o = TwoDaemons(std::chrono::seconds(3));
    o.daemons.resize(1);
    o.daemons[0].nvme_dir = dir + "/nvme";
    o.daemons[0].nvme_capacity_bytes = 128 * kMiB;
    o.daemons[0].nvme_segment_bytes = 64 * kMiB;
    o.daemons[0].metrics = false;
    o.placement_metrics = false;
    auto cluster = EmbeddedCluster::StartDaemons(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    ASSERT_TRUE((*cluster)->StartPlacement(BusCalibration()).ok());
    EXPECT_EQ((*cluster)->daemons()[0].metrics_url, "");
    EXPECT_EQ((*cluster)->placement_metrics_url(), "");
    auto stub = CacheHostStub((*cluster)->daemons()[0].grpc_address);
    v1::StatsResponse stats;
    ASSERT_TRUE(Stats(stub.get(), &stats).ok());
    ASSERT_EQ(stats.tiers_size(), 2);
    EXPECT_EQ(stats.tiers(1).tier(), v1::TIER_NVME);
    EXPECT_EQ(stats.tiers(1).capacity_bytes(), 128 * kMiB);
  }
  std::filesystem::remove_all(dir);
}

TEST(EmbeddedClusterTest, RefusesDuplicateHostIdsNamingThem) {
  EmbeddedClusterOptions o = TwoDaemons(std::chrono::seconds(3));
  o.daemons[1].host_id = "test-a";
  auto cluster = EmbeddedCluster::StartDaemons(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cluster.status().message().find("test-a"), std::string::npos);
}

TEST(EmbeddedClusterTest, RefusesMissingPoolSizeNamingDaemonAndSetting) {
  EmbeddedClusterOptions o = TwoDaemons(std::chrono::seconds(3));
  o.daemons[1].host_pool_bytes = 0;
  auto cluster = EmbeddedCluster::StartDaemons(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), StatusCode::kInvalidArgument);
  const std::string message(cluster.status().message());
  EXPECT_NE(message.find("test-b"), std::string::npos) << message;
  EXPECT_NE(message.find("host_pool_bytes"), std::string::npos) << message;
}

TEST(EmbeddedClusterTest, RefusesNvmeDirWithoutCapacity) {
  EmbeddedClusterOptions o = TwoDaemons(std::chrono::seconds(3));
  o.daemons[0].nvme_dir = "/tmp/kvf_embedded_cluster_test_nvme_unused";
  auto cluster = EmbeddedCluster::StartDaemons(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_NE(std::string(cluster.status().message()).find("nvme_capacity_bytes"), std::string::npos)
      << cluster.status().ToString();
}

}  // namespace
}  // namespace kvfabric::server
