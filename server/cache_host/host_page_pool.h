// HostPagePool: the cache host's pool of fixed-size host memory pages, over
// memory handed to it at start-up.
//
// Memory. The pool never allocates payload memory itself: the daemon obtains
// one range at start-up (Transport::AllocateMemory, so that transfers into it
// are one-sided, or AllocateAnonymousPoolMemory below) and passes it in as a
// PoolMemory, a span plus an owner object that keeps the range alive. The pool
// keeps the owner until it is destroyed, after it has unlocked the range. The
// sizes are explicit (HostPagePoolOptions): there is no automatic sizing, and
// Create refuses a configuration it cannot honour, naming the setting.
//
// Locking is a stated decision (LockMode). `kRequired` refuses to start when
// RLIMIT_MEMLOCK is below the pool (formula and settings in the message) or
// when mlock fails; `kBestEffort` tries and, if it cannot, logs one line that
// the pages are not locked; `kOff` logs that one line and does not try.
//
// Pages and states. Page i is bytes [i * page_bytes, (i + 1) * page_bytes) of
// the memory. Every page is in exactly one state: free, reserved (a write
// reservation owns it until commit or expiry), committed (a published block)
// or staging (an NVMe read lands there). Independently, a page may be pinned by
// any number of read leases or by a demotion in flight; a pinned page cannot be
// freed (Free refuses), so it is never recycled while a transfer may read it.
// Counts of each state, and of pinned ("leased") pages, are kept for metrics.
//
// Allocator. Free pages are kept as maximal extents (runs of free pages) in two
// ordered sets: by start page (to coalesce neighbours on Free) and by (length,
// start) (for best fit). Allocate(n) takes the smallest extent of at least n
// pages, lowest start on ties, and returns one contiguous run; only when no
// extent is long enough does it gather the longest extents, longest first, into
// at most kMaxRunsPerBlock runs. Both are O(log extents). Its bookkeeping uses a
// little heap memory for tree nodes; the payload memory is never allocated
// after start-up.
//
// Thread safety: every method may be called from any thread (one internal
// mutex; PreFault runs without it). The bytes of a page are not synchronised by
// the pool: whoever owns the page's state (the lease table) decides who may
// touch them.
#ifndef KVFABRIC_SERVER_CACHE_HOST_HOST_PAGE_POOL_H_
#define KVFABRIC_SERVER_CACHE_HOST_HOST_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/model_fingerprint.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/cache_host/block_location.h"

