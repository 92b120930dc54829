// The parallel, one-copy load path under faults (issue 22's correctness
// bar): eight engine threads load, check and save their histories through two
// in-process daemons at once, while one daemon flips a bit in one of every
// few blocks it pushes (transport/testing/fault_injection_transport.h on its
// data plane, so the client receives a corrupted block whose stored copy is
// intact) and the other is killed midway. Every corrupted block is caught by
// its CRC where it landed and falls back; no load returns a wrong byte; the
// loads go on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client/kvfabric_client.h"
#include "core/testing/test_seed.h"
#include "server/embedded_cluster.h"
#include "tests/test_engine.h"
#include "transport/testing/fault_injection_transport.h"

namespace kvfabric {
namespace {

using client::Client;
using client::ContextId;

constexpr int kThreads = 8;
constexpr int kRounds = 3;
constexpr std::uint32_t kContextTokens = 512;  // 32 blocks of 32 KiB

// What the "engine" writes for a block: a word per 8 bytes derived from the
// block's key and the offset, so a block from the wrong place, torn, or with
// a flipped bit is seen.
std::uint64_t Word(const BlockKey& key, std::uint64_t offset) {
  std::uint64_t k;
  std::memcpy(&k, key.bytes().data(), 8);
  return (k * 0x9e3779b97f4a7c15ull) ^ (offset * 0xbf58476d1ce4e5b9ull);
}

class ClientFaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed("ClientFaultInjectionTest");
    model_ = testing::SyntheticTestModel("client-fault-injection");
    block_bytes_ = *model_.BlockBytes();
    server::EmbeddedClusterOptions co;
    for (int i = 0; i < 2; ++i) {
      server::EmbeddedDaemonOptions d;
      d.host_id = i == 0 ? "corrupting" : "dying";
      d.host_pool_bytes = 64 << 20;
      d.host_page_bytes = 32 << 10;
      d.data_transport = "tcp";
      d.metrics = false;
      if (i == 0) {
        d.wrap_transport = [this](std::unique_ptr<transport::Transport> base) {
          transport::FaultInjectionOptions o;
          o.seed = seed_;
          auto wrapped = std::make_unique<transport::FaultInjectionTransport>(std::move(base), o);
          faults_ = wrapped.get();
          return std::unique_ptr<transport::Transport>(std::move(wrapped));
        };
      }
      co.daemons.push_back(std::move(d));
    }
    co.placement_metrics = false;
    auto cluster = server::EmbeddedCluster::StartDaemons(co);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(cluster).value();
    ASSERT_TRUE(cluster_->StartPlacement({}).ok());
    ASSERT_NE(faults_, nullptr);

