#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/cache_host/cache_host_node_test_fixture.h"

namespace kvfabric::cache_host::node_test {
namespace {

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

// kStore: reserve, pull, CRC check and commit in one data-plane round trip.
// What it commits reads back bit for bit (with its layer CRCs), a second
// store of a key answers AlreadyExists, a block whose bytes do not match its
// CRC is refused (DataLoss) without disturbing the others or leaving a
// reservation, a bad shape is refused per request, and bytes outside the
// client's region are refused before anything is reserved.
TEST_F(CacheHostNodeTest, StoreByKeyCommitsInOneRoundTripAndChecksEveryCrc) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(2);  // 128 KiB, two layer slices
  std::vector<BlockKey> keys;
  for (int i = 0; i < 11; ++i) keys.push_back(Key(i));  // two kStore messages (8 + 3)
  auto stored = StoreByKey("a", keys, meta, 0, 500);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_EQ(stored->size(), keys.size());
  for (StatusCode c : *stored) EXPECT_EQ(c, StatusCode::kOk);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(Get("a", keys[i], 4 << 20).ok()) << i;
    EXPECT_TRUE(Holds(4 << 20, meta.bytes, 500 + i)) << "block " << i;
  }
  // Its layer CRCs were computed at commit: a layer-range fetch verifies.
  auto layer1 = Fetch("a", {keys[3]}, 4 << 20, meta.bytes, std::nullopt, 1, 1);
  ASSERT_TRUE(layer1.ok()) << layer1.status().ToString();
  EXPECT_EQ((*layer1)[0].code, StatusCode::kOk);
  EXPECT_EQ((*layer1)[0].crc32c, crc32c::Value(Staging(4 << 20, meta.bytes / 2)));
  CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.grants_active, 0u);
  EXPECT_EQ(s.data_plane.stored_blocks, keys.size());

  // Again: every key is held already.
  auto again = StoreByKey("a", {keys[0], keys[1]}, meta, 0, 500);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0], StatusCode::kAlreadyExists);
  EXPECT_EQ((*again)[1], StatusCode::kAlreadyExists);

  // One block's CRC is wrong: only it is refused, and it leaves nothing.
  const std::vector<BlockKey> fresh = {Key(100), Key(101), Key(102)};
  std::vector<std::uint32_t> crcs;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    Fill(i * meta.bytes, meta.bytes, 700 + i);
    crcs.push_back(crc32c::Value(Staging(i * meta.bytes, meta.bytes)));
  }
  crcs[1] ^= 1;
  auto mixed = StoreByKey("a", fresh, meta, 0, 700, &crcs);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ((*mixed)[0], StatusCode::kOk);
  EXPECT_EQ((*mixed)[1], StatusCode::kDataLoss);
  EXPECT_EQ((*mixed)[2], StatusCode::kOk);
  EXPECT_EQ(Get("a", fresh[1], 4 << 20).code(), StatusCode::kNotFound);
  EXPECT_EQ(node_->Snapshot().grants_active, 0u);
  // ... and can be stored again with the right CRC.
  auto retry = StoreByKey("a", {fresh[1]}, meta, 0, 701);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ((*retry)[0], StatusCode::kOk);

  // A shape the block format cannot lay out: refused per request.
  BlockMeta odd = meta;
  odd.bytes += 2;  // not layers x 2 x tokens x heads x dim x 2
  auto bad = StoreByKey("a", {Key(200)}, odd, 0, 800);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_EQ((*bad)[0], StatusCode::kInvalidArgument);
  // Bytes past the end of the client's region: refused whole, nothing reserved.
  auto outside = StoreByKey("a", {Key(201)}, meta, staging_->bytes().size() - 4096, 801);
  EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument) << outside.status().ToString();
  EXPECT_EQ(node_->Snapshot().grants_active, 0u);
  EXPECT_EQ(Get("a", Key(201), 4 << 20).code(), StatusCode::kNotFound);
}

