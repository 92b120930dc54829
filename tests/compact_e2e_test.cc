// Compact copies end to end (issue 24, docs/compact.md): a real
// kvfabric-placement and a real kvfabric-cached with its background converter
// on (--compact-threads=1), this test process as the engine.
//
//   1. A 1,024-token history is prefilled and written back; the daemon gives
//      every block a compact_int8 copy, which placement then lists.
//   2. `exact` (the default): the plan fetches exact copies only, and every
//      byte equals the generator's.
//   3. `compact_after=256`: blocks ending 256 or more tokens before the end
//      land as compact copies (fewer bytes), the newest 16 exact; a compact
//      block decodes to within the codec's bound of the exact values, is
//      refused by BlockPayload and by Save (it is never written back as
//      exact).
//   4. The exact copies are deleted on the daemon, leaving the compact ones:
//      `exact` recomputes every block and receives nothing compact;
//      `compact_after=256` fetches the compact copies of the old blocks and
//      recomputes the newest.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "core/testing/test_seed.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/float_convert.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "tests/server_process.h"
#include "tests/test_engine.h"

namespace kvfabric {
namespace {

using client::Client;
using client::ContextId;
using client::ContextReport;

constexpr std::uint32_t kTokens = 1024;
constexpr std::uint32_t kBlocks = kTokens / 16;
constexpr std::uint32_t kQHeads = 4;
constexpr std::uint32_t kTileTokens = 256;
constexpr std::uint64_t kCompactAfter = 256;
constexpr std::uint32_t kCompactBlocks = (kTokens - kCompactAfter) / 16;  // blocks 0..47

class CompactEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    char tmpl[] = "/tmp/kvf_compact_e2e_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto p = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement", dir_,
        {"--insecure", "--grpc-address=127.0.0.1:0", "--metrics-address=off", "--log-level=warn"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    auto d = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cache-0", dir_,
        {"--host-id=cache-0", "--insecure", "--grpc-address=127.0.0.1:0",
         "--admin-address=127.0.0.1:0", "--transport-address=127.0.0.1:0", "--metrics-address=off",
         "--lock-memory=off", "--log-level=warn", "--host-page-bytes=32KiB",
         "--host-pool-bytes=16MiB", "--placement-address=" + placement_->grpc(),
         "--membership-ttl=120s", "--compact-threads=1"});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    placement_stub_ = v1::Placement::NewStub(
        grpc::CreateChannel(placement_->grpc(), grpc::InsecureChannelCredentials()));
    admin_stub_ = v1::CacheHost::NewStub(
        grpc::CreateChannel(daemon_->Get("admin"), grpc::InsecureChannelCredentials()));
    for (int attempt = 0; attempt < 100; ++attempt) {
      v1::ListHostsResponse resp;
      grpc::ClientContext ctx;
      if (placement_stub_->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok() &&
          resp.hosts_size() == 1) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto device = testing::CreateTestDevice(model_, kQHeads, kTileTokens, 2);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device->device);
    client::ClientOptions o;
    o.placement_address = placement_->grpc();
    o.security.insecure = true;
    o.model = model_;
    o.device = device_.get();
    o.num_q_heads = kQHeads;
    o.tile_tokens = kTileTokens;
    o.arena.page_bytes = device->page_bytes;
    o.arena.staging_pages = 2;
    o.staging_bytes = 4 << 20;
    o.history_pool_bytes = 4 << 20;
    o.max_context_tokens = kTokens;
    // Fetching beats recomputing (20 µs a token), and a compact token costs
    // nothing more to decode: a compact_after plan takes every compact copy
    // it may (fewer bytes).
    o.prefill = RecomputeParameters{0.0, 20.0, 0.0};
    o.compact_extra_decode_us_per_token = 0.0;
    o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
      const std::uint64_t bytes = *model_.BlockBytes();
      for (std::uint32_t i = 0; i < r.block_count; ++i) {
        KVF_RETURN_IF_ERROR(Expected(r.first_block + i, out.subspan(i * bytes, bytes)));
      }
      return Status::OK();
    };
    auto c = Client::Open(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    std::mt19937_64 rng(seed_);
    std::vector<std::uint32_t> ids(kTokens);
    for (std::uint32_t& t : ids) t = static_cast<std::uint32_t>(rng() % 128000);
    auto keys = client_->KeyTokens(ids);
    ASSERT_TRUE(keys.ok());
    chain_ = *keys;
    ASSERT_EQ(chain_.size(), kBlocks);
  }

