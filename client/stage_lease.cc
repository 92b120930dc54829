#include "client/stage_lease.h"

#include <string>
#include <utility>

#include "client/client_log.h"

namespace kvfabric::client {
namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

std::string Describe(const StageLease& l) {
  return "owner " + Num(l.owner) + " layer " + Num(l.layer) + " step " + Num(l.step) +
         " stage gen " + Num(l.stage_generation) + " host gen " + Num(l.host_generation);
}

}  // namespace

StatusOr<std::unique_ptr<Stager>> Stager::Create(gpu::Device& device, DeviceArena& arena,
                                                 const StagerOptions& options) {
  if (options.buffers == 0 || options.pages_per_buffer == 0 || options.fences_per_buffer == 0) {
    return Status::InvalidArgument("stager: buffers " + Num(options.buffers) +
                                   ", pages per buffer " + Num(options.pages_per_buffer) +
                                   ", fences per buffer " + Num(options.fences_per_buffer) +
                                   ": each must be > 0");
  }
  std::unique_ptr<Stager> stager(new Stager(device, arena, options));
  for (std::uint32_t b = 0; b < options.buffers; ++b) {
    auto range = arena.AcquireStaging(options.pages_per_buffer);
    if (!range.ok()) {
      return range.status().WithContext("stager: buffer " + Num(b) + " of " + Num(options.buffers) +
                                        " x " + Num(options.pages_per_buffer) + " pages");
    }
    Buffer& buf = stager->buffers_.emplace_back();
    buf.range = *range;
    buf.dirty.assign(options.rows_per_buffer, false);
    for (std::uint32_t e = 0; e < options.fences_per_buffer; ++e) {
      KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> event, device.CreateEvent());
      buf.events.push_back(std::move(event));
    }
  }
  return stager;
}

Stager::Stager(gpu::Device& device, DeviceArena& arena, const StagerOptions& options)
    : device_(device), arena_(arena), options_(options) {
  buffers_.reserve(options.buffers);
}

Stager::~Stager() {
  bool busy = quarantined_;
  for (const Buffer& b : buffers_) busy = busy || b.fences > 0;
  if (busy) {
    Status s = device_.Synchronize(std::chrono::steady_clock::now() + options_.fence_timeout);
    if (!s.ok()) {
      Log().warn(
          "stager: {} staging buffers kept out of use at destruction: the device did not prove "
          "its copies finished ({}){}",
          buffers_.size(), s.ToString(),
          quarantined_ ? "; quarantined since: " + quarantine_cause_ : std::string());
      return;
    }
  }
  for (const Buffer& b : buffers_) {
    // The range came from AcquireStaging; a failure here is a bug in the arena.
    arena_.ReleaseStaging(b.range).IgnoreError();
  }
}

Status Stager::Refuse(const char* what) {
  ++m_.refused_in_quarantine;
  return Status::FailedPrecondition(
      std::string("stager quarantined, ") + what +
      " refused until Drain() proves every copy finished: " + quarantine_cause_);
}

void Stager::Quarantine(const std::string& what, const StageLease& lease, const Status& cause) {
  quarantined_ = true;
  ++m_.quarantines;
  quarantine_cause_ = what + " (last " + Describe(lease) +
                      ") had an unknown outcome: " + cause.ToString() +
                      "; every staging buffer is held";
  Log().error("stager: quarantined: {}", quarantine_cause_);
}

Status Stager::BeginStage(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                          std::uint64_t host_generation) {
  if (quarantined_) return Refuse("new stage");
  if (stage_open_) {
    return Status::FailedPrecondition("stager: stage (" + Describe(stage_) +
                                      ") is not sealed; a new stage cannot begin");
  }
  stage_ = StageLease{owner, layer, step, ++generation_, host_generation, 0, {}};
  stage_open_ = true;
  ++m_.stages;
  return Status::OK();
}

StatusOr<StageLease> Stager::Acquire() {
  if (quarantined_) return Refuse("acquire");
  if (!stage_open_) return Status::FailedPrecondition("stager: acquire with no open stage");
  const std::uint32_t n = static_cast<std::uint32_t>(buffers_.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t index = (next_ + i) % n;
    Buffer& buf = buffers_[index];
    if (buf.leased) continue;
    const gpu::Deadline deadline = std::chrono::steady_clock::now() + options_.fence_timeout;
    for (std::uint32_t e = 0; e < buf.fences; ++e) {
      Status s = buf.events[e]->Wait(deadline);
      if (!s.ok()) {
        Quarantine("fence of staging buffer at arena offset " + Num(buf.range.offset), buf.lease,
                   s);
        return Refuse("acquire");
      }
      ++m_.fence_waits;
    }
    buf.fences = 0;
    buf.leased = true;
    buf.lease = stage_;
    buf.lease.buffer = index;
    buf.lease.range = buf.range;
    next_ = (index + 1) % n;
    ++m_.leases;
    return buf.lease;
  }
  return Status::ResourceExhausted("stager: all " + Num(n) + " staging buffers are leased");
}

