#include "gpu/cpu/cpu_device.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "core/errno_status.h"
#include "core/mutex.h"
#include "core/units.h"
#include "gpu/device_checks.h"
#include "gpu/kernel_args.h"
#include "gpu/kernels/compact_int8.h"
#include "gpu/kernels/cpu_kernels.h"

namespace kvfabric::gpu {
namespace {

constexpr int kNumQueues = 3;

// Index of `queue` in per-queue arrays, or -1 for a value that names no queue.
int QueueIndex(Queue queue) {
  switch (queue) {
    case Queue::kHostToDevice:
      return 0;
    case Queue::kDeviceToHost:
      return 1;
    case Queue::kCompute:
      return 2;
  }
  return -1;
}

constexpr std::array<const char*, kNumQueues> kQueueNames = {"h2d", "d2h", "compute"};

Status CheckQueue(Queue queue) {
  if (QueueIndex(queue) < 0) {
    return Status::InvalidArgument("queue " + std::to_string(static_cast<int>(queue)) +
                                   " names no queue");
  }
  return Status::OK();
}

// A private anonymous mapping, unmapped on destruction.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(std::byte* data, std::size_t size) : data_(data), size_(size) {}
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() {
    if (data_ != nullptr) munmap(data_, size_);
  }

  // ResourceExhausted (with `what` and the size) when the kernel refuses.
  static StatusOr<std::unique_ptr<MappedRegion>> Map(std::size_t size, std::string_view what) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return Status::ResourceExhausted(std::string(what) + ": cannot map " +
                                       FormatBytesExact(size) + ": " +
                                       std::string(StatusFromErrno(err, "mmap").message()));
    }
    return std::make_unique<MappedRegion>(static_cast<std::byte*>(p), size);
  }

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Why an event generation completed with an error.
enum class EventFailure : std::uint8_t { kNone, kInjected, kCancelled, kQueueError };

// One fence's state. Every field is guarded by the device's Hub::mu.
struct EventState {
  const void* device_tag = nullptr;  // the Hub of the device that created it
  std::uint64_t recorded = 0;        // generation of the latest Record (0: never recorded)
  std::uint64_t completed = 0;       // highest generation whose marker was passed
  std::uint64_t failed = 0;          // generation that completed with `failure`
  EventFailure failure = EventFailure::kNone;
};

// Queue entries. Trivially small values: moving one into the ring allocates
// nothing (the shared_ptr copy is a reference count).
struct CopyOp {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
};
enum class MarkerMode : std::uint8_t { kNormal, kHang, kFail };
struct MarkerOp {
  std::shared_ptr<EventState> event;
  std::uint64_t generation = 0;
  MarkerMode mode = MarkerMode::kNormal;
};
struct WaitOp {
  std::shared_ptr<EventState> event;
  std::uint64_t generation = 0;
};
using Entry = std::variant<std::monostate, CopyOp, MarkerOp, WaitOp, AttentionTileArgs,
                           CompactAttentionTileArgs, MergeStatesArgs, GatherPagesArgs>;

// The state shared by a device, its workers and its events (events may
// outlive the device). One mutex: the CPU backend values obviously-correct
// ordering over contention, and the critical sections are a few words.
struct Hub {
  Mutex mu;
  // Notified (all) when an entry finishes, an event completes, hangs are
  // released or the device stops: host waits and blocked workers wait on it.
  CondVar progress;
  bool stopping KVF_GUARDED_BY(mu) = false;
  std::array<std::uint32_t, kNumQueues> hang_next KVF_GUARDED_BY(mu) = {};
  std::array<std::uint32_t, kNumQueues> fail_next KVF_GUARDED_BY(mu) = {};
  std::array<bool, kNumQueues> release_hangs KVF_GUARDED_BY(mu) = {};
};

// Completes `generation` of `event`, with `failure` unless kNone. `hub` is
// the event's device's: its mutex guards the event.
void CompleteEvent(const Hub& hub, EventState& event, std::uint64_t generation,
                   EventFailure failure) KVF_REQUIRES(hub.mu) {
  event.completed = std::max(event.completed, generation);
  if (failure != EventFailure::kNone) {
    event.failed = generation;
    event.failure = failure;
  }
}

