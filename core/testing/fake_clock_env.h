// FakeClockEnv: an Env whose clocks only move when the test says so
// (Advance, or SleepForMicros, which returns at once); files go to the real
// Env::Default(). NowMicros starts at 1 s, WallMicros at a fixed 2023 date
// plus the same offset.
//
// Thread safety: the clock is atomic; file calls are Env::Default()'s.
#ifndef KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_
#define KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"

namespace kvfabric {

class FakeClockEnv final : public Env {
 public:
  void Advance(std::uint64_t us) { now_us_ += us; }

  StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path,
                                                          const FileOptions& options) override;
  bool FileExists(const std::string& path) override;
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  Status CreateDirIfMissing(const std::string& dir) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteDir(const std::string& dir) override;
  Status RenameFile(const std::string& src, const std::string& target) override;
  StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  uint64_t NowMicros() override { return now_us_; }
  uint64_t WallMicros() override { return 1'700'000'000'000'000 + now_us_; }
  void SleepForMicros(uint64_t micros) override { now_us_ += micros; }

 private:
  Env* const base_ = Env::Default();
  std::atomic<std::uint64_t> now_us_{1'000'000};
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_TESTING_FAKE_CLOCK_ENV_H_
