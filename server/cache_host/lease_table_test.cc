#include "server/cache_host/lease_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "core/crc32c.h"
#include "core/testing/test_seed.h"

namespace kvfabric::cache_host {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kTtl = 1'000'000;

BlockKey KeyOf(std::uint32_t k) {
  BlockKey::Bytes bytes{};
  bytes[0] = static_cast<std::uint8_t>(k);
  bytes[1] = static_cast<std::uint8_t>(k >> 8);
  return BlockKey(bytes);
}

BlockMeta Meta(std::uint64_t bytes, std::uint64_t token_offset = 0) {
  BlockMeta m;
  m.bytes = bytes;
  m.tokens = 16;
  m.token_offset = token_offset;
  return m;
}

class LeaseTableTest : public ::testing::Test {
 protected:
  void MakeTable(std::uint64_t pages, LeaseTableOptions options = {}) {
    auto memory = AllocateAnonymousPoolMemory(pages * kPage, false);
    ASSERT_TRUE(memory.ok());
    auto pool = HostPagePool::Create({pages * kPage, kPage, LockMode::kOff}, *std::move(memory));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    table_ = std::make_unique<LeaseTable>(
        pool_.get(), [this] { return now_.load(); }, options);
  }

  // The payload Put writes for key k.
  static std::vector<std::byte> Pattern(std::uint32_t k, std::uint64_t bytes) {
    std::vector<std::byte> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = std::byte((i * 31 + k) & 0xff);
    return data;
  }

  // Reserves, fills with Pattern(k), commits.
  void Put(const Namespace& ns, std::uint32_t k, std::uint64_t bytes, std::uint64_t offset = 0) {
    auto r = table_->Reserve(ns, KeyOf(k), Meta(bytes, offset), kTtl);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<std::byte> data = Pattern(k, bytes);
    ASSERT_TRUE(table_->CopyIn(r->id, data).ok());
    ASSERT_TRUE(table_->Commit(r->id, crc32c::Value(data)).ok());
  }

  std::atomic<std::uint64_t> now_{1000};
  std::unique_ptr<HostPagePool> pool_;
  std::unique_ptr<LeaseTable> table_;
  const Namespace a_{"tenant-a"};
  const Namespace b_{"tenant-b"};
  LruPolicy lru_;
};

TEST_F(LeaseTableTest, CommittedBlockIsLeasedWithItsPagesAndCrc) {
  MakeTable(16);
  Put(a_, 1, 3 * kPage + 5);
  const BlockKey keys[] = {KeyOf(1), KeyOf(2)};
  auto lease = table_->Lease(a_, keys, kTtl);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id, 0u);
  ASSERT_EQ(lease->blocks.size(), 2u);
  const LeasedBlock& b = lease->blocks[0];
  EXPECT_EQ(b.outcome, LeaseOutcome::kLeased);
  EXPECT_EQ(b.pages.TotalPages(), 4u);
  EXPECT_EQ(pool_->Crc32c(b.pages, b.bytes), b.crc32c);
  EXPECT_EQ(lease->blocks[1].outcome, LeaseOutcome::kMissing);
  EXPECT_EQ(pool_->Counts().leased, 4u);
  ASSERT_TRUE(table_->Release(lease->id).ok());
  EXPECT_EQ(pool_->Counts().leased, 0u);
  EXPECT_TRUE(table_->Release(lease->id).IsNotFound());
  const auto c = table_->Counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 1u);
}

TEST_F(LeaseTableTest, SecondWriterOfAKeyGetsAlreadyExists) {
  MakeTable(16);
  auto first = table_->Reserve(a_, KeyOf(1), Meta(kPage), kTtl);
  ASSERT_TRUE(first.ok());
  auto second = table_->Reserve(a_, KeyOf(1), Meta(kPage), kTtl);
  ASSERT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("reserved by another writer"));
  // Another namespace's key space is separate.
  EXPECT_TRUE(table_->Reserve(b_, KeyOf(1), Meta(kPage), kTtl).ok());
  std::vector<std::byte> zero(kPage);
  ASSERT_TRUE(table_->CopyIn(first->id, zero).ok());
  ASSERT_TRUE(table_->Commit(first->id, crc32c::Value(zero)).ok());
  auto third = table_->Reserve(a_, KeyOf(1), Meta(kPage), kTtl);
  EXPECT_EQ(third.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("already committed"));
}

