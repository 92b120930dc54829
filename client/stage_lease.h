// Staging leases: how the working set reuses its staging buffers safely.
//
// A Stager owns a fixed set of staging buffers (runs of DeviceArena staging
// pages) and the Device events that fence them. Work happens in *stages*: one
// stage is one (owner context, layer, decode step), opened by BeginStage and
// closed by Seal; a new stage cannot begin until the previous one is sealed.
// Within a stage the caller Acquires buffers; each acquisition is a StageLease
// naming the owner, layer, step, the stage generation (strictly increasing per
// Stager, one per BeginStage) and the generation of the host pages it stages.
//
// The reuse rule: after enqueuing any copy or kernel that touches a leased
// buffer, the caller calls RecordUse, which records a Device event after it on
// that queue. A buffer is handed out again only after a finished host wait on
// every event recorded against it since its last reuse (Acquire does the
// waits). The events are created once, at Create; nothing on the stage path
// allocates.
//
// Quarantine: a fence whose outcome is unknown (Event::Wait returned
// DeadlineExceeded, Internal or anything but OK) means a copy or kernel may
// still be writing into, or reading from, staging memory. The Stager then
// quarantines itself: every buffer stays held, BeginStage and Acquire return
// FailedPrecondition naming the quarantine and its cause, and only Drain(),
// when Device::Synchronize returns OK (every queue drained, so every copy
// finished), releases the buffers and lifts the quarantine.
//
// Write-back: MarkRowsDirty records which rows of a buffer changed on the
// device; WriteBackDirtyRows copies only those rows to the host, on the
// device->host queue, after an event (usually the attention kernel's) that
// the device->host queue waits for on the device (the host does not block).
//
// Ownership: borrows the Device and the DeviceArena (both must outlive it);
// owns its events and its staging pages, which the destructor returns to the
// arena only if Synchronize proves them idle (otherwise they stay out of use,
// and one warning says so). Threads: not synchronised; one thread (the decode
// thread of the layer stream) drives a Stager.
#ifndef KVFABRIC_CLIENT_STAGE_LEASE_H_
#define KVFABRIC_CLIENT_STAGE_LEASE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/device_arena.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::client {

struct StageLease {
  std::uint64_t owner = 0;  // context id
  std::uint32_t layer = 0;
  std::uint64_t step = 0;              // decode step
  std::uint64_t stage_generation = 0;  // > 0; strictly increasing per Stager
  std::uint64_t host_generation = 0;   // of the host pages staged
  std::uint32_t buffer = 0;            // index of the staging buffer
  gpu::DeviceRange range;              // the buffer's bytes in the arena
};

struct StagerOptions {
  // Staging buffers. Default 2: one is copied into while the other is read.
  std::uint32_t buffers = 2;
  // Staging pages per buffer (DeviceArena page size each). No default: 0 is
  // refused.
  std::uint32_t pages_per_buffer = 0;
  // Events per buffer, i.e. RecordUse calls allowed between two reuses.
  // Default 8 (one H2D fence, one compute fence, one D2H fence per tile, with
  // room to spare).
  std::uint32_t fences_per_buffer = 8;
  // Rows tracked for write-back per buffer (MarkRowsDirty). Default 0: no
  // write-back.
  std::uint32_t rows_per_buffer = 0;
  // How long Acquire waits for a buffer's fences before the outcome counts as
  // unknown and the Stager quarantines. Default 10 s: far beyond any healthy
  // copy of a staging buffer, short enough that a stuck DMA is noticed.
  std::chrono::microseconds fence_timeout = std::chrono::seconds(10);
};

struct StagerMetrics {
  std::uint64_t stages = 0;
  std::uint64_t leases = 0;
  std::uint64_t fences_recorded = 0;
  std::uint64_t fence_waits = 0;  // finished host waits before a reuse
  std::uint64_t quarantines = 0;
  std::uint64_t refused_in_quarantine = 0;
  std::uint64_t drains_ok = 0;
  std::uint64_t drains_failed = 0;
  std::uint64_t rows_written_back = 0;
  std::uint64_t bytes_written_back = 0;
  std::uint64_t write_back_copies = 0;
};