namespace kvfabric::cache_host {

// --lock-memory. Values are accepted on the command line as "required",
// "best-effort" and "off".
enum class LockMode : std::uint8_t {
  // mlock the whole pool or refuse to start. Production: RDMA registration pins
  // pages anyway, and a swapped-out page under DMA is a wrong byte.
  kRequired = 1,
  // Try; if RLIMIT_MEMLOCK or mlock says no, log one line and run unlocked.
  kBestEffort = 2,
  // Do not lock (development machines: RLIMIT_MEMLOCK is 8 MiB there).
  kOff = 3,
};

// "required", "best-effort", "off".
std::string_view LockModeName(LockMode mode);
// Inverse of LockModeName; InvalidArgument listing the accepted names.
StatusOr<LockMode> ParseLockMode(std::string_view name);

// Smallest page accepted: the O_DIRECT alignment, so an NVMe read can land in a
// staging page directly.
inline constexpr std::uint64_t kMinHostPageBytes = 4096;

struct HostPagePoolOptions {
  // --host-pool-bytes. No default: 0 is refused. Bytes of the pool; pages =
  // floor(pool_bytes / page_bytes), and any remainder is left unused.
  std::uint64_t pool_bytes = 0;
  // --host-page-bytes. No default: 0 is refused. A power of two, at least
  // kMinHostPageBytes. A block takes ceil(block_bytes / page_bytes) pages:
  // pages close to the block size waste least; smaller pages fit blocks of
  // several models with less waste per block but more bookkeeping.
  std::uint64_t page_bytes = 0;
  // --lock-memory. Default kRequired: an operator must opt out of locking.
  LockMode lock_mode = LockMode::kRequired;
};

// Answers RLIMIT_MEMLOCK and performs mlock/munlock. The default is the
// process's; tests inject a fake to exercise refusals without privileges.
// Thread safety: implementations may be called from any thread.
class MemoryLocker {
 public:
  virtual ~MemoryLocker() = default;
  // The process-wide POSIX locker; never destroyed.
  static MemoryLocker* Default();
  // The soft RLIMIT_MEMLOCK in bytes; nullopt when unlimited.
  virtual StatusOr<std::optional<std::uint64_t>> MemlockLimit() = 0;
  virtual Status Lock(std::span<std::byte> bytes) = 0;
  virtual void Unlock(std::span<std::byte> bytes) = 0;
};

// Memory the pool runs over, and whoever keeps it alive (a transport
// MemoryRegion, an mmap). The pool holds `owner` until it is destroyed.
struct PoolMemory {
  std::span<std::byte> bytes;
  std::shared_ptr<void> owner;
};

// Maps `bytes` of anonymous private memory (with MADV_HUGEPAGE when
// `huge_pages`), for daemons that do not let the transport allocate the pool,
// and for tests. The owner unmaps it. The memory is not touched here (see
// PreFault). ResourceExhausted naming the size if mmap fails.
StatusOr<PoolMemory> AllocateAnonymousPoolMemory(std::uint64_t bytes, bool huge_pages);

// Page states (see the class comment). Numbered explicitly: metric labels.
enum class PageState : std::uint8_t {
  kFree = 0,
  kReserved = 1,
  kCommitted = 2,
  kStaging = 3,
};

// "free", "reserved", "committed", "staging".
std::string_view PageStateName(PageState state);

// A snapshot of the page counts, for metrics. free + reserved + committed +
// staging == pages. `leased` counts pages with at least one pin, from read leases or a
// demotion in flight (they are also counted in their state).
struct PagePoolCounts {
  std::uint64_t pages = 0;
  std::uint64_t free = 0;
  std::uint64_t reserved = 0;
  std::uint64_t committed = 0;
  std::uint64_t staging = 0;
  std::uint64_t leased = 0;
  std::uint64_t free_extents = 0;         // fragmentation: 1 means all free pages are contiguous
  std::uint64_t largest_free_extent = 0;  // pages
  std::uint64_t allocations = 0;          // successful Allocate calls
  std::uint64_t split_allocations = 0;    // of which returned more than one run
  std::uint64_t allocation_refusals = 0;  // Allocate returned ResourceExhausted
};

// How long pre-faulting took.
struct PreFaultReport {
  std::uint64_t bytes = 0;
  std::uint64_t micros = 0;
  // "pre-faulted 1 GiB in 1.02 s (1.05 GB/s)".
  std::string ToString() const;
};

class HostPagePool {
 public:
  // Validates `options` against `memory` and applies the lock mode.
  // InvalidArgument (naming --host-pool-bytes / --host-page-bytes and the
  // numbers) for a zero size, a page size that is not a power of two of at
  // least kMinHostPageBytes, a pool smaller than one page, more pages than fit
  // in 32 bits, memory shorter than pool_bytes or not aligned to 4096 bytes.
  // FailedPrecondition for kRequired when RLIMIT_MEMLOCK < pool_bytes (the
  // message gives the formula and names --host-pool-bytes, `ulimit -l`,
  // systemd LimitMEMLOCK= and --lock-memory), or the mlock error.
  // `locker` defaults to MemoryLocker::Default() and must outlive the pool.
  static StatusOr<std::unique_ptr<HostPagePool>> Create(const HostPagePoolOptions& options,
                                                        PoolMemory memory,
                                                        MemoryLocker* locker = nullptr);

  HostPagePool(const HostPagePool&) = delete;
  HostPagePool& operator=(const HostPagePool&) = delete;
  // Unlocks the memory if it was locked, then drops the owner.
  // REQUIRES: no transfer touches the memory any more.
  ~HostPagePool();

  std::uint64_t page_bytes() const { return page_bytes_; }
  std::uint64_t page_count() const { return page_count_; }
  std::uint64_t pool_bytes() const { return page_bytes_ * page_count_; }
  bool locked() const { return locked_; }
  // The whole range the pages live in (for registering with a transport).
  std::span<std::byte> memory() const { return memory_.bytes.first(pool_bytes()); }

  // Pages a block of `bytes` takes: ceil(bytes / page_bytes).
  std::uint64_t PagesFor(std::uint64_t bytes) const {
    return (bytes + page_bytes_ - 1) / page_bytes_;
  }

  // Writes one byte per 4 KiB of the pool so that every page is faulted in
  // before the first transfer (first touch runs at about 1 GB/s, touched memory
  // at about 18 GB/s), timing it with env->NowMicros(). Overwrites the pages:
  // call at start-up, before any allocation.
  PreFaultReport PreFault(Env* env);

  // Takes `pages` free pages (see "Allocator") and puts them in `state`
  // (kReserved or kStaging). InvalidArgument for 0 pages or another state;
  // ResourceExhausted when the free pages cannot hold them in at most
  // kMaxRunsPerBlock runs, with the counts ("need 8 pages, 6 free in 3
  // extents, largest 2").
  StatusOr<PageRuns> Allocate(std::uint64_t pages, PageState state);

  // Moves every page of `runs` from `from` to `to` (e.g. reserved to
  // committed). FailedPrecondition, changing nothing, if any page is not in
  // `from`, or `to` is kFree (use Free).
  Status Transition(const PageRuns& runs, PageState from, PageState to);

