// An engine and a daemon on one host under different Unix users, the usual
// deployment: kvfabric-placement and kvfabric-cached run as this test's user
// (root), and a C engine (the C API, as an engine links it) runs as "nobody"
// in a child process.
//
// UCX's shared-memory transports cannot work between them: UCX makes its
// segments 0660 (owner and group) and CMA's process_vm_readv needs ptrace
// rights over the peer; and a daemon shares memory only with its own user
// (--shared-memory-peers same-user, the default: a peer could crash it by
// truncating what it shared; tests/shared_memory_attack_test.cc). Before
// this was detected, such an engine connected, then every write-back failed
// with a screen of UCX errors and a status that did not say what to change.
// Now, each case with its own placement and daemon:
//   1. a default daemon (UCX with shared memory, same-user peers): the
//      engine, whatever its ucx_tls, is refused before the data plane is
//      connected; kvf_finish returns FAILED_PRECONDITION naming both uids,
//      the daemon's --shared-memory-peers and the kernel-TCP data plane;
//   2. a daemon with --data-transport=tcp: the engine with data_transport
//      "tcp" saves a prompt, loads it back (all fetched), every byte matches;
//   3. a daemon that trusts every user (--shared-memory-peers=any): the
//      default ucx_tls is refused naming options->ucx_tls; ucx_tls "tcp"
//      round-trips exactly.
//
// Needs root (to start a child as another user); skipped otherwise.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/test_seed.h"
#include "kvfabric/kvfabric.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "tests/server_process.h"

