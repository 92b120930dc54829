// CopyPool: a few threads that help one caller copy a list of byte ranges.
//
// Why: a single thread copies cold memory at one core's bandwidth (11-19 GB/s
// on the development machines with streaming stores), well below what a
// memory-heavy node's DRAM delivers. The cache-host daemon's UCX progress
// thread copies every shared-memory transfer itself; with a CopyPool it
// splits a large batch across `threads` helpers plus itself.
//
// How: Copy() cuts the ranges into threads + 1 shares of about equal bytes
// (cutting inside a range at 4 KiB boundaries), hands shares 1..threads to
// the helpers, copies share 0 on the calling thread, and returns when every
// share is done. The caller blocks for the whole copy, as it would copying
// alone, so nothing about the ranges' lifetimes changes: they only have to
// stay valid until Copy returns. Concurrent Copy calls from several threads
// are allowed; their shares queue behind each other.
//
// Thread safety: every method may be called from any thread; the destructor
// must not race Copy.
#ifndef KVFABRIC_CORE_COPY_POOL_H_
#define KVFABRIC_CORE_COPY_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"

namespace kvfabric {

// One range to copy; dst and src must not overlap.
struct CopyRange {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  // When set, the range is copied and checked (GuardedCopyChecked, with
  // streaming stores when the copy is) and *crc receives the CRC32C of the
  // bytes stored in dst,
  // folded (crc32c::Combine) from the pieces the helpers copied. Untouched
  // if the copy faulted.
  std::uint32_t* crc = nullptr;
};

class CopyPool {
 public:
  // Copies of fewer bytes than this go on the caller alone (kMinSplitBytes).
  static constexpr std::size_t kDefaultMinSplitBytes = std::size_t{2} << 20;

  // Starts `threads` helper threads (0 is allowed: Copy then copies alone).
  // A Copy of fewer than `min_split_bytes` in all is not split: waking a
  // helper costs more than its share saves. Measured on the development
  // machine (2 vCPUs, two daemons copying at once): a kFetch of three 64 KiB
  // layer slices took 0.12-0.18 ms split with one helper, its copy alone
  // ~0.02 ms; a 1 MiB share copies in ~0.08 ms, about a wake-up's latency
  // under load, so splits start at 2 MiB.
  explicit CopyPool(int threads, std::size_t min_split_bytes = kDefaultMinSplitBytes);
  ~CopyPool();

  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }
  std::size_t min_split_bytes() const { return min_split_bytes_; }
  // Copy calls split across helpers so far.
  std::uint64_t split_copies() const { return split_copies_.load(std::memory_order_relaxed); }

  // Copies every range, with streaming stores (core/stream_copy.h) when
  // `streaming`, else std::memcpy (ranges with a `crc` are copied and
  // checked, see CopyRange); returns when all bytes are in place.
  // Every copy is guarded (core/guarded_copy.h): memory that faults (a peer
  // shrank what it shared) makes it return DataLoss, after the other ranges
  // were copied; the faulting range's destination is then not to be trusted.
  [[nodiscard]] Status Copy(std::span<const CopyRange> ranges, bool streaming);

 private:
  void Work();

  const std::size_t min_split_bytes_;
  std::atomic<std::uint64_t> split_copies_{0};
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ KVF_GUARDED_BY(mu_);
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_COPY_POOL_H_
