// Checks every Device backend applies to what it is given before enqueuing:
// device ranges must lie inside the arena, and host spans must lie inside a
// PinnedHostBuffer of the same device.
//
// PinnedBufferRegistry: the set of live pinned buffers of one device, as
// address ranges. A backend creates one and shares it (std::shared_ptr) with
// every buffer it allocates, so that a buffer destroyed after its device still
// unregisters safely. Lookups do not allocate (they run on the enqueue path).
//
// Thread safety: CheckArenaRange is a pure function. PinnedBufferRegistry may
// be called from any thread (one internal mutex).
#ifndef KVFABRIC_GPU_DEVICE_CHECKS_H_
#define KVFABRIC_GPU_DEVICE_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string_view>

#include "core/mutex.h"
#include "core/status.h"
#include "gpu/kernel_args.h"

namespace kvfabric::gpu {

// OK if [range.offset, range.offset + range.bytes) lies inside an arena of
// `arena_bytes` (overflow-checked). Otherwise InvalidArgument naming `what`
// and the numbers.
Status CheckArenaRange(DeviceRange range, std::uint64_t arena_bytes, std::string_view what);

class PinnedBufferRegistry {
 public:
  PinnedBufferRegistry() = default;
  PinnedBufferRegistry(const PinnedBufferRegistry&) = delete;
  PinnedBufferRegistry& operator=(const PinnedBufferRegistry&) = delete;

  // REQUIRES: `bytes` does not overlap a registered buffer.
  void Add(std::span<const std::byte> bytes);
  // REQUIRES: `bytes` was added and not removed.
  void Remove(std::span<const std::byte> bytes);

  // OK if `span` lies entirely inside one registered buffer; an empty span is
  // OK. Otherwise InvalidArgument naming `what`.
  Status CheckContains(std::span<const std::byte> span, std::string_view what) const;

  std::size_t size() const;

 private:
  mutable Mutex mu_;
  std::map<std::uintptr_t, std::uintptr_t> begin_to_end_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_DEVICE_CHECKS_H_