TEST_F(LeaseTableTest, ConcurrentWritersOfOneKeyExactlyOneWins) {
  std::mt19937_64 rng(TestSeed("LeaseTableTest.ConcurrentWritersOfOneKeyExactlyOneWins"));
  MakeTable(256);
  constexpr int kThreads = 8;
  constexpr int kKeys = 64;
  std::atomic<int> wins{0}, already{0}, other{0};
  std::vector<std::uint64_t> seeds(kThreads);
  for (auto& s : seeds) s = rng();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seeds[t]);
      for (int k = 0; k < kKeys; ++k) {
        auto r = table_->Reserve(a_, KeyOf(k), Meta(kPage + k), kTtl);
        if (!r.ok()) {
          (r.status().code() == StatusCode::kAlreadyExists ? already : other)++;
          continue;
        }
        std::vector<std::byte> data(kPage + k);
        for (auto& byte : data) byte = std::byte(local() & 0xff);
        ASSERT_TRUE(table_->CopyIn(r->id, data).ok());
        if (table_->Commit(r->id, crc32c::Value(data)).ok())
          wins++;
        else
          other++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wins.load(), kKeys);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(already.load(), kKeys * (kThreads - 1));
  // Every published block verifies: no writer overwrote another's pages.
  for (int k = 0; k < kKeys; ++k) {
    auto e = table_->Lookup(a_, KeyOf(k));
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(pool_->Crc32c(e->host_pages, e->meta.bytes), e->crc32c);
  }
  EXPECT_EQ(pool_->Counts().committed, 1 + (kKeys - 1) * 2u);  // key 0 fits one page
  EXPECT_EQ(pool_->Counts().reserved, 0u);
}

TEST_F(LeaseTableTest, CrcMismatchAtCommitReturnsPagesAndPublishesNothing) {
  MakeTable(8);
  auto r = table_->Reserve(a_, KeyOf(1), Meta(2 * kPage), kTtl);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pool_->Counts().free, 6u);
  std::vector<std::byte> data(2 * kPage, std::byte{7});
  ASSERT_TRUE(table_->CopyIn(r->id, data).ok());
  const std::uint32_t good = crc32c::Value(data);
  const Status s = table_->Commit(r->id, good ^ 1);
  ASSERT_TRUE(s.IsDataLoss()) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("payload CRC mismatch"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nothing published"));
  EXPECT_EQ(pool_->Counts().free, 8u);
  EXPECT_TRUE(table_->Lookup(a_, KeyOf(1)).status().IsNotFound());
  EXPECT_TRUE(table_->Commit(r->id, good).IsNotFound());
  EXPECT_EQ(table_->Counters().crc_failures, 1u);
  EXPECT_TRUE(table_->Usage(a_).status().IsNotFound()) << "a holds nothing: reclaimed";
  // The key is free for a correct writer.
  Put(a_, 1, 2 * kPage);
}

// kStore's commit: the transport computed each layer slice's CRC where the
// bytes landed, and Commit folds those instead of reading the pages again.
// They are what is compared with the writer's CRC (a slice CRC of other
// bytes fails the commit although the pages match), and they become the
// block's layer CRCs; a count that is not the block's slices is ignored
// and the pages are read.
TEST_F(LeaseTableTest, CommitFoldsLandedSliceCrcsInsteadOfReadingThePagesAgain) {
  MakeTable(32);
  auto meta = [] {
    BlockMeta m = Meta(4 * kPage);
    m.layers = 4;
    return m;
  };
  auto slices_of = [](std::span<const std::byte> data) {
    std::vector<std::uint32_t> out;
    for (std::size_t at = 0; at < data.size(); at += kPage) {
      out.push_back(crc32c::Value(data.subspan(at, kPage)));
    }
    return out;
  };
  const std::vector<std::byte> data = Pattern(1, 4 * kPage);
  auto r = table_->Reserve(a_, KeyOf(1), meta(), kTtl);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(table_->CopyIn(r->id, data).ok());
  const std::vector<std::uint32_t> slices = slices_of(data);
  ASSERT_TRUE(table_->Commit(r->id, crc32c::Value(data), slices).ok());
  const BlockKey one[] = {KeyOf(1)};
  auto lease = table_->Lease(a_, one, kTtl, nullptr, /*with_layer_crcs=*/true);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->blocks[0].crc32c, crc32c::Value(data));
  EXPECT_EQ(lease->blocks[0].layer_crc32c, slices);
  ASSERT_TRUE(table_->Release(lease->id).ok());

  // The pages hold key 2's bytes; slice CRCs of other bytes fail the commit.
  const std::vector<std::byte> other = Pattern(2, 4 * kPage);
  r = table_->Reserve(a_, KeyOf(2), meta(), kTtl);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(table_->CopyIn(r->id, other).ok());
  EXPECT_TRUE(table_->Commit(r->id, crc32c::Value(other), slices).IsDataLoss());

  // Three CRCs for four slices: not the transfer's, so the pages are read.
  r = table_->Reserve(a_, KeyOf(3), meta(), kTtl);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(table_->CopyIn(r->id, other).ok());
  const std::vector<std::uint32_t> three(slices.begin(), slices.begin() + 3);
  EXPECT_TRUE(table_->Commit(r->id, crc32c::Value(other), three).ok());
}

