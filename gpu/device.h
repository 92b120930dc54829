// Device: one accelerator (or the CPU reference) as kvfabric's working set
// sees it: one arena of device memory allocated once, pinned host buffers for
// staging, three queues (host->device copies, device->host copies, compute),
// reusable events, and the kernels of gpu/kernel_args.h.
//
// Backends: gpu/cpu (reference, always built: the arena is a separate
// allocation, queues are real threads, events are real fences), gpu/cuda
// (streams, events, cudaMemcpyAsync from pinned memory) and gpu/level_zero
// (command queues and events; copies plus the CPU merge at first, no
// attention kernels).
//
// Memory is a decision: the arena size is explicit (DeviceOptions); a size of
// 0 ("automatic") is refused with InvalidArgument naming the setting. Nothing
// on the decode path allocates: events come from CreateEvent() once and are
// re-recorded; device memory is addressed as DeviceRange offsets into the
// arena, which the working set (client/device_arena.h) hands out.
//
// Ordering: work on one queue runs in submission order. Work on different
// queues is unordered unless a queue waits for an event recorded on another
// (QueueWaitEvent: the wait happens on the device, the host does not block).
//
// Threads: a Device may be called from any thread; calls that enqueue on the
// same queue must be serialised by the caller (one thread per queue is the
// intended use). Host waits (Event::Wait, Synchronize) may be called from any
// thread.
#ifndef KVFABRIC_GPU_DEVICE_H_
#define KVFABRIC_GPU_DEVICE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "core/statusor.h"
#include "gpu/kernel_args.h"

namespace kvfabric::gpu {

using Deadline = std::chrono::steady_clock::time_point;

// Numbered explicitly: appears in logs, metrics labels and config.
enum class DeviceKind : std::uint8_t {
  kCpu = 1,
  kCuda = 2,
  kLevelZero = 3,
};

enum class Queue : std::uint8_t {
  kHostToDevice = 1,
  kDeviceToHost = 2,
  kCompute = 3,
};

struct DeviceOptions {
  // Bytes of device memory in the arena, allocated once at creation. No
  // default: 0 is refused ("set --device-arena-bytes"). The working set's
  // pages, staging tiles and kernel scratch all come out of it.
  std::uint64_t arena_bytes = 0;
  // Which device of the backend (CUDA ordinal, Level Zero device index).
  int device_index = 0;
};

// Host memory the device copies from/to at full speed (cudaHostAlloc'd on
// CUDA; plain aligned memory on the CPU backend). Owned by the caller; freed
// when destroyed. REQUIRES: no copy in flight uses it then.
class PinnedHostBuffer {
 public:
  virtual ~PinnedHostBuffer() = default;
  virtual std::span<std::byte> bytes() const = 0;
};

// A fence recorded on a queue: it completes when every piece of work that
// queue had accepted before the Record finished. Reusable: Record again after
// a completed Wait.
class Event {
 public:
  virtual ~Event() = default;

  // Non-blocking. OK: complete. Unavailable: not yet. Internal: the device
  // failed (the outcome of the work is unknown).
  virtual Status Query() const = 0;

  // Blocks until complete: OK; DeadlineExceeded when the deadline passes
  // (the outcome is unknown: callers quarantine the buffers involved, see
  // client/stage_lease.h); Internal on a device error.
  virtual Status Wait(Deadline deadline) const = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // e.g. "cpu", "cuda:0 NVIDIA H200".
  virtual std::string name() const = 0;
  virtual std::uint64_t arena_bytes() const = 0;

  // Staging memory. Allocates: call at start-up, not on the decode path.
  virtual StatusOr<std::unique_ptr<PinnedHostBuffer>> AllocatePinnedHost(std::uint64_t bytes) = 0;
  // Pins host memory allocated elsewhere (a data transport's shared-memory
  // region, which peers on this host can map and copy into directly) for
  // the device's copies, until the buffer is destroyed; `bytes` must outlive
  // the buffer. Call at start-up. Unimplemented where the backend cannot;
  // callers then allocate with AllocatePinnedHost.
  virtual StatusOr<std::unique_ptr<PinnedHostBuffer>> PinHostMemory(std::span<std::byte> bytes) {
    (void)bytes;
    return Status::Unimplemented(name() + ": pinning host memory allocated elsewhere");
  }
  // Allocates: call at start-up. The event starts complete.
  virtual StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;

  // Asynchronous copies on the copy queues. `src`/`dst` host spans must lie in
  // a PinnedHostBuffer of this device and stay untouched until an event
  // recorded after the copy completes. InvalidArgument for ranges outside the
  // arena or sizes that differ.
  virtual Status CopyHostToDevice(std::span<const std::byte> src, DeviceRange dst) = 0;
  virtual Status CopyDeviceToHost(DeviceRange src, std::span<std::byte> dst) = 0;

  // Records `event` on `queue` (see Event).
  virtual Status Record(Event& event, Queue queue) = 0;
  // Makes later work on `queue` wait for `event` on the device; the host does
  // not block.
  virtual Status QueueWaitEvent(Queue queue, const Event& event) = 0;

  // Kernels, enqueued on Queue::kCompute (shapes and layouts in kernel_args.h).
  virtual Status DecodeAttentionTile(const AttentionTileArgs& args) = 0;
  // Decode attention over a tile of compact_int8 blocks (docs/compact.md),
  // dequantised inside the kernel; its (output, lse) merges with exact tiles'
  // states like any other. InvalidArgument as ValidateCompactAttentionTile;
  // Unimplemented on a backend without the kernel (level_zero).
  virtual Status DecodeAttentionCompactTile(const CompactAttentionTileArgs& args) = 0;
  virtual Status MergeAttentionStates(const MergeStatesArgs& args) = 0;
  virtual Status GatherPages(const GatherPagesArgs& args) = 0;

  // Waits for every queue to drain: OK, DeadlineExceeded, or Internal.
  virtual Status Synchronize(Deadline deadline) = 0;

  // Test and debug access to arena bytes (CPU backend: direct; others copy
  // through a temporary host buffer synchronously). Not for the data path.
  virtual Status TEST_Read(DeviceRange src, std::span<std::byte> dst) = 0;
  virtual Status TEST_Write(std::span<const std::byte> src, DeviceRange dst) = 0;
};

// The CPU reference backend (gpu/cpu/cpu_device.cc).
StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceOptions& options);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_DEVICE_H_
