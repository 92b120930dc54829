// The CPU device's checks (gpu/cpu/cpu_device_test.cc) against a real GPU.
// Without one, every test but the option checks skips with one line saying
// why. The CUDA device has no fault hooks: hangs and device errors are tested
// on the CPU backend.
#include "gpu/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/compact_test_util.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

// The replacements below pair malloc with free on purpose; GCC cannot see that.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  if (g_count_allocations.load()) g_allocations.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace kvfabric::gpu {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

Deadline Soon() { return steady_clock::now() + milliseconds(10000); }

constexpr std::uint64_t kArenaBytes = 4 << 20;

TEST(CudaDeviceOptionsTest, RefusesZeroArenaNamingTheFlag) {
  auto device = CreateCudaDevice(DeviceOptions{});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("--device-arena-bytes"), std::string_view::npos);
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  // Probes once: without a usable GPU every test skips with the same reason.
  static void SetUpTestSuite() {
    DeviceOptions options;
    options.arena_bytes = kArenaBytes;
    auto probe = CreateCudaDevice(options);
    no_device_ = !probe.ok() && probe.status().code() == StatusCode::kFailedPrecondition;
    if (no_device_) {
      no_device_reason_ = new std::string(probe.status().ToString());
      std::fprintf(stderr, "no CUDA device, skipping: %s\n", no_device_reason_->c_str());
    }
  }
  static void TearDownTestSuite() {
    delete no_device_reason_;
    no_device_reason_ = nullptr;
  }

  void SetUp() override {
    if (no_device_) GTEST_SKIP() << "no CUDA device: " << *no_device_reason_;
    DeviceOptions options;
    options.arena_bytes = kArenaBytes;
    auto device = CreateCudaDevice(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
  }

  static inline bool no_device_ = false;
  static inline std::string* no_device_reason_ = nullptr;

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
  std::vector<std::byte> ReadArena(DeviceRange range) {
    EXPECT_TRUE(device_->Synchronize(Soon()).ok());
    std::vector<std::byte> out(range.bytes);
    EXPECT_TRUE(device_->TEST_Read(range, out).ok());
    return out;
  }

  std::unique_ptr<Device> device_;
};

void ExpectClose(const float* got, const float* want, std::size_t n, float tolerance) {
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << i;
    } else {
      ASSERT_NEAR(got[i], want[i], tolerance * (1.0f + std::fabs(want[i]))) << i;
    }
  }
}

TEST_F(CudaDeviceTest, ReportsKindAndSize) {
  EXPECT_EQ(device_->kind(), DeviceKind::kCuda);
  EXPECT_EQ(device_->arena_bytes(), kArenaBytes);
  EXPECT_EQ(device_->name().rfind("cuda:0 ", 0), 0u) << device_->name();
}

