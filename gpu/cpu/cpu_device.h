// The CPU reference backend of Device (gpu/device.h): every lifecycle rule of
// a real accelerator, exercised on a machine without one.
//
// - The arena is one separate mmap'd allocation of exactly arena_bytes,
//   pre-faulted at creation (the time it took is in name() and the start-up
//   log line), so the decode path never takes a page fault on it.
// - Each queue (host->device, device->host, compute) is a real worker thread
//   with a fixed-capacity FIFO ring of CpuDeviceOptions::max_pending_per_queue
//   entries. Copies and kernels run on their queue's thread. Enqueuing never
//   allocates; a full ring returns ResourceExhausted.
// - Events are real fences: Record puts a marker in the queue; the event
//   completes when the worker passes it. Each Record starts a new generation,
//   so a re-recorded event is pending again until its new marker is passed.
//   QueueWaitEvent puts a wait in the queue: that queue's worker (not the
//   host) blocks until the event's generation at the time of the call
//   completes. Waiting on a never-recorded event is a no-op, as on CUDA.
// - Kernels run on the compute queue's thread: DecodeAttentionTile,
//   MergeAttentionStates and GatherPages are gpu/kernels/cpu_kernels.h's,
//   DecodeAttentionCompactTile is gpu/kernels/compact_int8.h's
//   (DecodeAttentionCompactTileInArena: bit-identical to calling
//   DecodeAttentionCompactInt8BlocksWith on the same bytes).
// - Copies check that host spans lie inside a PinnedHostBuffer of this device
//   and device ranges inside the arena; kernels validate their arguments
//   (gpu/kernel_args.h) before they are enqueued, so a bad call fails at once
//   with InvalidArgument and never reaches the worker.
// - Destroying the device cancels queued work: the entry each worker is
//   running finishes; entries not yet started are dropped and their events
//   complete with Internal ("cancelled"). Call Synchronize first to have the
//   work done. Events and pinned buffers may outlive the device.
//
// Fault injection for tests (CpuDeviceTestHooks): the next N events recorded
// on a queue can hang (the queue stops at their marker until released, like a
// lost completion or a stuck DMA) or complete with a device error, so the
// working set's quarantine path runs for real.
//
// Threads: as gpu/device.h. TEST hooks may be called from any thread.
#ifndef KVFABRIC_GPU_CPU_CPU_DEVICE_H_
#define KVFABRIC_GPU_CPU_CPU_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::gpu {

struct CpuDeviceOptions {
  // Entries (copies, kernels, event markers, waits) each queue can hold before
  // an enqueue returns ResourceExhausted. The rings are allocated once at
  // creation (a few hundred bytes per entry). Default 1024: deeper than any
  // decode step needs; raise it only for a workload that enqueues whole
  // histories ahead of the workers.
  std::size_t max_pending_per_queue = 1024;
  // Run the scalar decode-attention kernels even where the CPU has AVX2 + FMA
  // + F16C (gpu/kernels/cpu_kernels.h: both compute the same bits; the
  // compact kernel's two paths sum in different orders, compact_int8.h; for
  // comparisons, and for a CPU whose detection is wrong). Default false:
  // BestKernelIsa().
  bool scalar_kernels = false;
};

// Fault injection on a CPU device, for tests only.
class CpuDeviceTestHooks {
 public:
  virtual ~CpuDeviceTestHooks() = default;

  // The next `n` events recorded on `queue` hang: the worker stops at their
  // marker, so they and all later work on `queue` stay incomplete (Wait gives
  // DeadlineExceeded, Synchronize too) until ReleaseHangs(queue).
  virtual void HangNextEvents(Queue queue, std::uint32_t n) = 0;
  // Lets `queue`'s worker pass every hung marker, present and future (until
  // HangNextEvents is called again); the hung events then complete normally.
  virtual void ReleaseHangs(Queue queue) = 0;
  // The next `n` events recorded on `queue` complete with a device error
  // (Query/Wait give Internal) after the work before them has run.
  virtual void FailNextEvents(Queue queue, std::uint32_t n) = 0;
  // Entries currently queued or running on `queue` (0 once it has drained).
  virtual std::size_t PendingEntries(Queue queue) const = 0;
};

// As CreateCpuDevice(options) with backend options. InvalidArgument for
// arena_bytes 0 (naming --device-arena-bytes) or max_pending_per_queue 0;
// ResourceExhausted, with the arithmetic, for an arena larger than this
// machine's physical memory or one that cannot be mapped.
StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceOptions& options,
                                                  const CpuDeviceOptions& cpu_options);

// The test hooks of `device`, or nullptr if it is not a CPU device. The hooks
// live as long as the device.
CpuDeviceTestHooks* TEST_CpuDeviceHooks(Device& device);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_CPU_CPU_DEVICE_H_