// Issue 17's probe, the half that lives in Commit's answer: tenant B reserves
// the pages tenant A's deleted block used and commits with a wrong CRC. The
// DATA_LOSS answer must not carry the CRC the daemon computed over those
// pages: it was a checksum of A's bytes, which B could then commit with.
TEST_F(LeaseTableTest, CrcMismatchNamesNoChecksumOfBytesTheCallerDidNotWrite) {
  MakeTable(4);
  const std::uint64_t bytes = 2 * kPage;
  const std::vector<std::byte> secret = Pattern(5, bytes);
  Put(a_, 5, bytes);
  ASSERT_TRUE(table_->Delete(a_, KeyOf(5)).ok());

  auto b = table_->Reserve(b_, KeyOf(6), Meta(bytes), kTtl);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<std::byte> mine(bytes, std::byte{1});
  ASSERT_TRUE(table_->CopyIn(b->id, mine).ok());
  const Status s = table_->Commit(b->id, 0);  // a wrong CRC over B's own bytes
  ASSERT_TRUE(s.IsDataLoss()) << s;
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", crc32c::Value(secret));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr(hex))) << s;
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("computed"))) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("declared 0x00000000"));
}

// Issue 17's probe, the half that lives in the pages: tenant B reserves the
// pages tenant A's deleted block used and, knowing A's CRC, commits without
// writing (or after writing only part). Pages are not cleared on reuse, so
// the table must refuse every payload byte no transfer of B's wrote.
TEST_F(LeaseTableTest, CommitRefusesPayloadBytesTheWriterNeverWrote) {
  MakeTable(4);
  const std::uint64_t bytes = 3 * kPage + 100;
  const std::vector<std::byte> secret = Pattern(5, bytes);
  Put(a_, 5, bytes);
  const std::string a_pages = table_->Lookup(a_, KeyOf(5))->host_pages.ToString();
  ASSERT_TRUE(table_->Delete(a_, KeyOf(5)).ok());

  auto b = table_->Reserve(b_, KeyOf(6), Meta(bytes), kTtl);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->pages.ToString(), a_pages) << "the probe needs A's pages";
  // Nothing written: the CRC matches A's bytes, and still nothing publishes.
  Status s = table_->Commit(b->id, crc32c::Value(secret));
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::to_string(bytes) + " of its " +
                                                  std::to_string(bytes) +
                                                  " payload bytes were never written"));
  EXPECT_TRUE(table_->Lookup(b_, KeyOf(6)).status().IsNotFound());

  // A transfer that failed records nothing; one that landed records its range.
  const std::uint64_t base = std::uint64_t{b->pages.begin()->first} * kPage;
  ASSERT_TRUE(table_->BeginWriteRange(b->id, base, kPage).ok());
  ASSERT_TRUE(table_->EndWrite(b->id).ok());
  s = table_->Commit(b->id, crc32c::Value(secret));
  EXPECT_THAT(std::string(s.message()), HasSubstr("first gap at byte 0")) << s;
  ASSERT_TRUE(table_->BeginWriteRange(b->id, base + 10, kPage).ok());
  ASSERT_TRUE(table_->EndWrite(b->id, PoolRange{base + 10, kPage}).ok());
  s = table_->Commit(b->id, crc32c::Value(secret));
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(std::to_string(bytes - kPage) + " of its " + std::to_string(bytes)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("first gap at byte 0")) << s;
  // Bytes 10..kPage+10 are B's; the rest still are not.
  ASSERT_TRUE(table_->BeginWriteRange(b->id, base, 10).ok());
  ASSERT_TRUE(table_->EndWrite(b->id, PoolRange{base, 10}).ok());
  s = table_->Commit(b->id, crc32c::Value(secret));
  EXPECT_THAT(std::string(s.message()), HasSubstr("first gap at byte " + std::to_string(kPage + 10)))
      << s;
  EXPECT_EQ(pool_->Counts().reserved, 4u) << "a refused commit keeps the reservation";

  // B writes its own payload over all of it: that commits, with B's bytes.
  std::vector<std::byte> mine(bytes, std::byte{0x5a});
  ASSERT_TRUE(table_->CopyIn(b->id, mine).ok());
  ASSERT_TRUE(table_->Commit(b->id, crc32c::Value(mine)).ok());
  auto e = table_->Lookup(b_, KeyOf(6));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(pool_->Crc32c(e->host_pages, bytes), crc32c::Value(mine));
}

