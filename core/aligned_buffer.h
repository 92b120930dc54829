// AlignedBuffer: an owned, zero-filled heap buffer whose address is a multiple
// of a given power of two, for O_DIRECT I/O (FileOptions::direct_io needs the
// buffer address, offset and length aligned to Env::DirectIoAlignment()).
//
// Ownership: the buffer owns its memory (posix_memalign, released with free)
// and is move-only; a moved-from buffer is empty.
// Thread safety: a value; distinct buffers may be used from different threads,
// and the bytes follow the usual rules for shared memory.
#ifndef KVFABRIC_CORE_ALIGNED_BUFFER_H_
#define KVFABRIC_CORE_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "core/errno_status.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

class AlignedBuffer {
 public:
  // An empty buffer (data() == nullptr, size() == 0).
  AlignedBuffer() = default;

  // Allocates `size` zeroed bytes at an address that is a multiple of
  // `alignment`. The allocation is rounded up to a multiple of `alignment`,
  // so an O_DIRECT read of the rounded length stays inside it, but size() and
  // span() report `size`. InvalidArgument unless `alignment` is a power of two
  // and a multiple of sizeof(void*); ResourceExhausted if memory runs out.
  static StatusOr<AlignedBuffer> Allocate(size_t size, size_t alignment) {
    if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
      return Status::InvalidArgument("AlignedBuffer: alignment " + std::to_string(alignment) +
                                     " is not a power of two >= " + std::to_string(sizeof(void*)));
    }
    if (size > SIZE_MAX - alignment) {
      return Status::InvalidArgument("AlignedBuffer: size " + std::to_string(size) +
                                     " overflows when rounded up");
    }
    size_t rounded = (size + alignment - 1) / alignment * alignment;
    if (rounded == 0) rounded = alignment;
    void* p = nullptr;
    int err = posix_memalign(&p, alignment, rounded);
    if (err != 0) {
      return StatusFromErrno(err, "posix_memalign of " + std::to_string(rounded) +
                                      " bytes aligned to " + std::to_string(alignment));
    }
    std::memset(p, 0, rounded);
    return AlignedBuffer(static_cast<std::byte*>(p), size);
  }

  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  AlignedBuffer(std::byte* data, size_t size) : data_(data), size_(size) {}

  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_ALIGNED_BUFFER_H_
