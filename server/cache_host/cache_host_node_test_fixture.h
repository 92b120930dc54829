// The fixture of the CacheHostNode tests (cache_host_node_test.cc and
// cache_host_node_limits_test.cc): a real node over the in-process loopback
// transport, with a client data plane and a staging region.
#ifndef KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_TEST_FIXTURE_H_
#define KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_TEST_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "client/data_plane_client.h"
#include "core/crc32c.h"
#include "core/env.h"
#include "core/testing/fake_clock_env.h"
#include "core/testing/fault_injection_env.h"
#include "core/testing/test_seed.h"
#include "core/testing/wait_for.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/data_plane.h"
#include "transport/loopback_transport.h"

namespace kvfabric::cache_host::node_test {

using client::DataOp;
using transport::Clock;

constexpr std::uint64_t kPage = 64 << 10;
constexpr std::uint32_t kRegion = 1;

// An exact fp16 block of `layers` layers x 16 tokens x 8 heads x 128 dims:
// layers x 64 KiB.
inline BlockMeta Meta(std::uint32_t layers, std::uint64_t token_offset = 0) {
  BlockMeta m;
  m.layers = layers;
  m.tokens = 16;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.dtype = KvDtype::kFp16;
  m.bytes = std::uint64_t{layers} * 2 * 16 * 8 * 128 * 2;
  m.token_offset = token_offset;
  m.fingerprint.fill(7);
  return m;
}

inline BlockKey Key(int i) {
  BlockKey::Bytes b{};
  b[0] = static_cast<std::uint8_t>(i);
  b[1] = static_cast<std::uint8_t>(i >> 8);
  b[31] = 0xab;
  return BlockKey(b);
}

class CacheHostNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    rng_.seed(seed_);
    char tmpl[] = "/tmp/kvf_node_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    server_ = *transport::CreateLoopbackTransport(transport::LoopbackOptions{&network_});
    client_transport_ = *transport::CreateLoopbackTransport(transport::LoopbackOptions{&network_});
    staging_ = *client_transport_->AllocateMemory(8 << 20, transport::MemoryKind::kHost);
    dp_ = *client::DataPlaneClient::Create(client_transport_.get());
  }

  void TearDown() override {
    dp_.reset();
    node_.reset();
    std::filesystem::remove_all(dir_);
  }

  CacheHostOptions Options(std::uint64_t pool_bytes, bool nvme) {
    CacheHostOptions o;
    o.host_id = "test-host";
    o.pool.pool_bytes = pool_bytes;
    o.pool.page_bytes = kPage;
    o.pool.lock_mode = LockMode::kOff;
    o.prefault = false;
    o.transport_allocates_pool = false;  // loopback allocations are not page-aligned
    o.policy = EvictionPolicyKind::kLru;
    o.transport_address = "loopback:0";
    o.maintenance_interval = std::chrono::milliseconds(5);
    if (nvme) {
      o.nvme.dir = dir_ + "/nvme";
      o.nvme.capacity_bytes = 64 << 20;
      o.nvme.segment_bytes = 32 << 20;
      o.nvme.max_group_bytes = 4 << 20;
      o.nvme.io_engine = IoEngineKind::kThreads;
    }
    return o;
  }

  // `env` is the node's clock (and files): Env::Default(), or clock_ where the
  // test moves time itself.
  void StartNode(CacheHostOptions o, Env* env = Env::Default()) {
    auto node = CacheHostNode::Create(std::move(o), server_.get(), env);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    node_ = std::move(*node);
    auto conn = dp_->Connect(node_->transport_address(), Clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    conn_ = std::move(*conn);
    ASSERT_TRUE(dp_->ExportRegion(conn_.get(), ++region_, *staging_, Clock::now() + std::chrono::seconds(5))
                    .ok());
  }

  // Restarts the node on the same NVMe directory (a new server transport, as a
  // new process would have).
  void RestartNode(CacheHostOptions o) {
    node_.reset();
    server_ = *transport::CreateLoopbackTransport(transport::LoopbackOptions{&network_});
    StartNode(std::move(o));
  }

  std::span<std::byte> Staging(std::uint64_t offset, std::uint64_t bytes) {
    return staging_->bytes().subspan(offset, bytes);
  }

  void Fill(std::uint64_t offset, std::uint64_t bytes, std::uint64_t salt) {
    std::mt19937_64 g(seed_ ^ salt);
    auto dst = Staging(offset, bytes);
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<std::byte>(g());
  }

  std::vector<wire::TransferRange> Ranges(const std::vector<ByteExtent>& extents,
                                          std::uint64_t staging_offset) {
    std::vector<wire::TransferRange> out;
    std::uint64_t pos = staging_offset;
    for (const ByteExtent& x : extents) {
      out.push_back({x.offset, x.length, pos});
      pos += x.length;
    }
    return out;
  }

  // Reserve, put from staging [offset, +bytes), commit. Returns the commit status.
  // Puts blocks Key(0..count) of 4 pages each (Meta(4, 16 i), salt i) into
  // `ns` and appends their keys to *keys.
  void PutFourPageBlocks(const std::string& ns, int count, std::vector<BlockKey>* keys) {
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(Put(ns, Key(i), Meta(4, 16 * i), 0, i).ok()) << i;
      keys->push_back(Key(i));
    }
  }

  Status Put(const std::string& ns, const BlockKey& key, const BlockMeta& meta,
             std::uint64_t offset, std::uint64_t salt) {
    Fill(offset, meta.bytes, salt);
    ReserveEntry e{key, meta};
    auto r = node_->Reserve(Namespace{ns}, std::span<const ReserveEntry>(&e, 1), 0);
    if (!r.ok()) return r.status();
    if (!r->results[0].status.ok()) return r->results[0].status;
    auto ranges = Ranges(r->results[0].extents, offset);
    KVF_RETURN_IF_ERROR(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token,
                                      region_, ranges, Clock::now() + std::chrono::seconds(10)));
    CommitEntry c{key, crc32c::Value(Staging(offset, meta.bytes))};
    auto s = node_->Commit(Namespace{ns}, GrantRef{r->grant.lease_id, r->grant.token}, std::span<const CommitEntry>(&c, 1),
                           true);
    if (!s.ok()) return s.status();
    return (*s)[0];
  }

  // Lease, get into staging [offset, ...), release. Returns the lease status
  // and sets *staged.
  Status Get(const std::string& ns, const BlockKey& key, std::uint64_t offset,
             bool* staged = nullptr) {
    auto l = node_->Lease(Namespace{ns}, std::span<const BlockKey>(&key, 1), {});
    // UNAVAILABLE means "retry" (a block staged from NVMe can be evicted again
    // by a background pass before this lease pins it), as clients do.
    for (int attempt = 0; attempt < 5 && l.ok() && l->results[0].status.IsUnavailable();
         ++attempt) {
      l = node_->Lease(Namespace{ns}, std::span<const BlockKey>(&key, 1), {});
    }
    if (!l.ok()) return l.status();
    const LeaseEntryResult& r = l->results[0];
    if (!r.status.ok()) return r.status;
    if (staged != nullptr) *staged = r.staged_from_nvme;
    KVF_RETURN_IF_ERROR(dp_->Transfer(conn_.get(), DataOp::kGet, l->grant.lease_id, l->grant.token,
                                      region_, Ranges(r.extents, offset),
                                      Clock::now() + std::chrono::seconds(10)));
    if (crc32c::Value(Staging(offset, r.meta.bytes)) != r.crc32c) {
      return Status::DataLoss("client-side CRC mismatch");
    }
    ReleaseEntry rel{l->grant.lease_id, l->grant.token, {}};
    return node_->Release(Namespace{ns}, std::span<const ReleaseEntry>(&rel, 1))[0];
  }

  // Fetches `keys` by key (one data-plane round trip per 16 keys) into
  // staging slots of `slot` bytes from `offset`.
  StatusOr<std::vector<wire::FetchKeyResult>> Fetch(
      const std::string& ns, const std::vector<BlockKey>& keys, std::uint64_t offset,
      std::uint64_t slot, std::optional<FingerprintDigest> fingerprint = std::nullopt,
      std::uint32_t first_layer = 0, std::uint32_t layer_count = 0) {
    std::vector<wire::FetchKey> raw;
    for (const BlockKey& k : keys) raw.push_back(k.bytes());
    client::DataPlaneClient::FetchRequest req;
    req.ns = ns;
    req.expected_fingerprint = fingerprint;
    req.keys = raw;
    req.region_id = region_;
    req.region_offset = offset;
    req.slot_bytes = slot;
    req.first_layer = first_layer;
    req.layer_count = layer_count;
    return dp_->Fetch(conn_.get(), req, Clock::now() + std::chrono::seconds(10));
  }

  // kStore of `keys`, each `meta` (its token_offset advanced by 16 per
  // key), from staging slots of meta.bytes from `offset` filled with salts
  // salt, salt + 1, ...; `crcs` (if given) instead of the bytes' own.
  StatusOr<std::vector<StatusCode>> StoreByKey(const std::string& ns,
                                               const std::vector<BlockKey>& keys,
                                               const BlockMeta& meta, std::uint64_t offset,
                                               std::uint64_t salt,
                                               const std::vector<std::uint32_t>* crcs = nullptr) {
    std::vector<wire::StoreEntry> entries(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint64_t at = offset + i * meta.bytes;
      // Past the staging region (a test of the daemon's bounds): nothing to fill.
      const bool inside = at + meta.bytes <= staging_->bytes().size();
      if (inside) Fill(at, meta.bytes, salt + i);
      wire::StoreEntry& e = entries[i];
      e.key = keys[i].bytes();
      e.region_offset = at;
      e.payload_bytes = meta.bytes;
      e.prefix_tokens = meta.token_offset + 16 * i;
      e.crc32c = crcs != nullptr ? (*crcs)[i] : inside ? crc32c::Value(Staging(at, meta.bytes)) : 0;
    }
    client::DataPlaneClient::StoreRequest req;
    req.ns = ns;
    req.region_id = region_;
    req.shape.representation = static_cast<std::uint8_t>(meta.representation);
    req.shape.dtype = static_cast<std::uint8_t>(meta.dtype);
    req.shape.format_version = 2;
    req.shape.tokens_per_block = meta.tokens;
    req.shape.layers = meta.layers;
    req.shape.kv_heads = meta.kv_heads;
    req.shape.head_dim = meta.head_dim;
    std::copy(meta.fingerprint.begin(), meta.fingerprint.end(), req.shape.fingerprint.begin());
    req.entries = entries;
    return dp_->Store(conn_.get(), req, Clock::now() + std::chrono::seconds(10));
  }

  // Whether staging [offset, +bytes) holds what Put wrote with `salt`.
  bool Holds(std::uint64_t offset, std::uint64_t bytes, std::uint64_t salt) {
    std::mt19937_64 g(seed_ ^ salt);
    auto got = Staging(offset, bytes);
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] != static_cast<std::byte>(g())) return false;
    }
    return true;
  }

  // Runs maintenance until the data plane holds no endpoint (closed ones go
  // once their peers see the close).
  ::testing::AssertionResult MaintainUntilNoDataEndpoints(const char* what) {
    return WaitFor(
        [&] {
          node_->TEST_RunMaintenance();
          return node_->Snapshot().data_plane_endpoints == 0;
        },
        std::chrono::seconds(10), what);
  }

  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string dir_;
  transport::LoopbackNetwork network_;
  std::unique_ptr<transport::Transport> server_;
  std::unique_ptr<transport::Transport> client_transport_;
  std::unique_ptr<transport::MemoryRegion> staging_;
  std::unique_ptr<client::DataPlaneClient> dp_;
  std::shared_ptr<client::DaemonConnection> conn_;
  std::uint32_t region_ = 0;
  FakeClockEnv clock_;  // outlives node_, which may read it
  // A disk a test can fail (options.nvme.env = &disk_); outlives node_, whose
  // NVMe committer thread writes through it until the node is destroyed.
  FaultInjectionEnv disk_{Env::Default()};
  std::unique_ptr<CacheHostNode> node_;
};

}  // namespace kvfabric::cache_host::node_test

#endif  // KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_NODE_TEST_FIXTURE_H_
