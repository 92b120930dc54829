// The C API end to end against a real (embedded, in-process) cluster: two
// daemons and placement. A prompt is keyed, prefilled through a C recompute
// callback, saved and written back; a second request loads it (fetches),
// and its history and attention equal the first's bit for bit; a request
// whose callback fails reports the failure through kvf_wait_layer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "client/synthetic_model.h"
#include "core/block_key.h"
#include "core/testing/test_seed.h"
#include "core/testing/wait_for.h"
#include "kvfabric/kvfabric.h"
#include "security/testing/test_pki.h"
#include "server/embedded_cluster.h"

namespace kvfabric {
namespace {

constexpr std::uint32_t kLayers = 2, kKvHeads = 2, kHeadDim = 64, kQHeads = 4, kTile = 64;
constexpr std::uint64_t kTokens = 1024 + 7;  // 64 full blocks and a partial one

struct Engine {
  ModelFingerprint model;
  std::uint64_t seed = 0;
  bool fail = false;
  int calls = 0;
};

// The engine's prefill, as a C callback: block b's KV from (seed, b).
kvf_status Prefill(void* user, const kvf_recompute_request* r, uint8_t* out, uint64_t out_bytes) {
  auto* e = static_cast<Engine*>(user);
  ++e->calls;
  if (e->fail) return KVF_RESOURCE_EXHAUSTED;
  const std::uint64_t bytes = *e->model.BlockBytes();
  if (out_bytes != r->block_count * bytes) return KVF_INTERNAL;
  for (std::uint32_t i = 0; i < r->block_count; ++i) {
    const std::uint64_t b = r->first_block + i;
    const auto valid = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(16, r->first_token + r->tokens - b * 16));
    std::span<std::byte> dst(reinterpret_cast<std::byte*>(out) + i * bytes, bytes);
    if (!client::SyntheticKv(e->model, e->seed * 1000003 + b, valid, dst).ok()) {
      return KVF_INTERNAL;
    }
  }
  return KVF_OK;
}

// Parameter: the data-plane transport of the daemons and the client ("ucx"
// or "tcp", kernel sockets), end to end through the C API; "tcp_mtls" runs
// every gRPC listener and connection with mutual TLS (certificates issued at
// run time; kvf_options.tls_*), so the data plane also proves its session,
// and runs inside TLS (kvf_options.data_plane_tls).
class CApiClusterTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string Transport() const {
    const std::string p = GetParam();
    return p.substr(0, p.find('_'));
  }
  bool MutualTls() const { return std::string(GetParam()).find("_mtls") != std::string::npos; }

  void SetUp() override {
    engine_.seed = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    engine_.model.model_id = "c-api/synthetic@1";
    engine_.model.layer_count = kLayers;
    engine_.model.kv_heads = kKvHeads;
    engine_.model.head_dim = kHeadDim;
    engine_.model.dtype = KvDtype::kFp16;
    server::EmbeddedClusterOptions co;
    for (const char* id : {"c-a", "c-b"}) {
      server::EmbeddedDaemonOptions d;
      d.host_id = id;
      d.host_pool_bytes = 16 << 20;
      d.host_page_bytes = 8 << 10;
      d.metrics = false;
      d.data_transport = Transport();
      co.daemons.push_back(d);
    }
    co.placement_metrics = false;
    if (MutualTls()) {
      char tmpl[] = "/tmp/kvf_c_api_tls_XXXXXX";
      ASSERT_NE(mkdtemp(tmpl), nullptr);
      tls_dir_ = tmpl;
      testing::TestPki pki(tls_dir_, "c api CA");
      const testing::TestPki::Files server = pki.Issue("cluster", {"IP:127.0.0.1"});
      engine_cert_ = pki.Issue("engine", {"DNS:engine.example"});
      ca_file_ = pki.ca_file();
      co.security = GrpcSecurityOptions();
      co.security.cert_file = server.cert;
      co.security.key_file = server.key;
      co.security.ca_file = ca_file_;
      co.data_plane_tls = true;  // and the kernel-TCP data plane inside TLS
    }
    auto cluster = server::EmbeddedCluster::StartDaemons(co);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    ASSERT_TRUE(cluster_->StartPlacement(BusCalibration{}).ok());
    address_ = cluster_->placement_address();

    kvf_options o;
    kvf_options_init(&o);
    o.placement_address = address_.c_str();
    if (MutualTls()) {
      o.tls_ca_file = ca_file_.c_str();
      o.tls_cert_file = engine_cert_.cert.c_str();
      o.tls_key_file = engine_cert_.key.c_str();
      o.data_plane_tls = 1;
    } else {
      o.insecure = 1;
    }
    o.model_id = engine_.model.model_id.c_str();
    o.layer_count = kLayers;
    o.dtype = KVF_DTYPE_FP16;
    o.kv_heads = kKvHeads;
    o.head_dim = kHeadDim;
    o.num_q_heads = kQHeads;
    o.tile_tokens = kTile;
    o.device_arena_bytes = 1 << 20;
    o.staging_bytes = 1 << 20;
    o.history_pool_bytes = 8 << 20;
    o.recompute = &Prefill;
    o.recompute_user = &engine_;
    const std::string transport = Transport();
    o.data_transport = transport.c_str();
    ASSERT_EQ(kvf_client_open(&o, &client_), KVF_OK) << kvf_last_error();
  }

