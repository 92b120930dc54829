// Faults across hosts: placement and two cache hosts, each in its own network
// namespace behind a switch (tests/fault/netns_cluster.h); this test process
// is the engine on the client host. The data plane is kernel TCP, so cutting
// or shaping a link cuts or shapes exactly that host's traffic.
//
//   DaemonPartitionedMidLoad  a load is under way when cache-a's link goes
//       down: the load completes exactly (the blocks on cache-a recomputed
//       within the transfer deadline), placement expires cache-a's lease and
//       plans route around it; on heal cache-a rejoins and its full report
//       puts its blocks back in the directory.
//   PlacementPartitioned  the client cannot reach placement: it plans
//       recompute-all locally and stays exact; when placement returns (having
//       expired and re-admitted the daemons meanwhile) plans fetch again.
//   SlowLinkShiftsPlans  cache-a's link is capped at 20 Mbit/s: the
//       transfers observed from it miss the model, the model rescales, and the
//       plans stop fetching from cache-a (recompute or the other daemon).
//   DaemonKillTest  small host pools over NVMe tiers; cache-a is SIGKILLed 20
//       times at seeded moments under 4 contexts of load (and 4 more times
//       while it recovers): no block it reported on NVMe is lost, nothing
//       reads back corrupt, every load stays exact.
//
// Each prints its figures. Needs root for the namespaces; skips saying why
// otherwise. Binaries: $KVF_CACHED, $KVF_PLACEMENT or beside this test.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client/kvfabric_client.h"
#include "client/streaming_attention.h"
#include "client/synthetic_model.h"
#include "core/testing/test_seed.h"
#include "gpu/cpu/cpu_device.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "tests/fault/fault_test_util.h"
#include "tests/fault/netns_cluster.h"
#include "tests/server_process.h"
#include "tests/test_engine.h"

