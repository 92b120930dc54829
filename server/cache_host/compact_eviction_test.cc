// Eviction that keeps compact copies in place of their exact blocks, over a
// real node with the real converter (eviction_policy.h, "Compact copies";
// --compact-keep-bytes): exact blocks leave first while their copies stay
// within the budget, copies beyond it leave too, a budget of 0 keeps the
// order as it was, placement hears the exact block leave and keeps the copy
// listed, and with an NVMe tier the exact block is demoted and a copy that
// leaves later survives a restart.
#include <gmock/gmock.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "server/cache_host/compact_converter_test_fixture.h"
#include "server/placement/directory.h"

namespace kvfabric::cache_host::node_test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

// A pool of 64 pages of 64 KiB. An exact block of Meta(8) is 512 KiB (8
// pages), its compact copy 288 KiB (5 pages): four converted blocks take 52.
constexpr std::uint64_t kPool = 4 << 20;
constexpr std::uint32_t kLayers = 8;
constexpr std::uint64_t kExactPages = 8;
constexpr std::uint64_t kCopyPages = 5;
constexpr std::uint64_t kCopyBytes = kCopyPages * kPage;

class CompactEvictionTest : public CompactConverterTest {
 protected:
  // LRU over a pool that evicts only when a write needs room (no background
  // passes), so each Put below frees exactly what it needs.
  CacheHostOptions KeepingOptions(std::uint64_t budget, bool nvme = false) {
    CacheHostOptions o = Options(kPool, nvme);
    o.watermarks = {1.0, 1.0};
    o.leases.compact_keep.budget_bytes = budget;
    o.leases.compact_keep.codec = kCompactInt8Codec;
    o.leases.compact_keep.codec_version = kCompactInt8Version;
    return o;
  }

  // Writes exact blocks Key(0..n) of finite fp16 values, each converted
  // before the next; every commit a millisecond after the last (the node's
  // fake clock), so LRU order is x0 < c0 < x1 < c1 < ... Then stops the
  // converter: later writes are pressure only.
  void PutConverted(int n) {
    CompactConverterOptions co = ConverterOptions(1);
    co.min_free_bytes = 0;
    StartConverter(co);
    for (int i = 0; i < n; ++i) {
      const BlockMeta meta = Meta(kLayers, 16 * i);
      exact_.push_back(FillFp16(meta, 0));
      clock_.Advance(1000);
      ASSERT_TRUE(PutStaged("tenant", Key(i), meta, 0).ok()) << i;
      clock_.Advance(1000);
      ASSERT_TRUE(converter_->TEST_WaitIdle(10s));
      ASSERT_TRUE(HasCopy("tenant", Key(i))) << i;
    }
    ASSERT_EQ(converter_->Stats().converted, static_cast<std::uint64_t>(n));
    converter_.reset();
    const BlockKey copy = CompactKey(Key(0));
    ASSERT_EQ(node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&copy, 1))[0].meta.bytes,
              gpu::CompactPayloadBytes(kLayers, 16, 8, 128));
  }

  // Another exact block (random bytes, never converted), a millisecond later.
  Status Pressure(int i) {
    clock_.Advance(1000);
    return Put("tenant", Key(100 + i), Meta(kLayers, 16 * (100 + i)), 0, 100 + i);
  }

  std::optional<LookupEntryResult> Find(const BlockKey& key) {
    LookupEntryResult r = node_->Lookup(Namespace{"tenant"}, std::span<const BlockKey>(&key, 1))[0];
    if (!r.status.ok()) return std::nullopt;
    return r;
  }

  std::string Explained(const BlockKey& key) {
    std::string all;
    for (const EvictionDecision& d : node_->ExplainEviction(Namespace{"tenant"}, key)) {
      all += d.explanation + "\n";
    }
    return all;
  }

  std::uint64_t KeptBytes() { return node_->Snapshot().table.compact_kept_bytes; }

  std::vector<std::vector<float>> exact_;  // the values of Key(i)
};

