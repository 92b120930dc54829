#include "client/admission_window.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvfabric::client {
namespace {

using Clock = AdmissionWindow::Clock;

// Waits (a bounded time) until `w` has `n` waiters.
bool WaitersReach(const AdmissionWindow& w, std::uint32_t n) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (w.waiting() != n) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

TEST(AdmissionWindowTest, AdmitsTheLowestRankFirstThenFirstCome) {
  AdmissionWindow w(1, 1);
  ASSERT_TRUE(w.TryAcquire());  // the one slot, held while the others queue
  std::mutex order_mu;
  std::vector<int> order;
  std::vector<std::thread> threads;
  // Arrive in this order; index i is the i-th to arrive.
  const std::vector<std::uint32_t> ranks = {5, 0, 3, 0, 5};
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(w.Acquire(ranks[i], Clock::now() + std::chrono::minutes(1)));
      {
        std::lock_guard<std::mutex> l(order_mu);
        order.push_back(static_cast<int>(i));
      }
      w.Release(/*refused=*/false, /*answered=*/true);
    });
    ASSERT_TRUE(WaitersReach(w, static_cast<std::uint32_t>(i + 1)));
  }
  EXPECT_FALSE(w.TryAcquire());  // full, and others wait
  w.Release(/*refused=*/false, /*answered=*/true);
  for (std::thread& t : threads) t.join();
  // Rank 0 (second and fourth to arrive), rank 3, then rank 5 in arrival order.
  EXPECT_EQ(order, (std::vector<int>{1, 3, 2, 0, 4}));
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_EQ(w.waiting(), 0u);
}

TEST(AdmissionWindowTest, AWaiterThatGivesUpLeavesTheQueue) {
  AdmissionWindow w(1, 1);
  ASSERT_TRUE(w.TryAcquire());
  // Rank 0 would go first, but gives up at its deadline.
  EXPECT_FALSE(w.Acquire(0, Clock::now() + std::chrono::milliseconds(20)));
  EXPECT_EQ(w.waiting(), 0u);
  std::thread later([&] {
    EXPECT_TRUE(w.Acquire(7, Clock::now() + std::chrono::minutes(1)));
    w.Release(false, true);
  });
  ASSERT_TRUE(WaitersReach(w, 1));
  w.Release(false, true);
  later.join();
  EXPECT_EQ(w.in_flight(), 0u);
}

TEST(AdmissionWindowTest, HalvesAtARefusalAndGrowsByOneAfterAWindowOfReplies) {
  AdmissionWindow w(4, 6);
  EXPECT_EQ(w.size(), 4u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w.TryAcquire());
  EXPECT_FALSE(w.TryAcquire());
  w.Release(/*refused=*/true, /*answered=*/true);
  EXPECT_EQ(w.size(), 2u);
  // A failed call (no reply) changes no size.
  w.Release(false, /*answered=*/false);
  EXPECT_EQ(w.size(), 2u);
  // Two answered replies at size 2: one more.
  w.Release(false, true);
  w.Release(false, true);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.in_flight(), 0u);
  // Up to max, never past it.
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t n = w.size();
    for (std::uint32_t i = 0; i < n; ++i) ASSERT_TRUE(w.TryAcquire());
    for (std::uint32_t i = 0; i < n; ++i) w.Release(false, true);
  }
  EXPECT_EQ(w.size(), 6u);
  // Down to 1, never 0.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(w.TryAcquire());
    w.Release(true, true);
  }
  EXPECT_EQ(w.size(), 1u);
}

TEST(AdmissionWindowTest, ClampsItsBounds) {
  AdmissionWindow zero(0, 0);
  EXPECT_EQ(zero.size(), 1u);
  AdmissionWindow above(9, 3);
  EXPECT_EQ(above.size(), 3u);
}

}  // namespace
}  // namespace kvfabric::client
