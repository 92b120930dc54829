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

TEST(SharedBacklogTest, TakesUpToTheStreamsBytesFromEachPlan) {
  const SharedBacklog b({3, 1, 10, 0, -2});
  EXPECT_EQ(b.plans(), 3u);
  EXPECT_DOUBLE_EQ(b.Total(), 14);
  EXPECT_DOUBLE_EQ(b.Taken(0), 0);
  EXPECT_DOUBLE_EQ(b.Taken(2), 1 + 2 + 2);
  EXPECT_DOUBLE_EQ(b.Taken(3), 1 + 3 + 3);
  EXPECT_DOUBLE_EQ(b.Taken(5), 1 + 3 + 5);
  EXPECT_DOUBLE_EQ(b.Taken(100), 14);
  EXPECT_DOUBLE_EQ(SharedBacklog().Taken(5), 0);
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
  EXPECT_DOUBLE_EQ(load.Backlog(kRemote, "h", 0).Taken(1'000'000), 1'000'000);
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

TEST(PathLoadTest, AClockThatGoesBackIsTheLatestTimeSeen) {
  PathLoad load;
  load.Admit({{kRemote, "h", 1'000'000, 1e9}}, 1000, kNever);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 1500), 500'000u);
  EXPECT_EQ(load.QueuedBytes(kRemote, "h", 900), 500'000u);
}

// The model against a server that shares a link equally, simulated in 0.05 us steps (each
// active plan receives beta x dt / n per step): plans arrive at random times with random bytes;
// each plan's end as predicted when it was admitted (its bytes plus what the plans before it
// take, SharedBacklog::Taken) plus what the plans after it took (AddedDelayUs) is the end the
// server gives it, and the backlog read at each arrival is what the server has left then.
TEST(PathLoadTest, PredictsTheEndsOfAServerThatSharesEqually) {
  const uint64_t seed = TestSeed("PathLoadTest.PredictsTheEndsOfAServerThatSharesEqually");
  std::mt19937_64 rng(seed);
  constexpr double kBeta = 1e9;  // bytes/s: 1000 bytes per us
  constexpr double kDtUs = 0.05;
  for (int round = 0; round < 4; ++round) {
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
      predicted[i] = static_cast<double>(arrive[i]) + (b + before.Taken(b)) / kBeta * 1e6;
      ticket[i] = load.Admit({{kRemote, "h", bytes[i], kBeta}}, arrive[i], kNever);
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
      const double share = kBeta * kDtUs / 1e6 / active;
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
          << "seed " << seed << " round " << round << " plan " << i << " of " << n;
      EXPECT_NEAR(backlog_at_arrival[i], seen_at_arrival[i], kBeta * kDtUs / 1e6 * (n + 1))
          << "seed " << seed << " round " << round << " plan " << i;
    }
  }
}

}  // namespace
}  // namespace kvfabric
