#include <cuda_runtime_api.h>

#include "gpu/cuda/attention_test_support.h"
#include "gpu/cuda/cuda_status.h"

namespace kvfabric::cuda {
namespace {

Status Check(cudaError_t err, const char* what) {
  return StatusFromCudaError(static_cast<int>(err), what);
}

Status CheckRange(std::uint64_t offset, std::uint64_t bytes, std::uint64_t size) {
  if (offset > size || bytes > size - offset) {
    return Status::InvalidArgument("CudaTestArena: range outside the arena");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<CudaTestArena>> CudaTestArena::Create(std::uint64_t bytes) {
  std::unique_ptr<CudaTestArena> arena(new CudaTestArena());
  KVF_RETURN_IF_ERROR(Check(cudaSetDevice(0), "cudaSetDevice(0)"));
  void* p = nullptr;
  KVF_RETURN_IF_ERROR(Check(cudaMalloc(&p, bytes), "cudaMalloc"));
  arena->data_ = static_cast<std::byte*>(p);
  arena->size_ = bytes;
  cudaStream_t stream = nullptr;
  KVF_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags"));
  arena->stream_ = stream;
  KVF_RETURN_IF_ERROR(Check(cudaMemsetAsync(p, 0, bytes, stream), "cudaMemsetAsync"));
  KVF_RETURN_IF_ERROR(arena->Synchronize());
  return arena;
}

CudaTestArena::~CudaTestArena() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (data_ != nullptr) cudaFree(data_);
}

Status CudaTestArena::Write(std::uint64_t offset, std::span<const std::byte> src) {
  KVF_RETURN_IF_ERROR(CheckRange(offset, src.size(), size_));
  KVF_RETURN_IF_ERROR(Check(
      cudaMemcpyAsync(data_ + offset, src.data(), src.size(), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync H2D"));
  return Synchronize();
}

Status CudaTestArena::Read(std::uint64_t offset, std::span<std::byte> dst) {
  KVF_RETURN_IF_ERROR(CheckRange(offset, dst.size(), size_));
  KVF_RETURN_IF_ERROR(Check(
      cudaMemcpyAsync(dst.data(), data_ + offset, dst.size(), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync D2H"));
  return Synchronize();
}

Status CudaTestArena::CopyWithin(std::uint64_t dst_offset, std::uint64_t src_offset,
                                 std::uint64_t bytes) {
  KVF_RETURN_IF_ERROR(CheckRange(dst_offset, bytes, size_));
  KVF_RETURN_IF_ERROR(CheckRange(src_offset, bytes, size_));
  return Check(cudaMemcpyAsync(data_ + dst_offset, data_ + src_offset, bytes,
                               cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync D2D");
}

Status CudaTestArena::Synchronize() {
  return Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace kvfabric::cuda
