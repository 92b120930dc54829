#include "server/cache_host/cache_host_node.h"

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
#include "server/cache_host/data_plane.h"
#include "transport/loopback_transport.h"

namespace kvfabric::cache_host {
namespace {

using client::DataOp;
using transport::Clock;

constexpr std::uint64_t kPage = 64 << 10;
constexpr std::uint32_t kRegion = 1;

// An exact fp16 block of `layers` layers x 16 tokens x 8 heads x 128 dims:
// layers x 64 KiB.
BlockMeta Meta(std::uint32_t layers, std::uint64_t token_offset = 0) {
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

BlockKey Key(int i) {
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
      std::uint64_t slot, std::optional<FingerprintDigest> fingerprint = std::nullopt) {
    std::vector<wire::FetchKey> raw;
    for (const BlockKey& k : keys) raw.push_back(k.bytes());
    client::DataPlaneClient::FetchRequest req;
    req.ns = ns;
    req.expected_fingerprint = fingerprint;
    req.keys = raw;
    req.region_id = region_;
    req.region_offset = offset;
    req.slot_bytes = slot;
    return dp_->Fetch(conn_.get(), req, Clock::now() + std::chrono::seconds(10));
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
  std::unique_ptr<CacheHostNode> node_;
};

TEST_F(CacheHostNodeTest, PutThenGetRoundTripsEveryByte) {
  StartNode(Options(8 << 20, false));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Put("a", Key(i), Meta(3), 0, i).ok());
  }
  for (int i = 0; i < 4; ++i) {
    std::vector<std::byte> want(Meta(3).bytes);
    Fill(0, want.size(), i);
    std::memcpy(want.data(), Staging(0, want.size()).data(), want.size());
    ASSERT_TRUE(Get("a", Key(i), 4 << 20).ok());
    EXPECT_EQ(0, std::memcmp(want.data(), Staging(4 << 20, want.size()).data(), want.size()));
  }
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.table.commits, 4u);
  EXPECT_EQ(s.table.hits, 4u);
  EXPECT_EQ(s.grants_active, 0u);
}

// Several blocks reserved together and moved in one request: their pool
// pages are adjacent, so the data plane joins their ranges into few transport
// entries (JoinAdjacentRanges). Every byte must still land at its own offset,
// whether the client's staging for the blocks is contiguous (ranges join) or
// has gaps (they do not), and whatever order the client lists them in.
TEST_F(CacheHostNodeTest, MultiBlockTransfersRoundTripJoinedOrNot) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(1);  // 64 KiB: several blocks per 256 KiB page run
  constexpr int kBlocks = 6;
  for (std::uint64_t gap : {std::uint64_t{0}, std::uint64_t{4096}}) {
    SCOPED_TRACE("staging gap " + std::to_string(gap));
    const int base = gap == 0 ? 0 : 100;
    std::vector<ReserveEntry> es;
    for (int i = 0; i < kBlocks; ++i) es.push_back({Key(base + i), meta});
    auto r = node_->Reserve(Namespace{"a"}, es, 0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<wire::TransferRange> ranges;
    std::vector<CommitEntry> commits;
    for (int i = 0; i < kBlocks; ++i) {
      ASSERT_TRUE(r->results[i].status.ok()) << r->results[i].status.ToString();
      const std::uint64_t at = i * (meta.bytes + gap);
      Fill(at, meta.bytes, base + i);
      for (const auto& x : Ranges(r->results[i].extents, at)) ranges.push_back(x);
      commits.push_back({Key(base + i), crc32c::Value(Staging(at, meta.bytes))});
    }
    if (gap == 0) {
      EXPECT_LT(JoinAdjacentRanges(ranges, kMaxJoinedRangeBytes).size(), ranges.size());
    } else {
      EXPECT_EQ(JoinAdjacentRanges(ranges, kMaxJoinedRangeBytes).size(), ranges.size());
    }
    ASSERT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token, region_,
                              ranges, Clock::now() + std::chrono::seconds(10))
                    .ok());
    auto c = node_->Commit(Namespace{"a"}, GrantRef{r->grant.lease_id, r->grant.token}, commits, true);
    ASSERT_TRUE(c.ok());
    for (const Status& st : *c) ASSERT_TRUE(st.ok()) << st.ToString();

    // One GET of all blocks, in reverse order, into the second half of staging.
    std::vector<BlockKey> keys;
    for (int i = kBlocks - 1; i >= 0; --i) keys.push_back(Key(base + i));
    auto l = node_->Lease(Namespace{"a"}, keys, {});
    ASSERT_TRUE(l.ok());
    std::vector<wire::TransferRange> get;
    const std::uint64_t out = 4 << 20;
    for (int k = 0; k < kBlocks; ++k) {
      ASSERT_TRUE(l->results[k].status.ok());
      for (const auto& x : Ranges(l->results[k].extents, out + k * (meta.bytes + gap))) {
        get.push_back(x);
      }
    }
    ASSERT_TRUE(dp_->Transfer(conn_.get(), DataOp::kGet, l->grant.lease_id, l->grant.token, region_, get,
                              Clock::now() + std::chrono::seconds(10))
                    .ok());
    for (int k = 0; k < kBlocks; ++k) {
      const int i = kBlocks - 1 - k;
      EXPECT_EQ(crc32c::Value(Staging(out + k * (meta.bytes + gap), meta.bytes)),
                commits[i].crc32c)
          << "block " << i;
    }
    ReleaseEntry rel{l->grant.lease_id, l->grant.token, {}};
    ASSERT_TRUE(node_->Release(Namespace{"a"}, std::span<const ReleaseEntry>(&rel, 1))[0].ok());
  }
}

