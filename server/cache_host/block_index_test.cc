#include "server/cache_host/block_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/testing/test_seed.h"

namespace kvfabric::cache_host {
namespace {

using ::testing::HasSubstr;

BlockKey KeyOf(std::uint8_t b) {
  BlockKey::Bytes bytes{};
  bytes[0] = b;
  bytes[31] = 0x77;
  return BlockKey(bytes);
}

BlockEntry HostEntry(NamespaceId ns, const BlockKey& key, std::uint64_t resident) {
  BlockEntry e;
  e.ns = ns;
  e.key = key;
  e.meta.bytes = resident - 10;
  e.tier = BlockTier::kHost;
  e.host_pages.runs[0] = {0, 1};
  e.host_pages.size = 1;
  e.host_resident_bytes = resident;
  return e;
}

TEST(BlockIndexTest, SameKeyInTwoNamespacesIsTwoBlocks) {
  BlockIndex index;
  const NamespaceId a = *index.InternNamespace({"a"});
  const NamespaceId b = *index.InternNamespace({"b"});
  ASSERT_NE(a, b);
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(1), 4096)).ok());
  EXPECT_NE(index.Find(a, KeyOf(1)), nullptr);
  EXPECT_EQ(index.Find(b, KeyOf(1)), nullptr);  // B cannot see A's block
  EXPECT_TRUE(index.Remove(b, KeyOf(1)).status().IsNotFound());
  ASSERT_TRUE(index.Publish(HostEntry(b, KeyOf(1), 8192)).ok());
  EXPECT_EQ(index.Usage(a).host_bytes, 4096u);
  EXPECT_EQ(index.Usage(b).host_bytes, 8192u);
  int seen_by_b = 0;
  index.ForEach(b, [&](const BlockEntry& e) {
    EXPECT_EQ(e.ns, b);
    ++seen_by_b;
  });
  EXPECT_EQ(seen_by_b, 1);
}

TEST(BlockIndexTest, KeptCompactCopiesCountOnlyWhileTheyHaveAHostCopy) {
  BlockIndex index;
  const NamespaceId a = *index.InternNamespace({"a"});
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(1), 4096)).ok());
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(2), 8192)).ok());
  ASSERT_TRUE(index.SetCompactKept(a, KeyOf(1), true).ok());
  ASSERT_TRUE(index.SetCompactKept(a, KeyOf(2), true).ok());
  EXPECT_EQ(index.compact_kept_bytes(), 4096u + 8192u);
  EXPECT_EQ(index.compact_kept_blocks(), 2u);
  // Demoted: no host copy, no longer kept (and not kept again if it comes back).
  ASSERT_TRUE(index.ReplaceLocation(a, KeyOf(1), BlockTier::kNvme, {}, 0, {}).ok());
  EXPECT_FALSE(index.Find(a, KeyOf(1))->compact_kept);
  EXPECT_EQ(index.compact_kept_bytes(), 8192u);
  EXPECT_EQ(index.SetCompactKept(a, KeyOf(1), true).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(index.Remove(a, KeyOf(2)).ok());
  EXPECT_EQ(index.compact_kept_bytes(), 0u);
  EXPECT_EQ(index.compact_kept_blocks(), 0u);
  EXPECT_TRUE(index.SetCompactKept(a, KeyOf(3), false).IsNotFound());
}

TEST(BlockIndexTest, PublishTwiceIsAlreadyExists) {
  BlockIndex index;
  const NamespaceId a = *index.InternNamespace({""});
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(1), 4096)).ok());
  EXPECT_EQ(index.Publish(HostEntry(a, KeyOf(1), 4096)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(index.Usage(a).blocks, 1u);
}

TEST(BlockIndexTest, FindNamespaceNeverInterns) {
  BlockIndex index;
  EXPECT_FALSE(index.FindNamespace({"ghost"}).has_value());
  EXPECT_EQ(index.namespace_count(), 0u);
}

TEST(BlockIndexTest, RefusesNamespacesBeyondTheLimit) {
  BlockIndex index(BlockIndexOptions{.max_namespaces = 2});
  ASSERT_TRUE(index.InternNamespace({"a"}).ok());
  ASSERT_TRUE(index.InternNamespace({"b"}).ok());
  ASSERT_TRUE(index.InternNamespace({"a"}).ok());  // known names are fine
  auto c = index.InternNamespace({"c"});
  ASSERT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("--max-namespaces"));
  EXPECT_TRUE(index.InternNamespace({std::string(300, 'x')}).status().IsInvalidArgument());
}

