#include "client/layer0_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvfabric::client {
namespace {

using std::chrono::steady_clock;

TEST(Layer0GateTest, OpensWhenEveryStreamIsDone) {
  Layer0Gate gate(2);
  gate.Done();
  // One stream still pending: the wait ends at its deadline, closed.
  EXPECT_FALSE(gate.AwaitUntil(steady_clock::now()));
  std::thread other([&] { gate.Done(); });
  // Far deadline: returns once the other stream is done, open.
  EXPECT_TRUE(gate.AwaitUntil(steady_clock::now() + std::chrono::minutes(5)));
  other.join();
  // Stays open, and extra Done calls change nothing.
  gate.Done();
  EXPECT_TRUE(gate.AwaitUntil(steady_clock::now()));
}

TEST(Layer0GateTest, NoStreamsIsOpen) {
  Layer0Gate gate(0);
  EXPECT_TRUE(gate.AwaitUntil(steady_clock::now()));
}

TEST(Layer0GateTest, AWaitPastItsDeadlineReturnsClosed) {
  Layer0Gate gate(1);
  // A deadline already passed: no wait at all.
  EXPECT_FALSE(gate.AwaitUntil(steady_clock::now() - std::chrono::seconds(1)));
}

}  // namespace
}  // namespace kvfabric::client
