#include "gpu/level_zero/ze_device.h"

#include <level_zero/ze_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/units.h"
#include "gpu/device_checks.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/level_zero/ze_status.h"

namespace kvfabric::gpu {
namespace {

using level_zero::StatusFromZeResult;

Status FromZe(ze_result_t result, std::string_view context) {
  return StatusFromZeResult(static_cast<std::uint32_t>(result), context);
}

// How long host-side steps of the CPU merge and the gather wait for the
// compute queue before giving up with DeadlineExceeded.
constexpr std::chrono::seconds kHostStepTimeout(60);

// The context, shared by the device and everything allocated in it (pinned
// buffers and events may outlive the device). Destroyed last.
class ZeContext {
 public:
  explicit ZeContext(ze_context_handle_t context) : context_(context) {}
  ZeContext(const ZeContext&) = delete;
  ZeContext& operator=(const ZeContext&) = delete;
  ~ZeContext() {
    // A failing release means the device is lost; nothing to do about it.
    static_cast<void>(zeContextDestroy(context_));
  }
  ze_context_handle_t get() const { return context_; }

 private:
  ze_context_handle_t context_;
};

// Memory from zeMemAlloc*, freed with zeMemFree.
class ZeMemory {
 public:
  ZeMemory(std::shared_ptr<ZeContext> context, void* ptr)
      : context_(std::move(context)), ptr_(ptr) {}
  ZeMemory(const ZeMemory&) = delete;
  ZeMemory& operator=(const ZeMemory&) = delete;
  ~ZeMemory() { static_cast<void>(zeMemFree(context_->get(), ptr_)); }
  std::byte* get() const { return static_cast<std::byte*>(ptr_); }

 private:
  std::shared_ptr<ZeContext> context_;
  void* ptr_;
};

StatusOr<std::unique_ptr<ZeMemory>> AllocateHost(const std::shared_ptr<ZeContext>& context,
                                                 std::size_t bytes) {
  ze_host_mem_alloc_desc_t desc = {ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr, 0};
  void* ptr = nullptr;
  KVF_RETURN_IF_ERROR(FromZe(zeMemAllocHost(context->get(), &desc, bytes, 64, &ptr),
                             "zeMemAllocHost(" + std::to_string(bytes) + " bytes)"));
  return std::make_unique<ZeMemory>(context, ptr);
}

// A command list, destroyed with the device.
class ZeCommandList {
 public:
  explicit ZeCommandList(ze_command_list_handle_t list) : list_(list) {}
  ZeCommandList(const ZeCommandList&) = delete;
  ZeCommandList& operator=(const ZeCommandList&) = delete;
  ~ZeCommandList() { static_cast<void>(zeCommandListDestroy(list_)); }
  ze_command_list_handle_t get() const { return list_; }

 private:
  ze_command_list_handle_t list_;
};

// One host-visible event in a pool of one. Starts signalled (complete).
class ZeFence final : public Event {
 public:
  ZeFence(std::shared_ptr<ZeContext> context, ze_event_pool_handle_t pool, ze_event_handle_t event,
          const void* device_tag)
      : context_(std::move(context)), pool_(pool), event_(event), device_tag_(device_tag) {}
  ~ZeFence() override {
    static_cast<void>(zeEventDestroy(event_));
    static_cast<void>(zeEventPoolDestroy(pool_));
  }

  Status Query() const override { return Result(zeEventQueryStatus(event_)); }

  Status Wait(Deadline deadline) const override {
    while (true) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        Status s = Query();
        if (!s.IsUnavailable()) return s;
        return Status::DeadlineExceeded(
            "level zero event not complete by the deadline (outcome unknown)");
      }
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      // zeEventHostSynchronize treats 0 as a query; ask for at least 1 ns.
      Status s = Result(zeEventHostSynchronize(
          event_, static_cast<std::uint64_t>(std::max<std::int64_t>(ns.count(), 1))));
      if (!s.IsUnavailable()) return s;
    }
  }

