#include "server/cache_host/eviction_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "core/testing/test_seed.h"

namespace kvfabric::cache_host {
namespace {

using ::testing::HasSubstr;

BlockKey KeyOf(std::uint8_t b) {
  BlockKey::Bytes bytes{};
  bytes[0] = b;
  return BlockKey(bytes);
}

constexpr std::uint64_t kPage = 1 << 20;

EvictionCandidate Block(std::uint8_t k, std::uint64_t last_access, std::uint64_t token_offset,
                        BlockTier tier = BlockTier::kHost) {
  EvictionCandidate c;
  c.key = KeyOf(k);
  c.tier = tier;
  c.bytes = kPage;
  c.pages = 1;
  c.resident_bytes = kPage;
  c.tokens = 16;
  c.token_offset = token_offset;
  c.last_access_us = last_access;
  return c;
}

CostAwareOptions Costs() {
  CostAwareOptions o;
  o.host_fetch = {10.0, 10e9};  // 10 us + 1 MiB / 10 GB/s = 114.9 us
  o.nvme_fetch = {80.0, 2e9};   // 80 us + 1 MiB / 2 GB/s = 604 us
  o.recompute = {0.0, 10.0, 0.001};
  return o;
}

EvictionTrigger Over(std::uint64_t pages, std::uint64_t occupied, bool nvme = false) {
  EvictionTrigger t;
  t.pool_pages = pages;
  t.occupied_pages = occupied;
  t.watermarks = {0.9, 0.8};
  t.nvme_enabled = nvme;
  return t;
}

std::vector<BlockKey> Keys(const std::vector<EvictionDecision>& ds) {
  std::vector<BlockKey> out;
  for (const auto& d : ds) out.push_back(d.key);
  return out;
}

TEST(EvictionPolicyTest, NothingHappensAtOrBelowTheHighWatermark) {
  LruPolicy lru;
  EXPECT_TRUE(PlanEviction(lru, {Block(1, 1, 0)}, Over(10, 9), 0).empty());
}

TEST(EvictionPolicyTest, LruEvictsLeastRecentlyUsedFirstDownToTheLowWatermark) {
  LruPolicy lru;
  std::vector<EvictionCandidate> c = {Block(1, 300, 0), Block(2, 100, 0), Block(3, 200, 0),
                                      Block(4, 400, 0)};
  // 10 pages, 10 occupied: high 9, low 8 -> take two.
  auto ds = PlanEviction(lru, c, Over(10, 10), 0);
  EXPECT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(2), KeyOf(3)}));
  EXPECT_EQ(ds[0].action, EvictionAction::kEvict);
  EXPECT_EQ(ds[0].rank, 1u);
  EXPECT_EQ(ds[0].candidates, 4u);
  EXPECT_THAT(ds[0].explanation, HasSubstr("lru: last access at 100 us"));
  EXPECT_THAT(ds[0].explanation, HasSubstr("10/10 pages (100.0%) > high watermark 9 pages"));
  EXPECT_THAT(ds[0].explanation, HasSubstr("no NVMe tier"));
}

TEST(EvictionPolicyTest, CostAwareEvictsTheBlockThatSavesLeastPerByte) {
  CostAwarePolicy cost(Costs());
  // Block 1 is the least recently used but sits deep in its context: its
  // recompute attends to 8192 tokens and is the most expensive to lose.
  std::vector<EvictionCandidate> c = {Block(1, 100, 8192), Block(2, 300, 0), Block(3, 200, 1024)};
  EXPECT_GT(cost.Score(c[0]), cost.Score(c[2]));
  EXPECT_GT(cost.Score(c[2]), cost.Score(c[1]));
  auto ds = PlanEviction(cost, c, Over(10, 10), 0);
  EXPECT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(2), KeyOf(3)}));
  // LRU would have chosen differently on the same input.
  LruPolicy lru;
  EXPECT_EQ(Keys(PlanEviction(lru, c, Over(10, 10), 0))[0], KeyOf(1));
  // value(block 2) = (160 us + 16 x (0 + 8) x 1 ns - 114.9 us) / 1 MiB = 45.3 us per MiB.
  EXPECT_THAT(ds[0].explanation, HasSubstr("t_recompute(n=16, p=0)"));
  EXPECT_THAT(ds[0].explanation, HasSubstr("t_fetch(remote→local, 1 MiB)"));
  EXPECT_THAT(ds[0].explanation, HasSubstr("= 45.3 µs per MiB of residency"));
}