// One region of a buffer written back row by row: rows of `row_bytes` start at
// `device_offset` bytes into the buffer and go to `host` (row r at
// host[r * row_bytes]). K and V of a tile are two regions with the same rows.
struct WriteBackRegion {
  std::uint64_t device_offset = 0;
  std::span<std::byte> host;  // in a PinnedHostBuffer of the device
};

class Stager {
 public:
  // Takes options.buffers runs of options.pages_per_buffer staging pages from
  // `arena` and creates the events. InvalidArgument for zero counts,
  // ResourceExhausted (from the arena) when the staging region is too small.
  static StatusOr<std::unique_ptr<Stager>> Create(gpu::Device& device, DeviceArena& arena,
                                                  const StagerOptions& options);
  ~Stager();

  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Opens stage (owner, layer, step) with the next stage generation.
  // FailedPrecondition in quarantine or when the previous stage is not sealed.
  Status BeginStage(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                    std::uint64_t host_generation);

  // Leases the next free buffer (round robin), after a finished wait on every
  // fence recorded against it. FailedPrecondition with no open stage or in
  // quarantine (including the quarantine this call enters when a wait's
  // outcome is unknown); ResourceExhausted when every buffer is leased.
  StatusOr<StageLease> Acquire();

  // Records a fence on `queue` after the work enqueued so far, against the
  // lease's buffer, and returns it (e.g. for Device::QueueWaitEvent). The
  // event stays valid until the buffer is reused. FailedPrecondition for a
  // stale lease; ResourceExhausted beyond fences_per_buffer.
  StatusOr<const gpu::Event*> RecordUse(const StageLease& lease, gpu::Queue queue);

  // Rows [first_row, first_row + rows) of the lease's buffer changed.
  // OutOfRange beyond rows_per_buffer.
  Status MarkRowsDirty(const StageLease& lease, std::uint32_t first_row, std::uint32_t rows);

  // Copies the dirty rows of every region to the host on the device->host
  // queue after `after` (a device-side wait), records a fence, and clears the
  // dirty rows. Aborted if `host_generation` (the host pages' generation now)
  // differs from the lease's: the host pages were recycled and must not
  // receive these rows. InvalidArgument for regions outside the buffer or
  // host spans too short.
  Status WriteBackDirtyRows(const StageLease& lease, const gpu::Event& after,
                            std::uint64_t row_bytes, std::span<const WriteBackRegion> regions,
                            std::uint64_t host_generation);

  // Returns the lease; its buffer is reused only after its fences complete.
  Status Release(const StageLease& lease);

  // Closes the open stage. FailedPrecondition if a lease is still out.
  Status Seal();

  // Device::Synchronize(deadline); if OK every fence is known complete: the
  // quarantine (if any) is lifted and the buffers are free again. Otherwise the
  // quarantine stays (entered now if it was not) and the error is returned.
  Status Drain(gpu::Deadline deadline);

  // Enters quarantine on behalf of the caller, which saw a fence with an
  // unknown outcome on work ordered with the staging buffers (e.g. the wait
  // for a step's output). Lifted only by Drain.
  void EnterQuarantine(const Status& cause) {
    if (!quarantined_) Quarantine("caller's fence", stage_, cause);
  }

  bool quarantined() const { return quarantined_; }
  std::uint64_t stage_generation() const { return generation_; }
  StagerMetrics metrics() const { return m_; }

 private:
  struct Buffer {
    gpu::DeviceRange range;
    std::vector<std::unique_ptr<gpu::Event>> events;
    std::uint32_t fences = 0;  // events recorded since the last reuse
    bool leased = false;
    StageLease lease;
    std::vector<bool> dirty;
  };

  Stager(gpu::Device& device, DeviceArena& arena, const StagerOptions& options);
  Status CheckLease(const StageLease& lease) const;
  Status Refuse(const char* what);
  void Quarantine(const std::string& what, const StageLease& lease, const Status& cause);

  gpu::Device& device_;
  DeviceArena& arena_;
  const StagerOptions options_;
  std::vector<Buffer> buffers_;
  std::uint32_t next_ = 0;  // round-robin cursor
  std::uint64_t generation_ = 0;
  bool stage_open_ = false;
  StageLease stage_;  // owner, layer, step, generations of the open/last stage
  bool quarantined_ = false;
  std::string quarantine_cause_;
  StagerMetrics m_;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_STAGE_LEASE_H_