  ze_event_handle_t get() const { return event_; }
  const void* device_tag() const { return device_tag_; }

 private:
  static Status Result(ze_result_t r) {
    if (r == ZE_RESULT_SUCCESS) return Status::OK();
    if (r == ZE_RESULT_NOT_READY) return Status::Unavailable("level zero event not ready");
    return Status::Internal(FromZe(r, "level zero event").message());
  }

  std::shared_ptr<ZeContext> context_;
  ze_event_pool_handle_t pool_;
  ze_event_handle_t event_;
  const void* device_tag_;
};

StatusOr<std::unique_ptr<ZeFence>> CreateFence(const std::shared_ptr<ZeContext>& context,
                                               ze_device_handle_t device, const void* device_tag) {
  ze_event_pool_desc_t pool_desc = {ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr,
                                    ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1};
  ze_event_pool_handle_t pool = nullptr;
  KVF_RETURN_IF_ERROR(FromZe(zeEventPoolCreate(context->get(), &pool_desc, 1, &device, &pool),
                             "zeEventPoolCreate"));
  ze_event_desc_t event_desc = {ZE_STRUCTURE_TYPE_EVENT_DESC, nullptr, 0, ZE_EVENT_SCOPE_FLAG_HOST,
                                ZE_EVENT_SCOPE_FLAG_HOST};
  ze_event_handle_t event = nullptr;
  Status s = FromZe(zeEventCreate(pool, &event_desc, &event), "zeEventCreate");
  if (!s.ok()) {
    static_cast<void>(zeEventPoolDestroy(pool));
    return s;
  }
  auto fence = std::make_unique<ZeFence>(context, pool, event, device_tag);
  KVF_RETURN_IF_ERROR(FromZe(zeEventHostSignal(event), "zeEventHostSignal"));
  return fence;
}

class ZePinnedBuffer final : public PinnedHostBuffer {
 public:
  ZePinnedBuffer(std::unique_ptr<ZeMemory> memory, std::size_t bytes,
                 std::shared_ptr<PinnedBufferRegistry> registry)
      : memory_(std::move(memory)), bytes_(bytes), registry_(std::move(registry)) {
    registry_->Add(this->bytes());
  }
  ~ZePinnedBuffer() override { registry_->Remove(bytes()); }
  std::span<std::byte> bytes() const override { return {memory_->get(), bytes_}; }

 private:
  std::unique_ptr<ZeMemory> memory_;
  std::size_t bytes_;
  std::shared_ptr<PinnedBufferRegistry> registry_;
};

constexpr int kNumQueues = 3;

struct ZeParts {
  std::shared_ptr<ZeContext> context;
  ze_device_handle_t device = nullptr;
  std::string name;
  std::unique_ptr<ZeMemory> arena;
  std::array<std::unique_ptr<ZeCommandList>, kNumQueues> lists;
};

class ZeDevice final : public Device {
 public:
  ZeDevice(ZeParts parts, std::uint64_t arena_bytes)
      : parts_(std::move(parts)),
        arena_bytes_(arena_bytes),
        registry_(std::make_shared<PinnedBufferRegistry>()) {}

  Status Init() {
    KVF_ASSIGN_OR_RETURN(host_step_fence_, CreateFence(parts_.context, parts_.device, this));
    return Status::OK();
  }

  ~ZeDevice() override {
    if (host_step_fence_ == nullptr) return;  // Init failed: nothing was enqueued
    Status s = Synchronize(std::chrono::steady_clock::now() + kHostStepTimeout);
    if (!s.ok()) spdlog::error("{}: destroyed with work in flight: {}", parts_.name, s.ToString());
  }

  DeviceKind kind() const override { return DeviceKind::kLevelZero; }
  std::string name() const override { return parts_.name; }
  std::uint64_t arena_bytes() const override { return arena_bytes_; }