TEST(EvictionPolicyTest, DropsHostCopiesOfNvmeBlocksBeforeTouchingHostOnlyBlocks) {
  LruPolicy lru;
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Block(2, 900, 0, BlockTier::kBoth),
                                      Block(3, 200, 0)};
  auto ds = PlanEviction(lru, c, Over(10, 10, /*nvme=*/true), 0);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].key, KeyOf(2));
  EXPECT_EQ(ds[0].action, EvictionAction::kDropHostCopy);
  EXPECT_EQ(ds[0].step, 1u);
  EXPECT_EQ(ds[1].key, KeyOf(1));
  EXPECT_EQ(ds[1].action, EvictionAction::kDemote);
  EXPECT_EQ(ds[1].step, 2u);
}

TEST(EvictionPolicyTest, CostAwareDemotesOnlyWhatIsWorthAnNvmeRead) {
  CostAwarePolicy cost(Costs());
  // 16 tokens at offset 0: t_recompute = 160 us < 604 + 115 us from NVMe.
  // 16 tokens at offset 65536: 160 + 16 x 65544 x 1 ns = 1.21 ms > 719 us.
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Block(2, 200, 65536)};
  auto ds = PlanEviction(cost, c, Over(4, 4, /*nvme=*/true), 0);  // low = 3.2 -> 3; take one
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].key, KeyOf(1));
  EXPECT_EQ(ds[0].action, EvictionAction::kEvict);
  EXPECT_THAT(ds[0].explanation, HasSubstr("dropped: t_recompute 160 µs <= t_fetch(nvme→host)"));
  ds = PlanEviction(cost, {c[1]}, Over(4, 4, true), 0);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].action, EvictionAction::kDemote);
}

// Issue 17: a full NVMe tier turned eviction into a loop of failing
// demotions. Demotions are budgeted by the tier's free bytes; what does not
// fit is evicted, saying why; a tier that is backing off explains itself.
TEST(EvictionPolicyTest, DemotionsBeyondTheNvmeTiersFreeBytesAreEvictions) {
  LruPolicy lru;
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Block(2, 200, 0), Block(3, 300, 0)};
  EvictionTrigger t = Over(4, 4, /*nvme=*/true);
  t.watermarks = {0.5, 0.25};  // take three
  t.nvme_free_bytes = kPage + 8192;  // one record (1 MiB + header, 4 KiB aligned)
  auto ds = PlanEviction(lru, c, t, 0);
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].action, EvictionAction::kDemote);
  EXPECT_EQ(ds[1].action, EvictionAction::kEvict);
  EXPECT_THAT(ds[1].explanation, HasSubstr("but the NVMe tier has 4 KiB free for 1.0 MiB"));
  EXPECT_EQ(ds[2].action, EvictionAction::kEvict);
  t.nvme_enabled = false;
  t.nvme_off_reason = "demotions to NVMe are failing";
  ds = PlanEviction(lru, c, t, 0);
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].action, EvictionAction::kEvict);
  EXPECT_THAT(ds[0].explanation, HasSubstr("demotions to NVMe are failing"));
}