  void TearDown() override {
    if (client_ != nullptr) {
      EXPECT_EQ(kvf_client_close(client_), KVF_OK) << kvf_last_error();
    }
    cluster_.reset();
    if (!tls_dir_.empty()) std::filesystem::remove_all(tls_dir_);
  }

  // Match, load and wait; the context (or 0 on failure, with the status).
  kvf_status LoadAll(const std::vector<kvf_block_key>& keys, kvf_context_id* ctx,
                     kvf_match_result** match) {
    kvf_status s = kvf_match(client_, keys.data(), keys.size(), 7, match);
    if (s != KVF_OK) return s;
    if ((s = kvf_new_context(client_, kTokens, ctx)) != KVF_OK) return s;
    if ((s = kvf_load(client_, *match, *ctx)) != KVF_OK) return s;
    for (std::uint32_t l = 0; l < kLayers; ++l) {
      if ((s = kvf_wait_layer(client_, *ctx, l, 60000)) != KVF_OK) return s;
    }
    return KVF_OK;
  }

  // The block keys of kTokens copies of `token`.
  void KeysOfRepeatedToken(std::uint32_t token, std::vector<kvf_block_key>* keys) {
    std::vector<std::uint32_t> tokens(kTokens, token);
    keys->assign(kTokens / 16, kvf_block_key{});
    size_t n = 0;
    ASSERT_EQ(kvf_key_tokens(client_, tokens.data(), tokens.size(), keys->data(), keys->size(), &n),
              KVF_OK);
    keys->resize(n);
  }

  Engine engine_;
  std::string tls_dir_;
  std::string ca_file_;
  testing::TestPki::Files engine_cert_;
  std::unique_ptr<server::EmbeddedCluster> cluster_;
  std::string address_;
  kvf_client* client_ = nullptr;
};

