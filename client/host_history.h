// HostHistory: a context's history in host memory, as the blocks it is made
// of. Block b's payload (every layer, laid out as docs/block-format.md says)
// is block(b), block_bytes long; blocks need not be adjacent: a history that
// lives in pages of the client's history pool (client/history_pool.h) is a
// page table over the pool, a plain buffer is block b at b * block_bytes.
//
// Representation per block (docs/compact.md): WithCompact attaches one flag
// per block; a block whose flag is nonzero holds, at the start of block(b),
// the compact_int8 payload of the block (layer l's slice, a K half then a V
// half of CompactHalfBytes each, at l * 2 * CompactHalfBytes) instead of the
// exact payload. A history without flags is all exact, as before flags
// existed. compact(b) is false past the end of the flags, but a reader that
// takes flags refuses fewer flags than the blocks it reads
// (StreamingAttention::Decode: InvalidArgument), as a short span is a bug.
//
// A view: it borrows the memory, the page table and the flags, and copies
// cheaply. Thread safety: a value; the bytes are the owner's to synchronise.
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

  // This history with block b compact where compact[b] != 0. `compact` is
  // borrowed: it must outlive every use of the returned view.
  HostHistory WithCompact(std::span<const std::uint8_t> compact) const {
    HostHistory h = *this;
    h.compact_ = compact;
    return h;
  }

  std::uint32_t blocks() const { return blocks_; }
  std::uint64_t block_bytes() const { return block_bytes_; }
  // REQUIRES: b < blocks().
  std::span<const std::byte> block(std::uint32_t b) const {
    const std::uint64_t page = pages_.empty() ? b : pages_[b];
    return {base_ + page * block_bytes_, block_bytes_};
  }
  // Whether block b holds its compact payload (see the class comment).
  bool compact(std::uint32_t b) const { return b < compact_.size() && compact_[b] != 0; }
  // The flags given to WithCompact (empty: every block is exact).
  std::span<const std::uint8_t> compact_flags() const { return compact_; }

 private:
  const std::byte* base_ = nullptr;
  std::span<const std::uint32_t> pages_;  // empty: contiguous
  std::span<const std::uint8_t> compact_;  // empty: every block exact
  std::uint64_t block_bytes_ = 0;
  std::uint32_t blocks_ = 0;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_HOST_HISTORY_H_
