// Placement replicated: a 3-member etcd cluster and two placement replicas
// (each given all three members, its own first), two daemons and the engine
// (this test), each in its own network namespace (tests/fault/netns_cluster.h).
// The placement the client and the daemons use is SIGKILLed, and with it the
// etcd member the other replica talks to: the client and the daemons fail
// over to the other replica (placement_address / --placement-address "a,b"),
// that replica fails over to a live etcd member (--etcd-endpoint "a,b,c"),
// membership survives in etcd's quorum, the directory is rebuilt from the
// daemons' full reports, and the next Match fetches the whole chain.
//
// Needs root and Debian's etcd-server; skips saying why otherwise. Binaries:
// $KVF_CACHED, $KVF_PLACEMENT or beside this test.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "core/testing/test_seed.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "server/placement/testing/etcd_process.h"
#include "tests/fault/fault_test_util.h"
#include "tests/fault/netns_cluster.h"
#include "tests/server_process.h"
#include "tests/test_engine.h"

extern char** environ;

namespace kvfabric {
namespace {

using namespace fault_test;  // NOLINT: the fault tests' shared constants and helpers
using client::Client;
using client::ContextReport;

// Placement and etcd replicated: a 3-member etcd cluster and two placement
// replicas (each talking to its own member), every process in its own
// namespace; the daemons and the client know both placements.
class PlacementFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::string skip = testing::NetnsCluster::SkipReason();
    if (skip.empty()) skip = placement::testing::EtcdProcess::SkipReason();
    if (!skip.empty()) GTEST_SKIP() << skip;
    char tmpl[] = "/tmp/kvf_failover_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto net = testing::NetnsCluster::Create(
        {"etcd-1", "etcd-2", "etcd-3", "placement-1", "placement-2", "cache-a", "cache-b"});
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    net_ = std::move(*net);
    std::string cluster;
    for (int i = 1; i <= 3; ++i) {
      const std::string host = "etcd-" + std::to_string(i);
      cluster += (cluster.empty() ? "" : ",") + host + "=http://" + net_->Address(host) + ":2380";
    }
    for (int i = 1; i <= 3; ++i) ASSERT_NO_FATAL_FAILURE(StartEtcd(i, cluster));
    for (int i = 1; i <= 2; ++i) {
      const std::string host = "placement-" + std::to_string(i);
      placements_.push_back(net_->Address(host) + ":7450");
      ASSERT_NO_FATAL_FAILURE(StartPlacement(i));
    }
    const std::string both = placements_[0] + "," + placements_[1];
    for (const char* host : {"cache-a", "cache-b"}) {
      auto d =
          net_->StartIn(host, testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), host, dir_,
                        {"--insecure", "--allow-insecure-remote", "--host-id=" + std::string(host),
                         "--grpc-address=" + net_->Address(host) + ":7440",
                         "--transport-address=" + net_->Address(host) + ":0",
                         "--data-transport=tcp", "--metrics-address=off", "--lock-memory=off",
                         "--log-level=warn", "--host-pool-bytes=32MiB", "--host-page-bytes=32KiB",
                         "--placement-address=" + both, "--membership-ttl=3s"});
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      daemons_.push_back(std::move(*d));
    }
  }

  void TearDown() override {
    client_.reset();
    device_.reset();
    daemons_.clear();
    placement_procs_.clear();
    for (pid_t pid : etcd_pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    net_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void StartEtcd(int i, const std::string& cluster) {
    const std::string host = "etcd-" + std::to_string(i);
    const std::string a = net_->Address(host);
    std::vector<std::string> argv = {"/usr/sbin/ip",
                                     "netns",
                                     "exec",
                                     net_->Namespace(host),
                                     placement::testing::EtcdProcess::kBinary,
                                     "--name",
                                     host,
                                     "--data-dir",
                                     dir_ + "/" + host,
                                     "--listen-client-urls",
                                     "http://" + a + ":2379",
                                     "--advertise-client-urls",
                                     "http://" + a + ":2379",
                                     "--listen-peer-urls",
                                     "http://" + a + ":2380",
                                     "--initial-advertise-peer-urls",
                                     "http://" + a + ":2380",
                                     "--initial-cluster",
                                     cluster,
                                     "--initial-cluster-state",
                                     "new",
                                     "--heartbeat-interval",
                                     "50",
                                     "--election-timeout",
                                     "500"};
    std::vector<char*> cargv;
    for (std::string& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    const std::string log = dir_ + "/" + host + ".log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    const int err = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(err, 0);
    etcd_pids_.push_back(pid);
  }

  void StartPlacement(int i) {
    const std::string host = "placement-" + std::to_string(i);
    // Each replica lists every etcd member, its own first. The cluster needs
    // a moment to elect a leader; placement refuses to start without etcd,
    // so retry.
    std::string members;
    for (int k = 0; k < 3; ++k) {
      members += (k == 0 ? "" : ",") + std::string("http://") +
                 net_->Address("etcd-" + std::to_string((i - 1 + k) % 3 + 1)) + ":2379";
    }
    StatusOr<std::unique_ptr<testing::ServerProcess>> p = Status::Unavailable("not started");
    for (int attempt = 0; attempt < 40 && !p.ok(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
      p = net_->StartIn(
          host, testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), host, dir_,
          {"--insecure", "--allow-insecure-remote",
           "--grpc-address=" + placements_[static_cast<std::size_t>(i - 1)],
           "--metrics-address=off", "--log-level=warn", "--etcd-endpoint=" + members});
    }
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_procs_.push_back(std::move(*p));
  }

  std::vector<std::string> Listed(const std::string& placement) {
    auto stub =
        v1::Placement::NewStub(grpc::CreateChannel(placement, grpc::InsecureChannelCredentials()));
    v1::ListHostsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    std::vector<std::string> out;
    if (!stub->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return out;
    for (const v1::HostStatus& h : resp.hosts()) out.push_back(h.host().host_id());
    return out;
  }
  std::uint64_t DirectoryBlocks(const std::string& placement) {
    auto stub =
        v1::Placement::NewStub(grpc::CreateChannel(placement, grpc::InsecureChannelCredentials()));
    v1::ListHostsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    std::uint64_t n = 0;
    if (!stub->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return 0;
    for (const v1::HostStatus& h : resp.hosts()) n += h.directory_blocks();
    return n;
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  std::unique_ptr<testing::NetnsCluster> net_;
  std::vector<pid_t> etcd_pids_;
  std::vector<std::string> placements_;
  std::vector<std::unique_ptr<testing::ServerProcess>> placement_procs_;
  std::vector<std::unique_ptr<testing::ServerProcess>> daemons_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<Client> client_;
};

// The placement the client and the daemons use, and the etcd member the
// other replica uses, are SIGKILLed: the client's next calls go to the other
// replica, which moves to a live etcd member, the daemons register there,
// membership survives in etcd's quorum, the directory is
// rebuilt from the daemons' full reports, and the client's calls stay few
// (it backs the dead replica off instead of retrying it per call).
TEST_F(PlacementFailoverTest, ClientsAndDaemonsFailOverToTheOtherPlacementReplica) {
  ASSERT_TRUE(WaitFor([&] { return Listed(placements_[0]).size() == 2; }, std::chrono::seconds(30)))
      << "the daemons did not join through placement-1";
  const ModelFingerprint model = testing::SyntheticTestModel("failover/synthetic@1");
  auto device = testing::CreateTestDevice(model, kQHeads, kTileTokens, 2);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  device_ = std::move(device->device);
  std::vector<BlockKey> chain;
  client::ClientOptions o;
  o.placement_address = placements_[0] + "," + placements_[1];
  o.security.insecure = true;  // the namespaces' addresses are not loopback
  o.security.allow_insecure_remote = true;
  o.data_transport = "tcp";
  o.model = model;
  o.device = device_.get();
  o.num_q_heads = kQHeads;
  o.tile_tokens = kTileTokens;
  o.arena.page_bytes = device->page_bytes;
  o.arena.staging_pages = 2;
  o.staging_bytes = 4 << 20;
  o.history_pool_bytes = 9 << 20;
  o.max_context_tokens = kTokens;
  // Generous for a loaded CI machine: a dead replica refuses connections at
  // once, so this bounds only a slow live one.
  o.rpc_timeout = std::chrono::milliseconds(3000);
  o.recompute = [&](const client::RecomputeRequest& r, std::span<std::byte> out) {
    const std::uint64_t bytes = *model.BlockBytes();
    for (std::uint32_t i = 0; i < r.block_count; ++i) {
      KVF_RETURN_IF_ERROR(client::SyntheticKv(model,
                                              client::SeedFromKey(chain[r.first_block + i], seed_),
                                              16, out.subspan(i * bytes, bytes)));
    }
    return Status::OK();
  };
  o.prefill = RecomputeParameters{0.0, kPrefillUsPerToken, 0.0};
  auto c = Client::Open(std::move(o));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  client_ = std::move(*c);
  std::vector<std::uint32_t> ids(kTokens);
  std::mt19937_64 rng(seed_);
  for (std::uint32_t& t : ids) t = static_cast<std::uint32_t>(rng() % 128000);
  chain = *client_->KeyTokens(ids);

  auto serve = [&]() -> std::pair<Status, client::MatchResult> {
    auto match = client_->Match(chain, 0);
    if (!match.ok()) return {match.status(), {}};
    auto ctx = client_->NewContext(kTokens);
    if (!ctx.ok()) return {ctx.status(), *match};
    Status s = client_->Load(*match, *ctx);
    for (std::uint32_t l = 0; s.ok() && l < model.layer_count; ++l) s = client_->WaitLayer(*ctx, l);
    if (s.ok()) {
      auto history = client_->History(*ctx);
      std::vector<std::byte> want(*model.BlockBytes());
      for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
        s = client::SyntheticKv(model, client::SeedFromKey(chain[b], seed_), 16, want);
        if (s.ok() && std::memcmp(want.data(), history->block(b).data(), want.size()) != 0) {
          s = Status::DataLoss("block " + std::to_string(b) + " differs");
        }
      }
    }
    for (std::uint32_t l = 0; s.ok() && l < model.layer_count; ++l) {
      s = client_->Save(*ctx, l, 0, chain);
    }
    ContextReport report;
    Status f = client_->Finish(*ctx, &report);
    return {s.ok() ? f : s, *match};
  };
  auto first = serve();
  ASSERT_TRUE(first.first.ok()) << first.first.ToString();
  ASSERT_TRUE(WaitFor([&] { return DirectoryBlocks(placements_[0]) == chain.size(); },
                      std::chrono::seconds(10)));

  // Kill placement-1, and etcd-2: the member placement-2 talks to.
  const auto killed = Clock::now();
  placement_procs_[0]->Kill(SIGKILL);
  kill(etcd_pids_[1], SIGKILL);
  waitpid(etcd_pids_[1], nullptr, 0);
  etcd_pids_[1] = -1;
  const client::ClientMetrics m0 = client_->metrics();

  // The daemons move to placement-2 and report in full: plans fetch again.
  ASSERT_TRUE(WaitFor([&] { return DirectoryBlocks(placements_[1]) == chain.size(); },
                      std::chrono::seconds(40)))
      << "placement-2 never learned the chain (" << DirectoryBlocks(placements_[1]) << " of "
      << chain.size() << " blocks)";
  const double rebuilt = Seconds(Clock::now() - killed);
  int requests = 0;
  std::pair<Status, client::MatchResult> after;
  do {
    after = serve();
    ++requests;
  } while (after.second.cached_prefix_blocks == 0 && requests < 20);
  const client::ClientMetrics m1 = client_->metrics();
  std::printf(
      "placement-1 and etcd-2 killed: placement-2 lists %zu daemons and %llu directory "
      "blocks %.2f s later; %d requests until a plan fetched again (%s, cached %u); "
      "client placement calls skipped by backoff %llu, local plans %llu\n",
      Listed(placements_[1]).size(),
      static_cast<unsigned long long>(DirectoryBlocks(placements_[1])), rebuilt, requests,
      after.second.kind.c_str(), after.second.cached_prefix_blocks,
      static_cast<unsigned long long>(m1.placement_calls_skipped - m0.placement_calls_skipped),
      static_cast<unsigned long long>(m1.placement_unavailable - m0.placement_unavailable));
  EXPECT_TRUE(after.first.ok()) << after.first.ToString();
  EXPECT_EQ(after.second.cached_prefix_blocks, chain.size());
  EXPECT_EQ(Listed(placements_[1]).size(), 2u);
  // The dead replica is tried, then backed off: matches fail over instead
  // of planning locally (at most one may if placement-2 was still starting).
  EXPECT_LE(m1.placement_unavailable - m0.placement_unavailable, 1u);
}

}  // namespace
}  // namespace kvfabric
