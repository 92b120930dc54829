#include "client/stage_lease.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "client/device_arena.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/device.h"

namespace kvfabric::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr std::uint64_t kPage = 4096;

class StagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu::DeviceOptions o;
    o.arena_bytes = 16 * kPage;
    auto d = gpu::CreateCpuDevice(o, gpu::CpuDeviceOptions());
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = std::move(d).value();
    hooks_ = gpu::TEST_CpuDeviceHooks(*device_);
    ASSERT_NE(hooks_, nullptr);
    DeviceArenaOptions a;
    a.page_bytes = kPage;
    a.staging_pages = 4;
    a.context_floor_pages = 2;
    auto arena = DeviceArena::Create(device_->arena_bytes(), a);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = std::move(arena).value();
    auto host = device_->AllocatePinnedHost(4 * kPage);
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = std::move(host).value();
  }

  std::unique_ptr<Stager> MakeStager(std::uint32_t rows = 0) {
    StagerOptions o;
    o.buffers = 2;
    o.pages_per_buffer = 1;
    o.fences_per_buffer = 4;
    o.rows_per_buffer = rows;
    o.fence_timeout = milliseconds(100);
    auto s = Stager::Create(*device_, *arena_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(s).value();
  }

  std::span<std::byte> Host(std::uint64_t offset, std::uint64_t bytes) {
    return host_->bytes().subspan(offset, bytes);
  }

  Status Sync() { return device_->Synchronize(steady_clock::now() + std::chrono::seconds(10)); }

  std::unique_ptr<gpu::Device> device_;
  gpu::CpuDeviceTestHooks* hooks_ = nullptr;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<gpu::PinnedHostBuffer> host_;
};

TEST_F(StagerTest, LeaseNamesItsStageAndGenerationsOnlyIncrease) {
  auto stager = MakeStager();
  std::uint64_t last = 0;
  for (std::uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(stager->BeginStage(7, 3, step, 40 + step).ok());
    auto lease = stager->Acquire();
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->owner, 7u);
    EXPECT_EQ(lease->layer, 3u);
    EXPECT_EQ(lease->step, step);
    EXPECT_EQ(lease->host_generation, 40 + step);
    EXPECT_GT(lease->stage_generation, last);
    last = lease->stage_generation;
    ASSERT_TRUE(stager->Release(*lease).ok());
    ASSERT_TRUE(stager->Seal().ok());
  }
  EXPECT_EQ(arena_->metrics().staging_in_use, 2u);
}

TEST_F(StagerTest, NewStageCannotBeginUntilThePreviousIsSealed) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  Status s = stager->BeginStage(1, 1, 0, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not sealed"), std::string::npos) << s;
  EXPECT_EQ(stager->Seal().code(), StatusCode::kFailedPrecondition);  // lease still out
  ASSERT_TRUE(stager->Release(*lease).ok());
  ASSERT_TRUE(stager->Seal().ok());
  EXPECT_TRUE(stager->BeginStage(1, 1, 0, 1).ok());
}

TEST_F(StagerTest, StaleLeaseIsRefused) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(stager->Release(*lease).ok());
  EXPECT_EQ(stager->Release(*lease).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stager->RecordUse(*lease, gpu::Queue::kCompute).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(StagerTest, EveryBufferLeasedIsResourceExhausted) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
  auto a = stager->Acquire();
  auto b = stager->Acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->range.offset, b->range.offset);
  EXPECT_EQ(stager->Acquire().status().code(), StatusCode::kResourceExhausted);
}

