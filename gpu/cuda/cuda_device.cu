#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include "core/units.h"
#include "gpu/cuda/attention_launchers.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/cuda_raii.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/cuda/host_log.h"
#include "gpu/device_checks.h"

namespace kvfabric::gpu {
namespace {

using cuda::StatusFromCudaError;

Status FromCuda(cudaError_t err, std::string_view context) {
  return StatusFromCudaError(static_cast<int>(err), context);
}

// Event and stream queries: NotReady is Unavailable; any other error means the
// work's outcome is unknown, which Device reports as Internal.
Status QueryResult(cudaError_t err, std::string_view context) {
  if (err == cudaSuccess) return Status::OK();
  if (err == cudaErrorNotReady) return Status::Unavailable(std::string(context) + ": not ready");
  return Status::Internal(FromCuda(err, context).message());
}

// Polls `query` until it is not Unavailable or `deadline` passes. Spins with
// yields first (a decode step's fences complete in microseconds), then
// sleeps with a growing interval capped at 200 us, so a long wait costs little
// CPU and overshoots the completion by at most that much.
template <typename Query>
Status PollUntil(Query query, Deadline deadline, std::string_view what) {
  auto interval = std::chrono::microseconds(1);
  for (int spins = 0;; ++spins) {
    Status s = query();
    if (!s.IsUnavailable()) return s;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status::DeadlineExceeded(std::string(what) +
                                      " not complete by the deadline (outcome unknown)");
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(interval, deadline - now));
      interval = std::min(interval * 2, std::chrono::microseconds(200));
    }
  }
}

class CudaFence final : public Event {
 public:
  CudaFence(cuda::CudaEvent event, const void* device_tag)
      : event_(std::move(event)), device_tag_(device_tag) {}

  Status Query() const override {
    return QueryResult(cudaEventQuery(event_.get()), "cudaEventQuery");
  }
  Status Wait(Deadline deadline) const override {
    return PollUntil([this] { return Query(); }, deadline, "cuda event");
  }

  cudaEvent_t get() const { return event_.get(); }
  const void* device_tag() const { return device_tag_; }

 private:
  cuda::CudaEvent event_;
  const void* device_tag_;
};

class CudaPinnedBuffer final : public PinnedHostBuffer {
 public:
  CudaPinnedBuffer(cuda::CudaPinnedHost memory, std::size_t bytes,
                   std::shared_ptr<PinnedBufferRegistry> registry)
      : memory_(std::move(memory)), bytes_(bytes), registry_(std::move(registry)) {
    registry_->Add(this->bytes());
  }
  ~CudaPinnedBuffer() override { registry_->Remove(bytes()); }

  std::span<std::byte> bytes() const override {
    return {static_cast<std::byte*>(memory_.get()), bytes_};
  }

 private:
  cuda::CudaPinnedHost memory_;
  std::size_t bytes_;
  std::shared_ptr<PinnedBufferRegistry> registry_;
};

// Memory allocated elsewhere, page-locked for the device with
// cudaHostRegister until the buffer is destroyed.
class CudaRegisteredBuffer final : public PinnedHostBuffer {
 public:
  CudaRegisteredBuffer(std::span<std::byte> bytes, std::shared_ptr<PinnedBufferRegistry> registry)
      : bytes_(bytes), registry_(std::move(registry)) {
    registry_->Add(bytes_);
  }
  ~CudaRegisteredBuffer() override {
    registry_->Remove(bytes_);
    cudaHostUnregister(bytes_.data());
  }

  std::span<std::byte> bytes() const override { return bytes_; }

 private:
  std::span<std::byte> bytes_;
  std::shared_ptr<PinnedBufferRegistry> registry_;
};

