#include "server/cache_host/host_page_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/crc32c.h"
#include "core/testing/test_seed.h"

namespace kvfabric::cache_host {
namespace {

using ::testing::HasSubstr;

constexpr std::uint64_t kPage = 4096;

class FakeLocker final : public MemoryLocker {
 public:
  std::optional<std::uint64_t> limit;
  Status lock_status;
  int locks = 0;
  int unlocks = 0;
  StatusOr<std::optional<std::uint64_t>> MemlockLimit() override { return limit; }
  Status Lock(std::span<std::byte>) override {
    ++locks;
    return lock_status;
  }
  void Unlock(std::span<std::byte>) override { ++unlocks; }
};

std::unique_ptr<HostPagePool> MakePool(std::uint64_t pages, FakeLocker* locker = nullptr,
                                       LockMode mode = LockMode::kOff) {
  auto memory = AllocateAnonymousPoolMemory(pages * kPage, /*huge_pages=*/false);
  EXPECT_TRUE(memory.ok()) << memory.status();
  HostPagePoolOptions o;
  o.pool_bytes = pages * kPage;
  o.page_bytes = kPage;
  o.lock_mode = mode;
  auto pool = HostPagePool::Create(o, *std::move(memory), locker);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

void ExpectCountsConsistent(const HostPagePool& pool) {
  const PagePoolCounts c = pool.Counts();
  EXPECT_EQ(c.free + c.reserved + c.committed + c.staging, c.pages);
  std::uint64_t free = 0, leased = 0;
  for (std::uint32_t p = 0; p < c.pages; ++p) {
    if (pool.StateOf(p) == PageState::kFree) ++free;
    if (pool.PinCount(p) > 0) ++leased;
  }
  EXPECT_EQ(c.free, free);
  EXPECT_EQ(c.leased, leased);
}

TEST(HostPagePoolTest, RefusesInvalidSizesNamingTheSetting) {
  HostPagePoolOptions o;
  o.pool_bytes = 1 << 20;
  o.page_bytes = 3000;
  EXPECT_THAT(std::string(ValidatePoolSizes(o).message()), HasSubstr("--host-page-bytes"));
  o.page_bytes = 0;
  EXPECT_TRUE(ValidatePoolSizes(o).IsInvalidArgument());
  o.page_bytes = 2 << 20;
  const Status s = ValidatePoolSizes(o);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(std::string(s.message()), HasSubstr("--host-pool-bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("floor(pool / page)"));
}

TEST(HostPagePoolTest, RefusesMemoryShorterThanThePool) {
  auto memory = AllocateAnonymousPoolMemory(4 * kPage, false);
  ASSERT_TRUE(memory.ok());
  HostPagePoolOptions o{8 * kPage, kPage, LockMode::kOff};
  auto pool = HostPagePool::Create(o, *std::move(memory));
  EXPECT_TRUE(pool.status().IsInvalidArgument()) << pool.status();
}

TEST(HostPagePoolTest, RequiredLockingRefusesWhenMemlockLimitIsBelowThePool) {
  FakeLocker locker;
  locker.limit = 8 << 20;
  auto memory = AllocateAnonymousPoolMemory(16 << 20, false);
  ASSERT_TRUE(memory.ok());
  HostPagePoolOptions o{16 << 20, kPage, LockMode::kRequired};
  auto pool = HostPagePool::Create(o, *std::move(memory), &locker);
  ASSERT_EQ(pool.status().code(), StatusCode::kFailedPrecondition) << pool.status();
  const std::string msg(pool.status().message());
  EXPECT_THAT(msg, HasSubstr("RLIMIT_MEMLOCK >= pool bytes"));
  EXPECT_THAT(msg, HasSubstr("4096 x 4 KiB = 16 MiB"));
  EXPECT_THAT(msg, HasSubstr("RLIMIT_MEMLOCK is 8 MiB"));
  EXPECT_THAT(msg, HasSubstr("--host-pool-bytes"));
  EXPECT_THAT(msg, HasSubstr("ulimit -l"));
  EXPECT_THAT(msg, HasSubstr("LimitMEMLOCK="));
  EXPECT_EQ(locker.locks, 0);
}

TEST(HostPagePoolTest, RequiredLockingRefusesWhenMlockFails) {
  FakeLocker locker;
  locker.lock_status = Status::PermissionDenied("mlock: Operation not permitted (errno 1)");
  auto memory = AllocateAnonymousPoolMemory(4 * kPage, false);
  ASSERT_TRUE(memory.ok());
  auto pool =
      HostPagePool::Create({4 * kPage, kPage, LockMode::kRequired}, *std::move(memory), &locker);
  EXPECT_EQ(pool.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pool.status().message()), HasSubstr("Operation not permitted"));
}

TEST(HostPagePoolTest, BestEffortRunsUnlockedWhenTheLimitIsTooLow) {
  FakeLocker locker;
  locker.limit = kPage;
  auto pool = MakePool(4, &locker, LockMode::kBestEffort);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->locked());
  EXPECT_EQ(locker.locks, 0);
}

TEST(HostPagePoolTest, LocksWhenAllowedAndUnlocksOnDestruction) {
  FakeLocker locker;  // unlimited
  {
    auto pool = MakePool(4, &locker, LockMode::kRequired);
    ASSERT_NE(pool, nullptr);
    EXPECT_TRUE(pool->locked());
  }
  EXPECT_EQ(locker.locks, 1);
  EXPECT_EQ(locker.unlocks, 1);
}

TEST(HostPagePoolTest, OffNeverTriesToLock) {
  FakeLocker locker;
  auto pool = MakePool(4, &locker, LockMode::kOff);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->locked());
  EXPECT_EQ(locker.locks, 0);
}

TEST(HostPagePoolTest, ParsesLockModes) {
  EXPECT_EQ(*ParseLockMode("best-effort"), LockMode::kBestEffort);
  EXPECT_EQ(*ParseLockMode("required"), LockMode::kRequired);
  EXPECT_EQ(*ParseLockMode("off"), LockMode::kOff);
  EXPECT_TRUE(ParseLockMode("on").status().IsInvalidArgument());
}

TEST(HostPagePoolTest, PreFaultTouchesTheWholePool) {
  auto pool = MakePool(16);
  ASSERT_NE(pool, nullptr);
  std::fill(pool->memory().begin(), pool->memory().end(), std::byte{0x5a});
  const PreFaultReport r = pool->PreFault(Env::Default());
  EXPECT_EQ(r.bytes, 16 * kPage);
  for (std::uint64_t off = 0; off < r.bytes; off += 4096) {
    ASSERT_EQ(pool->memory()[off], std::byte{0}) << off;
  }
  EXPECT_THAT(r.ToString(), HasSubstr("pre-faulted 64 KiB in"));
}

TEST(HostPagePoolTest, AllocatesBestFitContiguousRunAndCoalescesOnFree) {
  auto pool = MakePool(16);
  auto a = pool->Allocate(4, PageState::kReserved);
  auto b = pool->Allocate(2, PageState::kReserved);
  auto c = pool->Allocate(4, PageState::kReserved);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->runs[0], (PageRun{0, 4}));
  EXPECT_EQ(b->runs[0], (PageRun{4, 2}));
  EXPECT_EQ(c->runs[0], (PageRun{6, 4}));
  // Free extents: [4,+2) and [10,+6). A 2-page block takes the exact fit.
  ASSERT_TRUE(pool->Free(*b).ok());
  auto d = pool->Allocate(2, PageState::kStaging);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size, 1u);
  EXPECT_EQ(d->runs[0], (PageRun{4, 2}));
  // Freeing everything coalesces back to one extent.
  ASSERT_TRUE(pool->Free(*a).ok());
  ASSERT_TRUE(pool->Free(*c).ok());
  ASSERT_TRUE(pool->Free(*d).ok());
  EXPECT_EQ(pool->Counts().free_extents, 1u);
  EXPECT_EQ(pool->Counts().largest_free_extent, 16u);
  ExpectCountsConsistent(*pool);
}