TEST(JoinAdjacentRangesTest, JoinsOnlyWhatContinuesInBothSpacesUpToTheCap) {
  using R = wire::TransferRange;
  auto eq = [](const std::vector<R>& a, const std::vector<R>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i].pool_offset != b[i].pool_offset || a[i].length != b[i].length ||
          a[i].region_offset != b[i].region_offset) {
        return false;
      }
    }
    return true;
  };
  EXPECT_TRUE(JoinAdjacentRanges({}, 100).empty());
  // Adjacent in both: joined.
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{0, 10, 50}, {10, 10, 60}, {20, 5, 70}}, 100),
                 {{0, 25, 50}}));
  // Adjacent in the pool only, or in the region only: kept apart.
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{0, 10, 50}, {10, 10, 61}}, 100),
                 {{0, 10, 50}, {10, 10, 61}}));
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{0, 10, 50}, {11, 10, 60}}, 100),
                 {{0, 10, 50}, {11, 10, 60}}));
  // Backwards (the next range ends where the previous begins): kept apart.
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{10, 10, 60}, {0, 10, 50}}, 100),
                 {{10, 10, 60}, {0, 10, 50}}));
  // The cap: joins up to it, then starts a new range; an oversized range stays whole.
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{0, 10, 0}, {10, 10, 10}, {20, 10, 20}}, 20),
                 {{0, 20, 0}, {20, 10, 20}}));
  EXPECT_TRUE(eq(JoinAdjacentRanges(std::vector<R>{{0, 30, 0}, {30, 10, 30}}, 20),
                 {{0, 30, 0}, {30, 10, 30}}));
  // Sums that would wrap never join.
  const std::uint64_t top = ~std::uint64_t{0} - 4;
  EXPECT_EQ(JoinAdjacentRanges(std::vector<R>{{top, 10, 0}, {5, 10, 10}}, 100).size(), 2u);
}

TEST_F(CacheHostNodeTest, NamespacesDoNotSeeEachOther) {
  StartNode(Options(8 << 20, false));
  ASSERT_TRUE(Put("a", Key(1), Meta(1), 0, 1).ok());
  EXPECT_TRUE(Get("b", Key(1), 0).IsNotFound());
  const BlockKey k = Key(1);
  EXPECT_TRUE(node_->Lookup(Namespace{"b"}, std::span<const BlockKey>(&k, 1))[0].status.IsNotFound());
  EXPECT_TRUE(node_->Delete(Namespace{"b"}, std::span<const BlockKey>(&k, 1))[0].IsNotFound());
  EXPECT_TRUE(Get("a", Key(1), 0).ok());
}

TEST_F(CacheHostNodeTest, RefusesTransfersOutsideTheGrant) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(2);
  ReserveEntry e{Key(1), meta};
  auto r = node_->Reserve(Namespace{"a"}, std::span<const ReserveEntry>(&e, 1), 0);
  ASSERT_TRUE(r.ok() && r->results[0].status.ok());
  auto ranges = Ranges(r->results[0].extents, 0);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  AccessToken wrong = r->grant.token;
  wrong[3] ^= 1;
  EXPECT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, wrong, region_, ranges,
                            deadline)
                  .IsNotFound());
  // A read of the write grant's pages.
  EXPECT_FALSE(dp_->Transfer(conn_.get(), DataOp::kGet, r->grant.lease_id, r->grant.token, region_,
                             ranges, deadline)
                   .ok());
  // One byte past the block.
  auto past = ranges;
  past.back().length += 1;
  EXPECT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token, region_, past,
                            deadline)
                  .IsInvalidArgument());
  // Pages of the pool the grant does not hold.
  auto elsewhere = ranges;
  elsewhere[0].pool_offset = node_->pool_bytes() - kPage;
  elsewhere[0].length = 16;
  EXPECT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token, region_,
                            elsewhere, deadline)
                  .IsInvalidArgument());
  // Past the client's own region.
  auto beyond = ranges;
  beyond[0].region_offset = staging_->bytes().size();
  EXPECT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token, region_,
                            beyond, deadline)
                  .IsInvalidArgument());
  EXPECT_GE(node_->Snapshot().transfers_refused, 3u);
}