TEST_F(LeaseTableTest, WrittenRangesOfAReservationAreBounded) {
  MakeTable(4);
  auto r = table_->Reserve(a_, KeyOf(1), Meta(4 * kPage), kTtl);
  ASSERT_TRUE(r.ok());
  const std::uint64_t base = std::uint64_t{r->pages.begin()->first} * kPage;
  // Disjoint one-byte writes at every other byte.
  std::size_t i = 0;
  for (; i < kMaxWrittenRanges; ++i) {
    ASSERT_TRUE(table_->BeginWriteRange(r->id, base + 2 * i, 1).ok()) << i;
    ASSERT_TRUE(table_->EndWrite(r->id, PoolRange{base + 2 * i, 1}).ok());
  }
  const Status s = table_->BeginWriteRange(r->id, base + 2 * i, 1);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("disjoint written ranges"));
  // A range that merges them is still refused at the cap (the check is before
  // the write), but the writer can always write the whole block in one go
  // after Abort; and a landed range outside the payload is refused.
  ASSERT_TRUE(table_->Abort(r->id).ok());
  auto r2 = table_->Reserve(a_, KeyOf(1), Meta(kPage), kTtl);
  ASSERT_TRUE(r2.ok());
  const std::uint64_t base2 = std::uint64_t{r2->pages.begin()->first} * kPage;
  ASSERT_TRUE(table_->BeginWriteRange(r2->id, base2, 1).ok());
  EXPECT_EQ(table_->EndWrite(r2->id, PoolRange{base2, 2 * kPage}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Commit(r2->id, 0).code(), StatusCode::kFailedPrecondition);
}

// Issue 17: one connection's Reserves and Leases held every reservation and
// lease of the daemon. Each namespace now has its own caps, named in the
// refusal, and another namespace is still served.
TEST_F(LeaseTableTest, PerNamespaceCapsBoundReservationsLeasesAndPinnedBytes) {
  LeaseTableOptions o;
  o.max_reservations_per_namespace = 3;
  o.max_reserved_bytes_per_namespace = 5 * kPage;
  o.max_leases_per_namespace = 2;
  o.max_leased_bytes_per_namespace = 3 * kPage;
  MakeTable(64, o);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(table_->Reserve(a_, KeyOf(k), Meta(kPage), kTtl).ok());
  StatusOr<WriteReservation> r = table_->Reserve(a_, KeyOf(9), Meta(kPage), kTtl);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--max-reservations-per-namespace"));
  ASSERT_TRUE(table_->Reserve(b_, KeyOf(0), Meta(2 * kPage), kTtl).ok()) << "b is not a's";
  r = table_->Reserve(b_, KeyOf(1), Meta(4 * kPage), kTtl);  // 2 + 4 pages > 5
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--max-reserved-bytes-per-namespace"));

  for (int k = 10; k < 14; ++k) Put(b_, k, kPage);
  const BlockKey one[] = {KeyOf(10)};
  const BlockKey two[] = {KeyOf(11), KeyOf(12)};
  auto l1 = table_->Lease(b_, one, kTtl);
  ASSERT_TRUE(l1.ok());
  const BlockKey big[] = {KeyOf(11), KeyOf(12), KeyOf(13)};  // 1 + 3 pages pinned > 3
  auto refused = table_->Lease(b_, big, kTtl);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("--max-leased-bytes-per-namespace"));
  EXPECT_EQ(table_->Lookup(b_, KeyOf(11))->read_pins, 0u) << "a refused lease pins nothing";
  auto l2 = table_->Lease(b_, two, kTtl);
  ASSERT_TRUE(l2.ok());
  refused = table_->Lease(b_, one, kTtl);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--max-leases-per-namespace"));
  ASSERT_TRUE(table_->Release(l1->id).ok());
  EXPECT_TRUE(table_->Lease(b_, one, kTtl).ok());
}