TEST_P(CApiClusterTest, SavedPromptIsFetchedBackExactly) {
  std::mt19937_64 rng(engine_.seed);
  std::vector<std::uint32_t> tokens(kTokens);
  for (std::uint32_t& t : tokens) t = static_cast<std::uint32_t>(rng() % 50000);
  size_t n = 0;
  ASSERT_EQ(kvf_key_tokens(client_, tokens.data(), tokens.size(), nullptr, 0, &n), KVF_OK);
  ASSERT_EQ(n, kTokens / 16);
  std::vector<kvf_block_key> keys(n);
  ASSERT_EQ(kvf_key_tokens(client_, tokens.data(), tokens.size(), keys.data(), keys.size(), &n),
            KVF_OK)
      << kvf_last_error();

  // 1. Nothing cached: prefilled, saved, written back.
  kvf_context_id first = 0;
  kvf_match_result* match = nullptr;
  ASSERT_EQ(LoadAll(keys, &first, &match), KVF_OK) << kvf_last_error();
  EXPECT_EQ(kvf_match_cached_blocks(match), 0u);
  EXPECT_EQ(kvf_match_chain_blocks(match), n);
  EXPECT_STREQ(kvf_match_kind(match), "recompute_all");
  kvf_match_free(match);
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(kvf_save(client_, first, l, 0, keys.data(), keys.size()), KVF_OK)
        << kvf_last_error();
  }
  std::vector<float> q(kQHeads * kHeadDim), out1(q.size()), lse1(kQHeads);
  for (float& x : q) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  ASSERT_EQ(kvf_attend(client_, first, 1, 0, q.data(), q.size(), out1.data(), out1.size(),
                       lse1.data(), lse1.size()),
            KVF_OK)
      << kvf_last_error();
  std::vector<std::uint8_t> history1;
  for (std::uint32_t b = 0; b <= n; ++b) {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    ASSERT_EQ(kvf_block_payload(client_, first, b, &data, &bytes), KVF_OK) << kvf_last_error();
    history1.insert(history1.end(), data, data + bytes);
  }
  kvf_context_report report{};
  ASSERT_EQ(kvf_finish(client_, first, &report), KVF_OK) << kvf_last_error();
  EXPECT_EQ(report.blocks_saved, n);
  EXPECT_EQ(report.blocks_recomputed, n + 1);  // the chain and the partial tail

  // 2. Cached: fetched; the same bytes and the same attention, bit for bit.
  // The daemons report committed blocks to placement in the background, so
  // the directory may trail kvf_finish by a report: wait until it lists all.
  std::uint64_t waiting_matches = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        kvf_match_result* m = nullptr;
        ++waiting_matches;
        if (kvf_match(client_, keys.data(), keys.size(), 7, &m) != KVF_OK) return false;
        const bool all = kvf_match_cached_blocks(m) == n;
        kvf_match_free(m);
        return all;
      },
      std::chrono::seconds(10), "placement to list every saved block"));
  const int calls_before = engine_.calls;
  kvf_context_id second = 0;
  ASSERT_EQ(LoadAll(keys, &second, &match), KVF_OK) << kvf_last_error();
  EXPECT_EQ(kvf_match_cached_blocks(match), n);
  kvf_match_free(match);
  std::vector<std::uint8_t> history2;
  for (std::uint32_t b = 0; b <= n; ++b) {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    ASSERT_EQ(kvf_block_payload(client_, second, b, &data, &bytes), KVF_OK);
    history2.insert(history2.end(), data, data + bytes);
  }
  EXPECT_TRUE(history1 == history2) << "a fetched history differs from the prefilled one";
  std::vector<float> out2(q.size()), lse2(kQHeads);
  ASSERT_EQ(kvf_attend(client_, second, 1, 1, q.data(), q.size(), out2.data(), out2.size(),
                       lse2.data(), lse2.size()),
            KVF_OK);
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse1.data(), lse2.data(), lse1.size() * 4), 0);
  ASSERT_EQ(kvf_finish(client_, second, &report), KVF_OK);
  EXPECT_GT(report.blocks_fetched, 0u);
  EXPECT_EQ(report.blocks_fetched + report.blocks_recomputed, n + 1);
  EXPECT_GT(engine_.calls, calls_before);  // at least the partial tail

  kvf_metrics m{};
  ASSERT_EQ(kvf_client_metrics(client_, &m), KVF_OK);
  EXPECT_EQ(m.matches, 2u + waiting_matches);
  EXPECT_EQ(m.crc_failures, 0u);
  EXPECT_EQ(m.blocks_fallen_back, 0u);

  // 3. Attention before a load, and a wrong q length, are refused by name.
  kvf_context_id idle = 0;
  ASSERT_EQ(kvf_new_context(client_, kTokens, &idle), KVF_OK);
  EXPECT_EQ(kvf_attend(client_, idle, 0, 0, q.data(), q.size() - 1, out2.data(), out2.size(),
                       lse2.data(), lse2.size()),
            KVF_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(kvf_last_error(), "q_len"), nullptr) << kvf_last_error();
  EXPECT_EQ(kvf_attend(client_, idle, 0, 0, q.data(), q.size(), out2.data(), out2.size(),
                       lse2.data(), lse2.size()),
            KVF_FAILED_PRECONDITION);
  EXPECT_EQ(kvf_finish(client_, idle, nullptr), KVF_OK);
}

