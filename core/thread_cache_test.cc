#include "core/thread_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "core/mutex.h"

namespace kvfabric {
namespace {

// Waits (bounded) until pred holds; the cache parks threads asynchronously.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ThreadCacheTest, ParkedThreadsRunLaterTasks) {
  ThreadCache cache(4);
  std::atomic<int> ran{0};
  {
    TaskGroup group;
    for (int i = 0; i < 3; ++i) group.Run(&cache, [&] { ++ran; });
    group.Wait();
  }
  EXPECT_EQ(ran.load(), 3);
  ASSERT_TRUE(Eventually([&] { return cache.idle() == cache.started(); }));
  const std::uint64_t started = cache.started();
  EXPECT_LE(started, 3u);
  // The same number of tasks again, one after another: no new thread.
  for (int round = 0; round < 20; ++round) {
    TaskGroup group;
    group.Run(&cache, [&] { ++ran; });
    group.Wait();
    ASSERT_TRUE(Eventually([&] { return cache.idle() == cache.started(); }));
  }
  EXPECT_EQ(ran.load(), 23);
  EXPECT_EQ(cache.started(), started);
}

// Tasks that block on each other all run at once: a task never waits for a
// thread another task holds (the way a load's fetch workers wait on the
// stream's layer 0).
TEST(ThreadCacheTest, BlockingTasksEachGetAThread) {
  ThreadCache cache(2);
  constexpr int kTasks = 12;
  Mutex mu;
  CondVar cv;
  int arrived = 0;
  TaskGroup group;
  for (int i = 0; i < kTasks; ++i) {
    group.Run(&cache, [&] {
      MutexLock l(&mu);
      ++arrived;
      cv.NotifyAll();
      // Every task waits until all have started.
      cv.Wait(&mu, [&]() KVF_REQUIRES(mu) { return arrived == kTasks; });
    });
  }
  group.Wait();
  EXPECT_EQ(arrived, kTasks);
  EXPECT_GE(cache.started(), static_cast<std::uint64_t>(kTasks));
  // At most max_idle stay parked; the others exited.
  ASSERT_TRUE(Eventually([&] { return cache.idle() == 2; }));
  EXPECT_EQ(cache.idle(), 2u);
}

TEST(ThreadCacheTest, NoIdleThreadsKept) {
  ThreadCache cache(0);
  std::atomic<int> ran{0};
  for (int round = 0; round < 5; ++round) {
    TaskGroup group;
    group.Run(&cache, [&] { ++ran; });
    group.Run(&cache, [&] { ++ran; });
    group.Wait();
  }
  EXPECT_EQ(ran.load(), 10);
  EXPECT_EQ(cache.idle(), 0u);
  EXPECT_EQ(cache.started(), 10u);
}

TEST(ThreadCacheTest, DestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    ThreadCache cache(8);
    for (int i = 0; i < 16; ++i) {
      cache.Run([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 16);
}

// A task's captures are released before Wait returns: the client recycles a
// context only when Finish holds its last reference.
TEST(ThreadCacheTest, ATasksCapturesAreReleasedBeforeWaitReturns) {
  ThreadCache cache(4);
  auto held = std::make_shared<int>(1);
  for (int round = 0; round < 200; ++round) {
    TaskGroup group;
    group.Run(&cache, [held] { EXPECT_GE(held.use_count(), 2); });
    group.Wait();
    ASSERT_EQ(held.use_count(), 1) << "round " << round;
  }
}

TEST(ThreadCacheTest, TaskGroupIsReusable) {
  ThreadCache cache(4);
  TaskGroup group;
  std::atomic<int> ran{0};
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 3; ++i) group.Run(&cache, [&] { ++ran; });
    group.Wait();
    ASSERT_EQ(ran.load(), 3 * (round + 1));
  }
  group.Wait();  // nothing running: returns at once
}

}  // namespace
}  // namespace kvfabric
