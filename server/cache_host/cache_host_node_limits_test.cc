// CacheHostNode under a hostile or careless client and a failing disk (issue
// 17): bytes a writer never wrote, namespaces sharing keys on NVMe, a full
// or failing NVMe tier, and data-plane connections that stay idle or stop
// reading. Same fixture as cache_host_node_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/cache_host/cache_host_node_test_fixture.h"

namespace kvfabric::cache_host::node_test {
namespace {

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
  CacheHostOptions o = Options(1 << 20, true);
  o.nvme.env = &disk_;
  StartNode(std::move(o), &clock_);  // time moves only when the test says
  disk_.SetFilesystemActive(false);
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

  disk_.SetFilesystemActive(true);
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
  // Nothing happens on them for longer than the idle timeout: all closed. A
  // connection whose last reply (the region import's) is still being
  // delivered is not idle yet; it is closed by a later maintenance pass.
  clock_.Advance(std::chrono::milliseconds(1001));
  ASSERT_TRUE(WaitFor(
      [&] {
        node_->TEST_RunMaintenance();
        return node_->Snapshot().data_plane.closed_idle == 3u;
      },
      std::chrono::seconds(10), "the three idle connections to be closed"));
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
  // The client gave up on its side after 50 ms each; the daemon's data-plane
  // thread may still be receiving the requests on a loaded machine.
  ASSERT_TRUE(WaitFor(
      [&] {
        node_->TEST_RunMaintenance();
        return node_->Snapshot().data_plane.closed_overloaded == 1;
      },
      std::chrono::seconds(10), "the overloaded connection to be closed"));
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

}  // namespace
}  // namespace kvfabric::cache_host::node_test