TEST_F(CacheHostNodeTest, ConcurrentWritersOfOneKeyOneWins) {
  StartNode(Options(8 << 20, false));
  ReserveEntry e{Key(1), Meta(1)};
  auto first = node_->Reserve(Namespace{"a"}, std::span<const ReserveEntry>(&e, 1), 0);
  auto second = node_->Reserve(Namespace{"a"}, std::span<const ReserveEntry>(&e, 1), 0);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(first->results[0].status.ok());
  EXPECT_EQ(second->results[0].status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(second->grant.lease_id, 0u);
}

TEST_F(CacheHostNodeTest, CommitWithWrongCrcPublishesNothing) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(1);
  Fill(0, meta.bytes, 5);
  ReserveEntry e{Key(1), meta};
  auto r = node_->Reserve(Namespace{"a"}, std::span<const ReserveEntry>(&e, 1), 0);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(dp_->Transfer(conn_.get(), DataOp::kPut, r->grant.lease_id, r->grant.token, region_,
                            Ranges(r->results[0].extents, 0),
                            Clock::now() + std::chrono::seconds(5))
                  .ok());
  CommitEntry c{Key(1), crc32c::Value(Staging(0, meta.bytes)) ^ 1};
  auto s = node_->Commit(Namespace{"a"}, GrantRef{r->grant.lease_id, r->grant.token}, std::span<const CommitEntry>(&c, 1),
                         false);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*s)[0].IsDataLoss()) << (*s)[0].ToString();
  EXPECT_TRUE(Get("a", Key(1), 0).IsNotFound());
  EXPECT_EQ(node_->Snapshot().pages.reserved, 0u);
}

// Issue 17: a block is published only over bytes its writer's transfers put
// there. Tenant b reserves the pages tenant a's deleted block used and commits
// with a's CRC without a transfer: refused, and nothing of a's is readable.
TEST_F(CacheHostNodeTest, CommitWithoutAWriteIsRefusedEvenWithThePreviousOwnersCrc) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(1);
  ASSERT_TRUE(Put("a", Key(1), meta, 0, 7).ok());
  const std::uint32_t secret_crc = crc32c::Value(Staging(0, meta.bytes));
  const BlockKey gone = Key(1);
  ASSERT_TRUE(node_->Delete(Namespace{"a"}, std::span<const BlockKey>(&gone, 1))[0].ok());

  ReserveEntry e{Key(2), meta};
  auto r = node_->Reserve(Namespace{"b"}, std::span<const ReserveEntry>(&e, 1), 0);
  ASSERT_TRUE(r.ok() && r->results[0].status.ok());
  CommitEntry c{Key(2), secret_crc};
  auto s = node_->Commit(Namespace{"b"}, GrantRef{r->grant.lease_id, r->grant.token}, std::span<const CommitEntry>(&c, 1),
                         false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].code(), StatusCode::kFailedPrecondition) << (*s)[0];
  EXPECT_THAT(std::string((*s)[0].message()), ::testing::HasSubstr("never written"));
  EXPECT_TRUE(Get("b", Key(2), 0).IsNotFound());
}

TEST_F(CacheHostNodeTest, UncommittedReservationExpiresAndItsPagesReturn) {
  // The node reads time through its Env: the reservation's 20 ms pass when the
  // test says so, whatever the maintenance thread does meanwhile.
  StartNode(Options(8 << 20, false), &clock_);
  ReserveEntry e{Key(1), Meta(2)};
  auto r = node_->Reserve(Namespace{"a"}, std::span<const ReserveEntry>(&e, 1), 20'000);
  ASSERT_TRUE(r.ok() && r->results[0].status.ok());
  EXPECT_EQ(node_->Snapshot().pages.reserved, 2u);
  clock_.Advance(19'999);
  node_->TEST_RunMaintenance();
  EXPECT_EQ(node_->Snapshot().pages.reserved, 2u) << "expired before its TTL";
  EXPECT_EQ(node_->Snapshot().table.reservations_expired, 0u);
  clock_.Advance(1);
  node_->TEST_RunMaintenance();
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.pages.reserved, 0u);
  EXPECT_EQ(s.table.reservations_expired, 1u);
  CommitEntry c{Key(1), 0};
  EXPECT_TRUE(node_->Commit(Namespace{"a"}, GrantRef{r->grant.lease_id, r->grant.token},
                            std::span<const CommitEntry>(&c, 1), false)
                  .status()
                  .IsNotFound());
}

TEST_F(CacheHostNodeTest, FullPoolRefusesWritesAndKeepsServingReads) {
  CacheHostOptions o = Options(1 << 20, false);  // 16 pages, no NVMe
  o.watermarks = {1.0, 1.0};                      // no background eviction
  o.leases.max_leased_bytes_per_namespace = 4 << 20;  // "a" may pin the pool (twice) here
  StartNode(std::move(o));
  int stored = 0;
  for (int i = 0; i < 4; ++i) stored += Put("a", Key(i), Meta(4), 0, i).ok() ? 1 : 0;
  EXPECT_EQ(stored, 4);
  // Lease every block so nothing can be evicted.
  std::vector<BlockKey> keys = {Key(0), Key(1), Key(2), Key(3)};
  auto held = node_->Lease(Namespace{"a"}, keys, {});
  ASSERT_TRUE(held.ok());
  Status s = Put("a", Key(9), Meta(4), 0, 9);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("pages"), std::string::npos) << s.ToString();
  EXPECT_TRUE(Get("a", Key(2), 2 << 20).ok());
}

