// What the fault tests in tests/fault/ share: the engine's sizes and prefill
// cost, and polling helpers.
#ifndef KVFABRIC_TESTS_FAULT_FAULT_TEST_UTIL_H_
#define KVFABRIC_TESTS_FAULT_FAULT_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

namespace kvfabric::fault_test {

using Clock = std::chrono::steady_clock;

inline constexpr std::uint32_t kTokens = 4096;  // 256 blocks of 16 tokens, 32 KiB each
inline constexpr std::uint32_t kQHeads = 4;
inline constexpr std::uint32_t kTileTokens = 256;
// The engine's prefill is charged at this many µs per token: fetching over an
// unshaped veth is the better plan, fetching at 20 Mbit/s is not.
inline constexpr double kPrefillUsPerToken = 20.0;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Polls `condition` every 50 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

}  // namespace kvfabric::fault_test

#endif  // KVFABRIC_TESTS_FAULT_FAULT_TEST_UTIL_H_