TEST_F(CudaDeviceTest, CopiesRoundTripThroughTheArena) {
  std::mt19937_64 rng(TestSeed("CudaDeviceTest.CopiesRoundTripThroughTheArena"));
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

TEST_F(CudaDeviceTest, RunsWorkOnOneQueueInSubmissionOrder) {
  auto staging = Pinned(32 * 4096);
  auto done = NewEvent();
  for (int i = 0; i < 32; ++i) {
    std::span<std::byte> src = staging->bytes().subspan(i * 4096, 4096);
    std::memset(src.data(), i + 1, src.size());
    ASSERT_TRUE(device_->CopyHostToDevice(src, DeviceRange{0, 4096}).ok());
  }
  ASSERT_TRUE(device_->Record(*done, Queue::kHostToDevice).ok());
  ASSERT_TRUE(done->Wait(Soon()).ok());
  for (std::byte b : ReadArena(DeviceRange{0, 4096})) ASSERT_EQ(b, std::byte{32});
}

TEST_F(CudaDeviceTest, ComputeWaitsOnTheDeviceForAHostToDeviceCopy) {
  std::mt19937_64 rng(TestSeed("CudaDeviceTest.ComputeWaitsOnTheDeviceForAHostToDeviceCopy"));
  constexpr std::uint32_t kStates = 5, kHeads = 4, kDim = 128;
  constexpr std::uint64_t kOutputs = kStates * kHeads * kDim * 4, kLses = kStates * kHeads * 4;
  MergeStatesArgs merge;
  merge.num_states = kStates;
  merge.num_heads = kHeads;
  merge.head_dim = kDim;
  merge.outputs = {0, kOutputs};
  merge.lses = {kOutputs, kLses};
  merge.output = {65536, kHeads * kDim * 4};
  merge.lse = {65536 + kHeads * kDim * 4, kHeads * 4};
  auto staging = Pinned(kOutputs + kLses);
  auto result = Pinned(merge.output.bytes + merge.lse.bytes);
  auto* in = reinterpret_cast<float*>(staging->bytes().data());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (std::uint64_t i = 0; i < (kOutputs + kLses) / 4; ++i) in[i] = normal(rng);
  in[kOutputs / 4 + 1] = -std::numeric_limits<float>::infinity();  // an empty state

  auto copied = NewEvent();
  auto merged = NewEvent();
  auto returned = NewEvent();
  ASSERT_TRUE(device_->CopyHostToDevice(staging->bytes(), DeviceRange{0, kOutputs + kLses}).ok());
  ASSERT_TRUE(device_->Record(*copied, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device_->QueueWaitEvent(Queue::kCompute, *copied).ok());
  ASSERT_TRUE(device_->MergeAttentionStates(merge).ok());
  ASSERT_TRUE(device_->Record(*merged, Queue::kCompute).ok());
  ASSERT_TRUE(device_->QueueWaitEvent(Queue::kDeviceToHost, *merged).ok());
  ASSERT_TRUE(
      device_
          ->CopyDeviceToHost(DeviceRange{merge.output.offset, merge.output.bytes + merge.lse.bytes},
                             result->bytes())
          .ok());
  ASSERT_TRUE(device_->Record(*returned, Queue::kDeviceToHost).ok());
  ASSERT_TRUE(returned->Wait(Soon()).ok());

  std::vector<float> out(kHeads * kDim), lse(kHeads);
  cpu_kernels::MergeStates(kStates, kHeads, kDim, in, in + kOutputs / 4, out.data(), lse.data());
  const auto* got = reinterpret_cast<const float*>(result->bytes().data());
  ExpectClose(got, out.data(), out.size(), 1e-5f);
  ExpectClose(got + out.size(), lse.data(), lse.size(), 1e-5f);
}

TEST_F(CudaDeviceTest, EventsAreReusable) {
  auto event = NewEvent();
  EXPECT_TRUE(event->Query().ok()) << "a new event starts complete";
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(device_->Record(*event, Queue::kCompute).ok());
    ASSERT_TRUE(event->Wait(Soon()).ok());
  }
}

TEST_F(CudaDeviceTest, WaitWithAPassedDeadlineReturnsWithoutBlocking) {
  auto staging = Pinned(kArenaBytes);
  auto event = NewEvent();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(device_->CopyHostToDevice(staging->bytes(), DeviceRange{0, kArenaBytes}).ok());
  }
  ASSERT_TRUE(device_->Record(*event, Queue::kHostToDevice).ok());
  Status s = event->Wait(steady_clock::now() - milliseconds(1));
  EXPECT_TRUE(s.ok() || s.code() == StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(event->Wait(Soon()).ok());
}

TEST_F(CudaDeviceTest, RejectsRangesOutsideTheArenaAndHostMemoryThatIsNotPinned) {
  auto pinned = Pinned(4096);
  std::span<std::byte> all = pinned->bytes();
  auto bad = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  EXPECT_TRUE(bad(device_->CopyHostToDevice(all, DeviceRange{kArenaBytes - 4095, 4096})));
  EXPECT_TRUE(bad(device_->CopyHostToDevice(all, DeviceRange{~std::uint64_t{0} - 10, 4096})));
  EXPECT_TRUE(bad(device_->CopyDeviceToHost(DeviceRange{kArenaBytes, 4096}, all)));
  EXPECT_TRUE(bad(device_->CopyHostToDevice(all, DeviceRange{0, 4095})));
  std::vector<std::byte> plain(4096);
  EXPECT_TRUE(bad(device_->CopyHostToDevice(plain, DeviceRange{0, 4096})));
  EXPECT_TRUE(bad(device_->Record(*NewEvent(), static_cast<Queue>(9))));
  MergeStatesArgs merge;  // no heads
  EXPECT_TRUE(bad(device_->MergeAttentionStates(merge)));
  EXPECT_TRUE(device_->Synchronize(Soon()).ok());
}

std::uint16_t RandomFp16(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  return FloatToFp16Bits(normal(rng));
}

TEST_F(CudaDeviceTest, KernelsMatchTheCpuKernelsAndAreDeterministic) {
  std::mt19937_64 rng(TestSeed("CudaDeviceTest.KernelsMatchTheCpuKernelsAndAreDeterministic"));
  AttentionShape shape;
  shape.num_q_heads = 8;
  shape.num_kv_heads = 2;
  shape.head_dim = 128;
  shape.dtype = KvDtype::kFp16;
  const std::uint32_t tokens = 333;
  const std::uint64_t q_bytes = 8 * 128 * 4, kv_bytes = tokens * 2 * 128 * 2;
  AttentionTileArgs tile;
  tile.shape = shape;
  tile.scale = 1.0f / std::sqrt(128.0f);
  tile.tokens = tokens;
  tile.query = {0, q_bytes};
  tile.keys = {q_bytes, kv_bytes};
  tile.values = {q_bytes + kv_bytes, kv_bytes};
  tile.output = {1 << 20, q_bytes};
  tile.lse = {(1 << 20) + q_bytes, 8 * 4};
  const std::uint64_t input_bytes = q_bytes + 2 * kv_bytes;
  auto staging = Pinned(input_bytes);
  std::span<std::byte> in = staging->bytes();
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto* q = reinterpret_cast<float*>(in.data());
  for (std::uint64_t i = 0; i < q_bytes / 4; ++i) q[i] = normal(rng);
  auto* kv = reinterpret_cast<std::uint16_t*>(in.data() + q_bytes);
  for (std::uint64_t i = 0; i < kv_bytes; ++i) kv[i] = RandomFp16(rng);  // K then V

  // Gather four 4 KiB pages of the keys, in a scrambled order.
  const std::vector<std::uint64_t> offsets = {q_bytes + 3 * 4096, q_bytes, q_bytes + 8192,
                                              q_bytes + 4096};
  GatherPagesArgs gather;
  gather.num_pages = 4;
  gather.page_bytes = 4096;
  gather.page_offsets = {2 << 20, 32};
  gather.destination = {3 << 20, 4 * 4096};
  for (std::uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ValidateGatherSource(gather, i, offsets[i], kArenaBytes).ok());
  }
  ASSERT_TRUE(device_->TEST_Write(std::as_bytes(std::span(offsets)), gather.page_offsets).ok());

  auto copied = NewEvent();
  ASSERT_TRUE(device_->CopyHostToDevice(in, DeviceRange{0, input_bytes}).ok());
  ASSERT_TRUE(device_->Record(*copied, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device_->QueueWaitEvent(Queue::kCompute, *copied).ok());
  ASSERT_TRUE(device_->DecodeAttentionTile(tile).ok());
  ASSERT_TRUE(device_->GatherPages(gather).ok());
  std::vector<std::byte> first_out = ReadArena(tile.output);
  std::vector<std::byte> first_lse = ReadArena(tile.lse);
  ASSERT_TRUE(device_->DecodeAttentionTile(tile).ok());
  EXPECT_EQ(ReadArena(tile.output), first_out) << "the same tile gives the same bits";
  EXPECT_EQ(ReadArena(tile.lse), first_lse);

  std::vector<float> out(q_bytes / 4), lse(8);
  cpu_kernels::DecodeAttentionTile(shape, tile.scale, tokens, q, in.data() + tile.keys.offset,
                                   in.data() + tile.values.offset, out.data(), lse.data());
  ExpectClose(reinterpret_cast<const float*>(first_out.data()), out.data(), out.size(), 1e-4f);
  ExpectClose(reinterpret_cast<const float*>(first_lse.data()), lse.data(), lse.size(), 1e-5f);
  std::vector<std::byte> gathered = ReadArena(gather.destination);
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(gathered.data() + i * 4096, in.data() + offsets[i], 4096), 0) << i;
  }
}

