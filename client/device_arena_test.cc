#include "client/device_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "core/testing/test_seed.h"

namespace kvfabric::client {
namespace {

constexpr std::uint64_t kPage = 4096;

DeviceArenaOptions Opts(std::uint32_t staging = 2, std::uint32_t floor = 3) {
  DeviceArenaOptions o;
  o.page_bytes = kPage;
  o.staging_pages = staging;
  o.context_floor_pages = floor;
  o.hot_newest_pages = 1;
  return o;
}

std::unique_ptr<DeviceArena> MakeArena(std::uint32_t pool_pages, std::uint32_t staging = 2) {
  auto a = DeviceArena::Create((pool_pages + staging) * kPage, Opts(staging));
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(a).value();
}

ContextBudget Budget(std::uint32_t floor, std::uint32_t target, std::uint32_t burst,
                     std::uint32_t logical = 64) {
  return {floor, target, burst, logical};
}

// Maps logical pages [0, n) of `id`.
void Fill(DeviceArena& a, std::uint64_t id, std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_TRUE(a.AcquirePage(id, i).ok()) << i;
}

TEST(DeviceArenaTest, RefusesExplicitSettingsThatAreMissing) {
  DeviceArenaOptions o = Opts();
  o.page_bytes = 0;
  auto a = DeviceArena::Create(1 << 20, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--device-page-bytes"), std::string::npos);
  o = Opts();
  o.staging_pages = 0;
  a = DeviceArena::Create(1 << 20, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--device-staging-pages"), std::string::npos);
  o = Opts(2, 1);  // floor 1 < sink + 1 newest
  a = DeviceArena::Create(1 << 20, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--device-context-floor-pages"), std::string::npos);
}

TEST(DeviceArenaTest, RefusesArenaThatCannotHoldOneFloorPlusStaging) {
  // 4 pages < staging 2 + floor 3.
  auto a = DeviceArena::Create(4 * kPage, Opts(2, 3));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(a.status().IsInvalidArgument());
  const std::string msg(a.status().message());
  EXPECT_NE(msg.find("holds 4 pages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("staging 2 + one context's floor 3 = 5 pages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device-arena-bytes to at least 20 KiB"), std::string::npos) << msg;
  EXPECT_TRUE(DeviceArena::Create(5 * kPage, Opts(2, 3)).ok());
}

// The C API names its kvf_options fields instead of the flags; settings it
// does not expose (empty names) are not suggested at all.
TEST(DeviceArenaTest, RefusalsNameTheSettingsAsTheCallersApiSpellsThem) {
  DeviceArenaSettingNames names;
  names.arena_bytes = "options->device_arena_bytes";
  names.page_bytes = "options->device_page_bytes";
  names.staging_pages = "options->device_staging_pages";
  names.context_floor_pages = "options->device_context_floor_pages";
  names.scratch_bytes = "";
  names.hot_newest_pages = "";
  auto refusal = [&](DeviceArenaOptions o, std::uint64_t arena_bytes) {
    o.setting_names = names;
    auto a = DeviceArena::Create(arena_bytes, o);
    EXPECT_FALSE(a.ok());
    const std::string msg = a.ok() ? "" : std::string(a.status().message());
    EXPECT_EQ(msg.find("--"), std::string::npos) << msg;
    return msg;
  };

  DeviceArenaOptions o = Opts();
  o.page_bytes = 0;
  EXPECT_NE(refusal(o, 1 << 20).find("(set options->device_page_bytes)"), std::string::npos);
  o = Opts();
  o.staging_pages = 0;
  EXPECT_NE(refusal(o, 1 << 20).find("(set options->device_staging_pages)"), std::string::npos);
  std::string msg = refusal(Opts(2, 1), 1 << 20);
  EXPECT_NE(msg.find("(raise options->device_context_floor_pages)"), std::string::npos) << msg;
  o = Opts();
  o.scratch_bytes = 2 * kPage;
  msg = refusal(o, kPage);
  EXPECT_NE(msg.find("(raise options->device_arena_bytes)"), std::string::npos) << msg;
  msg = refusal(Opts(2, 3), 4 * kPage);
  EXPECT_NE(msg.find("raise options->device_arena_bytes to at least 20 KiB, or lower "
                     "options->device_staging_pages, options->device_context_floor_pages or "
                     "options->device_page_bytes"),
            std::string::npos)
      << msg;

  // Refusals after start-up too.
  o = Opts(1, 2);
  o.setting_names = names;
  auto a = DeviceArena::Create(4 * kPage, o);  // staging 1 + pool 3
  ASSERT_TRUE(a.ok()) << a.status();
  auto staging = (*a)->AcquireStaging(2);
  ASSERT_FALSE(staging.ok());
  EXPECT_NE(staging.status().message().find("raise options->device_staging_pages"),
            std::string::npos)
      << staging.status();
  ASSERT_TRUE((*a)->AdmitContext(1, Budget(2, 2, 0)).ok());
  Status s = (*a)->AdmitContext(2, Budget(2, 2, 0));
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("lower the context floor (options->device_context_floor_pages), "
                             "or raise options->device_arena_bytes"),
            std::string::npos)
      << s;
}

TEST(DeviceArenaTest, DescribesItsArithmetic) {
  DeviceArenaOptions o = Opts(2, 3);
  o.scratch_bytes = 1000;  // rounded up to 1024
  auto a = DeviceArena::Create(1024 + 11 * kPage + 100, o);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string line = (*a)->DescribeLayout();
  EXPECT_NE(line.find("scratch 1 KiB + staging 2 pages + pool 9 pages"), std::string::npos) << line;
  EXPECT_NE(line.find("100 B unused"), std::string::npos) << line;
  EXPECT_NE(line.find("fit: 3"), std::string::npos) << line;
  EXPECT_EQ((*a)->scratch().bytes, 1024u);
  // The first staging page follows the scratch; the first pool page follows staging.
  auto s = (*a)->AcquireStaging(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->offset, 1024u);
  ASSERT_TRUE((*a)->AdmitContext(1, Budget(2, 2, 0)).ok());
  auto p = (*a)->AcquirePage(1, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->range.offset, 1024u + 2 * kPage);
}

TEST(DeviceArenaTest, AdmissionRefusalShowsTheFormulaWithNumbers) {
  auto a = MakeArena(10);
  ASSERT_TRUE(a->AdmitContext(1, Budget(4, 6, 2)).ok());
  Fill(*a, 1, 8);  // held 8: floor 4, 2 above floor, 2 burst; free 2
  Status s = a->AdmitContext(2, Budget(7, 7, 0));
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
  const std::string msg(s.message());
  EXPECT_NE(msg.find("admit ctx 2: floor 7 pages > free 2 + reclaimable 4"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("pool 10 = held 8 + committed-unmapped 0 + free 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("burst 2 + above-floor 2"), std::string::npos) << msg;
  EXPECT_EQ(a->metrics().admission_refusals, 1u);
  // A floor that fits after reclamation is admitted, burst first.
  ASSERT_TRUE(a->AdmitContext(3, Budget(5, 5, 0)).ok());
  const DeviceArenaMetrics m = a->metrics();
  EXPECT_EQ(m.reclaimed_burst, 2u);
  EXPECT_EQ(m.reclaimed_above_floor, 1u);
  EXPECT_EQ(m.committed_pages, 10u);
  EXPECT_EQ(m.free_pages, 0u);
}

TEST(DeviceArenaTest, RefusesBadBudgetsAndDuplicates) {
  auto a = MakeArena(10);
  EXPECT_TRUE(a->AdmitContext(1, Budget(1, 1, 0)).IsInvalidArgument());  // below sink + newest
  EXPECT_TRUE(a->AdmitContext(1, Budget(3, 2, 0)).IsInvalidArgument());  // target < floor
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 2, 0)).ok());
  EXPECT_EQ(a->AdmitContext(1, Budget(2, 2, 0)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(a->AcquirePage(1, 64).status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(a->AcquirePage(9, 0).status().IsNotFound());
}

TEST(DeviceArenaTest, ReclaimsBurstOfLeastRecentlyActiveContextFirst) {
  auto a = MakeArena(12);
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 2, 4)).ok());
  ASSERT_TRUE(a->AdmitContext(2, Budget(2, 2, 4)).ok());
  ASSERT_TRUE(a->AdmitContext(3, Budget(2, 6, 0)).ok());
  Fill(*a, 1, 5);                          // 3 burst pages
  Fill(*a, 2, 5);                          // 3 burst pages; 2 is more recent than 1
  ASSERT_EQ(a->metrics().free_pages, 0u);  // 10 held + 2 committed for ctx 3
  Fill(*a, 3, 5);  // 2 from its floor, then 3 reclaimed: all from ctx 1 first
  EXPECT_EQ(a->metrics().reclaimed_burst, 3u);
  // ctx 1's non-hot pages 1..3 went (pages 0 and 4 are hot); ctx 2 kept all.
  for (std::uint32_t i = 1; i <= 3; ++i) EXPECT_FALSE(*a->IsResident(1, i)) << i;
  EXPECT_TRUE(*a->IsResident(1, 0));
  EXPECT_TRUE(*a->IsResident(1, 4));
  for (std::uint32_t i = 0; i < 5; ++i) EXPECT_TRUE(*a->IsResident(2, i)) << i;
  // Now ctx 2 is the only one with burst.
  ASSERT_TRUE(a->AcquirePage(3, 5).ok());
  EXPECT_EQ(a->metrics().reclaimed_burst, 4u);
  EXPECT_FALSE(*a->IsResident(2, 1));
}

TEST(DeviceArenaTest, TakesAboveFloorPagesOnlyFromLessRecentlyActiveContexts) {
  auto a = MakeArena(8);
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 4, 0)).ok());
  ASSERT_TRUE(a->AdmitContext(2, Budget(2, 6, 0)).ok());
  Fill(*a, 1, 4);                 // ctx 1: 2 above floor
  Fill(*a, 2, 4);                 // pool: 8 held
  ASSERT_TRUE(a->Touch(1).ok());  // ctx 1 is now more recent than ctx 2
  // ctx 2 is below target but may not take from the more recent ctx 1: it
  // recycles its own coldest page instead.
  ASSERT_TRUE(a->AcquirePage(2, 4).ok());
  DeviceArenaMetrics m = a->metrics();
  EXPECT_EQ(m.reclaimed_above_floor, 0u);
  EXPECT_EQ(m.reclaimed_own, 1u);
  EXPECT_FALSE(*a->IsResident(2, 1));
  // Once ctx 2 is the more recent one, ctx 1's pages above floor are fair game.
  ASSERT_TRUE(a->AcquirePage(2, 5).ok());
  m = a->metrics();
  EXPECT_EQ(m.reclaimed_above_floor, 1u);
  EXPECT_FALSE(*a->IsResident(1, 1));
}

TEST(DeviceArenaTest, NeverReclaimsHotPagesOrPagesAtTheFloor) {
  auto a = MakeArena(4);
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 2, 0, 8)).ok());
  ASSERT_TRUE(a->AdmitContext(2, Budget(2, 2, 0, 8)).ok());
  Fill(*a, 1, 2);
  // Every resident page of ctx 1 is hot (sink 0, newest 1); ctx 2 is at floor.
  ASSERT_TRUE(a->AcquirePage(2, 0).ok());
  ASSERT_TRUE(a->AcquirePage(2, 1).ok());
  // Page 2 of ctx 2: page 1 turns cold (the newest is now 2), so ctx 2 recycles it.
  ASSERT_TRUE(a->AcquirePage(2, 2).ok());
  EXPECT_FALSE(*a->IsResident(2, 1));
  EXPECT_TRUE(*a->IsResident(2, 0));
  EXPECT_TRUE(*a->IsResident(1, 0));
  EXPECT_TRUE(*a->IsResident(1, 1));
  // Page 1 of ctx 2 again: both resident pages are hot (sink, newest 2): refused.
  auto g = a->AcquirePage(2, 1);
  ASSERT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(g.status().message().find("every resident page of ctx 2 is hot"), std::string::npos)
      << g.status();
  EXPECT_EQ(a->metrics().page_refusals, 1u);
}

