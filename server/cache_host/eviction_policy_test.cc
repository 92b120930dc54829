#include "server/cache_host/eviction_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
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

// ---- Compact copies (the header's "Compact copies") ----

constexpr std::uint64_t kMiB = 1 << 20;

// A compact copy candidate (its exact block is set up by the caller).
EvictionCandidate Copy(std::uint8_t k, std::uint64_t last_access, CompactRole role) {
  EvictionCandidate c = Block(k, last_access, 0);
  c.compact_role = role;
  return c;
}

EvictionTrigger Keeping(std::uint64_t pages, std::uint64_t occupied, std::uint64_t budget,
                        std::uint64_t kept, bool nvme = false) {
  EvictionTrigger t = Over(pages, occupied, nvme);
  t.compact_keep_bytes = budget;
  t.compact_kept_bytes = kept;
  return t;
}

TEST(EvictionPolicyTest, AnExactVictimLeavesAndItsCopyIsKeptWithinTheBudget) {
  LruPolicy lru;
  // Exact blocks 1 and 2 with held copies 101 and 102; 3 and 4 without.
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Copy(101, 150, CompactRole::kHeld),
                                      Block(2, 200, 0), Copy(102, 250, CompactRole::kHeld),
                                      Block(3, 300, 0), Block(4, 400, 0)};
  c[0].held_copy = 1;
  c[2].held_copy = 3;
  // 10 pages, 10 occupied: high 9, low 8 -> take two pages.
  auto ds = PlanEviction(lru, c, Keeping(10, 10, 2 * kMiB, 0), 0);
  ASSERT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(1), KeyOf(2)}));
  EXPECT_EQ(ds[0].action, EvictionAction::kEvict);
  EXPECT_EQ(ds[0].compact, CompactOutcome::kCopyKept);
  EXPECT_EQ(ds[0].compact_key, KeyOf(101));
  EXPECT_THAT(ds[0].explanation,
              HasSubstr("compact copy " + KeyOf(101).ToHex() +
                        " (1 pages) stays in the host pool, kept: kept 0 B + 1 MiB = 1 MiB <= "
                        "budget 2 MiB (--compact-keep-bytes)"));
  EXPECT_EQ(ds[1].compact_key, KeyOf(102));
  EXPECT_THAT(ds[1].explanation, HasSubstr("kept 1 MiB + 1 MiB = 2 MiB <= budget 2 MiB"));
  // Without a budget the same candidates go in plain LRU order, the copy among them.
  EXPECT_EQ(Keys(PlanEviction(lru, c, Keeping(10, 10, 0, 0), 0)),
            (std::vector<BlockKey>{KeyOf(1), KeyOf(101)}));
}

TEST(EvictionPolicyTest, AHeldCopyNeverLeavesBeforeItsExactBlock) {
  LruPolicy lru;
  // The copy was never read (LRU's oldest) while its exact block is hot.
  std::vector<EvictionCandidate> c = {Copy(101, 10, CompactRole::kHeld), Block(1, 900, 0),
                                      Block(2, 100, 0), Block(3, 200, 0)};
  c[1].held_copy = 0;
  auto ds = PlanEviction(lru, c, Keeping(10, 10, 4 * kMiB, 0), 0);
  EXPECT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(2), KeyOf(3)}));
  // Everything must go: the exact block first, its copy kept, and taken only
  // in step 3 when nothing else is left.
  EvictionTrigger everything = Keeping(4, 4, 4 * kMiB, 0);
  everything.watermarks = {0.25, 0.0001};  // low = 0 pages
  ds = PlanEviction(lru, c, everything, 0);
  ASSERT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(2), KeyOf(3), KeyOf(1), KeyOf(101)}));
  EXPECT_EQ(ds[2].compact, CompactOutcome::kCopyKept);
  EXPECT_EQ(ds[3].step, 3u);
  EXPECT_EQ(ds[3].compact, CompactOutcome::kCopyLastResort);
  EXPECT_THAT(ds[3].explanation, HasSubstr("step 3 (compact copies kept or held"));
}

// Exact block 1 (the oldest) with held copy 101 (last access 150), and kept
// copy 200 (last access `kept_access`) filling a budget of 1 MiB.
std::vector<EvictionDecision> PlanWithAFullBudget(std::uint64_t kept_access) {
  LruPolicy lru;
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Copy(101, 150, CompactRole::kHeld),
                                      Copy(200, kept_access, CompactRole::kKept), Block(2, 600, 0),
                                      Block(3, 700, 0)};
  c[0].held_copy = 1;
  return PlanEviction(lru, c, Keeping(10, 10, kMiB, kMiB), 0);
}