  StatusOr<std::unique_ptr<PinnedHostBuffer>> AllocatePinnedHost(std::uint64_t bytes) override {
    if (bytes == 0) return Status::InvalidArgument("AllocatePinnedHost: 0 bytes");
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<ZeMemory> memory, AllocateHost(parts_.context, bytes));
    return std::unique_ptr<PinnedHostBuffer>(
        std::make_unique<ZePinnedBuffer>(std::move(memory), bytes, registry_));
  }

  StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<ZeFence> fence,
                         CreateFence(parts_.context, parts_.device, this));
    return std::unique_ptr<Event>(std::move(fence));
  }

  Status CopyHostToDevice(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(src, dst, "CopyHostToDevice"));
    if (src.empty()) return Status::OK();
    return AppendCopy(Queue::kHostToDevice, arena() + dst.offset, src.data(), src.size());
  }

  Status CopyDeviceToHost(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(dst, src, "CopyDeviceToHost"));
    if (dst.empty()) return Status::OK();
    return AppendCopy(Queue::kDeviceToHost, dst.data(), arena() + src.offset, dst.size());
  }

  Status Record(Event& event, Queue queue) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(const ZeFence* fence, FenceOf(event, "Record"));
    return RecordFence(*fence, queue);
  }

  Status QueueWaitEvent(Queue queue, const Event& event) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(const ZeFence* fence, FenceOf(event, "QueueWaitEvent"));
    ze_event_handle_t handle = fence->get();
    return FromZe(zeCommandListAppendWaitOnEvents(list(queue), 1, &handle),
                  "zeCommandListAppendWaitOnEvents");
  }

  Status DecodeAttentionTile(const AttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateAttentionTile(args, arena_bytes_));
    return Status::Unimplemented(
        "level zero device: DecodeAttentionTile has no kernel yet (use the CPU or CUDA backend)");
  }

  Status DecodeAttentionCompactTile(const CompactAttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateCompactAttentionTile(args, arena_bytes_));
    return Status::Unimplemented(
        "level zero device: DecodeAttentionCompactTile has no kernel yet (use the CPU or CUDA "
        "backend)");
  }

  Status MergeAttentionStates(const MergeStatesArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateMergeStates(args, arena_bytes_));
    MutexLock lock(&host_step_mu_);
    const std::uint64_t in_bytes = args.outputs.bytes + args.lses.bytes;
    const std::uint64_t out_bytes = args.output.bytes + args.lse.bytes;
    KVF_RETURN_IF_ERROR(EnsureScratch(in_bytes + out_bytes));
    std::byte* s = scratch_->get();
    // Inputs to scratch: [outputs | lses], after all earlier compute work.
    KVF_RETURN_IF_ERROR(
        AppendCopy(Queue::kCompute, s, arena() + args.outputs.offset, args.outputs.bytes));
    KVF_RETURN_IF_ERROR(AppendCopy(Queue::kCompute, s + args.outputs.bytes,
                                   arena() + args.lses.offset, args.lses.bytes));
    KVF_RETURN_IF_ERROR(DrainCompute());
    auto* outputs = reinterpret_cast<const float*>(s);
    auto* lses = reinterpret_cast<const float*>(s + args.outputs.bytes);
    auto* out = reinterpret_cast<float*>(s + in_bytes);
    auto* lse = reinterpret_cast<float*>(s + in_bytes + args.output.bytes);
    cpu_kernels::MergeStates(args.num_states, args.num_heads, args.head_dim, outputs, lses, out,
                             lse);
    KVF_RETURN_IF_ERROR(
        AppendCopy(Queue::kCompute, arena() + args.output.offset, out, args.output.bytes));
    KVF_RETURN_IF_ERROR(
        AppendCopy(Queue::kCompute, arena() + args.lse.offset, lse, args.lse.bytes));
    // Scratch is reused by the next host step: drain before returning.
    return DrainCompute();
  }

  Status GatherPages(const GatherPagesArgs& args) override {
    KVF_RETURN_IF_ERROR(ValidateGatherPages(args, arena_bytes_));
    MutexLock lock(&host_step_mu_);
    KVF_RETURN_IF_ERROR(EnsureScratch(args.page_offsets.bytes));
    KVF_RETURN_IF_ERROR(AppendCopy(Queue::kCompute, scratch_->get(),
                                   arena() + args.page_offsets.offset, args.page_offsets.bytes));
    KVF_RETURN_IF_ERROR(DrainCompute());
    const auto* offsets = reinterpret_cast<const std::uint64_t*>(scratch_->get());
    for (std::uint32_t i = 0; i < args.num_pages; ++i) {
      KVF_RETURN_IF_ERROR(ValidateGatherSource(args, i, offsets[i], arena_bytes_));
    }
    for (std::uint32_t i = 0; i < args.num_pages; ++i) {
      KVF_RETURN_IF_ERROR(AppendCopy(Queue::kCompute,
                                     arena() + args.destination.offset + i * args.page_bytes,
                                     arena() + offsets[i], args.page_bytes));
    }
    return Status::OK();
  }

  Status Synchronize(Deadline deadline) override {
    MutexLock lock(&host_step_mu_);
    for (int q = 0; q < kNumQueues; ++q) {
      KVF_RETURN_IF_ERROR(RecordFence(*host_step_fence_, QueueOf(q)));
      KVF_RETURN_IF_ERROR(host_step_fence_->Wait(deadline));
    }
    return Status::OK();
  }

  Status TEST_Read(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(src, arena_bytes_, "TEST_Read"));
    if (src.bytes != dst.size()) return Status::InvalidArgument("TEST_Read: sizes differ");
    MutexLock lock(&host_step_mu_);
    KVF_RETURN_IF_ERROR(EnsureScratch(dst.size()));
    KVF_RETURN_IF_ERROR(
        AppendCopy(Queue::kCompute, scratch_->get(), arena() + src.offset, dst.size()));
    KVF_RETURN_IF_ERROR(DrainCompute());
    std::copy_n(scratch_->get(), dst.size(), dst.data());
    return Status::OK();
  }

  Status TEST_Write(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(dst, arena_bytes_, "TEST_Write"));
    if (dst.bytes != src.size()) return Status::InvalidArgument("TEST_Write: sizes differ");
    MutexLock lock(&host_step_mu_);
    KVF_RETURN_IF_ERROR(EnsureScratch(src.size()));
    std::copy_n(src.data(), src.size(), scratch_->get());
    KVF_RETURN_IF_ERROR(
        AppendCopy(Queue::kCompute, arena() + dst.offset, scratch_->get(), src.size()));
    return DrainCompute();
  }

 private:
  static Status CheckQueue(Queue queue) {
    if (queue != Queue::kHostToDevice && queue != Queue::kDeviceToHost &&
        queue != Queue::kCompute) {
      return Status::InvalidArgument("queue " + std::to_string(static_cast<int>(queue)) +
                                     " names no queue");
    }
    return Status::OK();
  }
  static Queue QueueOf(int index) {
    return static_cast<Queue>(index + static_cast<int>(Queue::kHostToDevice));
  }
  // REQUIRES: CheckQueue(queue).ok().
  ze_command_list_handle_t list(Queue queue) const {
    return parts_.lists[static_cast<int>(queue) - static_cast<int>(Queue::kHostToDevice)]->get();
  }
  std::byte* arena() const { return parts_.arena->get(); }

  StatusOr<const ZeFence*> FenceOf(const Event& event, std::string_view what) const {
    const auto* fence = dynamic_cast<const ZeFence*>(&event);
    if (fence == nullptr || fence->device_tag() != this) {
      return Status::InvalidArgument(std::string(what) +
                                     ": the event was not created by this device");
    }
    return fence;
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

  // A copy, then a barrier so that later work on the queue starts after it.
  Status AppendCopy(Queue queue, void* dst, const void* src, std::size_t bytes) {
    KVF_RETURN_IF_ERROR(
        FromZe(zeCommandListAppendMemoryCopy(list(queue), dst, src, bytes, nullptr, 0, nullptr),
               "zeCommandListAppendMemoryCopy"));
    return FromZe(zeCommandListAppendBarrier(list(queue), nullptr, 0, nullptr),
                  "zeCommandListAppendBarrier");
  }

  // The host reset makes Query report the new generation as pending at once;
  // the barrier signals it when everything appended before has finished.
  Status RecordFence(const ZeFence& fence, Queue queue) {
    KVF_RETURN_IF_ERROR(FromZe(zeEventHostReset(fence.get()), "zeEventHostReset"));
    return FromZe(zeCommandListAppendBarrier(list(queue), fence.get(), 0, nullptr),
                  "zeCommandListAppendBarrier(signal)");
  }

  Status DrainCompute() KVF_REQUIRES(host_step_mu_) {
    KVF_RETURN_IF_ERROR(RecordFence(*host_step_fence_, Queue::kCompute));
    return host_step_fence_->Wait(std::chrono::steady_clock::now() + kHostStepTimeout);
  }

  Status EnsureScratch(std::uint64_t bytes) KVF_REQUIRES(host_step_mu_) {
    if (scratch_ != nullptr && scratch_bytes_ >= bytes) return Status::OK();
    KVF_RETURN_IF_ERROR(DrainCompute());  // the old scratch may still be read
    scratch_.reset();
    KVF_ASSIGN_OR_RETURN(scratch_, AllocateHost(parts_.context, bytes));
    scratch_bytes_ = bytes;
    return Status::OK();
  }

  ZeParts parts_;
  const std::uint64_t arena_bytes_;
  const std::shared_ptr<PinnedBufferRegistry> registry_;
  // Serialises the host steps (merge, gather, TEST access, Synchronize),
  // which share the fence and the scratch buffer.
  Mutex host_step_mu_;
  std::unique_ptr<ZeFence> host_step_fence_ KVF_PT_GUARDED_BY(host_step_mu_);  // set by Init
  std::unique_ptr<ZeMemory> scratch_ KVF_GUARDED_BY(host_step_mu_);
  std::uint64_t scratch_bytes_ KVF_GUARDED_BY(host_step_mu_) = 0;
};

