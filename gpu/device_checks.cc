#include "gpu/device_checks.h"

#include <string>

#include "core/mutex.h"

namespace kvfabric::gpu {

Status CheckArenaRange(DeviceRange range, std::uint64_t arena_bytes, std::string_view what) {
  if (range.offset > arena_bytes || range.bytes > arena_bytes - range.offset) {
    return Status::InvalidArgument(
        std::string(what) + ": device range [offset " + std::to_string(range.offset) + ", " +
        std::to_string(range.bytes) + " bytes) lies outside the arena of " +
        std::to_string(arena_bytes) + " bytes");
  }
  return Status::OK();
}

void PinnedBufferRegistry::Add(std::span<const std::byte> bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(bytes.data());
  MutexLock lock(&mu_);
  begin_to_end_[begin] = begin + bytes.size();
}

void PinnedBufferRegistry::Remove(std::span<const std::byte> bytes) {
  MutexLock lock(&mu_);
  begin_to_end_.erase(reinterpret_cast<std::uintptr_t>(bytes.data()));
}

Status PinnedBufferRegistry::CheckContains(std::span<const std::byte> span,
                                           std::string_view what) const {
  if (span.empty()) return Status::OK();
  const auto begin = reinterpret_cast<std::uintptr_t>(span.data());
  const std::uintptr_t end = begin + span.size();
  {
    MutexLock lock(&mu_);
    // The buffer that starts at or before `begin`, if any.
    auto it = begin_to_end_.upper_bound(begin);
    if (it != begin_to_end_.begin()) {
      --it;
      if (end >= begin && end <= it->second) return Status::OK();
    }
  }
  return Status::InvalidArgument(std::string(what) + ": host span of " +
                                 std::to_string(span.size()) +
                                 " bytes does not lie inside one pinned host buffer of this "
                                 "device (allocate staging with Device::AllocatePinnedHost)");
}

std::size_t PinnedBufferRegistry::size() const {
  MutexLock lock(&mu_);
  return begin_to_end_.size();
}

}  // namespace kvfabric::gpu
