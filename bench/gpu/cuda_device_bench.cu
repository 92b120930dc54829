// CUDA device benchmark: figures against physical limits measured in the same
// run (bench/gpu/run.sh builds and runs it on a GPU machine).
//
//   h2d      host->device through Device::CopyHostToDevice (pinned staging,
//            4 MiB copies, one event per batch) vs one plain cudaMemcpy of the
//            same pinned bytes (the bus peak this machine reaches).
//   merge    MergeAttentionStates throughput in GB/s of states read, vs the
//            HBM bandwidth of a device-to-device cudaMemcpy (read + write).
//
// Prints one line per figure with the ratio. Not a test: no thresholds.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_device.h"
#include "gpu/device.h"

namespace kvfabric::gpu {
namespace {

using Clock = std::chrono::steady_clock;

Deadline Soon() { return Clock::now() + std::chrono::seconds(60); }

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#define BENCH_CHECK(expr)                                                            \
  do {                                                                               \
    ::kvfabric::Status s_ = (expr);                                                  \
    if (!s_.ok()) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,              \
                   s_.ToString().c_str());                                           \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t e_ = (expr);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr,               \
                   cudaGetErrorString(e_));                                           \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

int Main() {
  constexpr std::uint64_t kStage = 256ull << 20;  // bytes per H2D round
  constexpr std::uint64_t kChunk = 4ull << 20;
  constexpr int kRounds = 8;
  // Merge: 32 layers' worth of one decode step: 64 tiles x 32 heads x 128 dim.
  constexpr std::uint32_t kStates = 64, kHeads = 32, kDim = 128;
  constexpr std::uint64_t kOutputs = std::uint64_t{kStates} * kHeads * kDim * 4;
  constexpr std::uint64_t kLses = std::uint64_t{kStates} * kHeads * 4;
  constexpr std::uint64_t kArena = 2 * kStage;

  DeviceOptions options;
  options.arena_bytes = kArena;
  auto created = CreateCudaDevice(options);
  BENCH_CHECK(created.status());
  std::unique_ptr<Device> device = std::move(created).value();
  std::printf("device: %s, arena %llu MiB\n", device->name().c_str(),
              static_cast<unsigned long long>(kArena >> 20));

  auto staging_or = device->AllocatePinnedHost(kStage);
  BENCH_CHECK(staging_or.status());
  std::unique_ptr<PinnedHostBuffer> staging = std::move(staging_or).value();
  for (std::byte& b : staging->bytes()) b = std::byte{1};
  auto event_or = device->CreateEvent();
  BENCH_CHECK(event_or.status());
  std::unique_ptr<Event> event = std::move(event_or).value();

  // Baseline: plain cudaMemcpy of the same pinned bytes into a separate buffer.
  void* plain = nullptr;
  CUDA_CHECK(cudaMalloc(&plain, kStage));
  CUDA_CHECK(cudaMemcpy(plain, staging->bytes().data(), kStage, cudaMemcpyHostToDevice));
  auto start = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    CUDA_CHECK(cudaMemcpy(plain, staging->bytes().data(), kStage, cudaMemcpyHostToDevice));
  }
  const double peak_gbs = kRounds * double(kStage) / Seconds(start) / 1e9;

  auto h2d_round = [&] {
    for (std::uint64_t off = 0; off < kStage; off += kChunk) {
      BENCH_CHECK(device->CopyHostToDevice(staging->bytes().subspan(off, kChunk),
                                           DeviceRange{off, kChunk}));
    }
    BENCH_CHECK(device->Record(*event, Queue::kHostToDevice));
    BENCH_CHECK(event->Wait(Soon()));
  };
  h2d_round();
  start = Clock::now();
  for (int r = 0; r < kRounds; ++r) h2d_round();
  const double h2d_gbs = kRounds * double(kStage) / Seconds(start) / 1e9;
  std::printf("h2d: Device %.1f GB/s, plain cudaMemcpy %.1f GB/s, ratio %.2f (4 MiB copies)\n",
              h2d_gbs, peak_gbs, h2d_gbs / peak_gbs);

  // HBM: device-to-device cudaMemcpy moves 2 bytes of traffic per byte copied.
  void* plain2 = nullptr;
  CUDA_CHECK(cudaMalloc(&plain2, kStage));
  CUDA_CHECK(cudaMemcpy(plain2, plain, kStage, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  start = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    CUDA_CHECK(cudaMemcpy(plain2, plain, kStage, cudaMemcpyDeviceToDevice));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const double hbm_gbs = kRounds * 2.0 * double(kStage) / Seconds(start) / 1e9;

  MergeStatesArgs merge;
  merge.num_states = kStates;
  merge.num_heads = kHeads;
  merge.head_dim = kDim;
  merge.outputs = {0, kOutputs};
  merge.lses = {kOutputs, kLses};
  merge.output = {kStage, std::uint64_t{kHeads} * kDim * 4};
  merge.lse = {kStage + merge.output.bytes, std::uint64_t{kHeads} * 4};
  // Finite states: the staging bytes (0x01010101 floats, lse 2.4e-38) will do.
  BENCH_CHECK(device->CopyHostToDevice(staging->bytes().first(kOutputs + kLses),
                                       DeviceRange{0, kOutputs + kLses}));
  BENCH_CHECK(device->Record(*event, Queue::kHostToDevice));
  BENCH_CHECK(device->QueueWaitEvent(Queue::kCompute, *event));
  BENCH_CHECK(device->MergeAttentionStates(merge));
  BENCH_CHECK(device->Synchronize(Soon()));
  constexpr int kMerges = 2000;
  start = Clock::now();
  for (int i = 0; i < kMerges; ++i) BENCH_CHECK(device->MergeAttentionStates(merge));
  BENCH_CHECK(device->Synchronize(Soon()));
  const double merge_s = Seconds(start);
  const double merge_bytes = double(kOutputs + kLses + merge.output.bytes + merge.lse.bytes);
  const double merge_gbs = kMerges * merge_bytes / merge_s / 1e9;
  std::printf("merge: %u states x %u heads x %u dim: %.2f us each, %.1f GB/s; HBM (d2d memcpy) "
              "%.1f GB/s; ratio %.2f\n",
              kStates, kHeads, kDim, merge_s / kMerges * 1e6, merge_gbs, hbm_gbs,
              merge_gbs / hbm_gbs);

  CUDA_CHECK(cudaFree(plain));
  CUDA_CHECK(cudaFree(plain2));
  return 0;
}

}  // namespace
}  // namespace kvfabric::gpu

int main() { return kvfabric::gpu::Main(); }