TEST_F(CacheHostNodeTest, QuotaMakesRoomOnlyFromTheTenantsOwnBlocks) {
  CacheHostOptions o = Options(2 << 20, false);  // 32 pages of 64 KiB
  o.quotas = {{"small", 512 << 10}};            // 2 blocks of 4 pages
  o.watermarks = {1.0, 1.0};                     // no background eviction
  StartNode(std::move(o));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put("big", Key(100 + i), Meta(4), 0, 100 + i).ok());
  // "small" writes four blocks into a two-block quota: each write past the
  // quota evicts one of its own older blocks, never one of "big"'s.
  for (int i = 0; i < 4; ++i) {
    Status s = Put("small", Key(i), Meta(4), 0, i);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  std::vector<BlockKey> big = {Key(100), Key(101), Key(102), Key(103)};
  for (const LookupEntryResult& r : node_->Lookup(Namespace{"big"}, big)) {
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  }
  std::vector<BlockKey> small = {Key(0), Key(1), Key(2), Key(3)};
  int present = 0;
  for (const LookupEntryResult& r : node_->Lookup(Namespace{"small"}, small)) {
    present += r.status.ok() ? 1 : 0;
  }
  EXPECT_EQ(present, 2);
  EXPECT_EQ(node_->Snapshot().table.evictions, 2u);
  // Holding both of its blocks, "small" cannot write a third: refused, with
  // the quota named.
  auto held = node_->Lease(Namespace{"small"}, small, {});
  ASSERT_TRUE(held.ok());
  Status s = Put("small", Key(9), Meta(4), 0, 9);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("quota"), std::string::npos) << s.ToString();
}

TEST_F(CacheHostNodeTest, DrainRefusesNewWorkAndResumeUndoesIt) {
  StartNode(Options(8 << 20, false));
  ASSERT_TRUE(Put("a", Key(1), Meta(1), 0, 1).ok());
  EXPECT_EQ(node_->Drain(false), ServingState::kDraining);
  EXPECT_TRUE(Put("a", Key(2), Meta(1), 0, 2).IsUnavailable());
  const BlockKey k = Key(1);
  EXPECT_TRUE(node_->Lookup(Namespace{"a"}, std::span<const BlockKey>(&k, 1))[0].status.ok());
  EXPECT_EQ(node_->Drain(true), ServingState::kServing);
  EXPECT_TRUE(Put("a", Key(2), Meta(1), 0, 2).ok());
}

TEST_F(CacheHostNodeTest, DemotesToNvmeStagesBackAndRecoversAfterRestart) {
  StartNode(Options(1 << 20, true));  // 16 pages of 64 KiB
  constexpr int kBlocks = 12;         // 4 pages each: 48 pages, three pools' worth
  for (int i = 0; i < kBlocks; ++i) {
    Status s = Put("tenant", Key(i), Meta(4, 16 * i), 0, i);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_GT(s.table.demotions_completed, 0u);
  int staged_reads = 0;
  for (int i = 0; i < kBlocks; ++i) {
    bool staged = false;
    Status g = Get("tenant", Key(i), 4 << 20, &staged);
    ASSERT_TRUE(g.ok()) << i << ": " << g.ToString();
    staged_reads += staged ? 1 : 0;
    std::vector<std::byte> got(Staging(4 << 20, Meta(4).bytes).begin(),
                               Staging(4 << 20, Meta(4).bytes).end());
    Fill(0, Meta(4).bytes, i);
    EXPECT_EQ(0, std::memcmp(got.data(), Staging(0, got.size()).data(), got.size())) << i;
  }
  EXPECT_GT(staged_reads, 0);

  // Every block whose demotion finished is on NVMe; a restart finds them all.
  std::vector<BlockKey> keys;
  for (int i = 0; i < kBlocks; ++i) keys.push_back(Key(i));
  std::vector<int> on_nvme;
  auto looked = node_->Lookup(Namespace{"tenant"}, keys);
  for (int i = 0; i < kBlocks; ++i) {
    if (looked[i].status.ok() && OnNvme(looked[i].tier)) on_nvme.push_back(i);
  }
  ASSERT_FALSE(on_nvme.empty());
  RestartNode(Options(1 << 20, true));
  s = node_->Snapshot();
  EXPECT_GE(s.table.recovered, on_nvme.size());
  for (int i : on_nvme) {
    ASSERT_TRUE(Get("tenant", Key(i), 4 << 20).ok()) << i;
    std::vector<std::byte> got(Staging(4 << 20, Meta(4).bytes).begin(),
                               Staging(4 << 20, Meta(4).bytes).end());
    Fill(0, Meta(4).bytes, i);
    EXPECT_EQ(0, std::memcmp(got.data(), Staging(0, got.size()).data(), got.size())) << i;
  }
  // The namespace and position came back from the catalog.
  auto again = node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&keys[on_nvme[0]], 1));
  ASSERT_TRUE(again[0].status.ok());
  EXPECT_EQ(again[0].meta.token_offset, 16u * on_nvme[0]);
  EXPECT_TRUE(node_->Lookup(Namespace{"other"}, std::span<const BlockKey>(&keys[on_nvme[0]], 1))[0]
                  .status.IsNotFound());
}