TEST_F(CompactEvictionTest, ExactCopiesLeaveFirstAndCopiesStayWithinTheBudgetThenGoToo) {
  const std::uint64_t budget = 2 * kCopyBytes;  // room for two copies
  StartNode(KeepingOptions(budget), &clock_);
  EXPECT_THAT(node_->arithmetic(),
              HasSubstr("compact copies: eviction keeps up to 640 KiB = 10 pages x 64 KiB (15.6% "
                        "of the host pool; --compact-keep-bytes)"));
  PutConverted(4);                // 52 of 64 pages
  ASSERT_TRUE(Pressure(0).ok());  // 60: fits

  // Each write of 8 pages now needs 4 more than are free. LRU's oldest is
  // the exact block x0: it leaves, its copy c0 stays (kept 5 pages <= 10).
  ASSERT_TRUE(Pressure(1).ok());
  EXPECT_FALSE(Find(Key(0)).has_value());
  ASSERT_TRUE(Find(CompactKey(Key(0))).has_value());
  EXPECT_EQ(KeptBytes(), kCopyBytes);
  EXPECT_THAT(Explained(Key(0)),
              HasSubstr("compact copy " + CompactKey(Key(0)).ToHex() +
                        " (5 pages) stays in the host pool, kept: kept 0 B + 320 KiB = 320 KiB <= "
                        "budget 640 KiB (--compact-keep-bytes)"));

  // x1 next (c0, older, is kept: no candidate while a block without a copy
  // or an exact block can go): c1 kept, the budget is full.
  ASSERT_TRUE(Pressure(2).ok());
  EXPECT_FALSE(Find(Key(1)).has_value());
  EXPECT_TRUE(Find(CompactKey(Key(0))).has_value());
  EXPECT_TRUE(Find(CompactKey(Key(1))).has_value());
  EXPECT_EQ(KeptBytes(), budget);

  // x2 next: c2 needs 5 pages the budget does not have; c0 ranks before it
  // (older), so c0 leaves over budget and c2 is kept.
  ASSERT_TRUE(Pressure(3).ok());
  EXPECT_FALSE(Find(Key(2)).has_value());
  EXPECT_FALSE(Find(CompactKey(Key(0))).has_value());
  EXPECT_TRUE(Find(CompactKey(Key(1))).has_value());
  EXPECT_TRUE(Find(CompactKey(Key(2))).has_value());
  EXPECT_EQ(KeptBytes(), budget);
  EXPECT_THAT(Explained(CompactKey(Key(0))),
              HasSubstr("compact copy over budget: makes room for " + CompactKey(Key(2)).ToHex() +
                        ", the copy of " + Key(2).ToHex()));

  // The exact blocks still there are served as ever; a kept copy reads back.
  EXPECT_TRUE(Get("tenant", Key(3), 0).ok());
  ExpectCopyDecodesTo("tenant", Key(1), Meta(kLayers, 16), exact_[1]);

  const CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.compact_keep_budget_bytes, budget);
  EXPECT_EQ(s.table.compact_kept_blocks, 2u);
  EXPECT_EQ(s.compact_kept_by_action[static_cast<int>(EvictionAction::kEvict)], 3u);
  EXPECT_EQ(s.compact_copies_evicted[static_cast<int>(CompactOutcome::kCopyOverBudget)], 1u);
  EXPECT_EQ(s.compact_copies_evicted[static_cast<int>(CompactOutcome::kCopyLastResort)], 0u);
  EXPECT_EQ(s.evictions_by_action[static_cast<int>(EvictionAction::kEvict)], 4u);  // x0-x2, c0
}

