// The Level Zero device against a real Intel GPU. Without one (zeInit fails),
// every test but the option checks skips with one line saying why.
#include "gpu/level_zero/ze_device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/kernels/cpu_kernels.h"

namespace kvfabric::gpu {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

Deadline Soon() { return steady_clock::now() + milliseconds(10000); }

constexpr std::uint64_t kArenaBytes = 4 << 20;

TEST(LevelZeroDeviceOptionsTest, RefusesZeroArenaNamingTheFlag) {
  auto device = CreateLevelZeroDevice(DeviceOptions{});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("--device-arena-bytes"), std::string_view::npos);
}

TEST(LevelZeroDeviceOptionsTest, ReportsAMissingDriverAsFailedPrecondition) {
  DeviceOptions options;
  options.arena_bytes = kArenaBytes;
  auto device = CreateLevelZeroDevice(options);
  if (device.ok()) GTEST_SKIP() << "this machine has a Level Zero device: " << (*device)->name();
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition) << device.status();
  EXPECT_NE(device.status().message().find("zeInit"), std::string_view::npos) << device.status();
}

class LevelZeroDeviceTest : public ::testing::Test {
 protected:
  // Probes once: without a usable device every test skips with the same reason.
  static void SetUpTestSuite() {
    DeviceOptions options;
    options.arena_bytes = kArenaBytes;
    auto probe = CreateLevelZeroDevice(options);
    if (!probe.ok() && probe.status().code() == StatusCode::kFailedPrecondition) {
      no_device_reason_ = new std::string(probe.status().ToString());
      std::fprintf(stderr, "no Level Zero device, skipping: %s\n", no_device_reason_->c_str());
    }
  }
  static void TearDownTestSuite() {
    delete no_device_reason_;
    no_device_reason_ = nullptr;
  }

  void SetUp() override {
    if (no_device_reason_ != nullptr) {
      GTEST_SKIP() << "no Level Zero device: " << *no_device_reason_;
    }
    DeviceOptions options;
    options.arena_bytes = kArenaBytes;
    auto device = CreateLevelZeroDevice(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
  }

  std::unique_ptr<PinnedHostBuffer> Pinned(std::uint64_t bytes) {
    auto buffer = device_->AllocatePinnedHost(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return std::move(buffer).value();
  }
  std::unique_ptr<Event> NewEvent() {
    auto event = device_->CreateEvent();
    EXPECT_TRUE(event.ok()) << event.status();
    return std::move(event).value();
  }

  static inline std::string* no_device_reason_ = nullptr;
  std::unique_ptr<Device> device_;
};

TEST_F(LevelZeroDeviceTest, CopiesRoundTripAndQueuesWaitForEachOther) {
  std::mt19937_64 rng(TestSeed("LevelZeroDeviceTest.CopiesRoundTripAndQueuesWaitForEachOther"));
  auto in = Pinned(1 << 20);
  auto out = Pinned(1 << 20);
  for (std::byte& b : in->bytes()) b = static_cast<std::byte>(rng());
  auto h2d_done = NewEvent();
  auto d2h_done = NewEvent();
  const DeviceRange range{12345, 1 << 20};
  ASSERT_TRUE(device_->CopyHostToDevice(in->bytes(), range).ok());
  ASSERT_TRUE(device_->Record(*h2d_done, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device_->QueueWaitEvent(Queue::kDeviceToHost, *h2d_done).ok());
  ASSERT_TRUE(device_->CopyDeviceToHost(range, out->bytes()).ok());
  ASSERT_TRUE(device_->Record(*d2h_done, Queue::kDeviceToHost).ok());
  ASSERT_TRUE(d2h_done->Wait(Soon()).ok());
  EXPECT_EQ(std::memcmp(in->bytes().data(), out->bytes().data(), in->bytes().size()), 0);
}

TEST_F(LevelZeroDeviceTest, EventsAreReusable) {
  auto event = NewEvent();
  EXPECT_TRUE(event->Query().ok()) << "a new event starts complete";
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(device_->Record(*event, Queue::kCompute).ok());
    ASSERT_TRUE(event->Wait(Soon()).ok());
  }
}

TEST_F(LevelZeroDeviceTest, RejectsRangesOutsideTheArenaAndHostMemoryThatIsNotPinned) {
  auto pinned = Pinned(4096);
  auto bad = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  EXPECT_TRUE(bad(device_->CopyHostToDevice(pinned->bytes(), DeviceRange{kArenaBytes - 1, 4096})));
  std::vector<std::byte> plain(4096);
  EXPECT_TRUE(bad(device_->CopyHostToDevice(plain, DeviceRange{0, 4096})));
}

TEST_F(LevelZeroDeviceTest, MergeRunsTheCpuMergeAndAttentionIsUnimplemented) {
  std::mt19937_64 rng(TestSeed("LevelZeroDeviceTest.MergeRunsTheCpuMerge"));
  constexpr std::uint32_t kStates = 3, kHeads = 2, kDim = 16;
  std::vector<float> outputs(kStates * kHeads * kDim), lses(kStates * kHeads);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : outputs) x = normal(rng);
  for (float& x : lses) x = normal(rng);
  MergeStatesArgs merge;
  merge.num_states = kStates;
  merge.num_heads = kHeads;
  merge.head_dim = kDim;
  merge.outputs = {0, outputs.size() * 4};
  merge.lses = {8192, lses.size() * 4};
  merge.output = {16384, kHeads * kDim * 4};
  merge.lse = {24576, kHeads * 4};
  ASSERT_TRUE(device_->TEST_Write(std::as_bytes(std::span(outputs)), merge.outputs).ok());
  ASSERT_TRUE(device_->TEST_Write(std::as_bytes(std::span(lses)), merge.lses).ok());
  ASSERT_TRUE(device_->MergeAttentionStates(merge).ok());
  std::vector<float> got(kHeads * kDim), want(kHeads * kDim), got_lse(kHeads), want_lse(kHeads);
  ASSERT_TRUE(device_->TEST_Read(merge.output, std::as_writable_bytes(std::span(got))).ok());
  ASSERT_TRUE(device_->TEST_Read(merge.lse, std::as_writable_bytes(std::span(got_lse))).ok());
  cpu_kernels::MergeStates(kStates, kHeads, kDim, outputs.data(), lses.data(), want.data(),
                           want_lse.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_lse, want_lse);

  AttentionTileArgs tile;
  tile.shape = {2, 2, 16, KvDtype::kFp32};
  tile.scale = 0.25f;
  tile.tokens = 1;
  tile.query = {0, 128};
  tile.keys = {4096, 128};
  tile.values = {8192, 128};
  tile.output = {12288, 128};
  tile.lse = {16384, 8};
  EXPECT_EQ(device_->DecodeAttentionTile(tile).code(), StatusCode::kUnimplemented);

  CompactAttentionTileArgs compact;
  compact.shape = {2, 2, 16, KvDtype::kInt8};
  compact.scale = 0.25f;
  compact.block_tokens = 4;
  compact.blocks = 2;
  compact.query = {0, 128};
  compact.slices = {4096, 2 * 2 * CompactHalfBytes(4, 2, 16)};
  compact.output = {12288, 128};
  compact.lse = {16384, 8};
  EXPECT_EQ(device_->DecodeAttentionCompactTile(compact).code(), StatusCode::kUnimplemented);
  compact.blocks = 0;  // validated first
  EXPECT_EQ(device_->DecodeAttentionCompactTile(compact).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfabric::gpu