TEST(HostPagePoolTest, SplitsIntoRunsOnlyWhenFragmented) {
  auto pool = MakePool(8);
  std::vector<PageRuns> singles;
  for (int i = 0; i < 8; ++i) singles.push_back(*pool->Allocate(1, PageState::kReserved));
  // Free pages 0,1 and 4,5 and 7: extents of 2, 2, 1.
  for (int i : {0, 1, 4, 5, 7}) ASSERT_TRUE(pool->Free(singles[i]).ok());
  auto r = pool->Allocate(4, PageState::kReserved);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size, 2u);
  EXPECT_EQ(r->TotalPages(), 4u);
  EXPECT_EQ(pool->Counts().split_allocations, 1u);
  ExpectCountsConsistent(*pool);
}

TEST(HostPagePoolTest, RefusesWithCountsWhenFull) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->Allocate(3, PageState::kReserved).ok());
  auto r = pool->Allocate(2, PageState::kReserved);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("need 2 pages, 1 of 4 free"));
  EXPECT_EQ(pool->Counts().allocation_refusals, 1u);
}

TEST(HostPagePoolTest, PinnedPagesAreNeverFreed) {
  auto pool = MakePool(4);
  auto r = *pool->Allocate(2, PageState::kReserved);
  ASSERT_TRUE(pool->Transition(r, PageState::kReserved, PageState::kCommitted).ok());
  ASSERT_TRUE(pool->Pin(r).ok());
  ASSERT_TRUE(pool->Pin(r).ok());
  EXPECT_EQ(pool->Counts().leased, 2u);
  EXPECT_EQ(pool->Free(r).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Unpin(r).ok());
  EXPECT_EQ(pool->Free(r).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Unpin(r).ok());
  EXPECT_EQ(pool->Counts().leased, 0u);
  EXPECT_TRUE(pool->Free(r).ok());
  EXPECT_EQ(pool->Free(r).code(), StatusCode::kFailedPrecondition);  // double free
  EXPECT_EQ(pool->Unpin(r).code(), StatusCode::kFailedPrecondition);
  ExpectCountsConsistent(*pool);
}