// Issue 17: the NVMe tier and its catalog were keyed by block key alone. The
// same key in two namespaces collided: after a restart one namespace served
// the other's payload, and deleting one tenant's block dropped the other's
// catalog entry. Each (namespace, key) is its own NVMe block now, and a
// delete survives restarts.
TEST_F(CacheHostNodeTest, SameKeyInTwoNamespacesStaysApartOnNvmeAcrossRestartsAndDeletes) {
  const CacheHostOptions options = Options(1 << 20, true);  // 16 pages of 64 KiB
  StartNode(options);
  const BlockKey k = Key(100);
  const BlockMeta meta_a = Meta(4, 0), meta_b = Meta(4, 32);
  ASSERT_TRUE(Put("a", k, meta_a, 0, /*salt=*/1).ok());
  ASSERT_TRUE(Put("b", k, meta_b, 0, /*salt=*/2).ok());
  auto tier_of = [&](const std::string& ns) {
    auto r = node_->Lookup(Namespace{ns}, std::span<const BlockKey>(&k, 1));
    return r[0].status.ok() ? std::optional<BlockTier>(r[0].tier) : std::nullopt;
  };
  // Other blocks push both out to NVMe (LRU: the oldest go first).
  for (int i = 0; i < 24 && !(tier_of("a") == BlockTier::kNvme && tier_of("b") == BlockTier::kNvme);
       ++i) {
    ASSERT_TRUE(Put("filler", Key(i), Meta(4), 0, 10 + i).ok());
  }
  ASSERT_EQ(tier_of("a"), BlockTier::kNvme);
  ASSERT_EQ(tier_of("b"), BlockTier::kNvme);
  // Reads back `ns`'s copy of k and compares it with the payload of `salt`.
  auto expect_payload = [&](const std::string& ns, std::uint64_t salt) {
    SCOPED_TRACE(ns);
    ASSERT_TRUE(Get(ns, k, 4 << 20).ok());
    std::vector<std::byte> got(Staging(4 << 20, meta_a.bytes).begin(),
                               Staging(4 << 20, meta_a.bytes).end());
    Fill(0, meta_a.bytes, salt);
    EXPECT_EQ(0, std::memcmp(got.data(), Staging(0, got.size()).data(), got.size()));
  };

  RestartNode(options);
  expect_payload("a", 1);
  expect_payload("b", 2);
  auto b_meta = node_->Lookup(Namespace{"b"}, std::span<const BlockKey>(&k, 1));
  ASSERT_TRUE(b_meta[0].status.ok());
  EXPECT_EQ(b_meta[0].meta.token_offset, 32u);

  // Deleting b's block leaves a's, now and after a restart.
  for (int i = 0; i < 24 && (tier_of("a") != BlockTier::kNvme || tier_of("b") != BlockTier::kNvme);
       ++i) {
    ASSERT_TRUE(Put("filler", Key(200 + i), Meta(4), 0, 50 + i).ok());
  }
  ASSERT_EQ(tier_of("b"), BlockTier::kNvme);
  ASSERT_TRUE(node_->Delete(Namespace{"b"}, std::span<const BlockKey>(&k, 1))[0].ok());
  expect_payload("a", 1);
  RestartNode(options);
  EXPECT_FALSE(tier_of("b").has_value()) << "the delete did not survive the restart";
  expect_payload("a", 1);
}

// Issue 17: with the NVMe tier full, every Reserve failed and the daemon
// logged 751,000 "demotion failed" lines. A tier far smaller than the pool:
// eviction counts its free space and drops what does not fit, so no demotion
// fails and the daemon keeps serving.
TEST_F(CacheHostNodeTest, TierFarSmallerThanThePoolEvictsInsteadOfFailingDemotions) {
  CacheHostOptions o = Options(1 << 20, true);  // 16 pages of 64 KiB
  o.nvme.capacity_bytes = 1 << 20;              // room for 3 blocks of 256 KiB
  o.nvme.segment_bytes = 1 << 20;
  o.nvme.max_group_bytes = 512 << 10;
  StartNode(std::move(o));
  for (int i = 0; i < 40; ++i) {  // 10 MiB through a 1 MiB pool and a 1 MiB tier
    Status s = Put("t", Key(i), Meta(4), 0, i);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  ASSERT_TRUE(Get("t", Key(39), 4 << 20).ok());
  const CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.demotion_failures, 0u);
  EXPECT_GT(s.evictions_by_action[static_cast<int>(EvictionAction::kEvict)], 0u);
  EXPECT_LE(s.nvme.used_bytes, std::uint64_t{1} << 20);
}

