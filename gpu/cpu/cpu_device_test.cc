#include "gpu/cpu/cpu_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <vector>

#include "core/testing/test_seed.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

// The replacements below pair malloc with free on purpose; GCC cannot see that.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// Counts global allocations while g_count_allocations is set, so a test can
// prove the enqueue and execution paths allocate nothing after warm-up.
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

Deadline In(milliseconds ms) { return steady_clock::now() + ms; }
// Long enough that only a bug makes a test wait for it; nothing may hang.
Deadline Soon() { return In(milliseconds(10000)); }

constexpr std::uint64_t kArenaBytes = 1 << 20;

std::unique_ptr<Device> MakeDevice(std::size_t max_pending = 1024) {
  DeviceOptions options;
  options.arena_bytes = kArenaBytes;
  CpuDeviceOptions cpu;
  cpu.max_pending_per_queue = max_pending;
  auto device = CreateCpuDevice(options, cpu);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(device).value();
}

std::unique_ptr<PinnedHostBuffer> Pinned(Device& device, std::uint64_t bytes) {
  auto buffer = device.AllocatePinnedHost(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

std::unique_ptr<Event> NewEvent(Device& device) {
  auto event = device.CreateEvent();
  EXPECT_TRUE(event.ok()) << event.status();
  return std::move(event).value();
}

void FillRandom(std::span<std::byte> bytes, std::mt19937_64& rng) {
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
}

std::vector<std::byte> ReadArena(Device& device, DeviceRange range) {
  std::vector<std::byte> out(range.bytes);
  EXPECT_TRUE(device.TEST_Read(range, out).ok());
  return out;
}

TEST(CpuDeviceTest, RefusesZeroArenaNamingTheFlag) {
  auto device = CreateCpuDevice(DeviceOptions{});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("--device-arena-bytes"), std::string_view::npos);
}

TEST(CpuDeviceTest, RefusesArenaLargerThanThisMachineWithTheArithmetic) {
  DeviceOptions options;
  options.arena_bytes = std::uint64_t{1} << 60;
  auto device = CreateCpuDevice(options);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(device.status().message().find("physical memory"), std::string_view::npos)
      << device.status();
}

TEST(CpuDeviceTest, RefusesZeroQueueCapacity) {
  DeviceOptions options;
  options.arena_bytes = kArenaBytes;
  CpuDeviceOptions cpu;
  cpu.max_pending_per_queue = 0;
  EXPECT_EQ(CreateCpuDevice(options, cpu).status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, ReportsKindSizeAndPrefaultTime) {
  auto device = MakeDevice();
  EXPECT_EQ(device->kind(), DeviceKind::kCpu);
  EXPECT_EQ(device->arena_bytes(), kArenaBytes);
  EXPECT_NE(device->name().find("pre-faulted in"), std::string::npos) << device->name();
}

TEST(CpuDeviceTest, CopiesRoundTripThroughTheArena) {
  std::mt19937_64 rng(TestSeed("CpuDeviceTest.CopiesRoundTripThroughTheArena"));
  auto device = MakeDevice();
  auto in = Pinned(*device, 64 << 10);
  auto out = Pinned(*device, 64 << 10);
  FillRandom(in->bytes(), rng);
  auto h2d_done = NewEvent(*device);
  auto d2h_done = NewEvent(*device);
  const DeviceRange range{12345, 64 << 10};
  ASSERT_TRUE(device->CopyHostToDevice(in->bytes(), range).ok());
  ASSERT_TRUE(device->Record(*h2d_done, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device->QueueWaitEvent(Queue::kDeviceToHost, *h2d_done).ok());
  ASSERT_TRUE(device->CopyDeviceToHost(range, out->bytes()).ok());
  ASSERT_TRUE(device->Record(*d2h_done, Queue::kDeviceToHost).ok());
  ASSERT_TRUE(d2h_done->Wait(Soon()).ok());
  EXPECT_EQ(std::memcmp(in->bytes().data(), out->bytes().data(), in->bytes().size()), 0);
}

// Memory allocated elsewhere (a transport's shared-memory region) is
// accepted for copies while PinHostMemory's buffer lives, and refused after.
TEST(CpuDeviceTest, PinnedForeignMemoryCopiesUntilItsBufferIsGone) {
  auto device = MakeDevice();
  std::vector<std::byte> foreign(64 << 10, std::byte{0x5a});
  const DeviceRange range{4096, foreign.size()};
  Status before = device->CopyHostToDevice(foreign, range);
  EXPECT_EQ(before.code(), StatusCode::kInvalidArgument) << before;
  EXPECT_EQ(device->PinHostMemory({}).status().code(), StatusCode::kInvalidArgument);
  {
    auto pinned = device->PinHostMemory(foreign);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_EQ((*pinned)->bytes().data(), foreign.data());  // the same memory, not a copy
    auto done = NewEvent(*device);
    ASSERT_TRUE(device->CopyHostToDevice((*pinned)->bytes(), range).ok());
    ASSERT_TRUE(device->Record(*done, Queue::kHostToDevice).ok());
    ASSERT_TRUE(done->Wait(Soon()).ok());
    EXPECT_EQ(ReadArena(*device, range), foreign);
  }
  Status after = device->CopyHostToDevice(foreign, range);
  EXPECT_EQ(after.code(), StatusCode::kInvalidArgument) << after;
}

TEST(CpuDeviceTest, RunsWorkOnOneQueueInSubmissionOrder) {
  auto device = MakeDevice();
  auto staging = Pinned(*device, 4096);
  auto done = NewEvent(*device);
  const DeviceRange range{0, 64};
  // 32 copies of different bytes to the same range: the last one wins.
  for (int i = 0; i < 32; ++i) {
    std::span<std::byte> src = staging->bytes().subspan(i * 64, 64);
    std::memset(src.data(), i + 1, src.size());
    ASSERT_TRUE(device->CopyHostToDevice(src, range).ok());
  }
  ASSERT_TRUE(device->Record(*done, Queue::kHostToDevice).ok());
  ASSERT_TRUE(done->Wait(Soon()).ok());
  for (std::byte b : ReadArena(*device, range)) ASSERT_EQ(b, std::byte{32});
}

TEST(CpuDeviceTest, WorkAfterAPendingMarkerWaitsForIt) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  ASSERT_NE(hooks, nullptr);
  auto staging = Pinned(*device, 64);
  std::memset(staging->bytes().data(), 7, 64);
  auto stuck = NewEvent(*device);
  auto after = NewEvent(*device);
  hooks->HangNextEvents(Queue::kHostToDevice, 1);
  ASSERT_TRUE(device->Record(*stuck, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device->CopyHostToDevice(staging->bytes(), DeviceRange{0, 64}).ok());
  ASSERT_TRUE(device->Record(*after, Queue::kHostToDevice).ok());
  EXPECT_EQ(after->Wait(In(milliseconds(50))).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(hooks->PendingEntries(Queue::kHostToDevice), 3u);
  for (std::byte b : ReadArena(*device, DeviceRange{0, 64})) ASSERT_EQ(b, std::byte{0});
  hooks->ReleaseHangs(Queue::kHostToDevice);
  ASSERT_TRUE(after->Wait(Soon()).ok());
  EXPECT_TRUE(stuck->Query().ok());
  for (std::byte b : ReadArena(*device, DeviceRange{0, 64})) ASSERT_EQ(b, std::byte{7});
}

// Inputs of one merge, staged in a pinned buffer laid out like the arena
// region it is copied to.
struct MergeLayout {
  static constexpr std::uint32_t kStates = 5, kHeads = 4, kDim = 32;
  static constexpr std::uint64_t kOutputsBytes = kStates * kHeads * kDim * 4;
  static constexpr std::uint64_t kLsesBytes = kStates * kHeads * 4;
  std::uint64_t base;
  MergeStatesArgs Args() const {
    MergeStatesArgs a;
    a.num_states = kStates;
    a.num_heads = kHeads;
    a.head_dim = kDim;
    a.outputs = {base, kOutputsBytes};
    a.lses = {base + kOutputsBytes, kLsesBytes};
    a.output = {base + 8192, kHeads * kDim * 4};
    a.lse = {base + 8192 + kHeads * kDim * 4, kHeads * 4};
    return a;
  }
  std::uint64_t input_bytes() const { return kOutputsBytes + kLsesBytes; }
};

void FillMergeInputs(std::span<std::byte> input, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  auto* f = reinterpret_cast<float*>(input.data());
  const std::size_t n = input.size() / 4;
  for (std::size_t i = 0; i < n; ++i) f[i] = normal(rng);
  // An empty state for one head: lse -inf.
  f[MergeLayout::kOutputsBytes / 4 + 1] = -std::numeric_limits<float>::infinity();
}

TEST(CpuDeviceTest, ComputeWaitsOnTheDeviceForAHostToDeviceCopy) {
  std::mt19937_64 rng(TestSeed("CpuDeviceTest.ComputeWaitsOnTheDeviceForAHostToDeviceCopy"));
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  const MergeLayout layout{4096};
  auto staging = Pinned(*device, layout.input_bytes());
  FillMergeInputs(staging->bytes(), rng);
  auto copied = NewEvent(*device);
  auto merged = NewEvent(*device);

  // The H2D queue stalls before the copy, so the merge must not run yet.
  auto gate = NewEvent(*device);
  hooks->HangNextEvents(Queue::kHostToDevice, 1);
  ASSERT_TRUE(device->Record(*gate, Queue::kHostToDevice).ok());
  ASSERT_TRUE(
      device->CopyHostToDevice(staging->bytes(), DeviceRange{layout.base, layout.input_bytes()})
          .ok());
  ASSERT_TRUE(device->Record(*copied, Queue::kHostToDevice).ok());
  // Returns at once: the wait happens on the compute queue, not the host.
  ASSERT_TRUE(device->QueueWaitEvent(Queue::kCompute, *copied).ok());
  ASSERT_TRUE(device->MergeAttentionStates(layout.Args()).ok());
  ASSERT_TRUE(device->Record(*merged, Queue::kCompute).ok());

  EXPECT_EQ(merged->Wait(In(milliseconds(50))).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(merged->Query().code(), StatusCode::kUnavailable);
  EXPECT_EQ(hooks->PendingEntries(Queue::kCompute), 3u);

  hooks->ReleaseHangs(Queue::kHostToDevice);
  ASSERT_TRUE(merged->Wait(Soon()).ok());

  // The merge saw the copied inputs: compare with the kernel called directly.
  const MergeStatesArgs args = layout.Args();
  std::vector<float> out(args.output.bytes / 4), lse(args.lse.bytes / 4);
  const auto* in = reinterpret_cast<const float*>(staging->bytes().data());
  cpu_kernels::MergeStates(args.num_states, args.num_heads, args.head_dim, in,
                           in + MergeLayout::kOutputsBytes / 4, out.data(), lse.data());
  EXPECT_EQ(std::memcmp(ReadArena(*device, args.output).data(), out.data(), args.output.bytes), 0);
  EXPECT_EQ(std::memcmp(ReadArena(*device, args.lse).data(), lse.data(), args.lse.bytes), 0);
}

TEST(CpuDeviceTest, EventsAreReusableAndAReRecordIsPendingAgain) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto event = NewEvent(*device);
  EXPECT_TRUE(event->Query().ok()) << "a new event starts complete";
  EXPECT_TRUE(event->Wait(In(milliseconds(0))).ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(device->Record(*event, Queue::kCompute).ok());
    ASSERT_TRUE(event->Wait(Soon()).ok());
  }
  hooks->HangNextEvents(Queue::kCompute, 1);
  ASSERT_TRUE(device->Record(*event, Queue::kCompute).ok());
  EXPECT_EQ(event->Query().code(), StatusCode::kUnavailable)
      << "the new generation is pending although earlier ones completed";
  hooks->ReleaseHangs(Queue::kCompute);
  EXPECT_TRUE(event->Wait(Soon()).ok());
}

TEST(CpuDeviceTest, WaitingOnANeverRecordedEventIsANoOp) {
  auto device = MakeDevice();
  auto never = NewEvent(*device);
  auto done = NewEvent(*device);
  ASSERT_TRUE(device->QueueWaitEvent(Queue::kCompute, *never).ok());
  ASSERT_TRUE(device->Record(*done, Queue::kCompute).ok());
  EXPECT_TRUE(done->Wait(Soon()).ok());
}

TEST(CpuDeviceTest, WaitReturnsDeadlineExceededWhenTheDeadlineHasPassed) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto event = NewEvent(*device);
  hooks->HangNextEvents(Queue::kDeviceToHost, 1);
  ASSERT_TRUE(device->Record(*event, Queue::kDeviceToHost).ok());
  EXPECT_EQ(event->Wait(steady_clock::now() - milliseconds(1)).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(event->Wait(In(milliseconds(20))).code(), StatusCode::kDeadlineExceeded);
  hooks->ReleaseHangs(Queue::kDeviceToHost);
  EXPECT_TRUE(event->Wait(Soon()).ok());
}

TEST(CpuDeviceTest, RejectsRangesOutsideTheArenaAndHostMemoryThatIsNotPinned) {
  auto device = MakeDevice();
  auto pinned = Pinned(*device, 4096);
  std::span<std::byte> all = pinned->bytes();
  auto bad = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  EXPECT_TRUE(bad(device->CopyHostToDevice(all, DeviceRange{kArenaBytes - 4095, 4096})));
  EXPECT_TRUE(bad(device->CopyHostToDevice(all, DeviceRange{~std::uint64_t{0} - 10, 4096})));
  EXPECT_TRUE(bad(device->CopyDeviceToHost(DeviceRange{kArenaBytes, 4096}, all)));
  EXPECT_TRUE(bad(device->CopyHostToDevice(all, DeviceRange{0, 4095})));  // sizes differ
  std::vector<std::byte> plain(4096);
  EXPECT_TRUE(bad(device->CopyHostToDevice(plain, DeviceRange{0, 4096})));
  EXPECT_TRUE(bad(device->CopyDeviceToHost(DeviceRange{0, 4096}, plain)));
  // Starts inside the pinned buffer, ends past it.
  std::span<const std::byte> overhang(all.data() + 2048, 4096);
  EXPECT_TRUE(bad(device->CopyHostToDevice(overhang, DeviceRange{0, 4096})));
  // Exactly the last byte of the arena and of the buffer is fine.
  EXPECT_TRUE(device->CopyHostToDevice(all.last(1), DeviceRange{kArenaBytes - 1, 1}).ok());
  EXPECT_TRUE(bad(device->Record(*NewEvent(*device), static_cast<Queue>(9))));
  EXPECT_TRUE(device->Synchronize(Soon()).ok());
}

TEST(CpuDeviceTest, RejectsPinnedBuffersAndEventsOfAnotherDevice) {
  auto device = MakeDevice();
  auto other = MakeDevice();
  auto foreign_buffer = Pinned(*other, 64);
  auto foreign_event = NewEvent(*other);
  EXPECT_EQ(device->CopyHostToDevice(foreign_buffer->bytes(), DeviceRange{0, 64}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(device->Record(*foreign_event, Queue::kCompute).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device->QueueWaitEvent(Queue::kCompute, *foreign_event).code(),
            StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, RejectsInvalidKernelArgumentsBeforeEnqueuing) {
  auto device = MakeDevice();
  MergeStatesArgs merge = MergeLayout{0}.Args();
  merge.output.offset = kArenaBytes - 4;  // outside the arena
  EXPECT_EQ(device->MergeAttentionStates(merge).code(), StatusCode::kInvalidArgument);
  merge = MergeLayout{2}.Args();  // misaligned floats
  EXPECT_EQ(device->MergeAttentionStates(merge).code(), StatusCode::kInvalidArgument);
  AttentionTileArgs tile;  // all zero: no heads
  EXPECT_EQ(device->DecodeAttentionTile(tile).code(), StatusCode::kInvalidArgument);
  GatherPagesArgs gather;  // page_bytes 0
  EXPECT_EQ(device->GatherPages(gather).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TEST_CpuDeviceHooks(*device)->PendingEntries(Queue::kCompute), 0u);
}

std::uint16_t RandomFp16(std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  return FloatToFp16Bits(normal(rng));
}

TEST(CpuDeviceTest, KernelsThroughTheDeviceMatchDirectCallsBitForBit) {
  std::mt19937_64 rng(TestSeed("CpuDeviceTest.KernelsThroughTheDeviceMatchDirectCallsBitForBit"));
  auto device = MakeDevice();
  AttentionShape shape;
  shape.num_q_heads = 8;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.dtype = KvDtype::kFp16;
  const std::uint32_t tokens = 37;
  const std::uint64_t q_bytes = 8 * 64 * 4, kv_bytes = tokens * 2 * 64 * 2;
  AttentionTileArgs tile;
  tile.shape = shape;
  tile.scale = 1.0f / 8.0f;
  tile.tokens = tokens;
  tile.query = {0, q_bytes};
  tile.keys = {4096, kv_bytes};
  tile.values = {16384, kv_bytes};
  tile.output = {32768, q_bytes};
  tile.lse = {36864, 8 * 4};
  const std::uint64_t input_bytes = 16384 + kv_bytes;

  auto staging = Pinned(*device, input_bytes);
  std::span<std::byte> in = staging->bytes();
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto* q = reinterpret_cast<float*>(in.data());
  for (std::uint64_t i = 0; i < q_bytes / 4; ++i) q[i] = normal(rng);
  for (std::uint64_t off : {tile.keys.offset, tile.values.offset}) {
    auto* h = reinterpret_cast<std::uint16_t*>(in.data() + off);
    for (std::uint64_t i = 0; i < kv_bytes / 2; ++i) h[i] = RandomFp16(rng);
  }
  auto copied = NewEvent(*device);
  auto computed = NewEvent(*device);
  ASSERT_TRUE(device->CopyHostToDevice(in, DeviceRange{0, input_bytes}).ok());
  ASSERT_TRUE(device->Record(*copied, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device->QueueWaitEvent(Queue::kCompute, *copied).ok());
  ASSERT_TRUE(device->DecodeAttentionTile(tile).ok());

  // Gather four 256-byte pages of the keys, in a scrambled order.
  const std::vector<std::uint64_t> offsets = {4096 + 768, 4096, 4096 + 2048, 4096 + 256};
  GatherPagesArgs gather;
  gather.num_pages = 4;
  gather.page_bytes = 256;
  gather.page_offsets = {40960, 32};
  gather.destination = {45056, 1024};
  ASSERT_TRUE(device->TEST_Write(std::as_bytes(std::span(offsets)), gather.page_offsets).ok());
  ASSERT_TRUE(device->GatherPages(gather).ok());
  ASSERT_TRUE(device->Record(*computed, Queue::kCompute).ok());
  ASSERT_TRUE(computed->Wait(Soon()).ok());

  std::vector<float> out(q_bytes / 4), lse(8);
  cpu_kernels::DecodeAttentionTile(shape, tile.scale, tokens, q, in.data() + tile.keys.offset,
                                   in.data() + tile.values.offset, out.data(), lse.data());
  for (float x : lse) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(std::memcmp(ReadArena(*device, tile.output).data(), out.data(), q_bytes), 0);
  EXPECT_EQ(std::memcmp(ReadArena(*device, tile.lse).data(), lse.data(), 32), 0);
  std::vector<std::byte> gathered = ReadArena(*device, gather.destination);
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(gathered.data() + i * 256, in.data() + offsets[i], 256), 0) << i;
  }
}

TEST(CpuDeviceTest, SynchronizeWaitsForEveryQueue) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto staging = Pinned(*device, 4096);
  std::memset(staging->bytes().data(), 5, 4096);
  auto event = NewEvent(*device);
  hooks->HangNextEvents(Queue::kDeviceToHost, 1);
  ASSERT_TRUE(device->Record(*event, Queue::kDeviceToHost).ok());
  ASSERT_TRUE(device->CopyHostToDevice(staging->bytes(), DeviceRange{0, 4096}).ok());
  Status s = device->Synchronize(In(milliseconds(50)));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("d2h"), std::string_view::npos) << s;
  hooks->ReleaseHangs(Queue::kDeviceToHost);
  ASSERT_TRUE(device->Synchronize(Soon()).ok());
  EXPECT_EQ(hooks->PendingEntries(Queue::kHostToDevice), 0u);
  for (std::byte b : ReadArena(*device, DeviceRange{0, 4096})) ASSERT_EQ(b, std::byte{5});
}

TEST(CpuDeviceTest, InjectedDeviceErrorFailsTheNextEventsThenClears) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto event = NewEvent(*device);
  hooks->FailNextEvents(Queue::kHostToDevice, 2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(device->Record(*event, Queue::kHostToDevice).ok());
    EXPECT_EQ(event->Wait(Soon()).code(), StatusCode::kInternal);
    EXPECT_EQ(event->Query().code(), StatusCode::kInternal);
  }
  ASSERT_TRUE(device->Record(*event, Queue::kHostToDevice).ok());
  EXPECT_TRUE(event->Wait(Soon()).ok());
  // A drain still proves the queues finished (the quarantine release path).
  EXPECT_TRUE(device->Synchronize(Soon()).ok());
}

TEST(CpuDeviceTest, AGatherFromOutsideTheArenaPoisonsTheComputeQueue) {
  auto device = MakeDevice();
  const std::uint64_t bad_offset = kArenaBytes - 16;  // page of 256 bytes runs past the end
  GatherPagesArgs gather;
  gather.num_pages = 1;
  gather.page_bytes = 256;
  gather.page_offsets = {0, 8};
  gather.destination = {4096, 256};
  ASSERT_TRUE(
      device->TEST_Write(std::as_bytes(std::span(&bad_offset, 1)), gather.page_offsets).ok());
  auto event = NewEvent(*device);
  ASSERT_TRUE(device->GatherPages(gather).ok()) << "offsets live on the device: checked there";
  ASSERT_TRUE(device->Record(*event, Queue::kCompute).ok());
  EXPECT_EQ(event->Wait(Soon()).code(), StatusCode::kInternal);
  EXPECT_EQ(device->Synchronize(Soon()).code(), StatusCode::kInternal);
  ASSERT_TRUE(device->Record(*event, Queue::kCompute).ok());
  EXPECT_EQ(event->Wait(Soon()).code(), StatusCode::kInternal) << "the error is sticky";
}

TEST(CpuDeviceTest, AFullQueueReturnsResourceExhausted) {
  auto device = MakeDevice(/*max_pending=*/4);
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto event = NewEvent(*device);
  hooks->HangNextEvents(Queue::kCompute, 1);
  int accepted = 0;
  Status s;
  for (int i = 0; i < 10 && s.ok(); ++i) {
    s = device->Record(*event, Queue::kCompute);
    if (s.ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 4);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("max_pending_per_queue"), std::string_view::npos) << s;
  hooks->ReleaseHangs(Queue::kCompute);
  EXPECT_TRUE(device->Synchronize(Soon()).ok());
  EXPECT_TRUE(device->Record(*event, Queue::kCompute).ok());
  EXPECT_TRUE(event->Wait(Soon()).ok());
}

TEST(CpuDeviceTest, DestroyingTheDeviceCancelsQueuedWorkAndFailsItsEvents) {
  auto device = MakeDevice();
  CpuDeviceTestHooks* hooks = TEST_CpuDeviceHooks(*device);
  auto staging = Pinned(*device, 4096);
  auto hung = NewEvent(*device);
  auto behind = NewEvent(*device);
  auto waiter = NewEvent(*device);
  hooks->HangNextEvents(Queue::kHostToDevice, 1);
  ASSERT_TRUE(device->Record(*hung, Queue::kHostToDevice).ok());
  ASSERT_TRUE(device->CopyHostToDevice(staging->bytes(), DeviceRange{0, 4096}).ok());
  ASSERT_TRUE(device->Record(*behind, Queue::kHostToDevice).ok());
  // The compute worker blocks in a device-side wait on the hung queue.
  ASSERT_TRUE(device->QueueWaitEvent(Queue::kCompute, *behind).ok());
  ASSERT_TRUE(device->Record(*waiter, Queue::kCompute).ok());
  device.reset();  // must not hang
  EXPECT_EQ(hung->Wait(Soon()).code(), StatusCode::kInternal);
  EXPECT_EQ(behind->Wait(Soon()).code(), StatusCode::kInternal);
  EXPECT_EQ(waiter->Query().code(), StatusCode::kInternal);
  EXPECT_EQ(staging->bytes().size(), 4096u);  // buffers outlive the device
}

TEST(CpuDeviceTest, DecodeStepsAllocateNothingAfterWarmUp) {
  std::mt19937_64 rng(TestSeed("CpuDeviceTest.DecodeStepsAllocateNothingAfterWarmUp"));
  auto device = MakeDevice();
  const MergeLayout layout{0};
  auto staging = Pinned(*device, layout.input_bytes());
  auto result = Pinned(*device, layout.Args().output.bytes);
  FillMergeInputs(staging->bytes(), rng);
  auto copied = NewEvent(*device);
  auto merged = NewEvent(*device);
  auto returned = NewEvent(*device);
  auto step = [&] {
    KVF_RETURN_IF_ERROR(
        device->CopyHostToDevice(staging->bytes(), DeviceRange{0, layout.input_bytes()}));
    KVF_RETURN_IF_ERROR(device->Record(*copied, Queue::kHostToDevice));
    KVF_RETURN_IF_ERROR(device->QueueWaitEvent(Queue::kCompute, *copied));
    KVF_RETURN_IF_ERROR(device->MergeAttentionStates(layout.Args()));
    KVF_RETURN_IF_ERROR(device->Record(*merged, Queue::kCompute));
    KVF_RETURN_IF_ERROR(device->QueueWaitEvent(Queue::kDeviceToHost, *merged));
    KVF_RETURN_IF_ERROR(device->CopyDeviceToHost(layout.Args().output, result->bytes()));
    KVF_RETURN_IF_ERROR(device->Record(*returned, Queue::kDeviceToHost));
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
