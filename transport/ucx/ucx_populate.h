// MappingPopulator: fills in this process's page tables for a peer's memory that maps here
// (RkeyHolder::mapped: memory UCX allocated, reached over shared memory), in the background,
// so that the first copy into each page does not take a minor fault.
//
// Why: a daemon's mapping of a client's history pool starts empty. Every 4 KiB page the daemon
// writes for the first time costs it a minor fault, and a load into pages it has not written
// before ran at about half the speed of one into pages it had (docs/benchmarks.md, run of
// 2026-12-04 19:07: 3.3-3.5 against 7.8 GB/s). Populating the mapping when the region is
// imported moves that work off the request path.
//
// Bounded by what the peer has: only pages resident in the peer's segment (mincore) are
// populated, so a peer that exports a large sparse range cannot make this process allocate
// memory for it. What populating costs this process is page-table memory, 8 bytes per 4 KiB
// page of the peer's resident memory (0.2%), freed when the mapping goes.
//
// The work goes in chunks of kChunkBytes, each under a shared RkeyHolder::map_mu, so
// RkeyHolder::Reset (which unmaps) waits for at most one chunk, and a region released
// meanwhile is left at the next chunk. MADV_POPULATE_WRITE needs Linux 5.14; where madvise
// refuses it, MADV_POPULATE_READ is used instead (the page-table entries exist, so a first
// write costs at most a write-protect fault), and where that is refused too the populator
// stops for good (stats().unsupported).
//
// Thread safety: every method may be called from any thread. One worker thread, started by the
// first Enqueue, stopped and joined by the destructor.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_POPULATE_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_POPULATE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "core/mutex.h"

namespace kvfabric::ucx::internal {

struct RkeyHolder;

class MappingPopulator {
 public:
  // Bytes populated per chunk (the longest an unmap waits), and regions queued at most (more
  // are dropped and counted: populating is an optimisation).
  static constexpr std::uint64_t kChunkBytes = std::uint64_t{16} << 20;
  static constexpr std::size_t kMaxQueued = 256;

  struct Stats {
    std::uint64_t regions = 0;             // regions worked through to their end
    std::uint64_t bytes_populated = 0;     // resident pages whose page-table entries were filled
    std::uint64_t bytes_not_resident = 0;  // pages skipped: the peer has not touched them
    std::uint64_t regions_dropped = 0;     // not queued (kMaxQueued)
    bool unsupported = false;              // the kernel refused both populate advices
  };

  MappingPopulator() = default;
  ~MappingPopulator();
  MappingPopulator(const MappingPopulator&) = delete;
  MappingPopulator& operator=(const MappingPopulator&) = delete;

  // Populates `holder`'s mapping, whole, in the background (nothing if it has none).
  void Enqueue(std::weak_ptr<RkeyHolder> holder);
  Stats stats() const;

 private:
  void Run();
  // One chunk of `h` from *offset: advances *offset; false when the region is done (released,
  // failed or finished).
  bool PopulateChunk(RkeyHolder& h, std::uint64_t* offset);

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::weak_ptr<RkeyHolder>> queue_ KVF_GUARDED_BY(mu_);
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  bool started_ KVF_GUARDED_BY(mu_) = false;
  Stats stats_ KVF_GUARDED_BY(mu_);
  int advice_ KVF_GUARDED_BY(mu_) = 0;  // 0: not tried yet; else the madvise advice that works
  std::thread thread_;
};

}  // namespace kvfabric::ucx::internal

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_POPULATE_H_
