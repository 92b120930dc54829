// The Level Zero backend of Device (gpu/device.h), for Intel GPUs.
//
// One device of the machine (DeviceOptions::device_index counts the devices
// of every driver, in driver order), one context, one zeMemAllocDevice of
// exactly arena_bytes, pinned staging from zeMemAllocHost, and one immediate
// command list per queue: the host->device and device->host lists use a copy
// engine group where the device has one, the compute list a compute group.
// Every appended operation is followed by a barrier, so work on one queue
// runs in submission order. An Event is one host-visible event in its own
// pool: Record resets it from the host and appends a barrier that signals it;
// QueueWaitEvent appends a wait on it; Event::Wait uses zeEventHostSynchronize
// bounded by the deadline.
//
// Kernels (no SPIR-V kernels yet):
//   - DecodeAttentionTile and DecodeAttentionCompactTile validate their
//     arguments, then return Unimplemented.
//   - MergeAttentionStates runs the CPU merge (gpu/kernels/cpu_kernels.h): it
//     waits on the host for the compute queue to drain, copies the states to
//     host scratch, merges and copies the result back, all before returning.
//     It blocks the calling thread and allocates its scratch on first use
//     (and when a larger merge comes along).
//   - GatherPages waits for the compute queue, reads the offset list to the
//     host, checks every page (ValidateGatherSource) and appends one
//     device-to-device copy per page; InvalidArgument for a bad page.
//
// zeInit fails on a machine without an Intel GPU: the factory returns
// FailedPrecondition (through StatusFromZeResult) and callers fall back.
//
// Threads: as gpu/device.h.
#ifndef KVFABRIC_GPU_LEVEL_ZERO_ZE_DEVICE_H_
#define KVFABRIC_GPU_LEVEL_ZERO_ZE_DEVICE_H_

#include <memory>

#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::gpu {

// InvalidArgument for arena_bytes 0 (naming --device-arena-bytes);
// FailedPrecondition when Level Zero has no driver or no device
// `device_index`; ResourceExhausted when the arena cannot be allocated.
StatusOr<std::unique_ptr<Device>> CreateLevelZeroDevice(const DeviceOptions& options);

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_LEVEL_ZERO_ZE_DEVICE_H_