TEST(HostPagePoolTest, TransitionChecksTheCurrentState) {
  auto pool = MakePool(4);
  auto r = *pool->Allocate(2, PageState::kStaging);
  EXPECT_EQ(pool->Transition(r, PageState::kReserved, PageState::kCommitted).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Counts().staging, 2u);
  EXPECT_TRUE(pool->Transition(r, PageState::kStaging, PageState::kCommitted).ok());
  EXPECT_EQ(pool->Counts().committed, 2u);
  EXPECT_EQ(pool->Counts().staging, 0u);
}

TEST(HostPagePoolTest, CrcCoversTheRunsInOrder) {
  auto pool = MakePool(8);
  std::vector<PageRuns> singles;
  for (int i = 0; i < 8; ++i) singles.push_back(*pool->Allocate(1, PageState::kReserved));
  for (int i : {1, 5, 6}) ASSERT_TRUE(pool->Free(singles[i]).ok());
  auto r = *pool->Allocate(3, PageState::kReserved);
  ASSERT_EQ(r.size, 2u);
  std::vector<std::byte> data(3 * kPage - 100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7 + 3);
  pool->CopyIn(r, data);
  EXPECT_EQ(pool->Crc32c(r, data.size()), crc32c::Value(data));
}

TEST(HostPagePoolTest, RandomAllocateFreeKeepsCountsConsistent) {
  std::mt19937_64 rng(TestSeed("HostPagePoolTest.RandomAllocateFreeKeepsCountsConsistent"));
  auto pool = MakePool(64);
  std::vector<PageRuns> held;
  for (int step = 0; step < 2000; ++step) {
    if (held.empty() || rng() % 2 == 0) {
      auto r = pool->Allocate(1 + rng() % 6, PageState::kReserved);
      if (r.ok())
        held.push_back(*r);
      else
        ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    } else {
      const std::size_t i = rng() % held.size();
      ASSERT_TRUE(pool->Free(held[i]).ok());
      held.erase(held.begin() + i);
    }
  }
  // No page is handed out twice.
  std::vector<int> owner(64, 0);
  for (const PageRuns& r : held) {
    for (const PageRun& run : r) {
      for (std::uint32_t p = run.first; p < run.first + run.count; ++p) ASSERT_EQ(owner[p]++, 0);
    }
  }
  ExpectCountsConsistent(*pool);
}

ModelFingerprint Llama8B() {
  ModelFingerprint f;
  f.model_id = "meta-llama/Llama-3.1-8B-Instruct";
  f.layer_count = 32;
  f.dtype = KvDtype::kBf16;
  f.kv_heads = 8;
  f.head_dim = 128;
  f.tokens_per_block = 16;
  return f;  // 32 x 2 x 16 x 8 x 128 x 2 = 2 MiB
}

TEST(HostPagePoolTest, PrintsStartUpArithmetic) {
  HostPagePoolOptions o{std::uint64_t{8} << 30, 2 << 20, LockMode::kOff};
  const PoolModel models[] = {{Llama8B(), 4096}};
  auto text = DescribePoolArithmetic(o, models, 0.9);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("host pool: 8 GiB = 4096 pages x 2 MiB"));
  EXPECT_THAT(*text, HasSubstr("write reserve: 410 pages"));
  EXPECT_THAT(*text, HasSubstr("floor(3686 / 1) = 3686"));
  EXPECT_THAT(*text, HasSubstr("histories of 4096 tokens: 14 = floor(3686 / 256 blocks)"));
}

TEST(HostPagePoolTest, RefusesPoolThatCannotHoldOneBlock) {
  HostPagePoolOptions o{1 << 20, 64 << 10, LockMode::kOff};
  const PoolModel models[] = {{Llama8B(), 4096}};
  auto text = DescribePoolArithmetic(o, models, 0.9);
  ASSERT_TRUE(text.status().IsInvalidArgument());
  const std::string msg(text.status().message());
  EXPECT_THAT(msg, HasSubstr("cannot hold one block"));
  EXPECT_THAT(msg, HasSubstr("pages per block = ceil(2 MiB / 64 KiB) = 32"));
  EXPECT_THAT(msg, HasSubstr("raise --host-pool-bytes"));
}

}  // namespace
}  // namespace kvfabric::cache_host