TEST_F(CompactEvictionTest, ABudgetOfZeroEvictsCopiesAsAnyBlock) {
  StartNode(KeepingOptions(0), &clock_);
  EXPECT_THAT(node_->arithmetic(),
              HasSubstr("compact copies: no eviction preference (--compact-keep-bytes 0)"));
  PutConverted(4);
  ASSERT_TRUE(Pressure(0).ok());
  // Plain LRU: x0 (8 pages) is enough for the first write; then c0, older
  // than x1, goes first (5 of the 4 pages needed), exactly as before issue 24.
  ASSERT_TRUE(Pressure(1).ok());
  EXPECT_FALSE(Find(Key(0)).has_value());
  EXPECT_TRUE(Find(CompactKey(Key(0))).has_value());
  ASSERT_TRUE(Pressure(2).ok());
  EXPECT_FALSE(Find(CompactKey(Key(0))).has_value());
  EXPECT_TRUE(Find(Key(1)).has_value());
  EXPECT_THAT(Explained(Key(0)), Not(HasSubstr("compact copy")));
  const CacheHostSnapshot s = node_->Snapshot();
  EXPECT_EQ(s.table.compact_kept_bytes, 0u);
  EXPECT_EQ(s.table.compact_kept_blocks, 0u);
  for (std::uint64_t n : s.compact_kept_by_action) EXPECT_EQ(n, 0u);
  for (std::uint64_t n : s.compact_copies_evicted) EXPECT_EQ(n, 0u);
}

// As placement_reporter.cc sends an event and placement reads it back
// (kinds numbered alike; the tier is NVMe or host).
placement::BlockEvent ToDirectory(const BlockEventRecord& r) {
  placement::BlockEvent e;
  e.kind = static_cast<placement::BlockEventKind>(r.kind);
  e.ns = r.tenant;
  e.key = r.key;
  e.tier = r.tier == BlockTier::kNvme ? kvfabric::Tier::kNvme : kvfabric::Tier::kHost;
  e.payload_bytes = r.meta.bytes;
  e.representation = static_cast<std::uint8_t>(r.meta.representation);
  return e;
}

TEST_F(CompactEvictionTest, PlacementHearsTheExactBlockLeaveAndKeepsTheCopyListed) {
  StartNode(KeepingOptions(2 * kCopyBytes), &clock_);
  std::mutex mu;
  std::vector<BlockEventRecord> events;
  node_->set_block_event_sink([&](std::vector<BlockEventRecord> batch) {
    std::lock_guard<std::mutex> lock(mu);
    for (BlockEventRecord& e : batch) events.push_back(std::move(e));
  });
  PutConverted(4);
  ASSERT_TRUE(Pressure(0).ok());
  ASSERT_TRUE(Pressure(1).ok());  // x0 leaves, c0 is kept

  placement::Directory directory({});
  directory.SetHostIncarnation("h", 1);
  std::vector<placement::BlockEvent> applied;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const BlockEventRecord& r : events) {
      applied.push_back(ToDirectory(r));
      // Nothing says the copy left.
      if (r.key == CompactKey(Key(0))) EXPECT_EQ(r.kind, BlockEventKind::kCommitted);
    }
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().kind, BlockEventKind::kCommitted);  // Key(101), the write
    const auto evicted = std::find_if(events.begin(), events.end(), [](const auto& r) {
      return r.kind == BlockEventKind::kEvicted;
    });
    ASSERT_NE(evicted, events.end());
    EXPECT_EQ(evicted->key, Key(0));
  }
  ASSERT_EQ(directory.Apply("h", 1, applied, 1), applied.size());
  const std::vector<BlockKey> keys = {Key(0), CompactKey(Key(0)), Key(1)};
  const std::vector<placement::DirectoryEntry> listed =
      directory.Lookup("tenant", keys, /*touch=*/false, 0);
  EXPECT_TRUE(listed[0].replicas.empty());
  ASSERT_EQ(listed[1].replicas.size(), 1u);
  EXPECT_TRUE(listed[1].replicas[0].on_host);
  EXPECT_EQ(listed[1].replicas[0].representation,
            static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8));
  EXPECT_EQ(listed[2].replicas.size(), 1u);

  // A full report (what placement gets after a restart) says the same.
  bool copy = false;
  for (const BlockEventRecord& r : node_->SnapshotBlocks()) {
    EXPECT_NE(r.key, Key(0));
    copy = copy || r.key == CompactKey(Key(0));
  }
  EXPECT_TRUE(copy);
  node_->set_block_event_sink(nullptr);
}