// The same with a filesystem that refuses every write (a full disk, say):
// demotions fail, then demotion backs off and eviction drops blocks instead;
// failures stay bounded by the passes before the backoff, not by the blocks
// written; once the filesystem takes writes again, demotion resumes.
TEST_F(CacheHostNodeTest, FailingFilesystemBacksDemotionOffAndKeepsServing) {
  FaultInjectionEnv disk(Env::Default());
  CacheHostOptions o = Options(1 << 20, true);
  o.nvme.env = &disk;
  StartNode(std::move(o), &clock_);  // time moves only when the test says
  disk.SetFilesystemActive(false);
  for (int i = 0; i < 40; ++i) {
    Status s = Put("t", Key(i), Meta(4), 0, i);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_GT(s.demotion_failures, 0u);
  EXPECT_LE(s.demotion_failures, 16u) << "demotions were retried block after block";
  EXPECT_TRUE(s.demotion_backing_off);
  EXPECT_GT(s.evictions_by_action[static_cast<int>(EvictionAction::kEvict)], 0u);
  ASSERT_TRUE(Get("t", Key(39), 4 << 20).ok());

  disk.SetFilesystemActive(true);
  clock_.Advance(std::chrono::seconds(31));  // past the longest backoff
  const std::uint64_t failures = s.demotion_failures;
  for (int i = 40; i < 60; ++i) ASSERT_TRUE(Put("t", Key(i), Meta(4), 0, i).ok()) << i;
  s = node_->Snapshot();
  EXPECT_EQ(s.demotion_failures, failures);
  EXPECT_GT(s.table.demotions_completed, 0u);
  EXPECT_FALSE(s.demotion_backing_off);
}

// Issue 17: 1,000 idle connections stayed open, and nothing bounded them.
// Connections are capped in all (and per host); idle ones are closed.
TEST_F(CacheHostNodeTest, DataConnectionsAreCappedAndIdleOnesClosed) {
  CacheHostOptions o = Options(8 << 20, false);
  o.data_plane.max_connections = 3;
  o.data_plane.idle_timeout_us = 1'000'000;
  StartNode(std::move(o), &clock_);  // dp_'s connection is the first
  std::vector<std::unique_ptr<transport::Endpoint>> extra;
  for (int i = 0; i < 3; ++i) {
    auto ep = client_transport_->Connect(node_->transport_address(),
                                         transport::PeerFailureMode::kFailInFlight,
                                         Clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(ep.ok()) << ep.status();
    extra.push_back(std::move(*ep));
  }
  ASSERT_TRUE(WaitFor([&] { return node_->Snapshot().data_plane.connections_refused == 1; },
                      std::chrono::seconds(10), "the fourth connection to be refused"));
  EXPECT_EQ(node_->Snapshot().data_plane_endpoints, 3u);
  ASSERT_TRUE(WaitFor([&] { return !extra[2]->health().ok(); }, std::chrono::seconds(10),
                      "the refused endpoint to fail"));
  // Nothing happens on them for longer than the idle timeout: all closed.
  clock_.Advance(std::chrono::milliseconds(1001));
  node_->TEST_RunMaintenance();
  EXPECT_EQ(node_->Snapshot().data_plane.closed_idle, 3u);
  ASSERT_TRUE(MaintainUntilNoDataEndpoints("the closed endpoints to go"));
}

// Issue 17: a peer that sent requests and never read the replies grew the
// daemon without bound, and a stalled transfer held its leases as long as the
// peer stayed connected. Here the client's transport stops progressing the
// daemon's pushes and replies: past max_requests_per_connection it is
// disconnected, and a transfer past transfer_timeout closes its connection;
// either way the transfers end and their lease brackets with them.
TEST_F(CacheHostNodeTest, PeerThatStopsReadingIsDisconnectedAndItsTransfersEnd) {
  CacheHostOptions o = Options(8 << 20, false);
  o.data_plane.max_outstanding_per_connection = 3;
  o.data_plane.transfer_timeout_us = 10'000'000;
  StartNode(std::move(o), &clock_);
  const BlockKey k = Key(1);
  ASSERT_TRUE(Put("a", k, Meta(1), 0, 1).ok());
  auto l = node_->Lease(Namespace{"a"}, std::span<const BlockKey>(&k, 1), {});
  ASSERT_TRUE(l.ok() && l->results[0].status.ok());
  auto* loopback = static_cast<transport::LoopbackTransport*>(client_transport_.get());
  loopback->TEST_StallPeerWork(true);
  for (int i = 0; i < 5; ++i) {  // none can complete: the client does not progress
    Status s = dp_->Transfer(conn_.get(), DataOp::kGet, l->grant.lease_id, l->grant.token, region_,
                             Ranges(l->results[0].extents, 0),
                             Clock::now() + std::chrono::milliseconds(50));
    EXPECT_FALSE(s.ok());
  }
  node_->TEST_RunMaintenance();
  EXPECT_EQ(node_->Snapshot().data_plane.closed_overloaded, 1u);
  loopback->TEST_StallPeerWork(false);
  ASSERT_TRUE(MaintainUntilNoDataEndpoints("the overloaded connection to go"));
  // Its transfers ended: the grant releases at once (no read in flight).
  ReleaseEntry rel{l->grant.lease_id, l->grant.token, {}};
  ASSERT_TRUE(node_->Release(Namespace{"a"}, std::span<const ReleaseEntry>(&rel, 1))[0].ok());
  EXPECT_EQ(node_->Snapshot().pages.leased, 0u);

  // A new connection, one stalled transfer, and time passes its deadline.
  auto conn = dp_->Connect(node_->transport_address(), Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE(dp_->ExportRegion(conn->get(), region_, *staging_, Clock::now() + std::chrono::seconds(5))
                  .ok());
  l = node_->Lease(Namespace{"a"}, std::span<const BlockKey>(&k, 1), {});
  ASSERT_TRUE(l.ok() && l->results[0].status.ok());
  loopback->TEST_StallPeerWork(true);
  EXPECT_FALSE(dp_->Transfer(conn->get(), DataOp::kGet, l->grant.lease_id, l->grant.token, region_,
                             Ranges(l->results[0].extents, 0),
                             Clock::now() + std::chrono::milliseconds(50))
                   .ok());
  clock_.Advance(std::chrono::seconds(11));
  node_->TEST_RunMaintenance();
  EXPECT_EQ(node_->Snapshot().data_plane.closed_transfer_timeout, 1u);
  loopback->TEST_StallPeerWork(false);
  ASSERT_TRUE(MaintainUntilNoDataEndpoints("the timed-out connection to go"));
}

TEST_F(CacheHostNodeTest, ReportsEveryBlockEventForPlacement) {
  StartNode(Options(1 << 20, true));
  std::mutex mu;
  std::vector<BlockEventRecord> events;
  node_->set_block_event_sink([&](std::vector<BlockEventRecord> batch) {
    std::lock_guard<std::mutex> lock(mu);
    events.insert(events.end(), batch.begin(), batch.end());
  });
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(Put("t", Key(i), Meta(4), 0, i).ok());
  bool staged = false;
  int first_on_nvme = -1;
  for (int i = 0; i < 8 && first_on_nvme < 0; ++i) {
    ASSERT_TRUE(Get("t", Key(i), 4 << 20, &staged).ok());
    if (staged) first_on_nvme = i;
  }
  ASSERT_GE(first_on_nvme, 0);
  const BlockKey gone = Key(7);
  auto del = node_->Delete(Namespace{"t"}, std::span<const BlockKey>(&gone, 1));
  std::map<BlockEventKind, int> kinds;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const BlockEventRecord& e : events) {
      ++kinds[e.kind];
      EXPECT_EQ(e.tenant, "t");
    }
  }
  EXPECT_EQ(kinds[BlockEventKind::kCommitted], 8);
  EXPECT_GE(kinds[BlockEventKind::kDemoted], 1);
  EXPECT_GE(kinds[BlockEventKind::kPromoted], 1);
  if (del[0].ok()) {
    EXPECT_EQ(kinds[BlockEventKind::kDeleted], 1);
  }
  // A full report lists every block the node holds.
  std::vector<BlockEventRecord> snapshot = node_->SnapshotBlocks();
  EXPECT_EQ(snapshot.size(), del[0].ok() ? 7u : 8u);
  for (const BlockEventRecord& e : snapshot) EXPECT_EQ(e.kind, BlockEventKind::kPresent);
  // The sink captures this test's locals: stop the node (its maintenance
  // thread and NVMe committer may still emit) before they go.
  node_.reset();
}

TEST_F(CacheHostNodeTest, CorruptNvmeBlockIsNeverServed) {
  StartNode(Options(1 << 20, true));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(Put("t", Key(i), Meta(4), 0, i).ok());
  std::vector<BlockKey> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(Key(i));
  node_.reset();  // everything queued is committed to NVMe on shutdown
  // Flip one payload byte in every segment file, past the segment header.
  int flipped = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_ + "/nvme")) {
    const std::string name = f.path().filename().string();
    if (name.rfind("catalog", 0) == 0) continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = std::filesystem::file_size(f.path());
    if (size < 64 << 10) continue;
    io.seekg(8192 + 4096);  // inside the first record's payload
    char c = 0;
    io.read(&c, 1);
    c ^= 0x40;
    io.seekp(8192 + 4096);
    io.write(&c, 1);
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  server_ = *transport::CreateLoopbackTransport(transport::LoopbackOptions{&network_});
  StartNode(Options(1 << 20, true));
  // Recovery verified every CRC: the damaged block was dropped, the rest serve.
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_GE(s.recovery.dropped_corrupt + s.recovery.dropped_torn, 1u);
  int served = 0, missing = 0;
  for (int i = 0; i < 12; ++i) {
    Status g = Get("t", Key(i), 4 << 20);
    if (g.ok()) {
      ++served;
      Fill(0, Meta(4).bytes, i);
      EXPECT_EQ(0, std::memcmp(Staging(0, Meta(4).bytes).data(),
                               Staging(4 << 20, Meta(4).bytes).data(), Meta(4).bytes))
          << "block " << i << " served with wrong bytes";
    } else {
      EXPECT_TRUE(g.IsNotFound() || g.IsDataLoss()) << g.ToString();
      ++missing;
    }
  }
  EXPECT_GE(missing, 1);
  EXPECT_GT(served, 0);
}