    auto device = testing::CreateTestDevice(model_, model_.kv_heads, 64, 2 * kThreads);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device->device);
    client::ClientOptions o;
    o.placement_address = cluster_->placement_address();
    o.security.insecure = true;
    o.model = model_;
    o.device = device_.get();
    o.num_q_heads = model_.kv_heads;
    o.data_transport = "tcp";
    o.tile_tokens = 64;
    o.staging_bytes = 1 << 20;
    o.history_pool_bytes = std::uint64_t{kThreads} * (kContextTokens / 16) * block_bytes_;
    o.max_context_tokens = kContextTokens;
    o.rpc_timeout = std::chrono::milliseconds(2000);
    o.transfer_timeout = std::chrono::milliseconds(3000);
    // A prefill far slower than a fetch (stated and spent), so plans fetch.
    o.prefill = RecomputeParameters{0.0, 20.0, 0.0, 0.0};
    o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
      std::vector<BlockKey> chain;
      {
        std::lock_guard<std::mutex> l(mu_);
        chain = chains_.at(r.context);
      }
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::microseconds(static_cast<std::int64_t>(20 * r.tokens));
      for (std::uint32_t i = 0; i < r.block_count; ++i) {
        for (std::uint64_t off = 0; off + 8 <= block_bytes_; off += 8) {
          const std::uint64_t w = Word(chain[r.first_block + i], off);
          std::memcpy(out.data() + std::uint64_t{i} * block_bytes_ + off, &w, 8);
        }
      }
      std::this_thread::sleep_until(until);
      return Status::OK();
    };
    auto c = Client::Open(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }

  void TearDown() override {
    client_.reset();
    cluster_.reset();
  }

  std::vector<BlockKey> ChainOf(std::uint64_t salt) {
    std::mt19937_64 rng(seed_ ^ (salt * 0x9e3779b97f4a7c15ull));
    std::vector<std::uint32_t> ids(kContextTokens);
    for (std::uint32_t& t : ids) t = static_cast<std::uint32_t>(rng() % 128000);
    auto keys = client_->KeyTokens(ids);
    return keys.ok() ? *keys : std::vector<BlockKey>{};
  }

  // One engine request: match, load, check every byte, save, finish.
  Status Serve(const std::vector<BlockKey>& chain) {
    KVF_ASSIGN_OR_RETURN(client::MatchResult match, client_->Match(chain, 0));
    KVF_ASSIGN_OR_RETURN(ContextId ctx, client_->NewContext(kContextTokens));
    {
      std::lock_guard<std::mutex> l(mu_);
      chains_[ctx] = chain;
    }
    Status s = client_->Load(match, ctx);
    for (std::uint32_t l = 0; s.ok() && l < model_.layer_count; ++l) s = client_->WaitLayer(ctx, l);
    for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
      auto payload = client_->BlockPayload(ctx, b);
      if (!payload.ok()) {
        s = payload.status();
        break;
      }
      for (std::uint64_t off = 0; off + 8 <= block_bytes_; off += 8) {
        std::uint64_t w;
        std::memcpy(&w, payload->data() + off, 8);
        if (w != Word(chain[b], off)) {
          wrong_blocks_.fetch_add(1);
          break;
        }
      }
    }
    for (std::uint32_t l = 0; s.ok() && l < model_.layer_count; ++l) {
      s = client_->Save(ctx, l, 0, chain);
    }
    auto report = client_->Finish(ctx);
    if (s.ok() && !report.ok()) s = report.status();
    if (report.ok()) fetched_.fetch_add(report->blocks_fetched);
    return s;
  }

  std::uint64_t seed_ = 0;
  ModelFingerprint model_;
  std::uint64_t block_bytes_ = 0;
  std::unique_ptr<server::EmbeddedCluster> cluster_;
  transport::FaultInjectionTransport* faults_ = nullptr;  // owned by daemon 0
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<Client> client_;
  std::mutex mu_;
  std::map<ContextId, std::vector<BlockKey>> chains_;
  std::atomic<int> wrong_blocks_{0};
  std::atomic<std::uint64_t> fetched_{0};
};

TEST_F(ClientFaultInjectionTest, CorruptedPushesAndADeadDaemonNeverYieldAWrongByte) {
  std::vector<std::vector<BlockKey>> chains;
  for (int t = 0; t < kThreads; ++t) chains.push_back(ChainOf(t + 1));
  // Every history prefilled and written back once, without faults.
  for (int t = 0; t < kThreads; ++t) ASSERT_TRUE(Serve(chains[t]).ok());
  // Let placement's directory learn them (daemons report on a heartbeat).
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));

  transport::FaultRates rates;
  rates.corrupt_write_one_in = 5;  // one in five blocks' pushes from "corrupting"
  faults_->SetRates(rates);
  const testing::ServedCounts n = testing::RunEngineThreads(
      kThreads, kRounds, [&](int t, int) { return std::vector<Status>{Serve(chains[t])}; },
      [&] { EXPECT_TRUE(cluster_->KillDaemon(1).ok()); });
  faults_->SetRates({});

  const client::ClientMetrics m = client_->metrics();
  const transport::FaultInjectionCounters fc = faults_->counters();
  std::printf(
      "served %d requests OK, %d reported a failure; %llu blocks fetched; corrupted "
      "pushes %llu; CRC failures caught %llu; blocks fallen back %llu; requests "
      "throttled %llu\n",
      n.ok, n.failed, static_cast<unsigned long long>(fetched_.load()),
      static_cast<unsigned long long>(fc.corrupted_writes),
      static_cast<unsigned long long>(m.crc_failures),
      static_cast<unsigned long long>(m.blocks_fallen_back),
      static_cast<unsigned long long>(m.fetch_requests_throttled));
  EXPECT_EQ(wrong_blocks_.load(), 0) << "a load returned wrong bytes";
  EXPECT_GT(fc.corrupted_writes, 0u) << "nothing was corrupted: the test proves nothing";
  EXPECT_GT(m.crc_failures, 0u) << "corrupted blocks were not caught by their CRC";
  EXPECT_GE(m.blocks_fallen_back, m.crc_failures > 0 ? 1u : 0u);
  EXPECT_GT(n.ok, 0);
  EXPECT_EQ(n.ok + n.failed, kThreads * kRounds);
}

}  // namespace
}  // namespace kvfabric