// The compact tile through the CUDA device, against the CPU kernel on the
// same bytes and FP64 over the decoded values (attention_test_util.h's
// bound), and run to run.
TEST_F(CudaDeviceTest, CompactTileMatchesTheCpuKernelAndIsDeterministic) {
  std::mt19937_64 rng(TestSeed("CudaDeviceTest.CompactTileMatchesTheCpuKernelAndIsDeterministic"));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst = 0;
  for (std::uint32_t head_dim : {64u, 128u, 256u}) {
    for (std::uint32_t ratio : {1u, 4u}) {
      for (std::uint32_t blocks : {1u, 7u, 64u}) {
        const std::string what = "head_dim " + std::to_string(head_dim) + " ratio " +
                                 std::to_string(ratio) + " blocks " + std::to_string(blocks);
        SCOPED_TRACE(what);
        const std::uint32_t q_heads = 2 * ratio;
        const testing::CompactTile tile = testing::MakeCompactTile(rng, 16, blocks, 2, head_dim);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        const CompactAttentionTileArgs a = testing::CompactTileLayout(tile, q_heads, scale);
        ASSERT_LE(testing::CompactTileArenaBytes(a), kArenaBytes);
        std::vector<float> q(std::size_t{q_heads} * head_dim);
        for (float& x : q) x = normal(rng);
        ASSERT_TRUE(device_->TEST_Write(std::as_bytes(std::span(q)), a.query).ok());
        ASSERT_TRUE(device_->TEST_Write(tile.slices, a.slices).ok());
        ASSERT_TRUE(device_->DecodeAttentionCompactTile(a).ok());
        const std::vector<std::byte> first_out = ReadArena(a.output);
        const std::vector<std::byte> first_lse = ReadArena(a.lse);
        ASSERT_TRUE(device_->DecodeAttentionCompactTile(a).ok());
        EXPECT_EQ(ReadArena(a.output), first_out) << "the same tile gives the same bits";
        EXPECT_EQ(ReadArena(a.lse), first_lse);

        testing::State gpu{std::vector<float>(q.size()), std::vector<float>(q_heads)};
        std::memcpy(gpu.out.data(), first_out.data(), first_out.size());
        std::memcpy(gpu.lse.data(), first_lse.data(), first_lse.size());
        std::vector<const std::byte*> slices;
        for (std::uint32_t b = 0; b < blocks; ++b) {
          slices.push_back(tile.slices.data() + b * tile.SliceBytes());
        }
        testing::State cpu{std::vector<float>(q.size()), std::vector<float>(q_heads)};
        DecodeAttentionCompactInt8Blocks(a.shape, scale, 16, blocks, q.data(), slices.data(),
                                         cpu.out.data(), cpu.lse.data());
        const testing::Problem p = testing::DecodedProblem(tile, q_heads, scale, q);
        const std::uint32_t roundings = testing::CompactDotRoundings(head_dim);
        worst = std::max(worst, testing::ExpectNearFp64(p, gpu, 1, what, roundings));
        const testing::Tolerance tol = testing::BoundFor(p, 1, roundings);
        for (std::size_t i = 0; i < q.size(); ++i) {
          ASSERT_NEAR(gpu.out[i], cpu.out[i], 2 * tol.out) << "out " << i;
        }
        for (std::uint32_t h = 0; h < q_heads; ++h) {
          ASSERT_NEAR(gpu.lse[h], cpu.lse[h], 2 * (tol.lse + 0x1p-24 * std::abs(cpu.lse[h])))
              << "lse " << h;
        }
      }
    }
  }
  std::printf("largest error against FP64 over the decoded values / asserted tolerance: %.3g\n",
              worst);
}