TEST(DeviceArenaTest, PageThatTurnsHotAgainIsCopiedInOnce) {
  auto a = MakeArena(4);
  ASSERT_TRUE(a->AdmitContext(1, Budget(3, 3, 0, 16)).ok());
  Fill(*a, 1, 3);
  EXPECT_EQ(a->metrics().copy_ins, 0u);    // new pages at the frontier: nothing to copy
  ASSERT_TRUE(a->AcquirePage(1, 3).ok());  // recycles page 1
  EXPECT_FALSE(*a->IsResident(1, 1));
  auto g = a->AcquirePage(1, 1);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->copy_in);
  for (int i = 0; i < 5; ++i) {
    auto again = a->AcquirePage(1, 1);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->copy_in);
    EXPECT_EQ(again->range.offset, g->range.offset);
  }
  EXPECT_EQ(*a->CopyIns(1, 1), 1u);
  EXPECT_EQ(a->metrics().copy_ins, 1u);
}

TEST(DeviceArenaTest, InactiveContextsHotPagesBecomeReclaimable) {
  auto a = MakeArena(6);
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 4, 0)).ok());
  ASSERT_TRUE(a->AdmitContext(2, Budget(2, 4, 0)).ok());
  Fill(*a, 1, 3);
  Fill(*a, 2, 3);
  ASSERT_TRUE(a->SetActive(1, false).ok());
  // ctx 2 wants a 4th page: ctx 1 is less recent and inactive, so its sink
  // page (hot while it was active, and its coldest) goes.
  ASSERT_TRUE(a->AcquirePage(2, 3).ok());
  EXPECT_EQ(a->metrics().reclaimed_above_floor, 1u);
  EXPECT_FALSE(*a->IsResident(1, 0));
}