// Issue 17: 4,096 invented tenant names filled the namespace table for good.
// A namespace that holds nothing is reclaimed; its eviction history stays
// findable by name and never shows under the id's next owner.
TEST_F(LeaseTableTest, NamespacesThatHoldNothingAreReclaimed) {
  LeaseTableOptions o;
  o.index.max_namespaces = 2;
  MakeTable(4, o);
  auto r = table_->Reserve(Namespace{"n1"}, KeyOf(1), Meta(kPage), kTtl);
  ASSERT_TRUE(r.ok());
  Put(Namespace{"n2"}, 2, kPage);
  StatusOr<WriteReservation> full = table_->Reserve(Namespace{"n3"}, KeyOf(3), Meta(kPage), kTtl);
  ASSERT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("--max-namespaces"));
  ASSERT_TRUE(table_->Abort(r->id).ok());  // n1 holds nothing now
  ASSERT_TRUE(table_->Reserve(Namespace{"n3"}, KeyOf(3), Meta(kPage), kTtl).ok());
  EXPECT_TRUE(table_->Usage(Namespace{"n1"}).status().IsNotFound());
  // n2's block is evicted: n2 is reclaimed, and its decision stays its own.
  EvictionRequest req;
  req.pages_needed = 4;
  req.scope = Namespace{"n2"};
  ASSERT_TRUE(table_->MakeRoom(lru_, req).ok());
  EXPECT_TRUE(table_->Usage(Namespace{"n2"}).status().IsNotFound());
  EXPECT_EQ(table_->Explain(Namespace{"n2"}, KeyOf(2)).size(), 1u);
  Put(Namespace{"n4"}, 2, kPage);  // likely n2's old id
  EXPECT_TRUE(table_->Explain(Namespace{"n4"}, KeyOf(2)).empty());
  EXPECT_EQ(table_->Usages().size(), 2u);
}

TEST_F(LeaseTableTest, ExpiredReservationReturnsItsPages) {
  MakeTable(8);
  auto r = table_->Reserve(a_, KeyOf(1), Meta(3 * kPage), 500);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->expires_at_us, 1500u);
  EXPECT_EQ(table_->ExpireUntil(1499).reservations, 0u);
  EXPECT_EQ(pool_->Counts().reserved, 3u);
  EXPECT_EQ(table_->ExpireUntil(1500).reservations, 1u);
  EXPECT_EQ(pool_->Counts().reserved, 0u);
  EXPECT_EQ(pool_->Counts().free, 8u);
  EXPECT_TRUE(table_->Commit(r->id, 0).IsNotFound());
  EXPECT_EQ(table_->Counters().reservations_expired, 1u);
  EXPECT_TRUE(table_->Reserve(a_, KeyOf(1), Meta(kPage), kTtl).ok());  // key free again
}