TEST(EvictionPolicyTest, ACopyWithoutRoomLeavesWithItsExactBlock) {
  // The policy ranks kept copy 200 after the new copy 101 (500 > 150): 101 goes.
  auto ds = PlanWithAFullBudget(500);
  ASSERT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(1), KeyOf(101)}));
  EXPECT_EQ(ds[0].compact, CompactOutcome::kNone);
  EXPECT_THAT(ds[0].explanation, HasSubstr("leaves with it: kept 1 MiB + 1 MiB = 2 MiB > budget "
                                           "1 MiB (--compact-keep-bytes)"));
  EXPECT_EQ(ds[1].compact, CompactOutcome::kCopyOverBudget);
  EXPECT_EQ(ds[1].action, EvictionAction::kEvict);
  EXPECT_EQ(ds[1].rank, 0u);
  EXPECT_THAT(ds[1].explanation, HasSubstr("compact copy over budget: its exact block " +
                                           KeyOf(1).ToHex() + " leaves"));
}

TEST(EvictionPolicyTest, AKeptCopyThePolicyRanksFirstMakesRoomForANewerOne) {
  // Kept copy 200 is older (50) than the new copy 101 (150): 200 goes.
  auto ds = PlanWithAFullBudget(50);
  ASSERT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(200), KeyOf(1)}));
  EXPECT_EQ(ds[0].compact, CompactOutcome::kCopyOverBudget);
  EXPECT_THAT(ds[0].explanation, HasSubstr("makes room for " + KeyOf(101).ToHex()));
  EXPECT_EQ(ds[1].compact, CompactOutcome::kCopyKept);
  EXPECT_THAT(ds[1].explanation, HasSubstr("kept 0 B + 1 MiB = 1 MiB <= budget 1 MiB"));
}

TEST(EvictionPolicyTest, WithNvmeTheExactBlockIsDemotedOrDroppedAndItsCopyKept) {
  LruPolicy lru;
  std::vector<EvictionCandidate> c = {Block(1, 100, 0), Copy(101, 150, CompactRole::kHeld),
                                      Block(2, 200, 0, BlockTier::kBoth),
                                      Copy(102, 250, CompactRole::kHeld), Block(3, 700, 0)};
  c[0].held_copy = 1;
  c[2].held_copy = 3;
  auto ds = PlanEviction(lru, c, Keeping(10, 10, 4 * kMiB, 0, /*nvme=*/true), 0);
  ASSERT_EQ(Keys(ds), (std::vector<BlockKey>{KeyOf(2), KeyOf(1)}));
  EXPECT_EQ(ds[0].action, EvictionAction::kDropHostCopy);  // step 1: the NVMe copy remains
  EXPECT_EQ(ds[0].compact, CompactOutcome::kCopyKept);
  EXPECT_EQ(ds[1].action, EvictionAction::kDemote);  // step 2: demoted, as without a copy
  EXPECT_EQ(ds[1].compact, CompactOutcome::kCopyKept);
  EXPECT_EQ(ds[1].compact_key, KeyOf(101));
}

TEST(EvictionPolicyTest, DecisionLogCountsCompactOutcomes) {
  DecisionLog log(4);
  EvictionDecision d;
  d.action = EvictionAction::kDemote;
  d.compact = CompactOutcome::kCopyKept;
  log.Record(d);
  d.action = EvictionAction::kEvict;
  d.compact = CompactOutcome::kCopyOverBudget;
  log.Record(d);
  EXPECT_EQ(log.CountCopyKept(EvictionAction::kDemote), 1u);
  EXPECT_EQ(log.CountCopyKept(EvictionAction::kEvict), 0u);
  EXPECT_EQ(log.CountCompact(CompactOutcome::kCopyOverBudget), 1u);
  EXPECT_EQ(log.CountCompact(CompactOutcome::kCopyLastResort), 0u);
  EXPECT_EQ(CompactOutcomeName(CompactOutcome::kCopyOverBudget), "over_budget");
}

TEST(EvictionPolicyTest, CompactKeepOptionsRefuseABudgetAboveThePool) {
  CompactKeepOptions o;
  EXPECT_TRUE(o.Validate(kMiB).ok());
  o.budget_bytes = 2 * kMiB;
  o.codec = "int8-kc-vt";
  o.codec_version = 1;
  const Status s = o.Validate(kMiB);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("--compact-keep-bytes"));
  EXPECT_TRUE(o.Validate(4 * kMiB).ok());
  o.codec.clear();
  EXPECT_TRUE(o.Validate(4 * kMiB).IsInvalidArgument());
}