// A layer-range kFetch moves only those layer slices of each block, to the
// key's slot, and answers with the range's CRC: folded from the layer CRCs
// the daemon computed at commit (or read back from NVMe at promotion), it is
// what the client checks the landed bytes against.
TEST_F(CacheHostNodeTest, FetchOfALayerRangeMovesThoseLayersWithTheirCrc) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(4);  // 4 layers of 64 KiB
  const std::uint64_t layer = meta.bytes / 4;
  std::vector<BlockKey> keys;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Put("a", Key(i), meta, 0, 40 + i).ok()) << i;
    keys.push_back(Key(i));
  }
  // Whole blocks at [0, 3 x 256 KiB) as the reference.
  auto whole = Fetch("a", keys, 0, meta.bytes);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const std::uint64_t base = 2 << 20;
  for (std::uint32_t first = 0; first < 4; ++first) {
    for (std::uint32_t count = 1; first + count <= 4; ++count) {
      auto got = Fetch("a", keys, base, meta.bytes, std::nullopt, first, count);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const wire::FetchKeyResult& r = (*got)[i];
        ASSERT_EQ(r.code, StatusCode::kOk) << first << "+" << count;
        EXPECT_EQ(r.payload_bytes, count * layer);
        const std::uint64_t at = base + i * meta.bytes;
        EXPECT_EQ(0, std::memcmp(Staging(at, count * layer).data(),
                                 Staging(i * meta.bytes + first * layer, count * layer).data(),
                                 count * layer))
            << "block " << i << " layers " << first << "+" << count;
        EXPECT_EQ(r.crc32c, crc32c::Value(Staging(at, count * layer)));
      }
    }
  }
  // A range past the block's layers: OutOfRange for that key; a slot too
  // small for the range: ResourceExhausted.
  auto past = Fetch("a", {Key(0)}, base, meta.bytes, std::nullopt, 3, 2);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ((*past)[0].code, StatusCode::kOutOfRange);
  auto small = Fetch("a", {Key(0)}, base, layer, std::nullopt, 0, 2);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)[0].code, StatusCode::kResourceExhausted);
  EXPECT_EQ(node_->Snapshot().grants_active, 0u);
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
  ASSERT_NO_FATAL_FAILURE(PutFourPageBlocks("t", kBlocks, &keys));
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
    // Staged back, it has its layer CRCs (read from the NVMe record's
    // table): a layer-range fetch of it is checked like any other.
    auto layer2 = Fetch("t", one, 1 << 20, Meta(4).bytes, std::nullopt, 2, 1);
    if (layer2.ok() && (*layer2)[0].code == StatusCode::kOk) {
      const std::uint64_t lb = Meta(4).bytes / 4;
      EXPECT_EQ((*layer2)[0].crc32c, crc32c::Value(Staging(2 * lb, lb))) << i;
      EXPECT_EQ(0, std::memcmp(Staging(1 << 20, lb).data(), Staging(2 * lb, lb).data(), lb));
    } else {
      // Evicted again meanwhile (the pool holds four blocks): not a failure.
      EXPECT_TRUE(layer2.ok() && (*layer2)[0].code == StatusCode::kUnavailable);
    }
  }
  EXPECT_GT(nvme_only, 0);
  EXPECT_GT(host, 0);
  // Staging reads came from the control-plane Leases only.
  EXPECT_GE(node_->Snapshot().staging_reads - staging_reads, static_cast<std::uint64_t>(nvme_only));
}

// Contexts loading the same prefix (a shared system prompt) lease the same
// NVMe-only block at once. One lease stages it; the others wait for that read
// and lease its copy. Until 2026-12-07 they were refused ("being staged by
// another lease", "already has a host copy") and their clients recomputed the
// block: cluster_planner_bench logged such fallbacks in most runs.
TEST_F(CacheHostNodeTest, ConcurrentLeasesOfOneNvmeBlockAllGetItFromOneRead) {
  StartNode(Options(2 << 20, true));  // 32 pages of 64 KiB
  constexpr int kBlocks = 16;         // 4 pages each: two pools' worth
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(PutFourPageBlocks("t", kBlocks, &keys));
  std::vector<int> nvme_only;
  auto looked = node_->Lookup(Namespace{"t"}, keys);
  for (int i = 0; i < kBlocks; ++i) {
    if (looked[i].status.ok() && looked[i].tier == BlockTier::kNvme) nvme_only.push_back(i);
  }
  ASSERT_FALSE(nvme_only.empty());
  constexpr int kLeases = 4;
  for (int i : nvme_only) {
    const BlockKey key = Key(i);
    const CacheHostSnapshot before = node_->Snapshot();
    std::vector<StatusOr<LeaseBatch>> got(kLeases, Status::Unknown("not run"));
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kLeases; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kLeases) std::this_thread::yield();
        got[t] = node_->Lease(Namespace{"t"}, std::span<const BlockKey>(&key, 1), {});
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kLeases; ++t) {
      ASSERT_TRUE(got[t].ok()) << got[t].status().ToString();
      EXPECT_TRUE(got[t]->results[0].status.ok())
          << "block " << i << ", lease " << t << ": " << got[t]->results[0].status.ToString();
      EXPECT_EQ(got[t]->results[0].crc32c, looked[i].crc32c) << i;
      if (!got[t]->results[0].status.ok()) continue;
      ReleaseEntry rel{got[t]->grant.lease_id, got[t]->grant.token, {}};
      EXPECT_TRUE(node_->Release(Namespace{"t"}, std::span<const ReleaseEntry>(&rel, 1))[0].ok());
    }
    const CacheHostSnapshot after = node_->Snapshot();
    // One read, however many leases asked; the others waited for it or found
    // its copy in the pool.
    EXPECT_EQ(after.staging_reads - before.staging_reads, 1u) << i;
    std::printf("block %d: %llu of %d leases waited for another's staging read\n", i,
                static_cast<unsigned long long>(after.staging_waits - before.staging_waits),
                kLeases);
  }
}

}  // namespace
}  // namespace kvfabric::cache_host::node_test
