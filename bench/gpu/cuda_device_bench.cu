// The CUDA-only pieces of the GPU benchmarks: see cuda_device_bench.h. The
// host driver that prints the figures is cuda_attention_bench.cc.
#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "bench/gpu/cuda_device_bench.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/cuda/cuda_status.h"
#include "gpu/device.h"

namespace kvfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;

gpu::Deadline Soon() { return Clock::now() + std::chrono::seconds(60); }

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Status FromCuda(cudaError_t err, const char* what) {
  return cuda::StatusFromCudaError(static_cast<int>(err), what);
}

// A cudaMalloc'd buffer freed on every path out.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Status Allocate(std::uint64_t bytes) { return FromCuda(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

StatusOr<DeviceMemory> QueryDeviceMemory(int device_index) {
  KVF_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device_index), "cudaSetDevice"));
  std::size_t free_bytes = 0, total_bytes = 0;
  KVF_RETURN_IF_ERROR(FromCuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  return DeviceMemory{free_bytes, total_bytes};
}

StatusOr<CopyAndMergeFigures> RunCopyAndMergeBench(int device_index) {
  constexpr std::uint64_t kStage = 256ull << 20;  // bytes per H2D round
  constexpr std::uint64_t kChunk = 4ull << 20;
  constexpr int kRounds = 8;
  // Merge: 32 layers' worth of one decode step: 64 tiles x 32 heads x 128 dim.
  constexpr std::uint32_t kStates = 64, kHeads = 32, kDim = 128;
  constexpr std::uint64_t kOutputs = std::uint64_t{kStates} * kHeads * kDim * 4;
  constexpr std::uint64_t kLses = std::uint64_t{kStates} * kHeads * 4;
  constexpr std::uint64_t kArena = 2 * kStage;
  constexpr int kMerges = 2000;

  CopyAndMergeFigures f;
  f.copy_bytes = kStage;
  f.chunk_bytes = kChunk;
  f.merge_states = kStates;
  f.merge_heads = kHeads;
  f.merge_head_dim = kDim;

  gpu::DeviceOptions options;
  options.arena_bytes = kArena;
  options.device_index = device_index;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> device, gpu::CreateCudaDevice(options));
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::PinnedHostBuffer> staging,
                       device->AllocatePinnedHost(kStage));
  for (std::byte& b : staging->bytes()) b = std::byte{1};
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> event, device->CreateEvent());

  // Baseline: plain cudaMemcpy of the same pinned bytes into a separate buffer.
  DeviceBuffer plain, plain2;
  KVF_RETURN_IF_ERROR(plain.Allocate(kStage));
  KVF_RETURN_IF_ERROR(plain2.Allocate(kStage));
  const void* src = staging->bytes().data();
  KVF_RETURN_IF_ERROR(
      FromCuda(cudaMemcpy(plain.get(), src, kStage, cudaMemcpyHostToDevice), "cudaMemcpy"));
  auto start = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    KVF_RETURN_IF_ERROR(
        FromCuda(cudaMemcpy(plain.get(), src, kStage, cudaMemcpyHostToDevice), "cudaMemcpy"));
  }
  f.plain_h2d_gbs = kRounds * double(kStage) / Seconds(start) / 1e9;

  auto h2d_round = [&]() -> Status {
    for (std::uint64_t off = 0; off < kStage; off += kChunk) {
      KVF_RETURN_IF_ERROR(device->CopyHostToDevice(staging->bytes().subspan(off, kChunk),
                                                   gpu::DeviceRange{off, kChunk}));
    }
    KVF_RETURN_IF_ERROR(device->Record(*event, gpu::Queue::kHostToDevice));
    return event->Wait(Soon());
  };
  KVF_RETURN_IF_ERROR(h2d_round());
  start = Clock::now();
  for (int r = 0; r < kRounds; ++r) KVF_RETURN_IF_ERROR(h2d_round());
  f.device_h2d_gbs = kRounds * double(kStage) / Seconds(start) / 1e9;

  // HBM: device-to-device cudaMemcpy moves 2 bytes of traffic per byte copied.
  KVF_RETURN_IF_ERROR(FromCuda(
      cudaMemcpy(plain2.get(), plain.get(), kStage, cudaMemcpyDeviceToDevice), "cudaMemcpy"));
  KVF_RETURN_IF_ERROR(FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  start = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    KVF_RETURN_IF_ERROR(FromCuda(
        cudaMemcpy(plain2.get(), plain.get(), kStage, cudaMemcpyDeviceToDevice), "cudaMemcpy"));
  }
  KVF_RETURN_IF_ERROR(FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  f.hbm_gbs = kRounds * 2.0 * double(kStage) / Seconds(start) / 1e9;

  gpu::MergeStatesArgs merge;
  merge.num_states = kStates;
  merge.num_heads = kHeads;
  merge.head_dim = kDim;
  merge.outputs = {0, kOutputs};
  merge.lses = {kOutputs, kLses};
  merge.output = {kStage, std::uint64_t{kHeads} * kDim * 4};
  merge.lse = {kStage + merge.output.bytes, std::uint64_t{kHeads} * 4};
  // Finite states: the staging bytes (0x01010101 floats, lse 2.4e-38) will do.
  KVF_RETURN_IF_ERROR(device->CopyHostToDevice(staging->bytes().first(kOutputs + kLses),
                                               gpu::DeviceRange{0, kOutputs + kLses}));
  KVF_RETURN_IF_ERROR(device->Record(*event, gpu::Queue::kHostToDevice));
  KVF_RETURN_IF_ERROR(device->QueueWaitEvent(gpu::Queue::kCompute, *event));
  KVF_RETURN_IF_ERROR(device->MergeAttentionStates(merge));
  KVF_RETURN_IF_ERROR(device->Synchronize(Soon()));
  start = Clock::now();
  for (int i = 0; i < kMerges; ++i) KVF_RETURN_IF_ERROR(device->MergeAttentionStates(merge));
  KVF_RETURN_IF_ERROR(device->Synchronize(Soon()));
  const double merge_s = Seconds(start);
  const double merge_bytes = double(kOutputs + kLses + merge.output.bytes + merge.lse.bytes);
  f.merge_us = merge_s / kMerges * 1e6;
  f.merge_gbs = kMerges * merge_bytes / merge_s / 1e9;
  return f;
}

}  // namespace kvfabric::bench