TEST_F(LeaseTableTest, ReservationWithAWriteInFlightOutlivesItsTtl) {
  MakeTable(4);
  auto r = table_->Reserve(a_, KeyOf(1), Meta(kPage), 100);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(table_->BeginWrite(r->id).ok());
  EXPECT_EQ(table_->ExpireUntil(5000).reservations, 0u);  // the payload is still landing
  EXPECT_EQ(pool_->Counts().reserved, 1u);
  EXPECT_EQ(table_->Commit(r->id, 0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_->Abort(r->id).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table_->EndWrite(r->id).ok());
  EXPECT_EQ(table_->EndWrite(r->id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_->ExpireUntil(5000).reservations, 1u);
  EXPECT_EQ(pool_->Counts().free, 4u);
  EXPECT_TRUE(table_->BeginWrite(r->id).IsNotFound());
}

TEST_F(LeaseTableTest, LeaseWithAReadInFlightOutlivesItsTtlAndRelease) {
  MakeTable(4);
  Put(a_, 1, kPage);
  const BlockKey keys[] = {KeyOf(1)};
  auto lease = table_->Lease(a_, keys, 100);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(table_->BeginRead(lease->id).ok());
  EXPECT_EQ(table_->ExpireUntil(5000).leases, 0u);
  ASSERT_TRUE(table_->Release(lease->id).ok());  // deferred to EndRead
  EXPECT_EQ(pool_->Counts().leased, 1u);
  EXPECT_TRUE(table_->BeginRead(lease->id).IsNotFound());
  EXPECT_EQ(table_->Delete(a_, KeyOf(1)).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table_->EndRead(lease->id).ok());
  EXPECT_EQ(pool_->Counts().leased, 0u);
  EXPECT_TRUE(table_->Delete(a_, KeyOf(1)).ok());
}

TEST_F(LeaseTableTest, LeasedPagesAreNeverEvictedUntilReleased) {
  MakeTable(10);
  for (std::uint32_t k = 0; k < 10; ++k) {
    now_ = 1000 + k;
    Put(a_, k, kPage);
  }
  // Lease the least recently used block, which LRU would evict first.
  const BlockKey oldest[] = {KeyOf(0)};
  now_ = 999;  // the lease touches it: keep it the oldest
  auto lease = table_->Lease(a_, oldest, kTtl);
  ASSERT_TRUE(lease.ok());
  EvictionRequest req;  // 10/10 > high 9 -> down to 8
  auto pass = table_->MakeRoom(lru_, req);
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_EQ(pass->decisions.size(), 2u);
  for (const auto& d : pass->decisions) EXPECT_NE(d.key, KeyOf(0));
  EXPECT_EQ(pass->decisions[0].key, KeyOf(1));
  EXPECT_TRUE(table_->Lookup(a_, KeyOf(0)).ok());
  EXPECT_EQ(table_->Delete(a_, KeyOf(0)).status().code(), StatusCode::kFailedPrecondition);
  // Even the pool refuses to recycle a leased page.
  EXPECT_EQ(pool_->Free(lease->blocks[0].pages).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table_->Release(lease->id).ok());
  EXPECT_TRUE(table_->Delete(a_, KeyOf(0)).ok());
}

TEST_F(LeaseTableTest, ExpiredLeaseUnpinsItsPages) {
  MakeTable(4);
  Put(a_, 1, kPage);
  const BlockKey keys[] = {KeyOf(1)};
  auto lease = table_->Lease(a_, keys, 100);
  ASSERT_TRUE(lease.ok());
  auto renewed = table_->Renew(lease->id, 200);
  ASSERT_TRUE(renewed.ok());
  EXPECT_EQ(*renewed, 1200u);
  EXPECT_EQ(table_->ExpireUntil(1100).leases, 0u);  // the renewal moved it
  EXPECT_EQ(pool_->Counts().leased, 1u);
  EXPECT_EQ(table_->ExpireUntil(1200).leases, 1u);
  EXPECT_EQ(pool_->Counts().leased, 0u);
  EXPECT_TRUE(table_->Release(lease->id).IsNotFound());
  EXPECT_TRUE(table_->Delete(a_, KeyOf(1)).ok());
  EXPECT_EQ(table_->Counters().leases_expired, 1u);
}

TEST_F(LeaseTableTest, FullPoolRefusesWithAMessageAndKeepsServingReads) {
  MakeTable(4);
  Put(a_, 1, 2 * kPage);
  Put(a_, 2, 2 * kPage);
  auto r = table_->Reserve(a_, KeyOf(3), Meta(kPage), kTtl);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("need 1 pages, 0 of 4 free"));
  const BlockKey keys[] = {KeyOf(1)};
  auto lease = table_->Lease(a_, keys, kTtl);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->blocks[0].outcome, LeaseOutcome::kLeased);
  // The caller makes room for its namespace and retries: block 2 goes (1 is leased).
  EvictionRequest req;
  req.scope = a_;
  req.pages_needed = 1;
  auto pass = table_->MakeRoom(lru_, req);
  ASSERT_TRUE(pass.ok());
  ASSERT_EQ(pass->decisions.size(), 1u);
  EXPECT_EQ(pass->decisions[0].key, KeyOf(2));
  EXPECT_TRUE(table_->Reserve(a_, KeyOf(3), Meta(kPage), kTtl).ok());
}

