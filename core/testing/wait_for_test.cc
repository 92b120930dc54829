#include "core/testing/wait_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace kvfabric {
namespace {

using namespace std::chrono_literals;

TEST(WaitForTest, SucceedsOnceAnotherThreadMakesTheConditionHold) {
  std::atomic<bool> go{false};
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!go.load()) std::this_thread::yield();
    done.store(true);
  });
  go.store(true);
  EXPECT_TRUE(WaitFor([&] { return done.load(); }, 60s, "the other thread"));
  other.join();
}

TEST(WaitForTest, ChecksAtOnceAndStopsPollingWhenItHolds) {
  int calls = 0;
  EXPECT_TRUE(WaitFor([&] { return ++calls == 3; }, 60s, "the third call"));
  EXPECT_EQ(calls, 3);
}

TEST(WaitForTest, FailsNamingWhatItAwaitedAfterTheTimeout) {
  int calls = 0;
  ::testing::AssertionResult r = WaitFor([&] { return ++calls < 0; }, 30ms, "pigs to fly");
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("waiting for pigs to fly"), std::string::npos)
      << r.message();
  EXPECT_NE(std::string(r.message()).find("30 ms"), std::string::npos) << r.message();
  EXPECT_GE(calls, 2) << "the condition is checked again at the deadline";
}

}  // namespace
}  // namespace kvfabric