namespace kvfabric {
namespace {

using namespace fault_test;  // NOLINT: the fault tests' shared constants and helpers
using client::Client;
using client::ContextReport;

constexpr auto kMembershipTtl = std::chrono::seconds(2);

ModelFingerprint TestModel() { return testing::SyntheticTestModel("fault/synthetic@1"); }

class NetworkFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string skip = testing::NetnsCluster::SkipReason();
    if (!skip.empty()) GTEST_SKIP() << skip;
    char tmpl[] = "/tmp/kvf_fault_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto net = testing::NetnsCluster::Create({"placement", "cache-a", "cache-b"});
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    net_ = std::move(*net);
    placement_address_ = net_->Address("placement") + ":7450";
    auto p = net_->StartIn(
        "placement", testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement",
        dir_,
        {"--insecure", "--allow-insecure-remote", "--grpc-address=" + placement_address_,
         "--metrics-address=off", "--log-level=warn"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    for (const char* host : {"cache-a", "cache-b"}) StartDaemon(host);
    stub_ = v1::Placement::NewStub(
        grpc::CreateChannel(placement_address_, grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(WaitFor([&] { return Hosts().size() == 2; }, std::chrono::seconds(20)))
        << "the daemons did not join";
    OpenClient();
    chain_ = ChainOf(0, kTokens);
    ASSERT_EQ(chain_.size(), kTokens / 16);
  }

  void TearDown() override {
    client_.reset();
    device_.reset();
    daemons_.clear();
    placement_.reset();
    net_.reset();  // deletes the namespaces, also after a failure
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The pool (and tier) flags of every daemon.
  virtual std::vector<std::string> TierFlags(const std::string&) {
    return {"--host-pool-bytes=32MiB"};
  }
  // Contexts served at once (arena pool pages: 2 each).
  virtual std::uint32_t Concurrency() { return 1; }

  std::vector<std::string> DaemonFlags(const std::string& host) {
    std::vector<std::string> flags = {
        "--insecure",
        "--allow-insecure-remote",
        "--host-id=" + host,
        "--grpc-address=" + net_->Address(host) + ":7440",
        "--transport-address=" + net_->Address(host) + ":0",
        "--data-transport=tcp",
        "--metrics-address=off",
        "--lock-memory=off",
        "--log-level=warn",
        "--host-page-bytes=32KiB",
        "--placement-address=" + placement_address_,
        "--membership-ttl=" + std::to_string(kMembershipTtl.count()) + "s"};
    for (std::string& f : TierFlags(host)) flags.push_back(std::move(f));
    return flags;
  }

  void StartDaemon(const std::string& host) {
    auto d = net_->StartIn(host, testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), host, dir_,
                           DaemonFlags(host));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemons_[host] = std::move(*d);
  }

  void OpenClient() {
    auto c = NewClient(&device_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }

  // A client of this cluster (an engine of its own) on a device it creates.
  StatusOr<std::unique_ptr<Client>> NewClient(std::unique_ptr<gpu::Device>* device_out) {
    auto device = testing::CreateTestDevice(model_, kQHeads, kTileTokens, 2 * Concurrency());
    if (!device.ok()) return device.status();
    *device_out = std::move(device->device);
    const std::uint64_t page_bytes = device->page_bytes;
    client::ClientOptions o;
    o.placement_address = placement_address_;
    o.security.insecure = true;  // the namespaces' addresses are not loopback
    o.security.allow_insecure_remote = true;
    o.data_transport = "tcp";
    o.model = model_;
    o.device = device_out->get();
    o.num_q_heads = kQHeads;
    o.tile_tokens = kTileTokens;
    o.arena.page_bytes = page_bytes;
    o.arena.staging_pages = 2;
    o.staging_bytes = 4 << 20;
    o.history_pool_bytes = std::uint64_t{Concurrency()} * (9 << 20);
    o.max_context_tokens = kTokens;
    // A cut link shows as a hung connection: these bound how long the client
    // waits for a call or a transfer before it falls back.
    o.rpc_timeout = std::chrono::milliseconds(1500);
    o.transfer_timeout = std::chrono::milliseconds(3000);
    o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
      const auto start = Clock::now();
      const std::uint64_t bytes = *model_.BlockBytes();
      std::vector<BlockKey> chain;
      {
        std::lock_guard<std::mutex> l(chains_mu_);
        auto it = chain_of_context_.find(r.context);
        if (it == chain_of_context_.end()) return Status::Internal("prefill of an unknown context");
        chain = it->second;
      }
      for (std::uint32_t i = 0; i < r.block_count; ++i) {
        KVF_RETURN_IF_ERROR(Expected(chain, r.first_block + i, out.subspan(i * bytes, bytes)));
      }
      std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<std::int64_t>(
                                                kPrefillUsPerToken * r.tokens)));
      return Status::OK();
    };
    o.prefill = RecomputeParameters{0.0, kPrefillUsPerToken, 0.0};
    return Client::Open(std::move(o));
  }

  Status Expected(const std::vector<BlockKey>& chain, std::uint32_t block,
                  std::span<std::byte> out) {
    return client::SyntheticKv(model_, client::SeedFromKey(chain[block], seed_), 16, out);
  }

  std::vector<BlockKey> ChainOf(std::uint64_t salt, std::uint32_t tokens) {
    std::vector<std::uint32_t> ids(tokens);
    std::mt19937_64 rng(seed_ ^ (salt * 0x9e3779b97f4a7c15ull));
    for (std::uint32_t& t : ids) t = static_cast<std::uint32_t>(rng() % 128000);
    auto keys = client_->KeyTokens(ids);
    return keys.ok() ? *keys : std::vector<BlockKey>{};
  }

  std::vector<v1::HostStatus> Hosts() {
    v1::ListHostsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!stub_->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return {};
    return {resp.hosts().begin(), resp.hosts().end()};
  }
  bool Listed(const std::string& host) {
    for (const v1::HostStatus& h : Hosts()) {
      if (h.host().host_id() == host) return true;
    }
    return false;
  }
  std::uint64_t DirectoryBlocks(const std::string& host) {
    for (const v1::HostStatus& h : Hosts()) {
      if (h.host().host_id() == host) return h.directory_blocks();
    }
    return 0;
  }

  struct Served {
    Status status;
    std::string kind;
    std::uint32_t cached_prefix_blocks = 0;
    std::map<std::string, std::uint32_t> fetched_by_host;  // planned fetch runs' blocks
    ContextReport report;
    double seconds = 0;
    int wrong_blocks = 0;
  };

  // One request: match, load (prefilling what is not fetched), check every
  // byte, save every layer, finish.
  Served Serve() { return Serve(chain_); }
  Served Serve(const std::vector<BlockKey>& chain) {
    Served out;
    const auto start = Clock::now();
    auto match = client_->Match(chain, 0);
    if (!match.ok()) {
      out.status = match.status();
      return out;
    }
    out.kind = match->kind;
    out.cached_prefix_blocks = match->cached_prefix_blocks;
    for (const auto& run : match->runs) {
      if (run.fetch && run.host < match->hosts.size()) {
        out.fetched_by_host[match->hosts[run.host].host_id] += run.block_count;
      }
    }
    auto ctx = client_->NewContext(static_cast<std::uint32_t>(chain.size() * 16));
    if (!ctx.ok()) {
      out.status = ctx.status();
      return out;
    }
    {
      std::lock_guard<std::mutex> l(chains_mu_);
      chain_of_context_[*ctx] = chain;
    }
    Status s = client_->Load(*match, *ctx);
    for (std::uint32_t l = 0; s.ok() && l < model_.layer_count; ++l)
      s = client_->WaitLayer(*ctx, l);
    if (s.ok()) {
      auto history = client_->History(*ctx);
      s = history.status();
      const std::uint64_t bytes = *model_.BlockBytes();
      std::vector<std::byte> want(bytes);
      for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
        s = Expected(chain, b, want);
        if (s.ok() && std::memcmp(want.data(), history->block(b).data(), bytes) != 0) {
          ++out.wrong_blocks;
        }
      }
    }
    for (std::uint32_t l = 0; s.ok() && l < model_.layer_count; ++l) {
      s = client_->Save(*ctx, l, 0, chain);
    }
    Status finished = client_->Finish(*ctx, &out.report);
    {
      std::lock_guard<std::mutex> l(chains_mu_);
      chain_of_context_.erase(*ctx);
    }
    out.status = s.ok() ? finished : s;
    out.seconds = Seconds(Clock::now() - start);
    return out;
  }

