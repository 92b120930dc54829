// The parallel, one-copy load path under faults (issue 22's correctness
// bar): eight engine threads load, check and save their histories through two
// in-process daemons at once, while one daemon flips a bit in one of every
// few blocks it pushes (transport/testing/fault_injection_transport.h on its
// data plane, so the client receives a corrupted block whose stored copy is
// intact) and the other is killed midway. Every corrupted block is caught by
// its CRC where it landed and falls back; no load returns a wrong byte; the
// loads go on. And a daemon whose pushes all complete late has its stream cut
// once its layer 0 shows it would end far past its prediction, before its
// later layers are asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "client/kvfabric_client.h"
#include "core/testing/test_seed.h"
#include "core/units.h"
#include "server/embedded_cluster.h"
#include "tests/test_engine.h"
#include "transport/testing/fault_injection_transport.h"

namespace kvfabric {
namespace {

using client::Client;
using client::ContextId;
using client::ContextReport;

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
      // Gated (the layer test): a fallback recompute (of blocks the plan
      // fetched) of context r.context waits until its engine read layer 0. If WaitLayer(0) waited
      // for this recompute, the two would wait for each other: the gate gives up after 20 s and
      // counts it.
      std::unique_lock<std::mutex> g(gate_mu_);
      auto planned = planned_fetch_.find(r.context);
      const bool fallback = planned != planned_fetch_.end() &&
                            r.first_block + r.block_count <= planned->second.size() &&
                            std::all_of(planned->second.begin() + r.first_block,
                                        planned->second.begin() + r.first_block + r.block_count,
                                        [](bool f) { return f; });
      if (gate_ && fallback) {
        if (gate_cv_.wait_for(g, std::chrono::seconds(20),
                              [&] { return layer0_read_.count(r.context) != 0; })) {
          ++gated_recomputes_;
        } else {
          ++gate_timeouts_;
        }
      }
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

  // Whether layer `layer` of block `b` of the history holds the engine's bytes.
  bool LayerIntact(ContextId ctx, const BlockKey& key, std::uint32_t b, std::uint32_t layer) {
    auto payload = client_->BlockPayload(ctx, b);
    if (!payload.ok()) return false;
    const std::uint64_t layer_bytes = block_bytes_ / model_.layer_count;
    for (std::uint64_t off = layer * layer_bytes; off + 8 <= (layer + 1) * layer_bytes; off += 8) {
      std::uint64_t w;
      std::memcpy(&w, payload->data() + off, 8);
      if (w != Word(key, off)) return false;
    }
    return true;
  }

  // One engine request: match (the plan changed by `edit`, if given), load,
  // check every byte, save, finish (its report in *report, if given).
  Status Serve(const std::vector<BlockKey>& chain,
               const std::function<void(client::MatchResult*)>& edit = {},
               ContextReport* report_out = nullptr) {
    KVF_ASSIGN_OR_RETURN(client::MatchResult match, client_->Match(chain, 0));
    if (edit) edit(&match);
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
    if (report.ok() && report_out != nullptr) *report_out = *report;
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
  // The layer test's gate (see the recompute callback).
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool gate_ = false;
  std::set<ContextId> layer0_read_;
  std::map<ContextId, std::vector<bool>> planned_fetch_;  // per block: the plan fetches it
  int gated_recomputes_ = 0, gate_timeouts_ = 0;
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

// Issue 22's layer-by-layer bar: the daemon corrupts pushes of later layer
// groups only (layer 0's pushes are one layer slice, shorter than the
// corruption's minimum), so some blocks' layers 1.. fail their layer CRC
// while their layer 0 landed. Each engine reads layer 0 of every block as
// soon as WaitLayer(0) returns, before the corrupted blocks' fallback
// recomputes may run (the recompute callback waits for that read): layer 0
// must not wait for them, must already hold the right bytes, and must keep
// them while the fallback writes the missing layers.
TEST_F(ClientFaultInjectionTest, ACorruptedLayerSliceFallsBackWithoutHoldingUpLayerZero) {
  constexpr int kEngines = 4;
  std::vector<std::vector<BlockKey>> chains;
  for (int t = 0; t < kEngines; ++t) chains.push_back(ChainOf(100 + t));
  for (int t = 0; t < kEngines; ++t) ASSERT_TRUE(Serve(chains[t]).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));

  const std::uint64_t layer_bytes = block_bytes_ / model_.layer_count;
  ASSERT_GE(model_.layer_count, 3u) << "needs later layer groups longer than one slice";
  transport::FaultRates rates;
  rates.corrupt_write_one_in = 3;
  rates.corrupt_write_min_bytes = 2 * layer_bytes;
  faults_->SetRates(rates);
  {
    std::lock_guard<std::mutex> g(gate_mu_);
    gate_ = true;
  }
  std::atomic<int> layer0_wrong{0}, layer0_changed{0};
  auto serve = [&](int t, int) {
    const std::vector<BlockKey>& chain = chains[t];
    auto match = client_->Match(chain, 0);
    if (!match.ok()) return std::vector<Status>{match.status()};
    auto ctx = client_->NewContext(kContextTokens);
    if (!ctx.ok()) return std::vector<Status>{ctx.status()};
    {
      std::lock_guard<std::mutex> l(mu_);
      chains_[*ctx] = chain;
    }
    {
      std::lock_guard<std::mutex> g(gate_mu_);
      layer0_read_.erase(*ctx);  // ids of finished contexts are reused
      std::vector<bool>& planned = planned_fetch_[*ctx];
      planned.assign(chain.size(), false);
      for (const client::MatchResult::Run& run : match->runs) {
        for (std::uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
          planned[b] = run.fetch;
        }
      }
    }
    Status s = client_->Load(*match, *ctx);
    if (s.ok()) s = client_->WaitLayer(*ctx, 0);
    std::vector<std::uint32_t> checked;
    for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
      if (LayerIntact(*ctx, chain[b], b, 0)) {
        checked.push_back(b);
      } else {
        layer0_wrong.fetch_add(1);
      }
    }
    {
      std::lock_guard<std::mutex> g(gate_mu_);
      layer0_read_.insert(*ctx);
    }
    gate_cv_.notify_all();
    for (std::uint32_t l = 1; s.ok() && l < model_.layer_count; ++l) {
      s = client_->WaitLayer(*ctx, l);
    }
    for (std::uint32_t b = 0; s.ok() && b < chain.size(); ++b) {
      for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
        if (!LayerIntact(*ctx, chain[b], b, l)) {
          (l == 0 ? layer0_changed : wrong_blocks_).fetch_add(1);
        }
      }
    }
    auto report = client_->Finish(*ctx);
    if (s.ok() && !report.ok()) s = report.status();
    return std::vector<Status>{s};
  };
  const testing::ServedCounts n = testing::RunEngineThreads(kEngines, 2, serve, [] {});
  faults_->SetRates({});
  int gated, timeouts;
  {
    std::lock_guard<std::mutex> g(gate_mu_);
    gate_ = false;
    gated = gated_recomputes_;
    timeouts = gate_timeouts_;
  }
  const client::ClientMetrics m = client_->metrics();
  const transport::FaultInjectionCounters fc = faults_->counters();
  std::printf(
      "served %d OK, %d failed; corrupted later-layer pushes %llu; CRC failures %llu; blocks "
      "fallen back %llu; fallback recomputes that ran after their engine read layer 0: %d; "
      "that layer 0 waited for: %d\n",
      n.ok, n.failed, static_cast<unsigned long long>(fc.corrupted_writes),
      static_cast<unsigned long long>(m.crc_failures),
      static_cast<unsigned long long>(m.blocks_fallen_back), gated, timeouts);
  EXPECT_GT(fc.corrupted_writes, 0u) << "nothing was corrupted: the test proves nothing";
  EXPECT_GT(m.crc_failures, 0u);
  EXPECT_GT(gated, 0) << "no fallback recompute ran: the test proves nothing";
  EXPECT_EQ(timeouts, 0) << "WaitLayer(0) waited for a later layer's fallback";
  EXPECT_EQ(layer0_wrong.load(), 0) << "WaitLayer(0) returned before layer 0 was right";
  EXPECT_EQ(layer0_changed.load(), 0) << "a fallback rewrote layer 0 after it was ready";
  EXPECT_EQ(wrong_blocks_.load(), 0) << "a load returned wrong bytes";
  EXPECT_EQ(n.ok, kEngines * 2);
}