TEST(DeviceArenaTest, StagingIsFirstFitAndCountsItsPeak) {
  auto a = MakeArena(4, 4);
  auto r1 = a->AcquireStaging(2);
  auto r2 = a->AcquireStaging(2);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(a->AcquireStaging(1).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(a->ReleaseStaging(*r1).ok());
  EXPECT_EQ(a->ReleaseStaging(*r1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->ReleaseStaging({1, kPage}).IsInvalidArgument());
  auto r3 = a->AcquireStaging(1);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->offset, r1->offset);
  const DeviceArenaMetrics m = a->metrics();
  EXPECT_EQ(m.peak_staging_in_use, 4u);
  EXPECT_EQ(m.staging_in_use, 3u);
  EXPECT_EQ(m.staging_refusals, 1u);
}

TEST(DeviceArenaTest, ReleaseReturnsEveryPage) {
  auto a = MakeArena(6);
  ASSERT_TRUE(a->AdmitContext(1, Budget(2, 6, 0)).ok());
  Fill(*a, 1, 6);
  ASSERT_TRUE(a->ReleaseContext(1).ok());
  const DeviceArenaMetrics m = a->metrics();
  EXPECT_EQ(m.held_pages, 0u);
  EXPECT_EQ(m.free_pages, 6u);
  EXPECT_EQ(m.released_with_context, 6u);
  EXPECT_EQ(m.peak_held_pages, 6u);
}

// Random admissions, acquisitions, touches and releases: the pool is never
// overdrawn, no physical page is lent twice, and the hot pages of every
// active context stay resident.
TEST(DeviceArenaTest, RandomOperationsKeepTheInvariants) {
  std::mt19937_64 rng(TestSeed("DeviceArenaTest.RandomOperationsKeepTheInvariants"));
  constexpr std::uint32_t kPool = 24;
  auto a = MakeArena(kPool);
  struct Ctx {
    bool admitted = false;
    std::uint32_t frontier = 0;
    bool sink = false;  // page 0 was acquired
  };
  Ctx ctx[6];
  for (int step = 0; step < 5000; ++step) {
    const std::uint64_t id = rng() % 6;
    const int op = static_cast<int>(rng() % 10);
    if (!ctx[id].admitted) {
      const std::uint32_t floor = 2 + rng() % 3;
      const std::uint32_t target = floor + rng() % 4;
      if (a->AdmitContext(id, Budget(floor, target, rng() % 4, 32)).ok()) {
        ctx[id] = {true, 0, false};
      }
      continue;
    }
    if (op == 0) {
      ASSERT_TRUE(a->ReleaseContext(id).ok());
      ctx[id] = {};
    } else if (op == 1) {
      ASSERT_TRUE(a->Touch(id).ok());
    } else {
      const std::uint32_t lp = static_cast<std::uint32_t>(
          op < 6 ? std::min<std::uint32_t>(ctx[id].frontier, 31) : rng() % 32);
      auto g = a->AcquirePage(id, lp);
      if (g.ok()) {
        ctx[id].frontier = std::max(ctx[id].frontier, lp + 1);
        ctx[id].sink = ctx[id].sink || lp == 0;
      } else {
        ASSERT_EQ(g.status().code(), StatusCode::kResourceExhausted) << g.status();
      }
    }
    const DeviceArenaMetrics m = a->metrics();
    ASSERT_LE(m.committed_pages, kPool);
    ASSERT_LE(m.held_pages, kPool);
    std::set<std::uint64_t> offsets;
    std::uint32_t resident = 0;
    for (std::uint64_t c = 0; c < 6; ++c) {
      if (!ctx[c].admitted) continue;
      for (std::uint32_t lp = 0; lp < 32; ++lp) {
        if (!*a->IsResident(c, lp)) continue;
        ++resident;
        auto g = a->AcquirePage(c, lp);  // a hit: reports the page without moving it
        ASSERT_TRUE(g.ok());
        ASSERT_FALSE(g->copy_in);
        ASSERT_TRUE(offsets.insert(g->range.offset).second) << "page lent twice";
      }
      if (ctx[c].sink) {
        ASSERT_TRUE(*a->IsResident(c, 0)) << "sink page of ctx " << c;
      }
      if (ctx[c].frontier > 0) {
        ASSERT_TRUE(*a->IsResident(c, ctx[c].frontier - 1)) << "newest page of ctx " << c;
      }
    }
    ASSERT_EQ(resident, m.held_pages);
  }
}

}  // namespace
}  // namespace kvfabric::client