// A copy into a buffer is still queued behind a slow (hung) marker when the
// lease is released; the next lease of that buffer comes only after the
// copy's fence completed, so its bytes are there.
TEST_F(StagerTest, BufferIsReusedOnlyAfterAFinishedWaitOnEveryFence) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  std::span<std::byte> src = Host(0, kPage);
  std::memset(src.data(), 0x5a, src.size());
  ASSERT_TRUE(device_->CopyHostToDevice(src, lease->range).ok());
  ASSERT_TRUE(stager->RecordUse(*lease, gpu::Queue::kHostToDevice).ok());
  ASSERT_TRUE(stager->RecordUse(*lease, gpu::Queue::kCompute).ok());
  ASSERT_TRUE(stager->Release(*lease).ok());
  auto other = stager->Acquire();  // the other buffer: no wait
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(stager->Release(*other).ok());
  EXPECT_EQ(stager->metrics().fence_waits, 0u);
  auto again = stager->Acquire();  // the first buffer again: waits on both fences
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->range.offset, lease->range.offset);
  EXPECT_EQ(stager->metrics().fence_waits, 2u);
  std::vector<std::byte> seen(kPage);
  ASSERT_TRUE(device_->TEST_Read(again->range, seen).ok());
  EXPECT_EQ(std::memcmp(seen.data(), src.data(), kPage), 0);
}