  // Returns the pages of `runs` to the free extents. FailedPrecondition,
  // changing nothing, if any page is free already or pinned.
  Status Free(const PageRuns& runs);

  // Adds / removes one pin on every page of `runs`. Pin: FailedPrecondition
  // if a page is free. Unpin: FailedPrecondition if a page has no pin. Either
  // way nothing changes on error.
  Status Pin(const PageRuns& runs);
  Status Unpin(const PageRuns& runs);

  // Pins on `page` (0 if out of range). For tests and assertions.
  std::uint32_t PinCount(std::uint32_t page) const;
  PageState StateOf(std::uint32_t page) const;

  // The bytes of `runs`, in order, as spans of whole pages. Does not check
  // states: the caller owns them.
  // REQUIRES: every run lies inside the pool.
  std::span<std::byte> RunBytes(const PageRun& run) const;
  // CRC32C of the first `bytes` bytes of the concatenation of `runs`.
  // REQUIRES: bytes <= runs.TotalPages() * page_bytes().
  std::uint32_t Crc32c(const PageRuns& runs, std::uint64_t bytes) const;
  // The CRC32C of each of the `slices` equal slices of the first `bytes`
  // bytes of `runs` into *out (resized), in one pass; returns the CRC of all
  // of them (folded, crc32c::Combine). REQUIRES: slices >= 1 and
  // bytes % slices == 0.
  std::uint32_t SliceCrc32c(const PageRuns& runs, std::uint64_t bytes, std::uint32_t slices,
                            std::vector<std::uint32_t>* out) const;
  // Copies `src` into the concatenation of `runs` (tests, staging reads).
  // REQUIRES: src.size() <= runs.TotalPages() * page_bytes().
  void CopyIn(const PageRuns& runs, std::span<const std::byte> src) const;

  PagePoolCounts Counts() const;

 private:
  HostPagePool(PoolMemory memory, std::uint64_t page_bytes, std::uint64_t page_count,
               MemoryLocker* locker, bool locked);

  Status CheckRunsLocked(const PageRuns& runs) const KVF_REQUIRES(mu_);
  void InsertExtentLocked(std::uint32_t start, std::uint32_t length) KVF_REQUIRES(mu_);
  void EraseExtentLocked(std::uint32_t start, std::uint32_t length) KVF_REQUIRES(mu_);
  void CountState(PageState state, std::int64_t delta) KVF_REQUIRES(mu_);

  const PoolMemory memory_;
  const std::uint64_t page_bytes_;
  const std::uint64_t page_count_;
  MemoryLocker* const locker_;
  const bool locked_;

  mutable Mutex mu_;
  std::vector<PageState> states_ KVF_GUARDED_BY(mu_);                         // one per page
  std::vector<std::uint32_t> pins_ KVF_GUARDED_BY(mu_);                       // one per page
  std::map<std::uint32_t, std::uint32_t> free_by_start_ KVF_GUARDED_BY(mu_);  // start -> length
  // The free extents again, ordered by (length, start).
  std::set<std::pair<std::uint32_t, std::uint32_t>> free_by_size_ KVF_GUARDED_BY(mu_);
  PagePoolCounts counts_ KVF_GUARDED_BY(mu_);
};

// Start-up arithmetic (ARCHITECTURE.md §5). One model the pool serves.
struct PoolModel {
  ModelFingerprint fingerprint;
  // N of "how many histories of N tokens fit" (--history-tokens). > 0.
  std::uint64_t history_tokens = 0;
};

// Returns the lines the daemon prints at start-up: pool bytes, page bytes,
// pages, the reserve kept free for in-flight writes (the pages above the high
// watermark: pages - floor(pages * high_watermark)), and for each model its
// block bytes, pages per block, blocks that fit below the high watermark and
// histories of N tokens that fit, e.g.
//   host pool: 8 GiB = 4096 pages x 2 MiB (remainder 0 B), lock-memory=required
//   write reserve: 410 pages (800 MiB) = 4096 - floor(4096 x 0.900) kept free by eviction
//   model=... block 2 MiB = 1 page; 3686 blocks fit = floor(3686 / 1); histories of 4096
//     tokens: 14 = floor(3686 / 256 blocks)
// InvalidArgument, with the formula and the setting to change
// (--host-pool-bytes, --host-page-bytes), if the sizes are invalid (as Create),
// a fingerprint is invalid, high_watermark is not in (0, 1], or any model
// cannot hold one block below the high watermark.
StatusOr<std::string> DescribePoolArithmetic(const HostPagePoolOptions& options,
                                             std::span<const PoolModel> models,
                                             double high_watermark);

// Validates the sizes alone (the checks Create does before looking at memory).
Status ValidatePoolSizes(const HostPagePoolOptions& options);

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_HOST_PAGE_POOL_H_