TEST_F(CompactEvictionTest, WithNvmeTheExactBlockIsDemotedAndALaterCopySurvivesARestart) {
  const CacheHostOptions options = KeepingOptions(kCopyBytes, /*nvme=*/true);  // one copy
  StartNode(options, &clock_);
  PutConverted(4);
  ASSERT_TRUE(Pressure(0).ok());
  auto on_nvme = [&](const BlockKey& key) {
    return WaitFor(
        [&] {
          std::optional<LookupEntryResult> r = Find(key);
          return r.has_value() && r->tier == BlockTier::kNvme;
        },
        10s, "on NVMe only");
  };

  // x0 is demoted as it would be without a copy; c0 stays in the pool, kept.
  ASSERT_TRUE(Pressure(1).ok());
  ASSERT_TRUE(on_nvme(Key(0)));
  std::optional<LookupEntryResult> c0 = Find(CompactKey(Key(0)));
  ASSERT_TRUE(c0.has_value());
  EXPECT_EQ(c0->tier, BlockTier::kHost);
  EXPECT_EQ(KeptBytes(), kCopyBytes);
  EXPECT_EQ(node_->Snapshot().compact_kept_by_action[static_cast<int>(EvictionAction::kDemote)],
            1u);
  EXPECT_THAT(Explained(Key(0)), HasSubstr("demote " + Key(0).ToHex()));

  // x1's copy takes the budget: c0, older, leaves over budget, demoted like
  // any host block worth it.
  ASSERT_TRUE(Pressure(2).ok());
  ASSERT_TRUE(on_nvme(Key(1)));
  ASSERT_TRUE(on_nvme(CompactKey(Key(0))));
  EXPECT_EQ(Find(CompactKey(Key(1)))->tier, BlockTier::kHost);
  EXPECT_EQ(KeptBytes(), kCopyBytes);
  EXPECT_EQ(
      node_->Snapshot().compact_copies_evicted[static_cast<int>(CompactOutcome::kCopyOverBudget)],
      1u);

  // x1 read again comes back into the pool: c1 is held again, out of the budget.
  bool staged = false;
  ASSERT_TRUE(Get("tenant", Key(1), 0, &staged).ok());
  EXPECT_TRUE(staged);
  EXPECT_EQ(KeptBytes(), 0u);
  EXPECT_EQ(node_->Snapshot().table.compact_kept_blocks, 0u);

  // After a restart what was on NVMe is back, the demoted copy among it, and
  // decodes as before; a copy only in the pool is lost with it, as an exact
  // block only in the pool is.
  RestartNode(options);
  ASSERT_TRUE(Find(Key(0)).has_value());
  std::optional<LookupEntryResult> recovered = Find(CompactKey(Key(0)));
  ASSERT_TRUE(recovered.has_value());
  EXPECT_EQ(recovered->tier, BlockTier::kNvme);
  EXPECT_EQ(recovered->meta.representation, BlockRepresentation::kCompactInt8);
  ExpectCopyDecodesTo("tenant", Key(0), Meta(kLayers, 0), exact_[0]);
  EXPECT_FALSE(Find(CompactKey(Key(1))).has_value());
}

TEST_F(CompactEvictionTest, RefusesABudgetLargerThanThePoolNamingTheFlag) {
  CacheHostOptions o = KeepingOptions(kPool + kPage);
  const StatusOr<std::string> checked = CacheHostNode::CheckOptions(o);
  ASSERT_TRUE(checked.status().IsInvalidArgument());
  EXPECT_THAT(checked.status().message(), HasSubstr("--compact-keep-bytes"));
  EXPECT_THAT(checked.status().message(), HasSubstr("--host-pool-bytes"));
  o.leases.compact_keep.budget_bytes = kPool;
  EXPECT_TRUE(CacheHostNode::CheckOptions(o).ok());
}

}  // namespace
}  // namespace kvfabric::cache_host::node_test