  void TearDown() override {
    client_.reset();
    device_.reset();
    daemon_.reset();
    placement_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  Status Expected(std::uint32_t block, std::span<std::byte> out) {
    return client::SyntheticKv(model_, client::SeedFromKey(chain_[block], seed_), 16, out);
  }

  // Replicas placement lists for each of `keys`.
  std::vector<int> Replicas(const std::vector<BlockKey>& keys) {
    v1::LocateRequest req;
    for (const BlockKey& k : keys) {
      req.add_keys(reinterpret_cast<const char*>(k.bytes().data()), BlockKey::kSize);
    }
    v1::LocateResponse resp;
    grpc::ClientContext ctx;
    std::vector<int> out(keys.size(), -1);
    if (!placement_stub_->Locate(&ctx, req, &resp).ok()) return out;
    for (int i = 0; i < resp.locations().blocks_size(); ++i) {
      out[i] = resp.locations().blocks(i).replicas_size();
    }
    return out;
  }
  std::vector<BlockKey> CompactKeys() const {
    std::vector<BlockKey> out;
    for (const BlockKey& k : chain_) out.push_back(CompactInt8BlockKey(k));
    return out;
  }
  // Waits (up to 30 s) until placement lists `want` replicas of every key.
  bool WaitForReplicas(const std::vector<BlockKey>& keys, int want) {
    for (int attempt = 0; attempt < 300; ++attempt) {
      const std::vector<int> r = Replicas(keys);
      if (std::all_of(r.begin(), r.end(), [&](int n) { return n == want; })) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Match under `accuracy`, load, wait for every layer; the context stays open.
  ContextId Load(const client::AccuracyPolicy& accuracy, client::MatchResult* match) {
    client::MatchOptions options;
    options.explain = true;
    options.accuracy = accuracy;
    Status s = client_->Match(chain_, 0, options, match);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::printf("%s: plan %llu %s, representation %s, predicted %.0f us + %.0f us decode\n",
                accuracy.ToString().c_str(), static_cast<unsigned long long>(match->plan_id),
                match->kind.c_str(), match->representation.c_str(), match->predicted_us,
                match->compact_penalty_us);
    auto ctx = client_->NewContext(kTokens);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    if (!ctx.ok()) return 0;
    EXPECT_TRUE(client_->Load(*match, *ctx).ok());
    for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
      Status w = client_->WaitLayer(*ctx, l);
      EXPECT_TRUE(w.ok()) << w.ToString();
    }
    return *ctx;
  }

  // Every block of `ctx` exact and equal to the generator's bytes.
  void ExpectAllExact(ContextId ctx, const std::string& what) {
    const std::uint64_t bytes = *model_.BlockBytes();
    std::vector<std::byte> want(bytes);
    int wrong = 0;
    for (std::uint32_t b = 0; b < kBlocks; ++b) {
      auto compact = client_->BlockIsCompact(ctx, b);
      ASSERT_TRUE(compact.ok());
      EXPECT_FALSE(*compact) << what << ": block " << b << " landed compact";
      auto payload = client_->BlockPayload(ctx, b);
      ASSERT_TRUE(payload.ok()) << payload.status().ToString();
      ASSERT_TRUE(Expected(b, want).ok());
      if (std::memcmp(want.data(), payload->data(), bytes) != 0) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << what;
  }

  std::uint64_t seed_ = 0;
  std::string dir_;
  ModelFingerprint model_ = testing::SyntheticTestModel("compact-e2e/synthetic@1");
  std::unique_ptr<testing::ServerProcess> placement_;
  std::unique_ptr<testing::ServerProcess> daemon_;
  std::unique_ptr<v1::Placement::Stub> placement_stub_;
  std::unique_ptr<v1::CacheHost::Stub> admin_stub_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<Client> client_;
  std::vector<BlockKey> chain_;
};

TEST_F(CompactEndToEndTest, ExactNeverReceivesACompactCopyAndCompactAfterFetchesOldBlocksCompact) {
  const std::uint64_t block_bytes = *model_.BlockBytes();
  const std::uint64_t compact_bytes = gpu::CompactPayloadBytes(
      model_.layer_count, model_.tokens_per_block, model_.kv_heads, model_.head_dim);
  ASSERT_LT(compact_bytes, block_bytes);

  // 1. Prefill (nothing is cached yet), save every layer, write back.
  {
    client::MatchResult match;
    const ContextId ctx = Load(client::AccuracyPolicy{}, &match);
    for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
      ASSERT_TRUE(client_->Save(ctx, l, 0, chain_).ok());
    }
    auto report = client_->Finish(ctx);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->blocks_written, kBlocks);
  }
  ASSERT_TRUE(WaitForReplicas(chain_, 1));
  ASSERT_TRUE(WaitForReplicas(CompactKeys(), 1)) << "the daemon did not convert every block";

  // 2. exact: exact copies only, byte for byte.
  {
    client::MatchResult match;
    const ContextId ctx = Load(client::AccuracyPolicy{}, &match);
    EXPECT_EQ(match.representation, "exact");
    for (const auto& run : match.runs) EXPECT_FALSE(run.compact);
    ExpectAllExact(ctx, "exact");
    auto report = client_->Finish(ctx);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->bytes_fetched, kBlocks * block_bytes);
  }

