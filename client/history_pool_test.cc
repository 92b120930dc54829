#include "client/history_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "gpu/cpu/cpu_device.h"

namespace kvfabric::client {
namespace {

class HistoryPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu::DeviceOptions o;
    o.arena_bytes = 1 << 20;
    auto d = gpu::CreateCpuDevice(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    device_ = std::move(*d);
  }
  HistoryPoolOptions Options(std::uint64_t pool_bytes, std::uint64_t max_tokens = 0) {
    HistoryPoolOptions o;
    o.pool_bytes = pool_bytes;
    o.block_bytes = 4096;
    o.tokens_per_block = 16;
    o.max_context_tokens = max_tokens;
    return o;
  }
  std::unique_ptr<gpu::Device> device_;
};

TEST_F(HistoryPoolTest, RefusesAPoolThatCannotHoldOneHistoryNamingTheSetting) {
  auto none = HistoryPool::Create(*device_, Options(4095));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("history_pool_bytes"), std::string_view::npos);
  // 1,024 tokens = 64 blocks = 256 KiB; 255 KiB holds 63.
  auto small = HistoryPool::Create(*device_, Options(255 << 10, 1024));
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("64 pages"), std::string_view::npos)
      << small.status().ToString();
  auto fits = HistoryPool::Create(*device_, Options(256 << 10, 1024));
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_NE((*fits)->DescribeLayout().find("1 at once"), std::string_view::npos)
      << (*fits)->DescribeLayout();
}

TEST_F(HistoryPoolTest, HandsOutPagesLowestFirstAndRefusesWhatDoesNotFitWithoutTakingAny) {
  auto pool = HistoryPool::Create(*device_, Options(10 * 4096));
  ASSERT_TRUE(pool.ok());
  std::vector<std::uint32_t> a, b, c;
  ASSERT_TRUE((*pool)->Take(4, &a, "a").ok());
  EXPECT_EQ(a, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  ASSERT_TRUE((*pool)->Take(3, &b, "b").ok());
  EXPECT_EQ(b, (std::vector<std::uint32_t>{4, 5, 6}));
  (*pool)->Return(a);
  // Lengths differ, nothing fragments: 7 pages free, in two runs.
  ASSERT_TRUE((*pool)->Take(7, &c, "c").ok());
  EXPECT_EQ(c, (std::vector<std::uint32_t>{0, 1, 2, 3, 7, 8, 9}));
  std::vector<std::uint32_t> d;
  Status full = (*pool)->Take(1, &d, "a context of 16 tokens");
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("0 of 10 are free"), std::string_view::npos) << full.ToString();
  EXPECT_EQ((*pool)->pages_in_use(), 10u);
  (*pool)->Return(b);
  (*pool)->Return(c);
  EXPECT_EQ((*pool)->pages_in_use(), 0u);
  EXPECT_EQ((*pool)->peak_pages_in_use(), 10u);
  // Pages are distinct, inside the pool, and writable.
  std::set<std::uint32_t> seen;
  ASSERT_TRUE((*pool)->Take(10, &d, "all").ok());
  for (std::uint32_t p : d) {
    EXPECT_TRUE(seen.insert(p).second);
    (*pool)->page(p)[4095] = std::byte{1};
  }
}

TEST_F(HistoryPoolTest, AQuarantinedPageIsNotHandedOutBeforeItsDeadline) {
  auto pool = HistoryPool::Create(*device_, Options(4 * 4096));
  ASSERT_TRUE(pool.ok());
  std::vector<std::uint32_t> a, b;
  ASSERT_TRUE((*pool)->Take(4, &a, "a").ok());
  const auto now = std::chrono::steady_clock::now();
  // Page 1 may still be written by a daemon for an hour; page 2 no longer.
  (*pool)->Quarantine(a[1], now + std::chrono::hours(1));
  (*pool)->Quarantine(a[2], now - std::chrono::seconds(1));
  EXPECT_EQ((*pool)->pages_quarantined(), 2u);
  (*pool)->Return(std::vector<std::uint32_t>{a[0], a[3]});
  // Page 2's deadline is not before page 1's (the ring stays in time order),
  // so neither is free: only pages 0 and 3.
  ASSERT_TRUE((*pool)->Take(2, &b, "b").ok());
  EXPECT_EQ(b, (std::vector<std::uint32_t>{0, 3}));
  std::vector<std::uint32_t> c;
  EXPECT_EQ((*pool)->Take(1, &c, "c").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*pool)->pages_in_use(), 4u);
}

TEST_F(HistoryPoolTest, AnExpiredQuarantineFreesItsPageAtTheNextTake) {
  auto pool = HistoryPool::Create(*device_, Options(2 * 4096));
  ASSERT_TRUE(pool.ok());
  std::vector<std::uint32_t> a, b;
  ASSERT_TRUE((*pool)->Take(2, &a, "a").ok());
  (*pool)->Quarantine(a[0], std::chrono::steady_clock::now() - std::chrono::milliseconds(1));
  ASSERT_TRUE((*pool)->Take(1, &b, "b").ok());
  EXPECT_EQ(b, (std::vector<std::uint32_t>{0}));
  EXPECT_EQ((*pool)->pages_quarantined(), 0u);
}

}  // namespace
}  // namespace kvfabric::client