TEST_F(LeaseTableTest, NamespacesNeverSeeLeaseOrEvictEachOther) {
  MakeTable(8);
  Put(a_, 1, kPage);
  Put(a_, 2, kPage);
  Put(b_, 9, kPage);
  const BlockKey a_keys[] = {KeyOf(1)};
  auto lease = table_->Lease(b_, a_keys, kTtl);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->id, 0u);  // nothing pinned
  EXPECT_EQ(lease->blocks[0].outcome, LeaseOutcome::kMissing);
  EXPECT_TRUE(table_->Lookup(b_, KeyOf(1)).status().IsNotFound());
  EXPECT_TRUE(table_->Delete(b_, KeyOf(1)).status().IsNotFound());
  EXPECT_TRUE(table_->Lease(Namespace{"never-seen"}, a_keys, kTtl).ok());
  // b needs the whole pool: a pass scoped to b only takes b's block.
  EvictionRequest req;
  req.scope = b_;
  req.pages_needed = 8;
  auto pass = table_->MakeRoom(lru_, req);
  ASSERT_TRUE(pass.ok());
  ASSERT_EQ(pass->decisions.size(), 1u);
  EXPECT_EQ(pass->decisions[0].key, KeyOf(9));
  EXPECT_EQ(pass->decisions[0].tenant, "tenant-b");
  EXPECT_TRUE(table_->Lookup(a_, KeyOf(1)).ok());
  EXPECT_TRUE(table_->Lookup(a_, KeyOf(2)).ok());
}

TEST_F(LeaseTableTest, QuotaRefusesOnlyTheNamespaceOverIt) {
  MakeTable(16);
  ASSERT_TRUE(table_->SetQuota(a_, 2 * kPage).ok());
  Put(a_, 1, kPage);
  auto reserved = table_->Reserve(a_, KeyOf(2), Meta(kPage), kTtl);
  ASSERT_TRUE(reserved.ok());
  auto refused = table_->Reserve(a_, KeyOf(3), Meta(1), kTtl);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("quota of namespace \"tenant-a\""));
  EXPECT_EQ(table_->Counters().quota_refusals, 1u);
  Put(b_, 3, 4 * kPage);  // b has no quota
  EXPECT_EQ(table_->Usage(a_)->host_bytes, kPage);
  EXPECT_EQ(table_->Usage(a_)->reserved_bytes, kPage);
}

TEST_F(LeaseTableTest, DemotionPinsPagesUntilTheTierCompletes) {
  MakeTable(10);
  for (std::uint32_t k = 0; k < 10; ++k) {
    now_ = 1000 + k;
    Put(a_, k, kPage);
  }
  EvictionRequest req;
  req.nvme_enabled = true;
  auto pass = table_->MakeRoom(lru_, req);
  ASSERT_TRUE(pass.ok());
  ASSERT_EQ(pass->demotions.size(), 2u);
  EXPECT_EQ(pass->pages_freed, 0u);
  const DemotionOrder& order = pass->demotions[0];
  EXPECT_EQ(pool_->PinCount(order.pages.runs[0].first), 1u);
  EXPECT_EQ(table_->Delete(a_, order.key).status().code(), StatusCode::kFailedPrecondition);
  // A second pass does not demote the same blocks again nor over-demote.
  auto again = table_->MakeRoom(lru_, req);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->decisions.empty());
  const NvmeLocation loc{1, 0, kPage + 128};
  ASSERT_TRUE(table_->CompleteDemotion(order.ns, order.key, loc).ok());
  EXPECT_EQ(pool_->Counts().free, 1u);
  auto e = table_->Lookup(a_, order.key);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tier, BlockTier::kNvme);
  EXPECT_EQ(e->nvme, loc);
  const BlockKey keys[] = {order.key};
  EXPECT_EQ(table_->Lease(a_, keys, kTtl)->blocks[0].outcome, LeaseOutcome::kNvmeOnly);
  ASSERT_TRUE(table_->AbortDemotion(pass->demotions[1].ns, pass->demotions[1].key).ok());
  EXPECT_EQ(pool_->Counts().leased, 0u);
  EXPECT_EQ(table_->CompleteDemotion(order.ns, order.key, loc).code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(LeaseTableTest, ExplainSaysWhyABlockLeft) {
  MakeTable(10);
  for (std::uint32_t k = 0; k < 10; ++k) Put(a_, k, kPage, 1024 * k);
  CostAwareOptions o;
  o.host_fetch = {10, 10e9};
  o.nvme_fetch = {80, 2e9};
  o.recompute = {0, 10, 0.001};
  CostAwarePolicy cost(o);
  auto pass = table_->MakeRoom(cost, EvictionRequest{});
  ASSERT_TRUE(pass.ok());
  ASSERT_EQ(pass->decisions.size(), 2u);
  EXPECT_EQ(pass->decisions[0].key, KeyOf(0));  // position 0 is cheapest to recompute
  auto why = table_->Explain(a_, KeyOf(0));
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0].explanation, HasSubstr("evict"));
  EXPECT_THAT(why[0].explanation, HasSubstr("t_recompute(n=16, p=0)"));
  EXPECT_TRUE(table_->Explain(b_, KeyOf(0)).empty());
  EXPECT_EQ(table_->Counters().evictions, 2u);
}