// `hub` is the event's device's: its mutex guards the event.
Status EventStatus(const Hub& hub, const EventState& event) KVF_REQUIRES(hub.mu) {
  if (event.completed < event.recorded) {
    return Status::Unavailable("event generation " + std::to_string(event.recorded) +
                               " not complete");
  }
  if (event.recorded != 0 && event.failed == event.recorded) {
    switch (event.failure) {
      case EventFailure::kInjected:
        return Status::Internal("cpu device: injected device error (CpuDeviceTestHooks)");
      case EventFailure::kCancelled:
        return Status::Internal(
            "cpu device: destroyed with the work before this event queued (cancelled; its "
            "outcome is unknown)");
      case EventFailure::kQueueError:
        return Status::Internal("cpu device: a kernel on the queue failed before this event");
      case EventFailure::kNone:
        break;
    }
  }
  return Status::OK();
}

class CpuEvent final : public Event {
 public:
  CpuEvent(std::shared_ptr<Hub> hub, std::shared_ptr<EventState> state)
      : hub_(std::move(hub)), state_(std::move(state)) {}

  Status Query() const override {
    MutexLock lock(&hub_->mu);
    return EventStatus(*hub_, *state_);
  }

  Status Wait(Deadline deadline) const override {
    MutexLock lock(&hub_->mu);
    const std::uint64_t target = state_->recorded;
    if (!hub_->progress.WaitUntil(&hub_->mu, deadline,
                                  [&] { return state_->completed >= target; })) {
      return Status::DeadlineExceeded("cpu device: event generation " + std::to_string(target) +
                                      " not complete by the deadline (outcome unknown)");
    }
    return EventStatus(*hub_, *state_);
  }

  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<Hub> hub_;
  std::shared_ptr<EventState> state_;
};

class CpuPinnedHostBuffer final : public PinnedHostBuffer {
 public:
  CpuPinnedHostBuffer(std::unique_ptr<MappedRegion> region, std::size_t bytes,
                      std::shared_ptr<PinnedBufferRegistry> registry)
      : region_(std::move(region)), bytes_(bytes), registry_(std::move(registry)) {
    registry_->Add(this->bytes());
  }
  ~CpuPinnedHostBuffer() override { registry_->Remove(bytes()); }

  std::span<std::byte> bytes() const override { return {region_->data(), bytes_}; }

 private:
  std::unique_ptr<MappedRegion> region_;
  std::size_t bytes_;
  std::shared_ptr<PinnedBufferRegistry> registry_;
};

// Memory allocated elsewhere, counted as pinned while the buffer lives.
class CpuBorrowedHostBuffer final : public PinnedHostBuffer {
 public:
  CpuBorrowedHostBuffer(std::span<std::byte> bytes, std::shared_ptr<PinnedBufferRegistry> registry)
      : bytes_(bytes), registry_(std::move(registry)) {
    registry_->Add(bytes_);
  }
  ~CpuBorrowedHostBuffer() override { registry_->Remove(bytes_); }

  std::span<std::byte> bytes() const override { return bytes_; }

 private:
  std::span<std::byte> bytes_;
  std::shared_ptr<PinnedBufferRegistry> registry_;
};

class CpuDevice final : public Device, public CpuDeviceTestHooks {
 public:
  CpuDevice(std::unique_ptr<MappedRegion> arena, std::uint64_t arena_bytes,
            std::size_t ring_capacity, cpu_kernels::KernelIsa isa, std::string name)
      : arena_(std::move(arena)),
        arena_bytes_(arena_bytes),
        isa_(isa),
        name_(std::move(name)),
        hub_(std::make_shared<Hub>()),
        registry_(std::make_shared<PinnedBufferRegistry>()) {
    for (int q = 0; q < kNumQueues; ++q) {
      queues_[q].ring.resize(ring_capacity);
    }
    for (int q = 0; q < kNumQueues; ++q) {
      queues_[q].thread = std::thread([this, q] { WorkerLoop(q); });
    }
  }

  ~CpuDevice() override {
    {
      MutexLock lock(&hub_->mu);
      hub_->stopping = true;
      for (QueueState& queue : queues_) queue.work.NotifyAll();
      hub_->progress.NotifyAll();
    }
    for (QueueState& queue : queues_) queue.thread.join();
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return name_; }
  std::uint64_t arena_bytes() const override { return arena_bytes_; }

