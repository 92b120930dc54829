// CompactConverter over a real node (compact_converter_test_fixture.h): what
// is converted, what is refused and counted, and that conversion never costs
// another block its place.
#include "server/cache_host/compact_converter.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "server/cache_host/compact_converter_test_fixture.h"

namespace kvfabric::cache_host::node_test {
namespace {

using namespace std::chrono_literals;

TEST_F(CompactConverterTest, PublishesACopyThatDecodesWithinTheBoundBesideTheExactBlock) {
  StartNode(Options(8 << 20, false));
  StartConverter(ConverterOptions(1));
  const BlockMeta meta = Meta(2);
  const std::vector<float> exact = FillFp16(meta, 0);
  const std::vector<std::byte> written(Staging(0, meta.bytes).begin(),
                                       Staging(0, meta.bytes).end());
  ASSERT_TRUE(PutStaged("tenant", Key(1), meta, 0).ok());
  ASSERT_TRUE(converter_->TEST_WaitIdle(10s));

  ExpectCopyDecodesTo("tenant", Key(1), meta, exact);
  const CompactConversionStats s = converter_->Stats();
  EXPECT_EQ(s.converted, 1u);
  EXPECT_EQ(s.bytes_written,
            gpu::CompactPayloadBytes(meta.layers, meta.tokens, meta.kv_heads, meta.head_dim));
  EXPECT_EQ(s.exact_bytes_converted, meta.bytes);
  EXPECT_GT(s.seconds, 0.0);

  // The exact block is as it was, and leases and reads as before.
  const BlockKey key = Key(1);
  auto looked = node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&key, 1));
  ASSERT_TRUE(looked[0].status.ok());
  EXPECT_EQ(looked[0].meta.representation, BlockRepresentation::kExact);
  EXPECT_EQ(looked[0].meta.bytes, meta.bytes);
  EXPECT_EQ(looked[0].active_leases, 0u);  // the converter's lease ended
  // Converting a block is no use of it: its hit count is still 0, so
  // eviction does not see it as hot.
  int found = 0;
  for (const BlockEventRecord& r : node_->SnapshotBlocks()) {
    if (r.key != key) continue;
    ++found;
    EXPECT_EQ(r.hit_count, 0u);
  }
  EXPECT_EQ(found, 1);
  ASSERT_TRUE(Get("tenant", Key(1), 2 << 20).ok());
  EXPECT_EQ(0, std::memcmp(Staging(2 << 20, meta.bytes).data(), written.data(), meta.bytes));
  // Another namespace sees neither.
  EXPECT_FALSE(HasCopy("other", Key(1)));
}

TEST_F(CompactConverterTest, ABlockWithANaNGetsNoCopyAndCountsAnEncodeFailure) {
  StartNode(Options(8 << 20, false));
  StartConverter(ConverterOptions(1));
  const BlockMeta meta = Meta(2);
  FillFp16(meta, 0, /*nan_at=*/1234);
  ASSERT_TRUE(PutStaged("tenant", Key(1), meta, 0).ok());
  ASSERT_TRUE(converter_->TEST_WaitIdle(10s));
  EXPECT_FALSE(HasCopy("tenant", Key(1)));
  const CompactConversionStats s = converter_->Stats();
  EXPECT_EQ(s.converted, 0u);
  EXPECT_EQ(s.failed[static_cast<std::size_t>(CompactFailure::kEncode)], 1u);
  EXPECT_TRUE(Get("tenant", Key(1), 2 << 20).ok());
  // No reservation was left behind.
  EXPECT_EQ(node_->Snapshot().pages.reserved, 0u);
}

