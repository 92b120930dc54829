// HostHistory: a context's history in host memory, as the blocks it is made
// of. Block b's payload (every layer, laid out as docs/block-format.md says)
// is block(b), block_bytes long; blocks need not be adjacent: a history that
// lives in pages of the client's history pool (client/history_pool.h) is a
// page table over the pool, a plain buffer is block b at b * block_bytes.
//
// A view: it borrows the memory (and the page table) and copies cheaply.
// Thread safety: a value; the bytes are the owner's to synchronise.
#ifndef KVFABRIC_CLIENT_HOST_HISTORY_H_
#define KVFABRIC_CLIENT_HOST_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvfabric::client {

class HostHistory {
 public:
  HostHistory() = default;

  // Block payloads back to back: block b at bytes[b * block_bytes].
  static HostHistory Contiguous(std::span<const std::byte> bytes, std::uint64_t block_bytes) {
    HostHistory h;
    h.base_ = bytes.data();
    h.block_bytes_ = block_bytes;
    h.blocks_ = block_bytes == 0 ? 0 : static_cast<std::uint32_t>(bytes.size() / block_bytes);
    return h;
  }
  // `blocks` blocks `stride` bytes apart from `base` (the last may be
  // shorter than the stride: only its payload is read).
  static HostHistory Contiguous(const std::byte* base, std::uint32_t blocks, std::uint64_t stride) {
    HostHistory h;
    h.base_ = base;
    h.block_bytes_ = stride;
    h.blocks_ = blocks;
    return h;
  }
  // Pages of a pool: block b at pool_base + pages[b] * block_bytes.
  static HostHistory Paged(const std::byte* pool_base, std::span<const std::uint32_t> pages,
                           std::uint64_t block_bytes) {
    HostHistory h;
    h.base_ = pool_base;
    h.pages_ = pages;
    h.block_bytes_ = block_bytes;
    h.blocks_ = static_cast<std::uint32_t>(pages.size());
    return h;
  }

  std::uint32_t blocks() const { return blocks_; }
  std::uint64_t block_bytes() const { return block_bytes_; }
  // REQUIRES: b < blocks().
  std::span<const std::byte> block(std::uint32_t b) const {
    const std::uint64_t page = pages_.empty() ? b : pages_[b];
    return {base_ + page * block_bytes_, block_bytes_};
  }

 private:
  const std::byte* base_ = nullptr;
  std::span<const std::uint32_t> pages_;  // empty: contiguous
  std::uint64_t block_bytes_ = 0;
  std::uint32_t blocks_ = 0;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_HOST_HISTORY_H_
