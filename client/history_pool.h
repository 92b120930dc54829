// HistoryPool: the client's pinned host memory for every context's history,
// allocated once at Client::Open and handed out in pages of one block.
//
// Engines fix their KV memory at start-up (vLLM's paged KV cache,
// TensorRT-LLM's pool) and so does libkvfabric: the pool is
// options.history_pool_bytes of pinned host memory, allocated and
// pre-faulted (every page touched) at Create, so no request ever pays for
// first-touch page faults (~0.6 s per GiB on the development machines) or
// for pinning. A context takes one page per block of its history
// (ceil(tokens / tokens_per_block)), in any order, so histories of different
// lengths never fragment the pool; pages are taken lowest address first, so
// a context's blocks usually lie in a few runs of adjacent pages (a recompute
// is one engine call per run). Create prints the arithmetic (pages, tokens,
// how many histories of max_context_tokens fit) and refuses a pool that
// cannot hold one such history, naming the setting.
//
// Ownership: the pool owns its memory (from the device, so it is pinned
// where the device needs it); contexts own the pages they took until they
// Return them. Threads: every method may be called from any thread.
// Take and Return allocate nothing.
#ifndef KVFABRIC_CLIENT_HISTORY_POOL_H_
#define KVFABRIC_CLIENT_HISTORY_POOL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/device.h"

namespace kvfabric::client {

struct HistoryPoolOptions {
  // Bytes of the pool (history_pool_bytes, --client-history-pool-bytes).
  // Required: 0 is refused.
  std::uint64_t pool_bytes = 0;
  // One page: one block of the model. Required.
  std::uint64_t block_bytes = 0;
  std::uint32_t tokens_per_block = 0;
  // The longest history a context may need (max_context_tokens,
  // --client-max-context-tokens); 0: not stated (only one block must fit).
  std::uint64_t max_context_tokens = 0;
  // How the caller spells the pool's setting in refusals.
  std::string setting = "history_pool_bytes (--client-history-pool-bytes)";
};

class HistoryPool {
 public:
  // `memory`: pinned memory to hold the pages (at least pages x
  // block_bytes; Device::PinHostMemory of a transport's region), or null to
  // allocate it with device.AllocatePinnedHost. Either way every page is
  // touched here.
  static StatusOr<std::unique_ptr<HistoryPool>> Create(
      gpu::Device& device, const HistoryPoolOptions& options,
      std::unique_ptr<gpu::PinnedHostBuffer> memory = nullptr);

  // Takes `n` pages into (*pages)[0..n) (resized; allocation-free once its
  // capacity is n), lowest free addresses first. ResourceExhausted with the
  // arithmetic when fewer are free; nothing is taken then.
  Status Take(std::uint32_t n, std::vector<std::uint32_t>* pages, const std::string& who);
  // Gives pages back. REQUIRES: each was taken and not yet returned.
  void Return(std::span<const std::uint32_t> pages);
  // Gives a page back that a peer may still write into until `until` (a
  // daemon was told to push a block into it, and the request failed as a
  // whole, so its writes may still be in flight): no Take hands it out before
  // then. The caller stops using it now. Allocation-free (the quarantine
  // holds at most every page). REQUIRES: taken and not yet returned.
  void Quarantine(std::uint32_t page, std::chrono::steady_clock::time_point until);
  std::uint32_t pages_quarantined() const;

  // Page p's bytes (one block).
  std::span<std::byte> page(std::uint32_t p) const {
    return buffer_->bytes().subspan(std::uint64_t{p} * o_.block_bytes, o_.block_bytes);
  }
  std::byte* base() const { return buffer_->bytes().data(); }
  std::uint64_t page_bytes() const { return o_.block_bytes; }
  std::uint32_t pages() const { return pages_; }
  std::uint32_t pages_in_use() const;
  std::uint32_t peak_pages_in_use() const;
  // One line: the pool's arithmetic.
  std::string DescribeLayout() const;

 private:
  HistoryPool(const HistoryPoolOptions& options, std::uint32_t pages,
              std::unique_ptr<gpu::PinnedHostBuffer> buffer);

  const HistoryPoolOptions o_;
  const std::uint32_t pages_;
  const std::unique_ptr<gpu::PinnedHostBuffer> buffer_;
  mutable Mutex mu_;
  std::vector<std::uint64_t> used_ KVF_GUARDED_BY(mu_);  // a bit per page
  std::uint32_t in_use_ KVF_GUARDED_BY(mu_) = 0;         // taken or quarantined
  // Quarantined pages, oldest first: a ring of capacity pages_ (deadlines
  // are added in time order, so the expired ones are at the head).
  struct Held {
    std::uint32_t page = 0;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Held> quarantine_ KVF_GUARDED_BY(mu_);
  std::size_t quarantine_head_ KVF_GUARDED_BY(mu_) = 0;
  std::size_t quarantined_ KVF_GUARDED_BY(mu_) = 0;
  // Frees the quarantined pages whose deadline passed.
  void ReleaseExpired() KVF_REQUIRES(mu_);
  std::uint32_t peak_ KVF_GUARDED_BY(mu_) = 0;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_HISTORY_POOL_H_