TEST(BlockIndexTest, QuotaCountsResidentAndReservedBytes) {
  BlockIndex index;
  ASSERT_TRUE(index.SetQuota({"a"}, 16384).ok());
  const NamespaceId a = *index.FindNamespace({"a"});
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(1), 8192)).ok());
  index.ChargeReserved(a, 4096);
  EXPECT_TRUE(index.CheckQuota(a, 4096).ok());
  const Status s = index.CheckQuota(a, 4097);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("resident 8 KiB + reserved 4 KiB"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("> quota 16 KiB"));
  index.ChargeReserved(a, -4096);
  EXPECT_TRUE(index.CheckQuota(a, 8192).ok());
  // Another namespace is not limited by a's quota.
  const NamespaceId b = *index.InternNamespace({"b"});
  EXPECT_TRUE(index.CheckQuota(b, std::uint64_t{1} << 40).ok());
}

TEST(BlockIndexTest, ReplaceLocationMovesBytesBetweenTiers) {
  BlockIndex index;
  const NamespaceId a = *index.InternNamespace({"a"});
  ASSERT_TRUE(index.Publish(HostEntry(a, KeyOf(1), 8192)).ok());
  const NvmeLocation loc{7, 4096, 8192 + 128};
  ASSERT_TRUE(index
                  .ReplaceLocation(a, KeyOf(1), BlockTier::kBoth,
                                   index.Find(a, KeyOf(1))->host_pages, 8192, loc)
                  .ok());
  EXPECT_EQ(index.Usage(a).host_bytes, 8192u);
  EXPECT_EQ(index.Usage(a).nvme_bytes, 8320u);
  ASSERT_TRUE(index.ReplaceLocation(a, KeyOf(1), BlockTier::kNvme, {}, 0, loc).ok());
  EXPECT_EQ(index.Usage(a).host_bytes, 0u);
  EXPECT_EQ(index.Find(a, KeyOf(1))->nvme, loc);
  EXPECT_TRUE(index.Find(a, KeyOf(1))->host_pages.empty());
  auto removed = index.Remove(a, KeyOf(1));
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(index.Usage(a).nvme_bytes, 0u);
  EXPECT_EQ(index.Usage(a).blocks, 0u);
}

TEST(BlockIndexTest, RandomOperationsKeepPerNamespaceAccounting) {
  std::mt19937_64 rng(TestSeed("BlockIndexTest.RandomOperationsKeepPerNamespaceAccounting"));
  BlockIndex index;
  const NamespaceId ids[] = {*index.InternNamespace({"a"}), *index.InternNamespace({"b"})};
  std::map<std::pair<NamespaceId, int>, std::uint64_t> model;  // -> resident bytes
  for (int step = 0; step < 3000; ++step) {
    const NamespaceId ns = ids[rng() % 2];
    const int k = static_cast<int>(rng() % 32);
    const std::uint64_t bytes = 4096 * (1 + rng() % 4);
    if (rng() % 2 == 0) {
      const Status s = index.Publish(HostEntry(ns, KeyOf(k), bytes));
      EXPECT_EQ(s.ok(), model.count({ns, k}) == 0);
      if (s.ok()) model[{ns, k}] = bytes;
    } else {
      EXPECT_EQ(index.Remove(ns, KeyOf(k)).ok(), model.erase({ns, k}) == 1);
    }
  }
  for (NamespaceId ns : ids) {
    std::uint64_t bytes = 0, blocks = 0;
    for (const auto& [slot, b] : model) {
      if (slot.first == ns) bytes += b, ++blocks;
    }
    EXPECT_EQ(index.Usage(ns).host_bytes, bytes);
    EXPECT_EQ(index.Usage(ns).blocks, blocks);
  }
}

}  // namespace
}  // namespace kvfabric::cache_host