  static std::uint32_t Fetched(const Served& s, const std::string& host) {
    auto it = s.fetched_by_host.find(host);
    return it == s.fetched_by_host.end() ? 0 : it->second;
  }

  static void Print(const char* what, const Served& s) {
    std::string hosts;
    for (const auto& [h, n] : s.fetched_by_host) hosts += " " + h + ":" + std::to_string(n);
    std::uint32_t from_replica = 0, recomputed_after_failure = 0, failed_runs = 0;
    for (const client::RunOutcome& r : s.report.runs) {
      from_replica += r.blocks_from_fallback_host;
      recomputed_after_failure += r.blocks_recomputed_after_failure;
      failed_runs += r.failure.empty() ? 0 : 1;
    }
    std::printf(
        "%-26s %-14s cached %3u, fetch plan{%s }, fetched %u, recomputed %u (%u after "
        "a failure), from replica %u, failed runs %u, %.3f s, %s\n",
        what, s.kind.c_str(), s.cached_prefix_blocks, hosts.c_str(), s.report.blocks_fetched,
        s.report.blocks_recomputed, recomputed_after_failure, from_replica, failed_runs, s.seconds,
        s.status.ToString().c_str());
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  ModelFingerprint model_ = TestModel();
  std::unique_ptr<testing::NetnsCluster> net_;
  std::string placement_address_;
  std::unique_ptr<testing::ServerProcess> placement_;
  std::map<std::string, std::unique_ptr<testing::ServerProcess>> daemons_;
  std::unique_ptr<v1::Placement::Stub> stub_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<Client> client_;
  std::vector<BlockKey> chain_;
  std::mutex chains_mu_;
  std::map<client::ContextId, std::vector<BlockKey>> chain_of_context_;
};

TEST_F(NetworkFaultTest, DaemonPartitionedMidLoadFallsBackExactlyAndRejoinsOnHeal) {
  const Served first = Serve();  // prefill and write back across both daemons
  Print("prefill + save", first);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  ASSERT_TRUE(
      WaitFor([&] { return DirectoryBlocks("cache-a") > 0 && DirectoryBlocks("cache-b") > 0; },
              std::chrono::seconds(10)));
  const std::uint64_t on_a = DirectoryBlocks("cache-a");
  std::printf("directory: cache-a %llu blocks, cache-b %llu blocks\n",
              static_cast<unsigned long long>(on_a),
              static_cast<unsigned long long>(DirectoryBlocks("cache-b")));

  // Cut cache-a while the next load is fetching from it: its link is slowed
  // to 10 Mbit/s first (the model does not know yet, so the plan still
  // fetches there; its ~4 MiB then take ~3 s), and cut 400 ms in.
  ASSERT_TRUE(net_->RateLimit("cache-a", 10'000'000).ok());
  auto load = std::async(std::launch::async, [&] { return Serve(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto cut = Clock::now();
  ASSERT_TRUE(net_->Partition("cache-a").ok());
  const Served during = load.get();
  ASSERT_TRUE(net_->RateLimit("cache-a", 0).ok());
  Print("cache-a cut mid-load", during);
  EXPECT_GT(Fetched(during, "cache-a"), 0u) << "the plan did not fetch from cache-a";
  std::uint32_t recovered = 0;
  for (const client::RunOutcome& r : during.report.runs) {
    recovered += r.blocks_recomputed_after_failure + r.blocks_from_fallback_host;
  }
  EXPECT_GT(recovered, 0u) << "nothing fell back: the cut came after the load";
  EXPECT_EQ(during.wrong_blocks, 0);
  // Bounded by the client's deadlines (transfer_timeout 3 s), not by TCP's
  // own retransmission timeouts (minutes).
  EXPECT_LT(during.seconds, 15.0);
  EXPECT_TRUE(during.status.ok() || during.status.code() != StatusCode::kDataLoss)
      << during.status.ToString();

  // Placement stops hearing cache-a and drops it; plans route around it.
  ASSERT_TRUE(WaitFor([&] { return !Listed("cache-a"); }, std::chrono::seconds(20)))
      << "placement still lists cache-a";
  std::printf("placement dropped cache-a %.2f s after the cut (membership TTL %llds)\n",
              Seconds(Clock::now() - cut), static_cast<long long>(kMembershipTtl.count()));
  const Served around = Serve();
  Print("cache-a gone", around);
  EXPECT_TRUE(around.status.ok()) << around.status.ToString();
  EXPECT_EQ(around.wrong_blocks, 0);
  EXPECT_EQ(around.fetched_by_host.count("cache-a"), 0u) << "a plan fetched from cache-a";

  // Heal: cache-a registers again and its full report restores its blocks.
  const auto healed = Clock::now();
  ASSERT_TRUE(net_->Heal("cache-a").ok());
  ASSERT_TRUE(WaitFor([&] { return DirectoryBlocks("cache-a") == on_a; }, std::chrono::seconds(30)))
      << "cache-a did not rejoin with its " << on_a << " blocks (now " << DirectoryBlocks("cache-a")
      << ")";
  std::printf("cache-a rejoined with %llu directory blocks %.2f s after the heal\n",
              static_cast<unsigned long long>(DirectoryBlocks("cache-a")),
              Seconds(Clock::now() - healed));
  const Served after = Serve();
  Print("healed", after);
  EXPECT_TRUE(after.status.ok()) << after.status.ToString();
  EXPECT_EQ(after.wrong_blocks, 0);
  // The directory holds exactly what cache-a kept (its full report), no more
  // and no less: nothing was written to it while it was away.
  EXPECT_EQ(DirectoryBlocks("cache-a"), on_a);
}

TEST_F(NetworkFaultTest, PlacementPartitionedFromTheClientMeansLocalRecomputeUntilItReturns) {
  const Served first = Serve();
  Print("prefill + save", first);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  ASSERT_TRUE(net_->Partition("placement").ok());
  const client::ClientMetrics m0 = client_->metrics();
  const Served cut = Serve();
  Print("placement cut", cut);
  EXPECT_EQ(cut.kind, "recompute_all");
  EXPECT_EQ(cut.wrong_blocks, 0);
  // The load is exact; the write-back cannot be placed and Finish says so,
  // at once: one Plan waits rpc_timeout, then placement is backed off and the
  // 16 Place batches are not each another rpc_timeout.
  EXPECT_TRUE(cut.status.ok() || cut.status.code() == StatusCode::kUnavailable ||
              cut.status.code() == StatusCode::kDeadlineExceeded)
      << cut.status.ToString();
  EXPECT_LT(cut.seconds, 6.0);
  const client::ClientMetrics m1 = client_->metrics();
  std::printf(
      "while cut: %llu placement calls skipped by the backoff, %llu local plans\n",
      static_cast<unsigned long long>(m1.placement_calls_skipped - m0.placement_calls_skipped),
      static_cast<unsigned long long>(m1.placement_unavailable - m0.placement_unavailable));
  EXPECT_GT(m1.placement_calls_skipped, m0.placement_calls_skipped);

  const auto healed = Clock::now();
  ASSERT_TRUE(net_->Heal("placement").ok());
  // Placement may have expired the daemons meanwhile; they register again and
  // report in full, and plans fetch again.
  Served back;
  ASSERT_TRUE(WaitFor(
      [&] {
        back = Serve();
        return back.status.ok() && back.cached_prefix_blocks > 0;
      },
      std::chrono::seconds(40)))
      << "plans never fetched again";
  Print("placement back", back);
  std::printf("fetching again %.2f s after the heal\n", Seconds(Clock::now() - healed));
  EXPECT_EQ(back.wrong_blocks, 0);
}

// Four engines keep asking for plans while placement is cut off for 12 s:
// each tries placement, waits rpc_timeout (1.5 s), then backs off (1 s
// doubling, jittered) and plans locally without calling; the RPCs they make
// stay a handful each instead of one per Match, and all plan through
// placement again after the heal.
TEST_F(NetworkFaultTest, EnginesBackOffAPartitionedPlacementInsteadOfStampeding) {
  constexpr int kEngines = 4;
  constexpr auto kOutage = std::chrono::seconds(12);
  std::vector<std::unique_ptr<gpu::Device>> devices(kEngines);
  std::vector<std::unique_ptr<Client>> engines;
  for (int i = 0; i < kEngines; ++i) {
    auto c = NewClient(&devices[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    engines.push_back(std::move(*c));
  }
  ASSERT_TRUE(net_->Partition("placement").ok());
  std::vector<client::ClientMetrics> before, after;
  for (const auto& e : engines) before.push_back(e->metrics());
  const auto end = Clock::now() + kOutage;
  std::vector<std::thread> threads;
  for (auto& e : engines) {
    threads.emplace_back([&, c = e.get()] {
      while (Clock::now() < end) {
        (void)c->Match(chain_, 0);  // no context: only Plan calls, no Place
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& e : engines) after.push_back(e->metrics());
  ASSERT_TRUE(net_->Heal("placement").ok());
  std::uint64_t total_matches = 0, total_calls = 0;
  for (int i = 0; i < kEngines; ++i) {
    const auto& b = before[static_cast<std::size_t>(i)];
    const auto& a = after[static_cast<std::size_t>(i)];
    const std::uint64_t matches = a.matches - b.matches;
    const std::uint64_t skipped = a.placement_calls_skipped - b.placement_calls_skipped;
    const std::uint64_t local = a.placement_unavailable - b.placement_unavailable;
    const std::uint64_t calls = local - skipped;  // Plan calls made, each failed
    std::printf(
        "engine %d: %llu matches in %lld s of outage, %llu planned locally, %llu Plan "
        "calls made, %llu skipped by the backoff\n",
        i, static_cast<unsigned long long>(matches), static_cast<long long>(kOutage.count()),
        static_cast<unsigned long long>(local), static_cast<unsigned long long>(calls),
        static_cast<unsigned long long>(skipped));
    EXPECT_EQ(local, matches);
    // Attempts at 0, then ~1, 2, 4 s (jittered) after each failure, each
    // failing after 1.5 s: about 4 in 12 s. Without the backoff a call per
    // Match would go out: ~8 here, hundreds with a faster rpc_timeout.
    EXPECT_LE(calls, 6u) << "engine " << i;
    EXPECT_GE(calls, 1u) << "engine " << i;
    total_matches += matches;
    total_calls += calls;
  }
  std::printf("%d engines: %llu matches, %llu Plan calls to the partitioned placement (%.1f%%)\n",
              kEngines, static_cast<unsigned long long>(total_matches),
              static_cast<unsigned long long>(total_calls),
              100.0 * static_cast<double>(total_calls) / static_cast<double>(total_matches));
  // After the heal every engine plans through placement again (its backoff
  // expires within 30 s at most; here within the next few seconds).
  for (int i = 0; i < kEngines; ++i) {
    Client* c = engines[static_cast<std::size_t>(i)].get();
    EXPECT_TRUE(WaitFor(
        [&] {
          const std::uint64_t local = c->metrics().placement_unavailable;
          (void)c->Match(chain_, 0);
          return c->metrics().placement_unavailable == local;
        },
        std::chrono::seconds(40)))
        << "engine " << i << " never planned through placement again";
  }
}

TEST_F(NetworkFaultTest, SlowLinkShiftsPlansAwayFromThatDaemon) {
  const Served first = Serve();
  Print("prefill + save", first);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  ASSERT_TRUE(WaitFor([&] { return DirectoryBlocks("cache-a") > 0; }, std::chrono::seconds(10)));
  const Served before = Serve();
  Print("before the cap", before);
  ASSERT_TRUE(before.status.ok());
  EXPECT_GT(Fetched(before, "cache-a"), 0u);

  ASSERT_TRUE(net_->RateLimit("cache-a", 20'000'000).ok());  // 20 Mbit/s
  std::vector<Served> after;
  for (int i = 0; i < 8; ++i) {
    after.push_back(Serve());
    Print(("capped, request " + std::to_string(i + 1)).c_str(), after.back());
    EXPECT_TRUE(after.back().status.ok()) << after.back().status.ToString();
    EXPECT_EQ(after.back().wrong_blocks, 0);
    if (Fetched(after.back(), "cache-a") * 10 <= Fetched(before, "cache-a")) break;
  }
  // The model rescaled cache-a's path: plans fetch at most a tenth of what
  // they did (a run's first block may still come from it).
  EXPECT_LE(Fetched(after.back(), "cache-a") * 10, Fetched(before, "cache-a"))
      << "after " << after.size() << " requests plans still fetch from the capped daemon";
  ASSERT_TRUE(net_->RateLimit("cache-a", 0).ok());
}

// Daemons whose host pools (2 MiB) are far smaller than what the load writes,
// over NVMe tiers: blocks are demoted while the clients run.
class DaemonKillTest : public NetworkFaultTest {
 protected:
  std::vector<std::string> TierFlags(const std::string& host) override {
    return {"--host-pool-bytes=2MiB", "--nvme-dir=" + dir_ + "/" + host + "-nvme",
            "--nvme-capacity-bytes=256MiB", "--nvme-segment-bytes=32MiB",
            "--nvme-io-engine=threads"};
  }
  std::uint32_t Concurrency() override { return 4; }

  // The keys of `keys` cache-a holds on NVMe (what it acknowledged durable).
  std::vector<std::string> OnNvme(const std::vector<std::string>& keys) {
    auto stub = v1::CacheHost::NewStub(grpc::CreateChannel(net_->Address("cache-a") + ":7440",
                                                           grpc::InsecureChannelCredentials()));
    v1::LookupRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::vector<std::string> out;
    if (!stub->Lookup(&ctx, req, &resp).ok()) return out;
    for (int i = 0; i < resp.results_size() && i < static_cast<int>(keys.size()); ++i) {
      if (resp.results(i).status().code() == 0 && resp.results(i).tier() == v1::TIER_NVME) {
        out.push_back(keys[static_cast<std::size_t>(i)]);
      }
    }
    return out;
  }
};

// SIGKILL of cache-a at 20 seeded moments while 4 contexts load and save
// (reads, writes and demotions in flight), every fifth time once more while
// it recovers its NVMe tier at start-up: clients fall back and stay exact;
// every block cache-a reported on NVMe before a kill is there after the
// restart (none lost), and nothing reads back corrupt.
TEST_F(DaemonKillTest, SigkillsUnderLoadLoseNoDemotedBlockAndServeNothingCorrupt) {
  constexpr int kChains = 8;
  constexpr std::uint32_t kChainTokens = 1024;  // 64 blocks, 2 MiB each chain
  constexpr int kKills = 20;
  std::vector<std::vector<BlockKey>> chains;
  std::vector<std::string> all_keys;
  for (int c = 0; c < kChains; ++c) {
    chains.push_back(ChainOf(100 + c, kChainTokens));
    ASSERT_EQ(chains.back().size(), kChainTokens / 16);
    for (const BlockKey& k : chains.back()) {
      all_keys.emplace_back(reinterpret_cast<const char*>(k.bytes().data()), k.bytes().size());
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, wrong_blocks{0};
  std::mutex errors_mu;
  std::map<std::string, int> errors;  // by code
  std::vector<std::thread> load;
  for (std::uint32_t t = 0; t < Concurrency(); ++t) {
    load.emplace_back([&, t] {
      std::mt19937_64 rng(seed_ + t);
      while (!stop.load()) {
        const Served r = Serve(chains[rng() % kChains]);
        served.fetch_add(1);
        wrong_blocks.fetch_add(r.wrong_blocks);
        if (!r.status.ok()) {
          std::lock_guard<std::mutex> l(errors_mu);
          ++errors[std::string(StatusCodeName(r.status.code()))];
        }
      }
    });
  }
  std::mt19937_64 rng(seed_);
  std::uint64_t acknowledged = 0, recovered = 0, lost = 0;
  int recovery_kills = 0;
  const auto start = Clock::now();
  for (int k = 0; k < kKills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
    const std::vector<std::string> before = OnNvme(all_keys);
    daemons_["cache-a"]->Kill(SIGKILL);
    if (k % 5 == 4) {
      // Started and killed again before it is ready: mid-recovery.
      auto early = net_->StartIn("cache-a", testing::ServerBinary("KVF_CACHED", "kvfabric-cached"),
                                 "cache-a-early", dir_, DaemonFlags("cache-a"),
                                 std::chrono::milliseconds(100 + rng() % 200));
      if (!early.ok()) ++recovery_kills;  // its destructor SIGKILLed it, not ready yet
    }
    ASSERT_NO_FATAL_FAILURE(StartDaemon("cache-a"));
    const std::vector<std::string> after = OnNvme(before);
    acknowledged += before.size();
    recovered += after.size();
    lost += before.size() - after.size();
  }
  stop = true;
  for (std::thread& t : load) t.join();
  const double seconds = Seconds(Clock::now() - start);

  // With both daemons up, every chain loads exactly (what is cached is fetched
  // and checked against its CRC, the rest recomputed).
  ASSERT_TRUE(WaitFor([&] { return Listed("cache-a"); }, std::chrono::seconds(20)));
  for (const auto& chain : chains) {
    const Served r = Serve(chain);
    EXPECT_EQ(r.wrong_blocks, 0);
  }
  const std::uint64_t corrupt = client_->metrics().crc_failures;
  std::string by_code;
  for (const auto& [code, n] : errors) by_code += " " + code + ":" + std::to_string(n);
  std::printf(
      "%d kills of cache-a (%d more mid-recovery) in %.1f s under %u contexts: %d "
      "requests served, errors by code {%s }, wrong blocks %d; blocks on NVMe before the "
      "kills %llu, after the restarts %llu, lost %llu, corrupt %llu\n",
      kKills, recovery_kills, seconds, Concurrency(), served.load(), by_code.c_str(),
      wrong_blocks.load(), static_cast<unsigned long long>(acknowledged),
      static_cast<unsigned long long>(recovered), static_cast<unsigned long long>(lost),
      static_cast<unsigned long long>(corrupt));
  EXPECT_GT(acknowledged, 0u) << "nothing was on NVMe: the kills tested no recovery";
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(corrupt, 0u);
  EXPECT_EQ(wrong_blocks.load(), 0);
  EXPECT_GT(served.load(), kKills);
}

}  // namespace
}  // namespace kvfabric