  // 3. compact_after=256: blocks 0..47 compact, 48..63 exact.
  auto policy = client::AccuracyPolicy::Parse("compact_after=" + std::to_string(kCompactAfter));
  ASSERT_TRUE(policy.ok());
  {
    client::MatchResult match;
    const ContextId ctx = Load(*policy, &match);
    EXPECT_EQ(match.representation, "compact") << match.explanation;
    EXPECT_NE(match.explanation.find("representation"), std::string::npos);
    const std::uint64_t elems = block_bytes / 2;
    std::vector<float> values(elems);
    std::vector<std::byte> want(block_bytes);
    double worst = 0;
    for (std::uint32_t b = 0; b < kBlocks; ++b) {
      auto compact = client_->BlockIsCompact(ctx, b);
      ASSERT_TRUE(compact.ok());
      EXPECT_EQ(*compact, b < kCompactBlocks) << "block " << b;
      ASSERT_TRUE(client_->DecodeBlock(ctx, b, values).ok());
      ASSERT_TRUE(Expected(b, want).ok());
      const auto* h = reinterpret_cast<const std::uint16_t*>(want.data());
      for (std::uint64_t i = 0; i < elems; ++i) {
        const double err = std::fabs(values[i] - gpu::Fp16BitsToFloat(h[i]));
        worst = std::max(worst, err);
        if (b >= kCompactBlocks) {
          ASSERT_EQ(err, 0.0) << "exact block " << b << " element " << i;
        }
      }
      auto payload = client_->BlockPayload(ctx, b);
      EXPECT_EQ(payload.ok(), b >= kCompactBlocks);
      if (!payload.ok()) {
        EXPECT_EQ(payload.status().code(), StatusCode::kFailedPrecondition);
      }
    }
    // The synthetic values lie in (-1, 1): half a step of at most 1/127, plus
    // the fp16 rounding of the scale.
    EXPECT_LE(worst, 0.5 / 127 + 1e-3) << "worst element error " << worst;
    std::printf("compact_after=%llu: worst element error %.5f\n",
                static_cast<unsigned long long>(kCompactAfter), worst);
    // Attend streams compact tiles for blocks 0..47 and exact ones after,
    // merged by LSE: within the codec's error of exact attention.
    {
      std::vector<std::byte> exact(std::uint64_t{kBlocks} * block_bytes);
      for (std::uint32_t b = 0; b < kBlocks; ++b) {
        ASSERT_TRUE(
            Expected(b, std::span<std::byte>(exact).subspan(b * block_bytes, block_bytes)).ok());
      }
      std::mt19937_64 rng(seed_);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> q(kQHeads * model_.head_dim), out(q.size()), lse(kQHeads);
      std::vector<float> ref(q.size()), ref_lse(kQHeads);
      double worst_out = 0, worst_lse = 0;
      for (std::uint32_t l = 0; l < model_.layer_count; ++l) {
        for (float& x : q) x = dist(rng);
        const Status a = client_->Attend(ctx, l, 1, q, out, lse);
        ASSERT_TRUE(a.ok()) << a.ToString();
        ASSERT_TRUE(client::ResidentAttention(model_, kQHeads, kTileTokens, exact, kTokens, l, q,
                                              ref, ref_lse)
                        .ok());
        for (std::uint32_t h = 0; h < kQHeads; ++h) {
          double num = 0, den = 0;
          for (std::uint32_t d = 0; d < model_.head_dim; ++d) {
            const double x = out[h * model_.head_dim + d], y = ref[h * model_.head_dim + d];
            num += (x - y) * (x - y);
            den += y * y;
          }
          worst_out = std::max(worst_out, std::sqrt(num / den));
          worst_lse = std::max(worst_lse, static_cast<double>(std::fabs(lse[h] - ref_lse[h])));
        }
      }
      std::printf("Attend over mixed tiles: worst relative output error %.2e, lse %.2e\n",
                  worst_out, worst_lse);
      EXPECT_LT(worst_out, 3e-2);
      EXPECT_LT(worst_lse, 2e-2);
    }
    // A compact block is never written back as exact.
    const Status save = client_->Save(ctx, 0, 0, std::span<const BlockKey>(chain_).first(1));
    EXPECT_EQ(save.code(), StatusCode::kFailedPrecondition) << save.ToString();
    auto report = client_->Finish(ctx);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->bytes_fetched,
              kCompactBlocks * compact_bytes + (kBlocks - kCompactBlocks) * block_bytes);
    EXPECT_EQ(report->blocks_recomputed, 0u);
    std::printf("bytes fetched: exact %llu, compact_after=%llu %llu (%.3fx)\n",
                static_cast<unsigned long long>(kBlocks * block_bytes),
                static_cast<unsigned long long>(kCompactAfter),
                static_cast<unsigned long long>(report->bytes_fetched),
                static_cast<double>(report->bytes_fetched) / (kBlocks * block_bytes));
  }

  // 4. Only the compact copies are left.
  {
    v1::DeleteRequest req;
    for (const BlockKey& k : chain_) {
      req.add_keys(reinterpret_cast<const char*>(k.bytes().data()), BlockKey::kSize);
    }
    v1::DeleteResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_stub_->Delete(&ctx, req, &resp).ok());
  }
  ASSERT_TRUE(WaitForReplicas(chain_, 0));
  ASSERT_TRUE(WaitForReplicas(CompactKeys(), 1));
  {
    client::MatchResult match;
    const ContextId ctx = Load(client::AccuracyPolicy{}, &match);
    EXPECT_EQ(match.kind, "recompute_all");
    for (const auto& run : match.runs) EXPECT_FALSE(run.compact);
    ExpectAllExact(ctx, "exact with only compact copies cached");
    auto report = client_->Finish(ctx);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->bytes_fetched, 0u);
    EXPECT_EQ(report->blocks_recomputed, kBlocks);
  }
  {
    client::MatchResult match;
    const ContextId ctx = Load(*policy, &match);
    EXPECT_NE(match.representation, "exact") << match.explanation;
    // Every block the plan fetches is an old block's compact copy; the rest are recomputed,
    // exact (the plan may recompute a front of old blocks beside the fetch: a split).
    std::vector<bool> fetched(kBlocks, false);
    std::uint32_t fetched_blocks = 0;
    for (const auto& run : match.runs) {
      if (!run.fetch) continue;
      EXPECT_TRUE(run.compact) << match.explanation;
      for (std::uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
        fetched[b] = true;
        ++fetched_blocks;
      }
    }
    EXPECT_GT(fetched_blocks, 0u) << match.explanation;
    for (std::uint32_t b = 0; b < kBlocks; ++b) {
      auto compact = client_->BlockIsCompact(ctx, b);
      ASSERT_TRUE(compact.ok());
      EXPECT_EQ(*compact, fetched[b]) << "block " << b;
      if (fetched[b]) EXPECT_LT(b, kCompactBlocks) << "block " << b;
    }
    auto report = client_->Finish(ctx);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->bytes_fetched, fetched_blocks * compact_bytes);
    EXPECT_EQ(report->blocks_recomputed, kBlocks - fetched_blocks);
  }
}

}  // namespace
}  // namespace kvfabric
