// A device arena and stream for the CUDA kernel tests, behind a header that
// needs no CUDA headers (the tests are plain C++). For tests only: it
// allocates and its copies synchronise.
//
// Thread safety: one thread at a time.
#ifndef KVFABRIC_GPU_CUDA_ATTENTION_TEST_SUPPORT_H_
#define KVFABRIC_GPU_CUDA_ATTENTION_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "core/statusor.h"

struct CUstream_st;

namespace kvfabric::cuda {

class CudaTestArena {
 public:
  // cudaMalloc's `bytes` (zeroed) on device 0 and creates a stream.
  static StatusOr<std::unique_ptr<CudaTestArena>> Create(std::uint64_t bytes);
  CudaTestArena(const CudaTestArena&) = delete;
  CudaTestArena& operator=(const CudaTestArena&) = delete;
  ~CudaTestArena();

  std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  CUstream_st* stream() const { return stream_; }

  // Synchronous copies on the stream (they wait for earlier work on it).
  // InvalidArgument for a range outside the arena.
  Status Write(std::uint64_t offset, std::span<const std::byte> src);
  Status Read(std::uint64_t offset, std::span<std::byte> dst);
  // Device-to-device copy within the arena, enqueued on the stream.
  Status CopyWithin(std::uint64_t dst_offset, std::uint64_t src_offset, std::uint64_t bytes);
  Status Synchronize();

 private:
  CudaTestArena() = default;
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  CUstream_st* stream_ = nullptr;
};

}  // namespace kvfabric::cuda

#endif  // KVFABRIC_GPU_CUDA_ATTENTION_TEST_SUPPORT_H_