  StatusOr<std::unique_ptr<PinnedHostBuffer>> AllocatePinnedHost(std::uint64_t bytes) override {
    if (bytes == 0) return Status::InvalidArgument("AllocatePinnedHost: 0 bytes");
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<MappedRegion> region,
                         MappedRegion::Map(bytes, "cpu device pinned host buffer"));
    return std::unique_ptr<PinnedHostBuffer>(
        std::make_unique<CpuPinnedHostBuffer>(std::move(region), bytes, registry_));
  }

  StatusOr<std::unique_ptr<PinnedHostBuffer>> PinHostMemory(std::span<std::byte> bytes) override {
    if (bytes.empty()) return Status::InvalidArgument("PinHostMemory: 0 bytes");
    return std::unique_ptr<PinnedHostBuffer>(
        std::make_unique<CpuBorrowedHostBuffer>(bytes, registry_));
  }

  StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    auto state = std::make_shared<EventState>();
    state->device_tag = hub_.get();
    return std::unique_ptr<Event>(std::make_unique<CpuEvent>(hub_, std::move(state)));
  }

  Status CopyHostToDevice(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(src, dst, "CopyHostToDevice"));
    if (src.empty()) return Status::OK();
    return Enqueue(Queue::kHostToDevice,
                   CopyOp{src.data(), arena_->data() + dst.offset, src.size()});
  }

  Status CopyDeviceToHost(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(dst, src, "CopyDeviceToHost"));
    if (dst.empty()) return Status::OK();
    return Enqueue(Queue::kDeviceToHost,
                   CopyOp{arena_->data() + src.offset, dst.data(), dst.size()});
  }

  Status Record(Event& event, Queue queue) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state, StateOf(event, "Record"));
    const int q = QueueIndex(queue);
    MutexLock lock(&hub_->mu);
    KVF_RETURN_IF_ERROR(CheckRoom(q));
    const std::uint64_t generation = state->recorded + 1;
    MarkerOp marker{std::move(state), generation, MarkerMode::kNormal};
    if (hub_->hang_next[q] > 0) {
      --hub_->hang_next[q];
      marker.mode = MarkerMode::kHang;
    } else if (hub_->fail_next[q] > 0) {
      --hub_->fail_next[q];
      marker.mode = MarkerMode::kFail;
    }
    marker.event->recorded = generation;
    Push(q, std::move(marker));
    return Status::OK();
  }

  Status QueueWaitEvent(Queue queue, const Event& event) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state, StateOf(event, "QueueWaitEvent"));
    const int q = QueueIndex(queue);
    MutexLock lock(&hub_->mu);
    KVF_RETURN_IF_ERROR(CheckRoom(q));
    // Never recorded: nothing to wait for (as cudaStreamWaitEvent).
    if (state->recorded == 0) return Status::OK();
    const std::uint64_t generation = state->recorded;
    Push(q, WaitOp{std::move(state), generation});
    return Status::OK();
  }

  Status DecodeAttentionTile(const AttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateAttentionTile(args, arena_bytes_));
    return Enqueue(Queue::kCompute, args);
  }

  Status DecodeAttentionCompactTile(const CompactAttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateCompactAttentionTile(args, arena_bytes_));
    return Enqueue(Queue::kCompute, args);
  }

  Status MergeAttentionStates(const MergeStatesArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateMergeStates(args, arena_bytes_));
    return Enqueue(Queue::kCompute, args);
  }

  Status GatherPages(const GatherPagesArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateGatherPages(args, arena_bytes_));
    return Enqueue(Queue::kCompute, args);
  }

  Status Synchronize(Deadline deadline) override {
    MutexLock lock(&hub_->mu);
    std::array<std::uint64_t, kNumQueues> target;
    for (int q = 0; q < kNumQueues; ++q) target[q] = queues_[q].submitted;
    auto drained = [&]() KVF_REQUIRES(hub_->mu) {
      for (int q = 0; q < kNumQueues; ++q) {
        if (queues_[q].finished < target[q]) return false;
      }
      return true;
    };
    if (!hub_->progress.WaitUntil(&hub_->mu, deadline, drained)) {
      std::string behind;
      for (int q = 0; q < kNumQueues; ++q) {
        if (queues_[q].finished >= target[q]) continue;
        behind += std::string(behind.empty() ? "" : ", ") + kQueueNames[q] + " " +
                  std::to_string(target[q] - queues_[q].finished) + " entries";
      }
      return Status::DeadlineExceeded("cpu device: Synchronize deadline passed with " + behind +
                                      " still pending");
    }
    for (const QueueState& queue : queues_) {
      if (!queue.error.ok()) return queue.error;
    }
    return Status::OK();
  }

  Status TEST_Read(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(src, arena_bytes_, "TEST_Read"));
    if (src.bytes != dst.size()) return Status::InvalidArgument("TEST_Read: sizes differ");
    if (!dst.empty()) std::memcpy(dst.data(), arena_->data() + src.offset, dst.size());
    return Status::OK();
  }

  Status TEST_Write(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(dst, arena_bytes_, "TEST_Write"));
    if (dst.bytes != src.size()) return Status::InvalidArgument("TEST_Write: sizes differ");
    if (!src.empty()) std::memcpy(arena_->data() + dst.offset, src.data(), src.size());
    return Status::OK();
  }

  // CpuDeviceTestHooks.
  void HangNextEvents(Queue queue, std::uint32_t n) override {
    const int q = QueueIndex(queue);
    if (q < 0) return;
    MutexLock lock(&hub_->mu);
    hub_->hang_next[q] = n;
    hub_->release_hangs[q] = false;
  }
  void ReleaseHangs(Queue queue) override {
    const int q = QueueIndex(queue);
    if (q < 0) return;
    MutexLock lock(&hub_->mu);
    hub_->release_hangs[q] = true;
    hub_->progress.NotifyAll();
  }
  void FailNextEvents(Queue queue, std::uint32_t n) override {
    const int q = QueueIndex(queue);
    if (q < 0) return;
    MutexLock lock(&hub_->mu);
    hub_->fail_next[q] = n;
  }
  std::size_t PendingEntries(Queue queue) const override {
    const int q = QueueIndex(queue);
    if (q < 0) return 0;
    MutexLock lock(&hub_->mu);
    return queues_[q].count;
  }

 private:
  struct QueueState {
    // Under hub_->mu (queues_ is KVF_GUARDED_BY it), except `thread`, which
    // only the constructor and destructor touch. The entry at `head` stays in
    // the ring while the worker runs it, so its slot is not reused.
    std::vector<Entry> ring;
    std::size_t head = 0;
    std::size_t count = 0;        // queued + running
    std::uint64_t submitted = 0;  // entries ever pushed
    std::uint64_t finished = 0;   // entries ever run or cancelled
    Status error;                 // sticky: the first kernel failure on this queue
    CondVar work;
    std::thread thread;
  };

  // The state of `event`, or InvalidArgument if another device created it.
  StatusOr<std::shared_ptr<EventState>> StateOf(const Event& event, std::string_view what) const {
    const auto* cpu_event = dynamic_cast<const CpuEvent*>(&event);
    if (cpu_event == nullptr || cpu_event->state()->device_tag != hub_.get()) {
      return Status::InvalidArgument(std::string(what) +
                                     ": the event was not created by this device");
    }
    return cpu_event->state();
  }

  Status CheckCopy(std::span<const std::byte> host, DeviceRange range, std::string_view what) {
    KVF_RETURN_IF_ERROR(CheckArenaRange(range, arena_bytes_, what));
    if (range.bytes != host.size()) {
      return Status::InvalidArgument(std::string(what) + ": host span of " +
                                     std::to_string(host.size()) + " bytes, device range of " +
                                     std::to_string(range.bytes) + " bytes");
    }
    return registry_->CheckContains(host, what);
  }

  Status CheckRoom(int q) const KVF_REQUIRES(hub_->mu) {
    if (hub_->stopping) return Status::FailedPrecondition("cpu device: shutting down");
    const QueueState& queue = queues_[q];
    if (queue.count == queue.ring.size()) {
      return Status::ResourceExhausted(
          std::string("cpu device: queue ") + kQueueNames[q] + " is full (" +
          std::to_string(queue.ring.size()) +
          " entries pending; CpuDeviceOptions::max_pending_per_queue)");
    }
    return Status::OK();
  }

  // REQUIRES: CheckRoom(q) OK.
  void Push(int q, Entry entry) KVF_REQUIRES(hub_->mu) {
    QueueState& queue = queues_[q];
    queue.ring[(queue.head + queue.count) % queue.ring.size()] = std::move(entry);
    ++queue.count;
    ++queue.submitted;
    queue.work.NotifyOne();
  }

  Status Enqueue(Queue queue, Entry entry) {
    const int q = QueueIndex(queue);
    MutexLock lock(&hub_->mu);
    KVF_RETURN_IF_ERROR(CheckRoom(q));
    Push(q, std::move(entry));
    return Status::OK();
  }

  void WorkerLoop(int q) {
    MutexLock lock(&hub_->mu);
    QueueState& queue = queues_[q];
    while (true) {
      queue.work.Wait(&hub_->mu,
                      [&]() KVF_REQUIRES(hub_->mu) { return hub_->stopping || queue.count > 0; });
      if (hub_->stopping) break;
      Entry& entry = queue.ring[queue.head];
      if (!Run(q, entry)) break;  // stopped while blocked: cancel it with the rest
      entry = std::monostate{};
      queue.head = (queue.head + 1) % queue.ring.size();
      --queue.count;
      ++queue.finished;
      hub_->progress.NotifyAll();
    }
    // Cancel what was not started: events complete (with an error) so no host
    // waits past its deadline for work that will never run.
    while (queue.count > 0) {
      Entry& entry = queue.ring[queue.head];
      if (auto* marker = std::get_if<MarkerOp>(&entry)) {
        CompleteEvent(*hub_, *marker->event, marker->generation, EventFailure::kCancelled);
      }
      entry = std::monostate{};
      queue.head = (queue.head + 1) % queue.ring.size();
      --queue.count;
      ++queue.finished;
    }
    hub_->progress.NotifyAll();
  }

  // Runs `entry` on queue `q`'s worker. Returns false if the device stopped
  // while the entry was blocked (it did not run).
  // hub_->mu is released while copies and kernels run.
  bool Run(int q, Entry& entry) KVF_REQUIRES(hub_->mu) {
    QueueState& queue = queues_[q];
    if (auto* marker = std::get_if<MarkerOp>(&entry)) {
      if (marker->mode == MarkerMode::kHang) {
        hub_->progress.Wait(&hub_->mu, [&]() KVF_REQUIRES(hub_->mu) {
          return hub_->stopping || hub_->release_hangs[q];
        });
        if (hub_->stopping) return false;
      }
      EventFailure failure = EventFailure::kNone;
      if (marker->mode == MarkerMode::kFail) failure = EventFailure::kInjected;
      if (!queue.error.ok()) failure = EventFailure::kQueueError;
      CompleteEvent(*hub_, *marker->event, marker->generation, failure);
      return true;
    }
    if (auto* wait = std::get_if<WaitOp>(&entry)) {
      hub_->progress.Wait(&hub_->mu, [&]() KVF_REQUIRES(hub_->mu) {
        return hub_->stopping || wait->event->completed >= wait->generation;
      });
      return !hub_->stopping;
    }
    if (std::holds_alternative<std::monostate>(entry)) return true;
    // Copies and kernels: after a kernel failure the queue is unusable (as a
    // CUDA context after an illegal address); later work is skipped.
    if (!queue.error.ok()) return true;
    hub_->mu.Unlock();  // the caller's MutexLock holds it again on return
    Status status = Execute(entry);
    hub_->mu.Lock();
    if (!status.ok() && queue.error.ok()) {
      queue.error = Status::Internal(std::string("cpu device: ") + kQueueNames[q] +
                                     " queue: " + std::string(status.message()));
    }
    return true;
  }

  // Runs a copy or kernel. Called without the lock.
  Status Execute(const Entry& entry) {
    std::byte* arena = arena_->data();
    if (const auto* copy = std::get_if<CopyOp>(&entry)) {
      std::memcpy(copy->dst, copy->src, copy->bytes);
      return Status::OK();
    }
    // The *InArena forms validate again (cheap next to the kernel), and the
    // gather checks its page offsets, which only exist once earlier work ran.
    const std::span<std::byte> arena_span(arena, arena_bytes_);
    if (const auto* a = std::get_if<AttentionTileArgs>(&entry)) {
      return cpu_kernels::DecodeAttentionTileInArena(isa_, *a, arena_span);
    }
    if (const auto* c = std::get_if<CompactAttentionTileArgs>(&entry)) {
      return DecodeAttentionCompactTileInArena(isa_, *c, arena_span);
    }
    if (const auto* m = std::get_if<MergeStatesArgs>(&entry)) {
      return cpu_kernels::MergeStatesInArena(*m, arena_span);
    }
    if (const auto* g = std::get_if<GatherPagesArgs>(&entry)) {
      return cpu_kernels::GatherPagesInArena(*g, arena_span);
    }
    return Status::OK();
  }

  const std::unique_ptr<MappedRegion> arena_;
  const std::uint64_t arena_bytes_;
  const cpu_kernels::KernelIsa isa_;  // the attention kernels' instruction set
  const std::string name_;
  const std::shared_ptr<Hub> hub_;
  const std::shared_ptr<PinnedBufferRegistry> registry_;
  std::array<QueueState, kNumQueues> queues_ KVF_GUARDED_BY(hub_->mu);
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceOptions& options,
                                                  const CpuDeviceOptions& cpu_options) {
  if (options.arena_bytes == 0) {
    return Status::InvalidArgument(
        "device arena of 0 bytes: the arena size is explicit, set --device-arena-bytes "
        "(DeviceOptions::arena_bytes)");
  }
  if (cpu_options.max_pending_per_queue == 0) {
    return Status::InvalidArgument("CpuDeviceOptions::max_pending_per_queue is 0");
  }
  const long page = sysconf(_SC_PAGESIZE);     // NOLINT(google-runtime-int): sysconf's type
  const long pages = sysconf(_SC_PHYS_PAGES);  // NOLINT(google-runtime-int)
  if (page > 0 && pages > 0) {
    const std::uint64_t physical =
        static_cast<std::uint64_t>(page) * static_cast<std::uint64_t>(pages);
    if (options.arena_bytes > physical) {
      return Status::ResourceExhausted(
          "cpu device arena of " + FormatBytesExact(options.arena_bytes) +
          " exceeds this machine's physical memory of " + FormatBytesExact(physical) + " (" +
          std::to_string(pages) + " pages x " + std::to_string(page) +
          " bytes); lower --device-arena-bytes");
    }
  }
  if (options.arena_bytes > SIZE_MAX) {
    return Status::ResourceExhausted("cpu device arena does not fit in the address space");
  }
  const auto start = std::chrono::steady_clock::now();
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<MappedRegion> arena,
                       MappedRegion::Map(options.arena_bytes, "cpu device arena"));
  // Pre-fault: one write per page, so no decode step pays for first touch.
  const std::size_t stride = page > 0 ? static_cast<std::size_t>(page) : 4096;
  for (std::size_t off = 0; off < arena->size(); off += stride) arena->data()[off] = std::byte{0};
  const double prefault_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  char ms[32];
  std::snprintf(ms, sizeof(ms), "%.1f", prefault_ms);
  const cpu_kernels::KernelIsa isa =
      cpu_options.scalar_kernels ? cpu_kernels::KernelIsa::kScalar : cpu_kernels::BestKernelIsa();
  std::string name = "cpu (arena " + FormatBytes(options.arena_bytes) + ", pre-faulted in " + ms +
                     " ms, " + cpu_kernels::KernelIsaName(isa) + " kernels)";
  spdlog::info(
      "cpu device: arena of {} mapped and pre-faulted in {} ms; queues h2d, d2h, "
      "compute with {} entries each; {} attention kernels",
      FormatBytesExact(options.arena_bytes), ms, cpu_options.max_pending_per_queue,
      cpu_kernels::KernelIsaName(isa));
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>(std::move(arena), options.arena_bytes,
                                                             cpu_options.max_pending_per_queue, isa,
                                                             std::move(name)));
}

StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceOptions& options) {
  return CreateCpuDevice(options, CpuDeviceOptions{});
}

CpuDeviceTestHooks* TEST_CpuDeviceHooks(Device& device) {
  return dynamic_cast<CpuDeviceTestHooks*>(&device);
}

}  // namespace kvfabric::gpu