// Random pools of exact blocks, held copies and kept copies, random budgets
// and policies: the formula's promises hold on every plan.
TEST(EvictionPolicyTest, RandomPlansKeepTheBudgetAndNeverTakeAHeldCopyFirst) {
  const std::uint64_t seed =
      TestSeed("EvictionPolicyTest.RandomPlansKeepTheBudgetAndNeverTakeAHeldCopyFirst");
  std::mt19937_64 rng(seed);
  LruPolicy lru;
  CostAwarePolicy cost(Costs());
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE("round " + std::to_string(round) + ", seed " + std::to_string(seed));
    std::vector<EvictionCandidate> c;
    std::vector<std::size_t> exact_of;  // per candidate: its exact block's index (copies), or npos
    std::uint64_t kept = 0;
    std::uint64_t occupied = 0;
    const int exacts = 1 + static_cast<int>(rng() % 12);
    std::uint8_t key = 0;
    auto random_block = [&](std::uint64_t pages) {
      const std::uint64_t last_access = rng() % 1000;
      const std::uint64_t token_offset = (rng() % 64) * 16;
      const BlockTier tier = rng() % 4 == 0 ? BlockTier::kBoth : BlockTier::kHost;
      EvictionCandidate b = Block(++key, last_access, token_offset, tier);
      b.pages = pages;
      b.bytes = b.resident_bytes = pages * kPage;
      occupied += pages;
      return b;
    };
    for (int i = 0; i < exacts; ++i) {
      const std::uint64_t pages = 2 + rng() % 3;
      c.push_back(random_block(pages));
      exact_of.push_back(kNoHeldCopy);
      if (rng() % 3 != 0) {  // a held copy
        const std::uint64_t copy_pages = 1 + rng() % 2;
        c.push_back(random_block(copy_pages));
        c.back().compact_role = CompactRole::kHeld;
        exact_of.push_back(c.size() - 2);
        c[c.size() - 2].held_copy = c.size() - 1;
      }
      if (rng() % 3 == 0) {  // a kept copy
        const std::uint64_t copy_pages = 1 + rng() % 2;
        c.push_back(random_block(copy_pages));
        c.back().compact_role = CompactRole::kKept;
        exact_of.push_back(kNoHeldCopy);
        kept += c.back().resident_bytes;
      }
    }
    const std::uint64_t budget = kept + (rng() % 6) * kPage;
    const std::uint64_t pool = occupied + rng() % 4;
    EvictionTrigger t = Keeping(pool, occupied, budget, kept, rng() % 2 == 0);
    t.pages_needed = rng() % (pool + 1);
    const EvictionPolicy& policy = rng() % 2 == 0 ? static_cast<const EvictionPolicy&>(lru) : cost;
    const std::vector<EvictionDecision> ds = PlanEviction(policy, c, t, 0);

    std::map<BlockKey, std::size_t> at;  // key -> decision position
    for (std::size_t i = 0; i < ds.size(); ++i) {
      ASSERT_TRUE(at.emplace(ds[i].key, i).second) << "decided twice";
    }
    std::uint64_t kept_after = kept;
    for (std::size_t i = 0; i < c.size(); ++i) {
      const bool left = at.count(c[i].key) != 0;
      if (left && c[i].compact_role == CompactRole::kKept) kept_after -= c[i].resident_bytes;
      if (budget > 0 && exact_of[i] != kNoHeldCopy && left) {
        // A held copy leaves only after its exact block (B = 0: no copy is held).
        auto x = at.find(c[exact_of[i]].key);
        ASSERT_NE(x, at.end()) << "a held copy left while its exact block stayed: " << [&] {
          std::string all;
          for (const EvictionDecision& d : ds) all += d.explanation + "\n";
          return all;
        }();
        EXPECT_LT(x->second, at[c[i].key]);
      }
    }
    for (const EvictionDecision& d : ds) {
      if (d.compact == CompactOutcome::kCopyKept) {
        for (const EvictionCandidate& k : c) {
          if (k.key == d.compact_key) kept_after += at.count(k.key) ? 0 : k.resident_bytes;
        }
      }
    }
    EXPECT_LE(kept_after, budget);
    // Budget 0 is the plan without any compact role.
    std::vector<EvictionCandidate> plain = c;
    for (EvictionCandidate& b : plain) {
      b.compact_role = CompactRole::kNone;
      b.held_copy = kNoHeldCopy;
    }
    EvictionTrigger zero = t;
    zero.compact_keep_bytes = 0;
    EXPECT_EQ(Keys(PlanEviction(policy, c, zero, 0)), Keys(PlanEviction(policy, plain, zero, 0)));
  }
}

TEST(EvictionPolicyTest, ValidatesWatermarks) {
  EXPECT_TRUE((Watermarks{0.9, 0.8}).Validate().ok());
  EXPECT_TRUE((Watermarks{0.8, 0.9}).Validate().IsInvalidArgument());
  EXPECT_TRUE((Watermarks{1.1, 0.9}).Validate().IsInvalidArgument());
}

}  // namespace
}  // namespace kvfabric::cache_host