constexpr int kNumQueues = 3;

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name, cuda::CudaDeviceMemory arena, std::uint64_t arena_bytes,
             std::array<cuda::CudaStream, kNumQueues> streams)
      : ordinal_(ordinal),
        name_(std::move(name)),
        arena_(std::move(arena)),
        arena_bytes_(arena_bytes),
        streams_(std::move(streams)),
        registry_(std::make_shared<PinnedBufferRegistry>()) {}

  ~CudaDevice() override {
    // Work in flight reads the arena: let it finish (bounded: a hung kernel
    // is a lost context, and freeing after a minute is the lesser evil), then
    // release the streams and the arena with this device current.
    static_cast<void>(cudaSetDevice(ordinal_));
    Status s = Synchronize(std::chrono::steady_clock::now() + std::chrono::seconds(60));
    if (!s.ok()) cuda::LogError(name_ + ": destroyed with work in flight: " + s.ToString());
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  std::uint64_t arena_bytes() const override { return arena_bytes_; }

  StatusOr<std::unique_ptr<PinnedHostBuffer>> AllocatePinnedHost(std::uint64_t bytes) override {
    if (bytes == 0) return Status::InvalidArgument("AllocatePinnedHost: 0 bytes");
    KVF_RETURN_IF_ERROR(MakeCurrent());
    KVF_ASSIGN_OR_RETURN(cuda::CudaPinnedHost memory, cuda::AllocatePinnedHost(bytes));
    return std::unique_ptr<PinnedHostBuffer>(
        std::make_unique<CudaPinnedBuffer>(std::move(memory), bytes, registry_));
  }

  StatusOr<std::unique_ptr<PinnedHostBuffer>> PinHostMemory(std::span<std::byte> bytes) override {
    if (bytes.empty()) return Status::InvalidArgument("PinHostMemory: 0 bytes");
    KVF_RETURN_IF_ERROR(MakeCurrent());
    KVF_RETURN_IF_ERROR(StatusFromCudaError(
        static_cast<int>(cudaHostRegister(bytes.data(), bytes.size(), cudaHostRegisterDefault)),
        "cudaHostRegister(" + std::to_string(bytes.size()) + " bytes)"));
    return std::unique_ptr<PinnedHostBuffer>(
        std::make_unique<CudaRegisteredBuffer>(bytes, registry_));
  }

  StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    KVF_ASSIGN_OR_RETURN(cuda::CudaEvent event, cuda::CreateFenceEvent());
    return std::unique_ptr<Event>(std::make_unique<CudaFence>(std::move(event), this));
  }

  Status CopyHostToDevice(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(src, dst, "CopyHostToDevice"));
    if (src.empty()) return Status::OK();
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(cudaMemcpyAsync(arena() + dst.offset, src.data(), src.size(),
                                    cudaMemcpyHostToDevice, stream(Queue::kHostToDevice)),
                    "cudaMemcpyAsync(host to device)");
  }

  Status CopyDeviceToHost(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckCopy(dst, src, "CopyDeviceToHost"));
    if (dst.empty()) return Status::OK();
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(cudaMemcpyAsync(dst.data(), arena() + src.offset, dst.size(),
                                    cudaMemcpyDeviceToHost, stream(Queue::kDeviceToHost)),
                    "cudaMemcpyAsync(device to host)");
  }

  Status Record(Event& event, Queue queue) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(const CudaFence* fence, FenceOf(event, "Record"));
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(cudaEventRecord(fence->get(), stream(queue)), "cudaEventRecord");
  }

  Status QueueWaitEvent(Queue queue, const Event& event) override {
    KVF_RETURN_IF_ERROR(CheckQueue(queue));
    KVF_ASSIGN_OR_RETURN(const CudaFence* fence, FenceOf(event, "QueueWaitEvent"));
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(cudaStreamWaitEvent(stream(queue), fence->get(), 0), "cudaStreamWaitEvent");
  }

  Status DecodeAttentionTile(const AttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return cuda::LaunchDecodeAttentionTile(args, arena(), arena_bytes_, stream(Queue::kCompute));
  }

  Status DecodeAttentionCompactTile(const CompactAttentionTileArgs& args) override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return cuda::LaunchDecodeAttentionCompactTile(args, arena(), arena_bytes_,
                                                  stream(Queue::kCompute));
  }

  Status MergeAttentionStates(const MergeStatesArgs& args) override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return cuda::LaunchMergeStates(args, arena(), arena_bytes_, stream(Queue::kCompute));
  }

  Status GatherPages(const GatherPagesArgs& args) override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return cuda::LaunchGatherPages(args, arena(), arena_bytes_, stream(Queue::kCompute));
  }

  Status Synchronize(Deadline deadline) override {
    KVF_RETURN_IF_ERROR(MakeCurrent());
    for (const cuda::CudaStream& s : streams_) {
      cudaStream_t handle = s.get();
      KVF_RETURN_IF_ERROR(
          PollUntil([handle] { return QueryResult(cudaStreamQuery(handle), "cudaStreamQuery"); },
                    deadline, name_ + " Synchronize"));
    }
    return Status::OK();
  }

  Status TEST_Read(DeviceRange src, std::span<std::byte> dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(src, arena_bytes_, "TEST_Read"));
    if (src.bytes != dst.size()) return Status::InvalidArgument("TEST_Read: sizes differ");
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(
        cudaMemcpy(dst.data(), arena() + src.offset, dst.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy(TEST_Read)");
  }

  Status TEST_Write(std::span<const std::byte> src, DeviceRange dst) override {
    KVF_RETURN_IF_ERROR(CheckArenaRange(dst, arena_bytes_, "TEST_Write"));
    if (dst.bytes != src.size()) return Status::InvalidArgument("TEST_Write: sizes differ");
    KVF_RETURN_IF_ERROR(MakeCurrent());
    return FromCuda(
        cudaMemcpy(arena() + dst.offset, src.data(), src.size(), cudaMemcpyHostToDevice),
        "cudaMemcpy(TEST_Write)");
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

  // REQUIRES: CheckQueue(queue).ok().
  cudaStream_t stream(Queue queue) const {
    return streams_[static_cast<int>(queue) - static_cast<int>(Queue::kHostToDevice)].get();
  }

  std::byte* arena() const { return static_cast<std::byte*>(arena_.get()); }

  // cudaSetDevice is per host thread, and callers may run on any thread.
  Status MakeCurrent() const { return FromCuda(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  StatusOr<const CudaFence*> FenceOf(const Event& event, std::string_view what) const {
    const auto* fence = dynamic_cast<const CudaFence*>(&event);
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

  const int ordinal_;
  const std::string name_;
  // Declared before the streams so that the streams are destroyed first.
  cuda::CudaDeviceMemory arena_;
  const std::uint64_t arena_bytes_;
  std::array<cuda::CudaStream, kNumQueues> streams_;
  const std::shared_ptr<PinnedBufferRegistry> registry_;
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options) {
  if (options.arena_bytes == 0) {
    return Status::InvalidArgument(
        "device arena of 0 bytes: the arena size is explicit, set --device-arena-bytes "
        "(DeviceOptions::arena_bytes)");
  }
  int count = 0;
  KVF_RETURN_IF_ERROR(FromCuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (options.device_index < 0 || options.device_index >= count) {
    return Status::FailedPrecondition("CUDA device " + std::to_string(options.device_index) +
                                      " requested; this machine has " + std::to_string(count));
  }
  const int ordinal = options.device_index;
  KVF_RETURN_IF_ERROR(FromCuda(cudaSetDevice(ordinal), "cudaSetDevice"));
  cudaDeviceProp prop{};
  KVF_RETURN_IF_ERROR(FromCuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
  std::size_t free_bytes = 0, total_bytes = 0;
  KVF_RETURN_IF_ERROR(FromCuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  if (options.arena_bytes > free_bytes) {
    return Status::ResourceExhausted(
        "cuda:" + std::to_string(ordinal) + " arena of " + FormatBytesExact(options.arena_bytes) +
        " exceeds the device's free memory of " + FormatBytesExact(free_bytes) + " (of " +
        FormatBytesExact(total_bytes) + " total); lower --device-arena-bytes");
  }
  const auto start = std::chrono::steady_clock::now();
  KVF_ASSIGN_OR_RETURN(cuda::CudaDeviceMemory arena,
                       cuda::AllocateDeviceMemory(options.arena_bytes));
  std::array<cuda::CudaStream, kNumQueues> streams;
  for (cuda::CudaStream& s : streams) {
    KVF_ASSIGN_OR_RETURN(s, cuda::CreateNonBlockingStream());
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string name = "cuda:" + std::to_string(ordinal) + " " + prop.name;
  char ms_text[32];
  std::snprintf(ms_text, sizeof(ms_text), "%.1f", ms);
  cuda::LogInfo(name + ": arena of " + FormatBytesExact(options.arena_bytes) + " allocated in " +
                ms_text + " ms (" + FormatBytes(free_bytes) + " free of " +
                FormatBytes(total_bytes) + " before); streams h2d, d2h, compute (non-blocking)");
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(
      ordinal, std::move(name), std::move(arena), options.arena_bytes, std::move(streams)));
}

}  // namespace kvfabric::gpu
