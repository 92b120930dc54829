// WaitFor: how a test waits for something another thread or process does. It
// polls what the test can observe until it holds, instead of sleeping for a
// guessed time and hoping (STYLE.md, "Sleeping in a test to wait for
// something").
//
//   ASSERT_TRUE(WaitFor([&] { return !ep->health().ok(); }, 10s, "the endpoint to fail"));
//
// The timeout only bounds a failing test: nothing asserts how long the wait
// took (rule 10), so make it generous. On timeout the result says what was
// awaited and for how long. Where the code under test reads its clock through
// Env, advance a FakeClockEnv (fake_clock_env.h) instead of waiting at all.
//
// Thread safety: `condition` runs on the calling thread only; it must do its
// own locking of anything other threads write.
#ifndef KVFABRIC_CORE_TESTING_WAIT_FOR_H_
#define KVFABRIC_CORE_TESTING_WAIT_FOR_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string_view>
#include <thread>

namespace kvfabric {

// Calls `condition` until it returns true, first at once, then at intervals
// that grow from 1 ms to 20 ms. Success as soon as it holds; after `timeout`
// a failure "timed out after T ms waiting for <what>", once `condition` has
// been checked a last time.
inline ::testing::AssertionResult WaitFor(const std::function<bool()>& condition,
                                          std::chrono::milliseconds timeout,
                                          std::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds interval(1);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(interval);
    interval = std::min(interval * 2, std::chrono::milliseconds(20));
  }
  if (condition()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "timed out after " << timeout.count() << " ms waiting for " << what;
}

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_TESTING_WAIT_FOR_H_