TEST_P(CApiClusterTest, AFailingPrefillFailsTheLoadItDoesNotHang) {
  std::vector<std::uint32_t> tokens(kTokens, 7);
  std::vector<kvf_block_key> keys(kTokens / 16);
  size_t n = 0;
  ASSERT_EQ(kvf_key_tokens(client_, tokens.data(), tokens.size(), keys.data(), keys.size(), &n),
            KVF_OK);
  engine_.fail = true;
  kvf_context_id ctx = 0;
  kvf_match_result* match = nullptr;
  EXPECT_EQ(LoadAll(keys, &ctx, &match), KVF_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::strstr(kvf_last_error(), "recompute"), nullptr) << kvf_last_error();
  kvf_match_free(match);
  // Regression: kvf_finish returned OK after a failed load.
  kvf_context_report report;
  EXPECT_EQ(kvf_finish(client_, ctx, &report), KVF_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::strstr(kvf_last_error(), "load failed"), nullptr) << kvf_last_error();
  EXPECT_EQ(report.blocks_fetched, 0u);
}

TEST_P(CApiClusterTest, MatchAccuracyParsesThePolicyAndNamesTheRepresentation) {
  std::vector<kvf_block_key> keys;
  ASSERT_NO_FATAL_FAILURE(KeysOfRepeatedToken(11, &keys));
  const size_t n = keys.size();
  kvf_match_result* match = nullptr;
  EXPECT_EQ(kvf_match_accuracy(client_, keys.data(), n, 0, "compact_after=lots", 0, &match),
            KVF_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(kvf_last_error(), "compact_after=N"), nullptr) << kvf_last_error();
  EXPECT_EQ(match, nullptr);
  // Nothing is cached (no compact copies either): an exact recompute plan.
  ASSERT_EQ(kvf_match_accuracy(client_, keys.data(), n, 0, "compact_after=64", 4, &match), KVF_OK)
      << kvf_last_error();
  EXPECT_STREQ(kvf_match_representation(match), "exact");
  EXPECT_STREQ(kvf_match_kind(match), "recompute_all");
  kvf_match_free(match);
  ASSERT_EQ(kvf_match_accuracy(client_, keys.data(), n, 0, nullptr, 0, &match), KVF_OK);
  EXPECT_STREQ(kvf_match_representation(match), "exact");
  kvf_context_id ctx = 0;
  ASSERT_EQ(kvf_new_context(client_, kTokens, &ctx), KVF_OK);
  ASSERT_EQ(kvf_load(client_, match, ctx), KVF_OK);
  kvf_match_free(match);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    ASSERT_EQ(kvf_wait_layer(client_, ctx, l, 60000), KVF_OK);
  int compact = 7;
  ASSERT_EQ(kvf_block_is_compact(client_, ctx, 0, &compact), KVF_OK);
  EXPECT_EQ(compact, 0);
  EXPECT_EQ(kvf_block_is_compact(client_, ctx, 1u << 20, &compact), KVF_OUT_OF_RANGE);
  EXPECT_EQ(kvf_finish(client_, ctx, nullptr), KVF_OK);
}

// KVF_MATCH_PREFIX_PLANS_ONLY reaches placement (MatchOptions::prefix_plans_only); a bit the
// library does not know is refused, naming it.
TEST_P(CApiClusterTest, MatchWithFlagsPlansPrefixesOnlyAndRefusesUnknownBits) {
  std::vector<kvf_block_key> keys;
  ASSERT_NO_FATAL_FAILURE(KeysOfRepeatedToken(13, &keys));
  const size_t n = keys.size();
  kvf_match_result* match = nullptr;
  EXPECT_EQ(kvf_match_with_flags(client_, keys.data(), n, 0, nullptr, 0, 2u, &match),
            KVF_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(kvf_last_error(), "flags 2"), nullptr) << kvf_last_error();
  EXPECT_EQ(match, nullptr);
  ASSERT_EQ(kvf_match_with_flags(client_, keys.data(), n, 0, nullptr, 0,
                                 KVF_MATCH_PREFIX_PLANS_ONLY, &match),
            KVF_OK)
      << kvf_last_error();
  EXPECT_NE(kvf_match_plan_id(match), 0u);  // placement planned it
  EXPECT_STRNE(kvf_match_kind(match), "split");
  kvf_match_free(match);
}

INSTANTIATE_TEST_SUITE_P(DataTransports, CApiClusterTest,
                         ::testing::Values("ucx", "tcp", "tcp_mtls"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace kvfabric