TEST_F(LeaseTableTest, RefusesUnboundedRequests) {
  LeaseTableOptions o;
  o.max_keys_per_lease = 2;
  o.max_ttl_us = 10;
  MakeTable(4, o);
  const BlockKey keys[] = {KeyOf(1), KeyOf(2), KeyOf(3)};
  EXPECT_TRUE(table_->Lease(a_, keys, 5).status().IsInvalidArgument());
  EXPECT_TRUE(table_->Lease(a_, std::span(keys, 2), 11).status().IsInvalidArgument());
  EXPECT_TRUE(table_->Reserve(a_, KeyOf(1), Meta(0), 5).status().IsInvalidArgument());
  EXPECT_TRUE(table_->Reserve(a_, KeyOf(1), Meta(kPage), 0).status().IsInvalidArgument());
}

TEST_F(LeaseTableTest, RandomConcurrentTrafficKeepsPoolAndIndexConsistent) {
  const std::uint64_t seed =
      TestSeed("LeaseTableTest.RandomConcurrentTrafficKeepsPoolAndIndexConsistent");
  MakeTable(64);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<std::uint64_t> my_leases;
      for (int step = 0; step < 1500; ++step) {
        const Namespace& ns = rng() % 2 ? a_ : b_;
        const std::uint32_t k = rng() % 48;
        switch (rng() % 6) {
          case 0:
          case 1: {
            const std::uint64_t bytes = 1 + rng() % (3 * kPage);
            auto r = table_->Reserve(ns, KeyOf(k), Meta(bytes), 1 + rng() % 2000);
            if (!r.ok()) break;
            std::vector<std::byte> data(bytes, std::byte(k));
            if (!table_->CopyIn(r->id, data).ok()) break;  // expired already
            const std::uint32_t crc = crc32c::Value(data) ^ (rng() % 8 == 0 ? 1 : 0);
            table_->Commit(r->id, crc).IgnoreError();  // DataLoss, or NotFound if expired
            break;
          }
          case 2: {
            const BlockKey keys[] = {KeyOf(k), KeyOf(k + 1)};
            auto l = table_->Lease(ns, keys, 1 + rng() % 2000);
            ASSERT_TRUE(l.ok());
            if (l->id != 0 && table_->BeginRead(l->id).ok()) {  // as the daemon's push does
              for (const LeasedBlock& b : l->blocks) {
                if (b.outcome == LeaseOutcome::kLeased) {
                  ASSERT_EQ(pool_->Crc32c(b.pages, b.bytes), b.crc32c);
                }
              }
              ASSERT_TRUE(table_->EndRead(l->id).ok());
            }
            if (l->id != 0) my_leases.push_back(l->id);
            break;
          }
          case 3:
            if (!my_leases.empty()) {
              table_->Release(my_leases.back()).IgnoreError();  // may have expired
              my_leases.pop_back();
            }
            break;
          case 4:
            table_->Delete(ns, KeyOf(k)).status().IgnoreError();  // may be leased or absent
            break;
          case 5:
            if (t == 0) {
              now_ += rng() % 500;
              table_->ExpireUntil(now_.load());
              EvictionRequest req;
              req.nvme_enabled = false;
              ASSERT_TRUE(table_->MakeRoom(lru_, req).ok());
            }
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  table_->ExpireUntil(now_.load() + 10 * kTtl);
  const PagePoolCounts c = pool_->Counts();
  EXPECT_EQ(c.leased, 0u);
  EXPECT_EQ(c.reserved, 0u);
  EXPECT_EQ(c.free + c.committed, c.pages);
  // A namespace left with nothing is reclaimed (Usage: NotFound).
  auto host_bytes = [&](const Namespace& ns) {
    auto u = table_->Usage(ns);
    return u.ok() ? u->host_bytes : 0;
  };
  const std::uint64_t committed_bytes = host_bytes(a_) + host_bytes(b_);
  EXPECT_EQ(committed_bytes, c.committed * kPage);
}

}  // namespace
}  // namespace kvfabric::cache_host