TEST_F(CompactConverterTest, PausesWithoutEvictingWhileFreeBytesAreUnderTheMinimum) {
  CacheHostOptions o = Options(4 << 20, false);  // 64 pages of 64 KiB
  o.watermarks = {1.0, 1.0};  // no background eviction: only the converter's choice
  StartNode(o);
  const BlockMeta meta = Meta(2);  // 2 pages
  for (int i = 0; i < 29; ++i) {   // 58 pages: 6 free, under 10% of the pool
    Fill(0, meta.bytes, i);
    ASSERT_TRUE(PutStaged("tenant", Key(i), Meta(2, 16 * i), 0).ok()) << i;
  }
  CompactConverterOptions co = ConverterOptions(1);  // min_free: the default, 10% of the pool
  StartConverter(co);
  EXPECT_EQ(converter_->min_free_bytes(), (4u << 20) / 10);
  const BlockMeta last = Meta(2, 16 * 29);
  const std::vector<float> exact = FillFp16(last, 0);
  ASSERT_TRUE(PutStaged("tenant", Key(29), last, 0).ok());
  ASSERT_TRUE(WaitFor([&] { return converter_->Stats().paused >= 3; }, 10s, "paused"));
  CacheHostSnapshot snap = node_->Snapshot();
  for (std::uint64_t n : snap.evictions_by_action) EXPECT_EQ(n, 0u);
  EXPECT_EQ(converter_->Stats().converted, 0u);
  // The paused block goes back to the queue after each try (retry_interval
  // apart); while a worker tries it again the queue is empty, so wait for it
  // to be back rather than read the count once (a race CI lost once).
  EXPECT_TRUE(WaitFor([&] { return converter_->Stats().queued == 1; }, 10s, "queued again"));
  EXPECT_FALSE(HasCopy("tenant", Key(29)));
  std::vector<BlockKey> keys;
  for (int i = 0; i < 30; ++i) keys.push_back(Key(i));
  for (const LookupEntryResult& r : node_->Lookup(Namespace{"tenant"}, keys)) {
    EXPECT_TRUE(r.status.ok());
  }

  // Room again: the paused conversion goes ahead.
  std::vector<BlockKey> drop(keys.begin(), keys.begin() + 10);
  for (const Status& s : node_->Delete(Namespace{"tenant"}, drop)) ASSERT_TRUE(s.ok());
  ASSERT_TRUE(converter_->TEST_WaitIdle(10s));
  EXPECT_EQ(converter_->Stats().converted, 1u);
  ExpectCopyDecodesTo("tenant", Key(29), last, exact);
  snap = node_->Snapshot();
  for (std::uint64_t n : snap.evictions_by_action) EXPECT_EQ(n, 0u);
}

TEST_F(CompactConverterTest, PausesWhileClientsHoldMoreLeasesThanTheBound) {
  StartNode(Options(8 << 20, false));
  const BlockMeta meta = Meta(2);
  Fill(0, meta.bytes, 1);
  ASSERT_TRUE(PutStaged("tenant", Key(1), meta, 0).ok());
  CompactConverterOptions co = ConverterOptions(1);
  co.pause_above_leases = 1;
  StartConverter(co);
  // Two clients' loads in flight: more leases than the bound.
  const BlockKey k = Key(1);
  auto a = node_->Lease(Namespace{"tenant"}, std::span<const BlockKey>(&k, 1), {});
  auto b = node_->Lease(Namespace{"tenant"}, std::span<const BlockKey>(&k, 1), {});
  ASSERT_TRUE(a.ok() && a->results[0].status.ok());
  ASSERT_TRUE(b.ok() && b->results[0].status.ok());
  const BlockMeta next = Meta(2, 16);
  const std::vector<float> exact = FillFp16(next, 0);
  ASSERT_TRUE(PutStaged("tenant", Key(2), next, 0).ok());
  ASSERT_TRUE(
      WaitFor([&] { return converter_->Stats().paused_for_load >= 2; }, 10s, "paused for load"));
  EXPECT_EQ(converter_->Stats().converted, 0u);
  EXPECT_FALSE(HasCopy("tenant", Key(2)));
  // The loads end: the conversion goes ahead.
  for (const auto* l : {&a, &b}) {
    ReleaseEntry rel{(*l)->grant.lease_id, (*l)->grant.token, {}};
    ASSERT_TRUE(
        node_->Release(Namespace{"tenant"}, std::span<const ReleaseEntry>(&rel, 1))[0].ok());
  }
  ASSERT_TRUE(converter_->TEST_WaitIdle(10s));
  EXPECT_EQ(converter_->Stats().converted, 1u);
  ExpectCopyDecodesTo("tenant", Key(2), next, exact);
}