// kFetch: lease, push and release by key in one data-plane round trip. 20
// keys take two requests (16 keys each at most); every block lands in its own
// slot, a key the daemon lacks answers NotFound without disturbing the
// others, and no grant outlives the request.
TEST_F(CacheHostNodeTest, FetchByKeyLandsEveryBlockInItsSlotAndKeepsNoGrant) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(1);  // 64 KiB
  std::vector<BlockKey> keys;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Put("a", Key(i), meta, 0, 100 + i).ok()) << i;
    keys.push_back(Key(i));
  }
  keys.insert(keys.begin() + 7, Key(999));  // never stored
  const std::uint64_t slot = meta.bytes + 4096;  // slots larger than the blocks
  auto got = Fetch("a", keys, 1 << 20, slot);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const wire::FetchKeyResult& r = (*got)[i];
    if (i == 7) {
      EXPECT_EQ(r.code, StatusCode::kNotFound);
      continue;
    }
    const int block = static_cast<int>(i < 7 ? i : i - 1);
    ASSERT_EQ(r.code, StatusCode::kOk) << i;
    EXPECT_EQ(r.payload_bytes, meta.bytes);
    const std::uint64_t at = (1 << 20) + i * slot;
    EXPECT_TRUE(Holds(at, meta.bytes, 100 + block)) << "block " << block;
    EXPECT_EQ(r.crc32c, crc32c::Value(Staging(at, meta.bytes))) << block;
  }
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.table.hits, 20u);
  EXPECT_EQ(s.table.misses, 1u);
  EXPECT_EQ(s.grants_active, 0u);
  EXPECT_EQ(s.table.active_leases, 0u);
  // The pages are free to go: deleting every block succeeds.
  keys.erase(keys.begin() + 7);
  for (const Status& d : node_->Delete(Namespace{"a"}, keys)) EXPECT_TRUE(d.ok()) << d.ToString();
}