TEST(EvictionPolicyTest, ARequestThatNeedsRoomTriggersBelowTheHighWatermark) {
  LruPolicy lru;
  EvictionTrigger t = Over(10, 5);
  t.pages_needed = 7;  // 5 free: need 2 more; target = min(8, 10 - 7) = 3
  auto ds = PlanEviction(lru, {Block(1, 1, 0), Block(2, 2, 0), Block(3, 3, 0)}, t, 0);
  EXPECT_EQ(ds.size(), 2u);
  EXPECT_THAT(ds[0].explanation, HasSubstr("request needs 7 pages, 5 free"));
}

TEST(EvictionPolicyTest, TiesBreakByAccessThenKey) {
  LruPolicy lru;
  auto ds = PlanEviction(lru, {Block(9, 5, 0), Block(3, 5, 0), Block(7, 5, 0)}, Over(10, 10), 0);
  EXPECT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(3), KeyOf(7)}));  // down to 8 pages
}

TEST(EvictionPolicyTest, PlanIsThePrefixOfTheFullPolicyOrder) {
  std::mt19937_64 rng(TestSeed("EvictionPolicyTest.PlanIsThePrefixOfTheFullPolicyOrder"));
  CostAwarePolicy cost(Costs());
  for (int round = 0; round < 50; ++round) {
    std::vector<EvictionCandidate> c;
    const int n = 1 + rng() % 60;
    std::uint64_t occupied = 0;
    for (int i = 0; i < n; ++i) {
      EvictionCandidate b = Block(static_cast<std::uint8_t>(i), rng() % 50, rng() % 20000);
      b.pages = 1 + rng() % 3;
      b.resident_bytes = b.pages * kPage;
      b.bytes = b.resident_bytes - rng() % kPage;
      b.tokens = 1 + rng() % 64;
      occupied += b.pages;
      c.push_back(b);
    }
    auto ds = PlanEviction(cost, c, Over(occupied, occupied), 0);
    std::sort(c.begin(), c.end(), [&](const EvictionCandidate& a, const EvictionCandidate& b) {
      return std::make_tuple(cost.Score(a), a.last_access_us, a.key) <
             std::make_tuple(cost.Score(b), b.last_access_us, b.key);
    });
    ASSERT_LE(ds.size(), c.size());
    std::uint64_t freed = 0;
    for (std::size_t i = 0; i < ds.size(); ++i) {
      ASSERT_EQ(ds[i].key, c[i].key) << i;
      freed += ds[i].pages;
    }
    const auto low = static_cast<std::uint64_t>(std::floor(occupied * 0.8));
    EXPECT_LE(occupied - freed, low);
    if (!ds.empty()) {
      EXPECT_GT(occupied - freed + ds.back().pages, low);  // no extra victim
    }
  }
}

TEST(EvictionPolicyTest, DecisionLogIsBoundedAndQueryableByKey) {
  DecisionLog log(3);
  for (int i = 0; i < 5; ++i) {
    EvictionDecision d;
    d.key = KeyOf(static_cast<std::uint8_t>(i % 2));
    d.action = i == 4 ? EvictionAction::kDemote : EvictionAction::kEvict;
    log.Record(d);
  }
  EXPECT_EQ(log.Recent(10).size(), 3u);
  EXPECT_EQ(log.Recent(10)[0].sequence, 5u);
  auto zero = log.Find("", KeyOf(0));  // the default tenant's; sequences 3 and 5 remain
  ASSERT_EQ(zero.size(), 2u);
  EXPECT_EQ(zero[0].sequence, 5u);
  EXPECT_TRUE(log.Find("other", KeyOf(0)).empty());  // another namespace
  EXPECT_EQ(log.Count(EvictionAction::kEvict), 4u);
  EXPECT_EQ(log.Count(EvictionAction::kDemote), 1u);
}

TEST(EvictionPolicyTest, ValidatesWatermarks) {
  EXPECT_TRUE((Watermarks{0.9, 0.8}).Validate().ok());
  EXPECT_TRUE((Watermarks{0.8, 0.9}).Validate().IsInvalidArgument());
  EXPECT_TRUE((Watermarks{1.1, 0.9}).Validate().IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cache_host
