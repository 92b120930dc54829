// FakeClockEnv: an Env whose clocks only move when the test says so
// (Advance, or SleepForMicros, which returns at once); files go to the real
// Env::Default(). NowMicros starts at 1 s, WallMicros at a fixed 2023 date
// plus the same offset.
//
// Thread safety: the clock is atomic; file calls are Env::Default()'s.
#ifndef KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_
#define KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/env.h"

namespace kvfabric {

class FakeClockEnv final : public EnvWrapper {
 public:
  FakeClockEnv() : EnvWrapper(Env::Default()) {}

  void Advance(std::uint64_t us) { now_us_ += us; }
  void Advance(std::chrono::microseconds d) { Advance(static_cast<std::uint64_t>(d.count())); }

  uint64_t NowMicros() override { return now_us_; }
  uint64_t WallMicros() override { return 1'700'000'000'000'000 + now_us_; }
  void SleepForMicros(uint64_t micros) override { now_us_ += micros; }

 private:
  std::atomic<std::uint64_t> now_us_{1'000'000};
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_