TEST_F(StagerTest, FenceThatTimesOutQuarantinesUntilDrainProvesTheCopiesFinished) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 2, 9, 1).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  hooks_->HangNextEvents(gpu::Queue::kHostToDevice, 1);
  ASSERT_TRUE(device_->CopyHostToDevice(Host(0, kPage), lease->range).ok());
  ASSERT_TRUE(stager->RecordUse(*lease, gpu::Queue::kHostToDevice).ok());
  ASSERT_TRUE(stager->Release(*lease).ok());
  auto other = stager->Acquire();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(stager->Release(*other).ok());

  auto stuck = stager->Acquire();  // waits 100 ms on the hung fence
  ASSERT_EQ(stuck.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(stager->quarantined());
  const std::string msg(stuck.status().message());
  EXPECT_NE(msg.find("quarantined"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DeadlineExceeded"), std::string::npos) << msg;
  EXPECT_NE(msg.find("owner 1 layer 2 step 9"), std::string::npos) << msg;
  // Every buffer is held, including the one whose fences were fine.
  EXPECT_EQ(stager->Acquire().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stager->Seal().ok());
  EXPECT_EQ(stager->BeginStage(1, 3, 9, 1).code(), StatusCode::kFailedPrecondition);
  // A drain that cannot prove completion keeps the quarantine.
  EXPECT_FALSE(stager->Drain(steady_clock::now() + milliseconds(50)).ok());
  EXPECT_TRUE(stager->quarantined());
  EXPECT_EQ(stager->metrics().drains_failed, 1u);

  hooks_->ReleaseHangs(gpu::Queue::kHostToDevice);
  ASSERT_TRUE(stager->Drain(steady_clock::now() + std::chrono::seconds(10)).ok());
  EXPECT_FALSE(stager->quarantined());
  ASSERT_TRUE(stager->BeginStage(1, 3, 9, 1).ok());
  auto fresh = stager->Acquire();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const StagerMetrics m = stager->metrics();
  EXPECT_EQ(m.quarantines, 1u);
  EXPECT_EQ(m.drains_ok, 1u);
  EXPECT_GE(m.refused_in_quarantine, 3u);
}

TEST_F(StagerTest, DeviceErrorOnAFenceQuarantinesToo) {
  auto stager = MakeStager();
  ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  hooks_->FailNextEvents(gpu::Queue::kCompute, 1);
  ASSERT_TRUE(stager->RecordUse(*lease, gpu::Queue::kCompute).ok());
  ASSERT_TRUE(stager->Release(*lease).ok());
  ASSERT_TRUE(stager->Release(*stager->Acquire()).ok());
  auto failed = stager->Acquire();
  ASSERT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.status().message().find("Internal"), std::string::npos) << failed.status();
  ASSERT_TRUE(stager->Drain(steady_clock::now() + std::chrono::seconds(10)).ok());
  EXPECT_TRUE(stager->Acquire().ok());
}

// Rows 1-2 and 5 of 8 changed. Only they travel, on the device->host queue,
// after the (hung) attention fence: nothing moves until it completes.
TEST_F(StagerTest, WriteBackCopiesOnlyChangedRowsAfterTheAttentionEvent) {
  constexpr std::uint64_t kRow = 256;
  constexpr std::uint32_t kRows = 8;
  auto stager = MakeStager(kRows);
  ASSERT_TRUE(stager->BeginStage(4, 0, 0, 11).ok());
  auto lease = stager->Acquire();
  ASSERT_TRUE(lease.ok());
  std::vector<std::byte> pattern(lease->range.bytes);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 7 + 1);
  ASSERT_TRUE(device_->TEST_Write(pattern, lease->range).ok());
  std::span<std::byte> host_k = Host(0, kRows * kRow);
  std::span<std::byte> host_v = Host(kPage, kRows * kRow);
  std::memset(host_k.data(), 0, host_k.size());
  std::memset(host_v.data(), 0, host_v.size());

  ASSERT_TRUE(stager->MarkRowsDirty(*lease, 1, 2).ok());
  ASSERT_TRUE(stager->MarkRowsDirty(*lease, 5, 1).ok());
  EXPECT_EQ(stager->MarkRowsDirty(*lease, 7, 2).code(), StatusCode::kOutOfRange);
  hooks_->HangNextEvents(gpu::Queue::kCompute, 1);
  auto attention = stager->RecordUse(*lease, gpu::Queue::kCompute);
  ASSERT_TRUE(attention.ok());
  const WriteBackRegion regions[] = {{0, host_k}, {kRows * kRow, host_v}};
  EXPECT_EQ(stager->WriteBackDirtyRows(*lease, **attention, kRow, regions, 12).code(),
            StatusCode::kAborted);  // the host pages were recycled
  ASSERT_TRUE(stager->WriteBackDirtyRows(*lease, **attention, kRow, regions, 11).ok());
  // The host did not block, and the device->host queue waits for attention.
  EXPECT_EQ(device_->Synchronize(steady_clock::now() + milliseconds(50)).code(),
            StatusCode::kDeadlineExceeded);
  for (std::byte b : host_k) ASSERT_EQ(b, std::byte{0});
  hooks_->ReleaseHangs(gpu::Queue::kCompute);
  ASSERT_TRUE(Sync().ok());
  for (std::uint32_t r = 0; r < kRows; ++r) {
    const bool dirty = r == 1 || r == 2 || r == 5;
    for (std::uint64_t i = 0; i < kRow; ++i) {
      const std::byte k = dirty ? pattern[r * kRow + i] : std::byte{0};
      const std::byte v = dirty ? pattern[kRows * kRow + r * kRow + i] : std::byte{0};
      ASSERT_EQ(host_k[r * kRow + i], k) << "row " << r;
      ASSERT_EQ(host_v[r * kRow + i], v) << "row " << r;
    }
  }
  const StagerMetrics m = stager->metrics();
  EXPECT_EQ(m.rows_written_back, 3u);
  EXPECT_EQ(m.bytes_written_back, 2 * 3 * kRow);
  EXPECT_EQ(m.write_back_copies, 4u);  // two runs x two regions
  // Dirty rows are cleared: a second write-back moves nothing.
  ASSERT_TRUE(stager->WriteBackDirtyRows(*lease, **attention, kRow, regions, 11).ok());
  EXPECT_EQ(stager->metrics().rows_written_back, 3u);
}

TEST_F(StagerTest, DestructorReturnsStagingPagesOnlyWhenTheDeviceIsIdle) {
  {
    auto stager = MakeStager();
    EXPECT_EQ(arena_->metrics().staging_in_use, 2u);
  }
  EXPECT_EQ(arena_->metrics().staging_in_use, 0u);
  {
    auto stager = MakeStager();
    ASSERT_TRUE(stager->BeginStage(1, 0, 0, 1).ok());
    auto lease = stager->Acquire();
    ASSERT_TRUE(lease.ok());
    hooks_->HangNextEvents(gpu::Queue::kHostToDevice, 1);
    ASSERT_TRUE(stager->RecordUse(*lease, gpu::Queue::kHostToDevice).ok());
  }
  EXPECT_EQ(arena_->metrics().staging_in_use, 2u);  // kept: the copy may still land
  hooks_->ReleaseHangs(gpu::Queue::kHostToDevice);
  ASSERT_TRUE(Sync().ok());
}

}  // namespace
}  // namespace kvfabric::client