Status Stager::CheckLease(const StageLease& lease) const {
  if (lease.buffer >= buffers_.size() || !buffers_[lease.buffer].leased ||
      buffers_[lease.buffer].lease.stage_generation != lease.stage_generation) {
    return Status::FailedPrecondition("stager: stale lease (" + Describe(lease) + ")");
  }
  return Status::OK();
}

StatusOr<const gpu::Event*> Stager::RecordUse(const StageLease& lease, gpu::Queue queue) {
  KVF_RETURN_IF_ERROR(CheckLease(lease));
  Buffer& buf = buffers_[lease.buffer];
  if (buf.fences == buf.events.size()) {
    return Status::ResourceExhausted("stager: buffer " + Num(lease.buffer) + " has all " +
                                     Num(buf.events.size()) +
                                     " fences recorded (raise fences_per_buffer)");
  }
  gpu::Event& event = *buf.events[buf.fences];
  KVF_RETURN_IF_ERROR(device_.Record(event, queue));
  ++buf.fences;
  ++m_.fences_recorded;
  return &event;
}

Status Stager::MarkRowsDirty(const StageLease& lease, std::uint32_t first_row, std::uint32_t rows) {
  KVF_RETURN_IF_ERROR(CheckLease(lease));
  Buffer& buf = buffers_[lease.buffer];
  if (std::uint64_t{first_row} + rows > buf.dirty.size()) {
    return Status::OutOfRange("stager: rows [" + Num(first_row) + ", +" + Num(rows) + ") beyond " +
                              Num(buf.dirty.size()) + " rows per buffer");
  }
  for (std::uint32_t r = first_row; r < first_row + rows; ++r) buf.dirty[r] = true;
  return Status::OK();
}

Status Stager::WriteBackDirtyRows(const StageLease& lease, const gpu::Event& after,
                                  std::uint64_t row_bytes, std::span<const WriteBackRegion> regions,
                                  std::uint64_t host_generation) {
  KVF_RETURN_IF_ERROR(CheckLease(lease));
  if (host_generation != lease.host_generation) {
    return Status::Aborted("stager: write-back for " + Describe(lease) +
                           ": host pages are now at generation " + Num(host_generation));
  }
  Buffer& buf = buffers_[lease.buffer];
  const std::uint64_t rows = buf.dirty.size();
  for (const WriteBackRegion& r : regions) {
    if (row_bytes == 0 || rows > (UINT64_MAX - r.device_offset) / row_bytes ||
        r.device_offset + rows * row_bytes > buf.range.bytes || r.host.size() < rows * row_bytes) {
      return Status::InvalidArgument(
          "stager: write-back region at buffer offset " + Num(r.device_offset) + " of " +
          Num(rows) + " rows x " + Num(row_bytes) + " bytes does not fit the buffer (" +
          Num(buf.range.bytes) + " bytes) or its host span (" + Num(r.host.size()) + " bytes)");
    }
  }
  KVF_RETURN_IF_ERROR(device_.QueueWaitEvent(gpu::Queue::kDeviceToHost, after));
  std::uint64_t row = 0;
  while (row < rows) {
    if (!buf.dirty[row]) {
      ++row;
      continue;
    }
    std::uint64_t end = row;
    while (end < rows && buf.dirty[end]) ++end;
    for (const WriteBackRegion& r : regions) {
      const gpu::DeviceRange src{buf.range.offset + r.device_offset + row * row_bytes,
                                 (end - row) * row_bytes};
      KVF_RETURN_IF_ERROR(
          device_.CopyDeviceToHost(src, r.host.subspan(row * row_bytes, (end - row) * row_bytes)));
      ++m_.write_back_copies;
      m_.bytes_written_back += src.bytes;
    }
    m_.rows_written_back += end - row;
    for (std::uint64_t i = row; i < end; ++i) buf.dirty[i] = false;
    row = end;
  }
  return RecordUse(lease, gpu::Queue::kDeviceToHost).status();
}

Status Stager::Release(const StageLease& lease) {
  KVF_RETURN_IF_ERROR(CheckLease(lease));
  buffers_[lease.buffer].leased = false;
  return Status::OK();
}

Status Stager::Seal() {
  if (!stage_open_) return Status::FailedPrecondition("stager: seal with no open stage");
  for (const Buffer& b : buffers_) {
    if (b.leased) {
      return Status::FailedPrecondition("stager: seal of stage (" + Describe(stage_) +
                                        ") with buffer at arena offset " + Num(b.range.offset) +
                                        " still leased");
    }
  }
  stage_open_ = false;
  return Status::OK();
}

Status Stager::Drain(gpu::Deadline deadline) {
  Status s = device_.Synchronize(deadline);
  if (!s.ok()) {
    ++m_.drains_failed;
    if (!quarantined_) Quarantine("drain", stage_, s);
    return s.WithContext("stager drain");
  }
  ++m_.drains_ok;
  for (Buffer& b : buffers_) b.fences = 0;
  if (quarantined_) {
    Log().info("stager: quarantine lifted: the device drained every queue");
    quarantined_ = false;
    quarantine_cause_.clear();
  }
  return Status::OK();
}

}  // namespace kvfabric::client