TEST_F(CudaDeviceTest, DestroyingTheDeviceLetsWorkInFlightFinish) {
  auto staging = Pinned(kArenaBytes);
  auto event = NewEvent();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(device_->CopyHostToDevice(staging->bytes(), DeviceRange{0, kArenaBytes}).ok());
  }
  ASSERT_TRUE(device_->Record(*event, Queue::kHostToDevice).ok());
  device_.reset();
  EXPECT_TRUE(event->Query().ok()) << "the destructor drained the queues";
}

TEST_F(CudaDeviceTest, DecodeStepsAllocateNothingAfterWarmUp) {
  constexpr std::uint64_t kBytes = 64 << 10;
  auto staging = Pinned(kBytes);
  auto result = Pinned(kBytes);
  auto copied = NewEvent();
  auto returned = NewEvent();
  auto step = [&] {
    KVF_RETURN_IF_ERROR(device_->CopyHostToDevice(staging->bytes(), DeviceRange{0, kBytes}));
    KVF_RETURN_IF_ERROR(device_->Record(*copied, Queue::kHostToDevice));
    KVF_RETURN_IF_ERROR(device_->QueueWaitEvent(Queue::kDeviceToHost, *copied));
    KVF_RETURN_IF_ERROR(device_->CopyDeviceToHost(DeviceRange{0, kBytes}, result->bytes()));
    KVF_RETURN_IF_ERROR(device_->Record(*returned, Queue::kDeviceToHost));
    return returned->Wait(Soon());
  };
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(step().ok());
  g_allocations = 0;
  g_count_allocations = true;
  bool all_ok = true;
  for (int i = 0; i < 1000; ++i) all_ok = step().ok() && all_ok;
  g_count_allocations = false;
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(g_allocations.load(), 0u);
}

}  // namespace
}  // namespace kvfabric::gpu