TEST_F(CompactConverterTest, AFullQueueDropsTheOldestAndCountsIt) {
  StartNode(Options(8 << 20, false));
  CompactConverterOptions co = ConverterOptions(1);
  co.queue_blocks = 2;
  co.min_free_bytes = 8 << 20;  // never room: everything waits in the queue
  StartConverter(co);
  for (int i = 0; i < 5; ++i) {
    FillFp16(Meta(2, 16 * i), 0);
    ASSERT_TRUE(PutStaged("tenant", Key(i), Meta(2, 16 * i), 0).ok()) << i;
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        const CompactConversionStats s = converter_->Stats();
        return s.dropped == 3 && s.queued == 2 && s.paused > 0;
      },
      10s, "three dropped, two queued"));
  EXPECT_EQ(converter_->Stats().converted, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(HasCopy("tenant", Key(i))) << i;
}

TEST_F(CompactConverterTest, ZeroThreadsConvertsNothing) {
  StartNode(Options(8 << 20, false));
  StartConverter(ConverterOptions(0));
  FillFp16(Meta(2), 0);
  ASSERT_TRUE(PutStaged("tenant", Key(1), Meta(2), 0).ok());
  ASSERT_TRUE(converter_->TEST_WaitIdle(1s));
  node_->TEST_RunMaintenance();
  EXPECT_FALSE(HasCopy("tenant", Key(1)));
  const CompactConversionStats s = converter_->Stats();
  EXPECT_EQ(s.threads, 0u);
  EXPECT_EQ(s.converted + s.queued + s.dropped + s.paused, 0u);
}

TEST_F(CompactConverterTest, RefusesBadOptions) {
  StartNode(Options(8 << 20, false));
  CompactConverterOptions o = ConverterOptions(-1);
  EXPECT_TRUE(CompactConverter::Create(o, node_.get()).status().IsInvalidArgument());
  o = ConverterOptions(1);
  o.queue_blocks = 0;
  EXPECT_TRUE(CompactConverter::Create(o, node_.get()).status().IsInvalidArgument());
}

TEST_F(CompactConverterTest, ACopyDemotedToNvmeSurvivesARestart) {
  StartNode(Options(1 << 20, true));  // 16 pages of 64 KiB
  CompactConverterOptions co = ConverterOptions(1);
  co.min_free_bytes = 0;
  StartConverter(co);
  const BlockMeta meta = Meta(2);
  const std::vector<float> exact = FillFp16(meta, 0);
  ASSERT_TRUE(PutStaged("tenant", Key(0), meta, 0).ok());
  ASSERT_TRUE(converter_->TEST_WaitIdle(10s));
  ASSERT_EQ(converter_->Stats().converted, 1u);
  converter_.reset();

  // Pressure from other blocks demotes the older ones, the copy among them.
  const BlockKey ckey = CompactKey(Key(0));
  auto copy_on_nvme = [&] {
    auto r = node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&ckey, 1));
    return r[0].status.ok() && OnNvme(r[0].tier);
  };
  for (int i = 1; i < 20 && !copy_on_nvme(); ++i) {
    ASSERT_TRUE(Put("tenant", Key(i), Meta(2, 16 * i), 0, i).ok()) << i;
  }
  ASSERT_TRUE(WaitFor([&] { return copy_on_nvme(); }, 10s, "the copy on NVMe"));

  RestartNode(Options(1 << 20, true));
  auto r = node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&ckey, 1));
  ASSERT_TRUE(r[0].status.ok()) << r[0].status.ToString();
  EXPECT_EQ(r[0].meta.representation, BlockRepresentation::kCompactInt8);
  ExpectCopyDecodesTo("tenant", Key(0), meta, exact);  // staged back from NVMe, CRC checked
}

}  // namespace
}  // namespace kvfabric::cache_host::node_test
