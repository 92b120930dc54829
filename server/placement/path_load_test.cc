#include "server/placement/path_load.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric {
namespace {

constexpr BusPath kRemote = BusPath::kRemoteHostToLocalHost;
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// Gain 1: a new transfer of B moves beside each plan until min(r_i, B) of it has moved.
TEST(SharedBacklogTest, EachPlanTakesUpToTheNewTransfersBytes) {
  const SharedBacklog b({3, 1, 10, 0, -2});
  EXPECT_EQ(b.plans(), 3u);
  EXPECT_DOUBLE_EQ(b.Total(), 14);
  EXPECT_DOUBLE_EQ(b.Stretched(0), 0);
  EXPECT_DOUBLE_EQ(b.Stretched(2), 2 + 1 + 2 + 2);
  EXPECT_DOUBLE_EQ(b.Stretched(3), 3 + 1 + 3 + 3);
  EXPECT_DOUBLE_EQ(b.Stretched(5), 5 + 1 + 3 + 5);
  EXPECT_DOUBLE_EQ(b.Stretched(100), 100 + 14);
  EXPECT_DOUBLE_EQ(SharedBacklog().Stretched(5), 5);
}

// Gain 2: up to two transfers move at full speed; three share 2 x beta.
TEST(SharedBacklogTest, AGainLetsSeveralTransfersMoveAtFullSpeed) {
  EXPECT_DOUBLE_EQ(SharedBacklog({4}, 2).Stretched(8), 8);
  // With two plans of 4 left, the first 4 bytes move at 2/3 speed (x1.5), the rest alone.
  const SharedBacklog b({4, 4}, 2);
  EXPECT_DOUBLE_EQ(b.Stretched(2), 3);
  EXPECT_DOUBLE_EQ(b.Stretched(8), 4 * 1.5 + 4);
  // Below 1 is 1.
  EXPECT_DOUBLE_EQ(SharedBacklog({4}, 0.5).Stretched(8), 12);
}

// 1 MB at 1 GB/s: 1000 us.
TEST(PathLoadTest, APlanDrainsAtTheRateItAssumed) {
  PathLoad load;
  const uint64_t t = load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 1000, kNever);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 1000), 1'000'000u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 1500), 500'000u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 2000), 0u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "other", 2000), 0u);
  // Drained, but admitted until the client reports it finished.
  EXPECT_EQ(load.admitted_plans(), 1u);
  double delay = -1;
  EXPECT_TRUE(load.Release(t, 2500, &delay));
  EXPECT_EQ(delay, 0);
  EXPECT_FALSE(load.Release(t, 2500));
}

TEST(PathLoadTest, PlansStartedTogetherEndTogether) {
  PathLoad load;
  const uint64_t a = load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 0, kNever);
  const uint64_t b = load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 0, kNever);
  const SharedBacklog half = load.Backlog(kRemote, "h", 1000);
  EXPECT_EQ(half.plans(), 2u);
  EXPECT_NEAR(half.Total(), 1'000'000, 1e-3);
  // a was priced alone (1000 us); b took 1 MB from it: 1000 us more.
  EXPECT_NEAR(load.AddedDelayUs(a), 1000, 1e-9);
  EXPECT_EQ(load.AddedDelayUs(b), 0);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 2000), 0u);
}

TEST(PathLoadTest, ASmallPlanBesideALargeOneEndsFirst) {
  PathLoad load;
  const uint64_t big = load.Admit({{kRemote, "h", 10'000'000, 1e9}}, 0, kNever);
  // A new 1 MB stream shares with 10 MB: it ends after 2 MB have moved, not 11 MB.
  EXPECT_DOUBLE_EQ(load.Backlog(kRemote, "h", 0).Stretched(1'000'000), 2'000'000);
  load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 0, kNever);
  const SharedBacklog at_2ms = load.Backlog(kRemote, "h", 2000);
  ASSERT_EQ(at_2ms.plans(), 1u);
  EXPECT_NEAR(at_2ms.Total(), 9'000'000, 1e-3);
  EXPECT_NEAR(load.AddedDelayUs(big), 1000, 1e-9);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 11'000), 0u);
}

TEST(PathLoadTest, AReleasedPlanStopsTakingItsShare) {
  PathLoad load;
  load.Admit({{kRemote, "h", 2'000'000, 1e9}}, 0, kNever);
  const uint64_t b = load.Admit({{kRemote, "h", 2'000'000, 1e9}}, 0, kNever);
  EXPECT_TRUE(load.Release(b, 1000));  // each had 1.5 MB left
  EXPECT_NEAR(load.Backlog(kRemote, "h", 2000).Total(), 500'000, 1e-3);
}

// Gain 2: two plans move at full speed each; a third slows all three to 2/3.
TEST(PathLoadTest, AGainLetsPlansMoveSideBySideAtFullSpeed) {
  PathLoad load;
  const uint64_t a = load.Admit({{kRemote, "h", 1'000'000, 1e9, 2}}, 0, kNever);
  const uint64_t b = load.Admit({{kRemote, "h", 1'000'000, 1e9, 2}}, 0, kNever);
  EXPECT_EQ(load.AddedDelayUs(a), 0);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 500), 1'000'000u);
  // At 500 us each has 0.5 MB left; a third of 0.5 MB ends with them, at 500 + 750 us.
  const uint64_t c = load.Admit({{kRemote, "h", 500'000, 1e9, 2}}, 500, kNever);
  EXPECT_NEAR(load.AddedDelayUs(a), 250, 1e-9);
  EXPECT_NEAR(load.AddedDelayUs(b), 250, 1e-9);
  EXPECT_EQ(load.AddedDelayUs(c), 0);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 1250), 0u);
  // Priced with a gain given by the caller instead of the resource's.
  EXPECT_DOUBLE_EQ(load.Backlog(kRemote, "h", 1250, 1).Stretched(10), 10);
}

