#include "core/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace kvfabric {
namespace {

using std::chrono::milliseconds;

// A value with its mutex, annotated as the library's classes are.
struct Guarded {
  Mutex mu;
  CondVar cv;
  int value KVF_GUARDED_BY(mu) = 0;
  bool ready KVF_GUARDED_BY(mu) = false;
};

// True when `mu` was free: takes it and lets it go again.
bool TryLockAndUnlock(Mutex& mu) {
  if (!mu.TryLock()) return false;
  mu.Unlock();
  return true;
}

TEST(MutexTest, MutexLockExcludesOtherThreads) {
  Guarded g;
  constexpr int kThreads = 4;
  constexpr int kAdds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&g] {
      for (int i = 0; i < kAdds; ++i) {
        MutexLock lock(&g.mu);
        // A read-modify-write in two steps: lost updates if the lock let two in.
        const int v = g.value;
        g.value = v + 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(&g.mu);
  EXPECT_EQ(g.value, kThreads * kAdds);
}

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsIt) {
  Mutex mu;
  mu.Lock();
  bool got = true;
  std::thread([&] {
    got = TryLockAndUnlock(mu);
  }).join();
  EXPECT_FALSE(got);
  mu.Unlock();
  std::thread([&] {
    got = TryLockAndUnlock(mu);
  }).join();
  EXPECT_TRUE(got);
}

TEST(MutexTest, MutexLockUnlockLetsOthersInUntilLockRetakesIt) {
  Mutex mu;
  MutexLock lock(&mu);
  lock.Unlock();
  bool got = false;
  std::thread([&] {
    got = TryLockAndUnlock(mu);
  }).join();
  EXPECT_TRUE(got);
  lock.Lock();
  mu.AssertHeld();
  std::thread([&] {
    got = TryLockAndUnlock(mu);
  }).join();
  EXPECT_FALSE(got);
}

TEST(MutexTest, MutexLockDestructorDoesNotUnlockWhatItReleased) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    lock.Unlock();
  }
  // Still unlocked exactly once: taking it again works from another thread.
  bool got = false;
  std::thread([&] {
    got = TryLockAndUnlock(mu);
  }).join();
  EXPECT_TRUE(got);
}

TEST(MutexTest, AssertHeldPassesForTheHolder) {
  Mutex mu;
  MutexLock lock(&mu);
  mu.AssertHeld();
}

TEST(MutexDeathTest, AssertHeldAbortsWhenNotHeld) {
  Mutex mu;
  EXPECT_DEATH(mu.AssertHeld(), "not held by this thread");
}

void AssertHeldOnAnotherThreadWhileHoldingIt() {
  Mutex mu;
  MutexLock lock(&mu);
  std::thread([&mu] { mu.AssertHeld(); }).join();
}

TEST(MutexDeathTest, AssertHeldAbortsWhenAnotherThreadHoldsIt) {
  EXPECT_DEATH(AssertHeldOnAnotherThreadWhileHoldingIt(), "not held by this thread");
}

TEST(CondVarTest, WaitWithPredicateReturnsOnceAnotherThreadMakesItTrue) {
  Guarded g;
  std::thread setter([&g] {
    MutexLock lock(&g.mu);
    g.ready = true;
    g.value = 42;
    g.cv.NotifyAll();
  });
  {
    MutexLock lock(&g.mu);
    g.cv.Wait(&g.mu, [&g]() KVF_REQUIRES(g.mu) { return g.ready; });
    EXPECT_EQ(g.value, 42);
    g.mu.AssertHeld();  // held again, by this thread, after the wait
  }
  setter.join();
}

TEST(CondVarTest, WaitReleasesTheMutexWhileAsleep) {
  Guarded g;
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    MutexLock lock(&g.mu);
    waiting.store(true);
    while (g.value == 0) g.cv.Wait(&g.mu);
    g.value = 2;
  });
  // The waiter holds the mutex until it sleeps; taking it here proves the
  // wait released it (the waiter cannot leave its loop before value is 1).
  while (!waiting.load()) std::this_thread::yield();
  {
    MutexLock lock(&g.mu);
    g.value = 1;
    g.cv.NotifyOne();
  }
  waiter.join();
  MutexLock lock(&g.mu);
  EXPECT_EQ(g.value, 2);
}

TEST(CondVarTest, WaitForWithPredicateReturnsFalseAtTimeoutWithMutexHeld) {
  Guarded g;
  MutexLock lock(&g.mu);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.cv.WaitFor(&g.mu, milliseconds(20), [&g]() KVF_REQUIRES(g.mu) { return g.ready; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  g.mu.AssertHeld();
}

TEST(CondVarTest, WaitForWithPredicateReturnsTrueWhenMadeTrueInTime) {
  Guarded g;
  std::thread setter([&g] {
    MutexLock lock(&g.mu);
    g.ready = true;
    g.cv.NotifyOne();
  });
  {
    MutexLock lock(&g.mu);
    // A minute: far longer than the setter needs, so only a lost wake-up fails.
    EXPECT_TRUE(g.cv.WaitFor(&g.mu, std::chrono::minutes(1),
                             [&g]() KVF_REQUIRES(g.mu) { return g.ready; }));
  }
  setter.join();
}

TEST(CondVarTest, WaitUntilAPassedDeadlineTimesOut) {
  Guarded g;
  MutexLock lock(&g.mu);
  EXPECT_EQ(g.cv.WaitUntil(&g.mu, std::chrono::steady_clock::now() - milliseconds(1)),
            std::cv_status::timeout);
  EXPECT_EQ(g.cv.WaitFor(&g.mu, milliseconds(0)), std::cv_status::timeout);
  g.mu.AssertHeld();
}

}  // namespace
}  // namespace kvfabric