namespace kvfabric {
namespace {

constexpr std::uint32_t kLayers = 2, kKvHeads = 2, kHeadDim = 64, kTokensPerBlock = 16;
constexpr std::uint64_t kTokens = 512;  // 32 blocks
constexpr std::uint64_t kBlockBytes = std::uint64_t{kLayers} * 2 * kTokensPerBlock * kKvHeads *
                                      kHeadDim * 2;

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t g_seed = 1;

void FillBlock(std::uint64_t block, std::uint8_t* out, std::uint64_t bytes) {
  for (std::uint64_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<std::uint8_t>(SplitMix64(g_seed ^ (block << 32) ^ (i >> 3)) >> (8 * (i & 7)));
  }
}

kvf_status Recompute(void* /*user*/, const kvf_recompute_request* r, std::uint8_t* out,
                     std::uint64_t out_bytes) {
  if (out_bytes != r->block_count * kBlockBytes) return KVF_INTERNAL;
  for (std::uint32_t i = 0; i < r->block_count; ++i) {
    FillBlock(r->first_block + i, out + i * kBlockBytes, kBlockBytes);
  }
  return KVF_OK;
}

// What the engine saw: the first failed call's status and message, or OK
// with the load's counts.
struct Outcome {
  kvf_status status = KVF_OK;
  std::string what;  // the failed call, or "ok"
  std::string error;
  std::uint32_t fetched = 0, recomputed = 0;
  std::uint64_t differing_bytes = 0;
};

// kvf_match, repeated (every 50 ms, up to 10 s) until placement knows every
// block: the daemon reports committed blocks to placement asynchronously (its
// directory is eventually consistent, docs/placement.md), so a match right
// after kvf_finish may not see the last batch yet and would plan to
// recompute it.
kvf_status MatchOnceKnown(kvf_client* client, const kvf_block_key* keys, std::size_t n,
                          kvf_match_result** out) {
  for (int attempt = 0;; ++attempt) {
    const kvf_status s = kvf_match(client, keys, n, 0, out);
    if (s != KVF_OK || kvf_match_cached_blocks(*out) == n || attempt == 200) return s;
    kvf_match_free(*out);
    *out = nullptr;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The engine: save a prompt under `data_transport` ("ucx" with `ucx_tls`, or
// "tcp"), finish, load it back, compare.
Outcome Engine(const std::string& placement, const char* data_transport, const char* ucx_tls) {
  Outcome out;
  auto fail = [&](const char* what, kvf_status s) {
    out.status = s;
    out.what = what;
    out.error = kvf_last_error();
    return out;
  };
  kvf_options o;
  kvf_options_init(&o);
  o.placement_address = placement.c_str();
  o.insecure = 1;
  o.model_id = "cross-user/synthetic@1";
  o.layer_count = kLayers;
  o.dtype = KVF_DTYPE_FP16;
  o.kv_heads = kKvHeads;
  o.head_dim = kHeadDim;
  o.tokens_per_block = kTokensPerBlock;
  o.num_q_heads = 4;
  o.tile_tokens = 64;
  o.device_arena_bytes = 1 << 20;
  o.staging_bytes = 1 << 20;
  o.history_pool_bytes = 2 << 20;
  o.recompute = &Recompute;
  o.data_transport = data_transport;
  o.ucx_tls = ucx_tls;
  kvf_client* client = nullptr;
  kvf_status s = kvf_client_open(&o, &client);
  if (s != KVF_OK) return fail("kvf_client_open", s);
  std::vector<std::uint32_t> tokens(kTokens);
  for (std::uint64_t i = 0; i < kTokens; ++i) tokens[i] = SplitMix64(g_seed + i) % 50000;
  std::vector<kvf_block_key> keys(kTokens / kTokensPerBlock);
  std::size_t n = 0;
  std::vector<std::uint8_t> expected(keys.size() * kBlockBytes);
  kvf_context_id first = 0, second = 0;
  kvf_context_report report{};
  kvf_match_result* match = nullptr;
  if ((s = kvf_key_tokens(client, tokens.data(), tokens.size(), keys.data(), keys.size(), &n)) !=
      KVF_OK) {
    fail("kvf_key_tokens", s);
  } else if ((s = kvf_new_context(client, kTokens, &first)) != KVF_OK) {
    fail("kvf_new_context", s);
  } else {
    for (std::uint32_t b = 0; b < n && s == KVF_OK; ++b) {
      std::uint8_t* data = nullptr;
      std::uint64_t bytes = 0;
      if ((s = kvf_block_payload(client, first, b, &data, &bytes)) == KVF_OK) {
        FillBlock(b, data, bytes);
        std::memcpy(&expected[b * kBlockBytes], data, bytes);
      }
    }
    for (std::uint32_t l = 0; l < kLayers && s == KVF_OK; ++l) {
      s = kvf_save(client, first, l, 0, keys.data(), n);
    }
    if (s != KVF_OK) {
      fail("kvf_save", s);
    } else if ((s = kvf_finish(client, first, &report)) != KVF_OK) {
      fail("kvf_finish (save)", s);
    } else if ((s = MatchOnceKnown(client, keys.data(), n, &match)) != KVF_OK) {
      fail("kvf_match", s);
    } else if ((s = kvf_new_context(client, kTokens, &second)) != KVF_OK ||
               (s = kvf_load(client, match, second)) != KVF_OK) {
      fail("kvf_load", s);
    } else {
      for (std::uint32_t l = 0; l < kLayers && s == KVF_OK; ++l) {
        s = kvf_wait_layer(client, second, l, 60000);
      }
      for (std::uint32_t b = 0; b < n && s == KVF_OK; ++b) {
        std::uint8_t* data = nullptr;
        std::uint64_t bytes = 0;
        if ((s = kvf_block_payload(client, second, b, &data, &bytes)) != KVF_OK) break;
        for (std::uint64_t k = 0; k < bytes; ++k) {
          out.differing_bytes += data[k] != expected[b * kBlockBytes + k];
        }
      }
      if (s != KVF_OK) {
        fail("kvf_wait_layer", s);
      } else if ((s = kvf_finish(client, second, &report)) != KVF_OK) {
        fail("kvf_finish (load)", s);
      } else {
        out.what = "ok";
        out.fetched = report.blocks_fetched;
        out.recomputed = report.blocks_recomputed;
      }
    }
  }
  kvf_match_free(match);
  kvf_client_close(client);
  return out;
}

// Engine(...) as nobody.
Outcome EngineAsNobody(const std::string& placement, const char* data_transport,
                       const char* ucx_tls) {
  const std::string text = testing::RunInChild(true, [&] {
    const Outcome out = Engine(placement, data_transport, ucx_tls);
    return std::to_string(out.status) + "\t" + out.what + "\t" + std::to_string(out.fetched) +
           "\t" + std::to_string(out.recomputed) + "\t" + std::to_string(out.differing_bytes) +
           "\t" + out.error;
  });
  std::vector<std::string> f;
  std::size_t start = 0;
  for (int i = 0; i < 5; ++i) {
    const std::size_t tab = text.find('\t', start);
    if (tab == std::string::npos) return Outcome{KVF_INTERNAL, "child", text};
    f.push_back(text.substr(start, tab - start));
    start = tab + 1;
  }
  Outcome out;
  out.status = static_cast<kvf_status>(std::stoi(f[0]));
  out.what = f[1];
  out.fetched = std::stoul(f[2]);
  out.recomputed = std::stoul(f[3]);
  out.differing_bytes = std::stoull(f[4]);
  out.error = text.substr(start);
  return out;
}

// "1" once placement lists one live daemon (polled for up to 30 s), else why not.
std::string WaitForOneHost(const std::string& placement) {
  auto stub = v1::Placement::NewStub(
      grpc::CreateChannel(placement, grpc::InsecureChannelCredentials()));
  std::string last = "no answer";
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListHostsResponse resp;
    const grpc::Status g = stub->ListHosts(&ctx, v1::ListHostsRequest(), &resp);
    if (g.ok() && resp.hosts_size() == 1) return "1";
    last = g.ok() ? std::to_string(resp.hosts_size()) + " hosts" : g.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "placement lists no daemon after 30 s: " + last;
}

class CrossUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run the engine as another user (CI is root)";
    g_seed = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/cross_user";
    std::filesystem::create_directories(dir_);
  }

  // Placement and one daemon, as this test's user (root), the daemon with
  // `daemon_flags` added.
  void StartCluster(const std::vector<std::string>& daemon_flags) {
    auto p = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement", dir_,
        {"--insecure", "--grpc-address=127.0.0.1:0", "--metrics-address=off", "--log-level=warn"});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    std::vector<std::string> flags = {
        "--host-id=cache-root",       "--insecure",
        "--grpc-address=127.0.0.1:0", "--transport-address=127.0.0.1:0",
        "--metrics-address=off",      "--lock-memory=off",
        "--log-level=warn",           "--host-pool-bytes=16MiB",
        "--host-page-bytes=16KiB",    "--placement-address=" + placement_->grpc()};
    flags.insert(flags.end(), daemon_flags.begin(), daemon_flags.end());
    auto d = testing::ServerProcess::Start(testing::ServerBinary("KVF_CACHED", "kvfabric-cached"),
                                           "cache", dir_, flags);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    // The daemon registers after writing its ready file.
    ASSERT_EQ(testing::RunInChild(false, [&] { return WaitForOneHost(placement_->grpc()); }), "1");
  }

  static void Print(const char* what, const Outcome& o) {
    std::printf("%s: %s %s: %u fetched, %u recomputed, %llu bytes differ %s\n", what,
                kvf_status_name(o.status), o.what.c_str(), o.fetched, o.recomputed,
                static_cast<unsigned long long>(o.differing_bytes), o.error.c_str());
  }

  static void ExpectExactRoundTrip(const Outcome& o) {
    ASSERT_EQ(o.status, KVF_OK) << o.what << ": " << o.error;
    EXPECT_EQ(o.differing_bytes, 0u);
    EXPECT_EQ(o.fetched, kTokens / kTokensPerBlock) << "every block fetched, none recomputed";
  }

  std::string dir_;
  std::unique_ptr<testing::ServerProcess> placement_, daemon_;
};

TEST_F(CrossUserTest, SameUserOnlyDaemonIsRefusedUpFrontNamingTheKernelTcpDataPlane) {
  StartCluster({});
  for (const char* tls : {"sm,self,tcp", "tcp"}) {
    const Outcome o = EngineAsNobody(placement_->grpc(), "ucx", tls);
    Print((std::string("ucx_tls ") + tls + " as nobody").c_str(), o);
    EXPECT_EQ(o.status, KVF_FAILED_PRECONDITION) << o.what << ": " << o.error;
    EXPECT_EQ(o.what, "kvf_finish (save)");
    EXPECT_NE(o.error.find("--shared-memory-peers"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("data_transport"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("uid 0"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("uid 65534"), std::string::npos) << o.error;
  }
}

TEST_F(CrossUserTest, KernelTcpDataPlaneRoundTripsExactlyAcrossUsers) {
  StartCluster({"--data-transport=tcp"});
  const Outcome o = EngineAsNobody(placement_->grpc(), "tcp", "");
  Print("data_transport tcp as nobody", o);
  ExpectExactRoundTrip(o);
}

TEST_F(CrossUserTest, TrustingDaemonStillRefusesSharedMemoryNamingUcxTls) {
  StartCluster({"--shared-memory-peers=any"});
  const Outcome sm = EngineAsNobody(placement_->grpc(), "ucx", "sm,self,tcp");
  Print("default ucx_tls as nobody", sm);
  EXPECT_EQ(sm.status, KVF_FAILED_PRECONDITION) << sm.what << ": " << sm.error;
  EXPECT_EQ(sm.what, "kvf_finish (save)");
  EXPECT_NE(sm.error.find("options->ucx_tls"), std::string::npos) << sm.error;
  EXPECT_NE(sm.error.find("uid 0"), std::string::npos) << sm.error;
  EXPECT_NE(sm.error.find("uid 65534"), std::string::npos) << sm.error;

  const Outcome tcp = EngineAsNobody(placement_->grpc(), "ucx", "tcp");
  Print("ucx_tls tcp as nobody", tcp);
  ExpectExactRoundTrip(tcp);
}

}  // namespace
}  // namespace kvfabric