// The ordinal of the first queue group with `flag`, or -1.
int FindQueueGroup(const std::vector<ze_command_queue_group_properties_t>& groups,
                   ze_command_queue_group_property_flags_t flag, bool exclude_compute) {
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if ((groups[i].flags & flag) == 0) continue;
    if (exclude_compute && (groups[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) != 0) {
      continue;
    }
    return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateLevelZeroDevice(const DeviceOptions& options) {
  if (options.arena_bytes == 0) {
    return Status::InvalidArgument(
        "device arena of 0 bytes: the arena size is explicit, set --device-arena-bytes "
        "(DeviceOptions::arena_bytes)");
  }
  KVF_RETURN_IF_ERROR(FromZe(zeInit(ZE_INIT_FLAG_GPU_ONLY), "zeInit(ZE_INIT_FLAG_GPU_ONLY)"));
  std::uint32_t driver_count = 0;
  KVF_RETURN_IF_ERROR(FromZe(zeDriverGet(&driver_count, nullptr), "zeDriverGet"));
  std::vector<ze_driver_handle_t> drivers(driver_count);
  KVF_RETURN_IF_ERROR(FromZe(zeDriverGet(&driver_count, drivers.data()), "zeDriverGet"));
  ze_driver_handle_t driver = nullptr;
  ze_device_handle_t device = nullptr;
  int seen = 0;
  for (ze_driver_handle_t d : drivers) {
    std::uint32_t n = 0;
    KVF_RETURN_IF_ERROR(FromZe(zeDeviceGet(d, &n, nullptr), "zeDeviceGet"));
    std::vector<ze_device_handle_t> devices(n);
    KVF_RETURN_IF_ERROR(FromZe(zeDeviceGet(d, &n, devices.data()), "zeDeviceGet"));
    if (options.device_index >= seen && options.device_index < seen + static_cast<int>(n)) {
      driver = d;
      device = devices[options.device_index - seen];
    }
    seen += static_cast<int>(n);
  }
  if (device == nullptr) {
    return Status::FailedPrecondition("Level Zero device " + std::to_string(options.device_index) +
                                      " requested; this machine has " + std::to_string(seen));
  }
  ze_device_properties_t props = {};
  props.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  KVF_RETURN_IF_ERROR(FromZe(zeDeviceGetProperties(device, &props), "zeDeviceGetProperties"));
  if (options.arena_bytes > props.maxMemAllocSize) {
    return Status::ResourceExhausted(
        "level zero arena of " + FormatBytesExact(options.arena_bytes) +
        " exceeds the device's largest allocation of " + FormatBytesExact(props.maxMemAllocSize) +
        "; lower --device-arena-bytes");
  }

  ZeParts parts;
  parts.device = device;
  parts.name = "level_zero:" + std::to_string(options.device_index) + " " + props.name;
  ze_context_desc_t context_desc = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
  ze_context_handle_t context = nullptr;
  KVF_RETURN_IF_ERROR(FromZe(zeContextCreate(driver, &context_desc, &context), "zeContextCreate"));
  parts.context = std::make_shared<ZeContext>(context);

  ze_device_mem_alloc_desc_t mem_desc = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, nullptr, 0, 0};
  void* arena = nullptr;
  KVF_RETURN_IF_ERROR(
      FromZe(zeMemAllocDevice(context, &mem_desc, options.arena_bytes, 64, device, &arena),
             "zeMemAllocDevice(" + FormatBytesExact(options.arena_bytes) + ")"));
  parts.arena = std::make_unique<ZeMemory>(parts.context, arena);

  std::uint32_t group_count = 0;
  KVF_RETURN_IF_ERROR(FromZe(zeDeviceGetCommandQueueGroupProperties(device, &group_count, nullptr),
                             "zeDeviceGetCommandQueueGroupProperties"));
  std::vector<ze_command_queue_group_properties_t> groups(group_count);
  for (auto& g : groups) g.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
  KVF_RETURN_IF_ERROR(
      FromZe(zeDeviceGetCommandQueueGroupProperties(device, &group_count, groups.data()),
             "zeDeviceGetCommandQueueGroupProperties"));
  const int compute = FindQueueGroup(groups, ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE, false);
  if (compute < 0) return Status::FailedPrecondition(parts.name + ": no compute queue group");
  int copy = FindQueueGroup(groups, ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY, true);
  if (copy < 0) copy = compute;
  const std::array<int, kNumQueues> ordinals = {copy, copy, compute};
  for (int q = 0; q < kNumQueues; ++q) {
    ze_command_queue_desc_t desc = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                    nullptr,
                                    static_cast<std::uint32_t>(ordinals[q]),
                                    0,
                                    0,
                                    ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                    ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    ze_command_list_handle_t list = nullptr;
    KVF_RETURN_IF_ERROR(FromZe(zeCommandListCreateImmediate(context, device, &desc, &list),
                               "zeCommandListCreateImmediate"));
    parts.lists[q] = std::make_unique<ZeCommandList>(list);
  }
  spdlog::info("{}: arena of {} allocated; copy queue group {}, compute group {}", parts.name,
               FormatBytesExact(options.arena_bytes), copy, compute);
  auto result = std::make_unique<ZeDevice>(std::move(parts), options.arena_bytes);
  KVF_RETURN_IF_ERROR(result->Init());
  return std::unique_ptr<Device>(std::move(result));
}

}  // namespace kvfabric::gpu