TEST_F(CacheHostNodeTest, FetchChecksNamespaceFingerprintAndSlots) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(2);  // 128 KiB
  ASSERT_TRUE(Put("a", Key(1), meta, 0, 1).ok());
  const std::vector<BlockKey> one = {Key(1)};
  // Another namespace does not see the block.
  auto got = Fetch("b", one, 0, meta.bytes);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0].code, StatusCode::kNotFound);
  // Another model's fingerprint is refused; the right one is served.
  FingerprintDigest other;
  other.fill(9);
  got = Fetch("a", one, 0, meta.bytes, other);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].code, StatusCode::kFailedPrecondition);
  got = Fetch("a", one, 0, meta.bytes, meta.fingerprint);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].code, StatusCode::kOk);
  // A slot smaller than the block moves nothing into it.
  std::memset(Staging(0, meta.bytes).data(), 0, meta.bytes);
  got = Fetch("a", one, 0, meta.bytes - 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].code, StatusCode::kResourceExhausted);
  EXPECT_EQ((*got)[0].payload_bytes, meta.bytes);
  EXPECT_EQ(Staging(0, 1)[0], std::byte{0});
  // Slots past the end of the region: the whole request is refused.
  got = Fetch("a", one, staging_->bytes().size() - meta.bytes + 1, meta.bytes);
  EXPECT_TRUE(got.status().IsInvalidArgument()) << got.status().ToString();
  // A region that was never imported.
  std::vector<wire::FetchKey> raw = {Key(1).bytes()};
  client::DataPlaneClient::FetchRequest req;
  req.ns = "a";
  req.keys = raw;
  req.region_id = region_ + 50;
  req.slot_bytes = meta.bytes;
  EXPECT_TRUE(dp_->Fetch(conn_.get(), req, Clock::now() + std::chrono::seconds(10)).status().IsNotFound());
  // A draining daemon refuses the whole request.
  node_->Drain(false);
  EXPECT_TRUE(Fetch("a", one, 0, meta.bytes).status().IsUnavailable());
  node_->Drain(true);
  EXPECT_TRUE(Fetch("a", one, 0, meta.bytes).ok());
  EXPECT_EQ(node_->Snapshot().grants_active, 0u);
}

// kFetch never does I/O on the data path: a block resting on NVMe only
// answers Unavailable, and a control-plane Lease stages it as before.
TEST_F(CacheHostNodeTest, FetchLeavesNvmeOnlyBlocksToTheControlPlane) {
  StartNode(Options(1 << 20, true));  // 16 pages of 64 KiB
  constexpr int kBlocks = 12;         // 4 pages each: three pools' worth
  std::vector<BlockKey> keys;
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(Put("t", Key(i), Meta(4, 16 * i), 0, i).ok()) << i;
    keys.push_back(Key(i));
  }
  ASSERT_GT(node_->Snapshot().table.demotions_completed, 0u);
  const std::uint64_t staging_reads = node_->Snapshot().staging_reads;
  int host = 0, nvme_only = 0;
  for (int i = 0; i < kBlocks; ++i) {
    const std::vector<BlockKey> one = {Key(i)};
    auto got = Fetch("t", one, 0, Meta(4).bytes);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if ((*got)[0].code == StatusCode::kOk) {
      ++host;
      EXPECT_TRUE(Holds(0, Meta(4).bytes, i)) << i;
      continue;
    }
    // Refused only as Unavailable, and only because it rests on NVMe alone
    // (nothing but the Get below stages a block back).
    EXPECT_EQ((*got)[0].code, StatusCode::kUnavailable) << i;
    EXPECT_EQ(node_->Lookup(Namespace{"t"}, one)[0].tier, BlockTier::kNvme) << i;
    ++nvme_only;
    ASSERT_TRUE(Get("t", Key(i), 0).ok()) << i;  // the control plane stages it
    EXPECT_TRUE(Holds(0, Meta(4).bytes, i)) << i;
  }
  EXPECT_GT(nvme_only, 0);
  EXPECT_GT(host, 0);
  // Staging reads came from the control-plane Leases only.
  EXPECT_GE(node_->Snapshot().staging_reads - staging_reads, static_cast<std::uint64_t>(nvme_only));
}

}  // namespace
}  // namespace kvfabric::cache_host