TEST(PathLoadTest, ChargesOnOneResourceAreOneShareAndResourcesAreSeparate) {
  PathLoad load;
  load.Admit({{kRemote, "h", 500'000, 1e9},
              {kRemote, "h", 500'000, 1e9},
              {BusPath::kNvmeToHost, "h", 1'000'000, 2e9}},
             0, kNever);
  EXPECT_EQ(load.Backlog(kRemote, "h", 0).plans(), 1u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 500), 500'000u);
  EXPECT_EQ(load.QueuedBytes(BusPath::kNvmeToHost, "h", 500), 0u);
}

TEST(PathLoadTest, ChargesWithoutARateHoldTheirBytesUntilReleased) {
  PathLoad load;
  load.Admit({{BusPath::kNvmeToHost, "h", 100}}, 0, 50);
  load.Admit({{BusPath::kNvmeToHost, "h", 10}}, 0, 80);
  EXPECT_EQ(load.QueuedBytes(BusPath::kNvmeToHost, "h", 40), 110u);
  EXPECT_EQ(load.ReleaseExpired(60), 1u);
  EXPECT_EQ(load.QueuedBytes(BusPath::kNvmeToHost, "h", 60), 10u);
  EXPECT_EQ(load.admitted_plans(), 1u);
}

TEST(PathLoadTest, PlansPastTheBoundAreNotCharged) {
  PathLoad load(2);
  EXPECT_NE(load.Admit({{kRemote, "h", 100, 1e9}}, 0, kNever), 0u);
  const uint64_t b = load.Admit({{kRemote, "h", 100, 1e9}}, 0, kNever);
  EXPECT_NE(b, 0u);
  EXPECT_EQ(load.Admit({{kRemote, "h", 100, 1e9}}, 0, kNever), 0u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 0), 200u);
  EXPECT_TRUE(load.Release(b, 0));
  EXPECT_NE(load.Admit({{kRemote, "h", 100, 1e9}}, 0, kNever), 0u);
}

TEST(PathLoadTest, AClockThatGoesBackIsTheLatestTimeSeen) {
  PathLoad load;
  load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 1000, kNever);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 1500), 500'000u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 900), 500'000u);
}

// The model against a server that shares a link equally, simulated in 0.05 us steps (each
// active plan receives beta x min(1, gain / n) x dt per step, gain 1, 1.5 or 3): plans arrive
// at random times with random bytes; each plan's end as predicted when it was admitted
// (SharedBacklog::Stretched beside the plans before it) plus what the plans after it added
// (AddedDelayUs) is the end the server gives it, and the backlog read at each arrival is what
// the server has left then.
TEST(PathLoadTest, PredictsTheEndsOfAServerThatSharesEqually) {
  const uint64_t seed = TestSeed("PathLoadTest.PredictsTheEndsOfAServerThatSharesEqually");
  std::mt19937_64 rng(seed);
  constexpr double kBeta = 1e9;  // bytes/s: 1000 bytes per us
  constexpr double kDtUs = 0.05;
  constexpr double kGains[] = {1, 1.5, 3};
  for (int round = 0; round < 6; ++round) {
    const double gain = kGains[round % 3];
    const int n = 4 + static_cast<int>(rng() % 9);
    std::vector<uint64_t> arrive(n), bytes(n);
    for (int i = 0; i < n; ++i) {
      arrive[i] = rng() % 4000;
      bytes[i] = 100'000 + rng() % 2'900'000;
    }
    std::sort(arrive.begin(), arrive.end());

    PathLoad load;
    std::vector<uint64_t> ticket(n);
    std::vector<double> predicted(n), backlog_at_arrival(n);
    for (int i = 0; i < n; ++i) {
      const SharedBacklog before = load.Backlog(kRemote, "h", arrive[i]);
      backlog_at_arrival[i] = before.Total();
      const double b = static_cast<double>(bytes[i]);
      predicted[i] = static_cast<double>(arrive[i]) + before.Stretched(b) / kBeta * 1e6;
      ticket[i] = load.Admit({{kRemote, "h", bytes[i], kBeta, gain}}, arrive[i], kNever);
    }
    for (int i = 0; i < n; ++i) predicted[i] += load.AddedDelayUs(ticket[i]);

    // The server.
    std::vector<double> left(n, -1), end(n, -1), seen_at_arrival(n, 0);
    int next = 0, done = 0;
    for (uint64_t step = 0; done < n; ++step) {
      const double t = static_cast<double>(step) * kDtUs;
      while (next < n && static_cast<double>(arrive[next]) <= t) {
        for (int j = 0; j < next; ++j) seen_at_arrival[next] += std::max(0.0, left[j]);
        left[next] = static_cast<double>(bytes[next]);
        ++next;
      }
      int active = 0;
      for (int j = 0; j < next; ++j) active += left[j] > 0;
      if (active == 0) continue;
      const double share = kBeta * std::min(1.0, gain / active) * kDtUs / 1e6;
      for (int j = 0; j < next; ++j) {
        if (left[j] <= 0) continue;
        left[j] -= share;
        if (left[j] <= 0) {
          end[j] = t + kDtUs;
          ++done;
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      // A step's error per plan on the server, times the plans sharing it.
      EXPECT_NEAR(predicted[i], end[i], kDtUs * (n + 1))
          << "seed " << seed << " round " << round << " gain " << gain << " plan " << i << " of "
          << n;
      EXPECT_NEAR(backlog_at_arrival[i], seen_at_arrival[i], kBeta * kDtUs / 1e6 * (n + 1))
          << "seed " << seed << " round " << round << " plan " << i;
    }
  }
}

}  // namespace
}  // namespace kvfabric