// Every push of one daemon completes 250 ms late (a link far slower than
// placement knew), and the plan predicts each stream to end after 100 ms:
// cut-off 4 x 100 + 50 = 450 ms. That daemon's layer 0 (a quarter of its
// bytes: four layers) is answered after about 250 ms, past the stream's whole
// predicted time, and at that rate its stream would end after about 1 s: it
// is cut there, having moved exactly layer 0, instead of at 450 ms with its
// later layers' requests on the slow link. The other daemon's stream goes on;
// every byte the engine reads is right (the cut blocks are recomputed).
TEST_F(ClientFaultInjectionTest, AStreamWhoseLayerZeroProjectsItFarPastItsCutOffStopsThere) {
  const std::vector<BlockKey> chain = ChainOf(200);
  ASSERT_TRUE(Serve(chain).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  transport::FaultRates rates;
  rates.delay_one_in = 1;
  rates.delay = std::chrono::milliseconds(250);
  faults_->SetRates(rates);
  const client::ClientMetrics before = client_->metrics();
  std::uint32_t slow_blocks = 0;
  ContextReport report;
  const Status s = Serve(
      chain,
      [&slow_blocks](client::MatchResult* m) {
        for (client::MatchResult::Run& run : m->runs) {
          if (!run.fetch) continue;
          run.predicted_end_us = 100e3;
          if (m->hosts[run.host].host_id == "corrupting") slow_blocks += run.block_count;
        }
      },
      &report);
  faults_->SetRates({});
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_GT(slow_blocks, 0u) << "the plan fetched nothing from the slow daemon";
  const client::ClientMetrics after = client_->metrics();
  const std::uint64_t layer_bytes = block_bytes_ / model_.layer_count;
  const std::string moved = FormatBytes(std::uint64_t{slow_blocks} * layer_bytes) + " of " +
                            FormatBytes(std::uint64_t{slow_blocks} * block_bytes_) + " moved";
  for (const client::RunOutcome& run : report.runs) {
    if (!run.fetch) continue;
    if (run.host_id == "corrupting") {
      EXPECT_NE(run.failure.find("would end at"), std::string::npos) << run.failure;
      EXPECT_NE(run.failure.find(moved), std::string::npos)
          << run.failure << "\n(expected exactly layer 0: " << moved << ")";
      EXPECT_EQ(run.blocks_recomputed_after_failure + run.blocks_from_fallback_host,
                run.block_count);
    } else {
      EXPECT_EQ(run.failure, "") << "the other daemon's stream was cut too";
    }
  }
  EXPECT_EQ(after.streams_cut_projected - before.streams_cut_projected, 1u);
  EXPECT_EQ(after.streams_cut_past_cut_off, before.streams_cut_past_cut_off);
  EXPECT_EQ(wrong_blocks_.load(), 0) << "a load returned wrong bytes";
}

}  // namespace
}  // namespace kvfabric
