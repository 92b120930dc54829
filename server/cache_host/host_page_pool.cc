#include "server/cache_host/host_page_pool.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/bus_cost_model.h"
#include "core/crc32c.h"
#include "core/errno_status.h"
#include "core/mutex.h"
#include "core/units.h"

namespace kvfabric::cache_host {
namespace {

constexpr std::uint64_t kTouchStride = 4096;
constexpr std::uint64_t kMaxPages = std::numeric_limits<std::uint32_t>::max();

class PosixMemoryLocker final : public MemoryLocker {
 public:
  StatusOr<std::optional<std::uint64_t>> MemlockLimit() override {
    rlimit limit{};
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
      return StatusFromErrno(errno, "getrlimit(RLIMIT_MEMLOCK)");
    }
    if (limit.rlim_cur == RLIM_INFINITY) return std::optional<std::uint64_t>();
    return std::optional<std::uint64_t>(limit.rlim_cur);
  }
  Status Lock(std::span<std::byte> bytes) override {
    if (mlock(bytes.data(), bytes.size()) != 0) {
      return StatusFromErrno(errno, "mlock of " + FormatBytesExact(bytes.size()));
    }
    return Status::OK();
  }
  void Unlock(std::span<std::byte> bytes) override { munlock(bytes.data(), bytes.size()); }
};

bool IsPowerOfTwo(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string LockHint(std::uint64_t pool_bytes) {
  return "lower --host-pool-bytes, raise the limit (`ulimit -l " +
         std::to_string((pool_bytes + 1023) / 1024) +
         "` in KiB, or LimitMEMLOCK=" + std::to_string(pool_bytes) +
         " in the systemd unit), or run with --lock-memory=best-effort or off";
}

}  // namespace

std::string_view LockModeName(LockMode mode) {
  switch (mode) {
    case LockMode::kRequired:
      return "required";
    case LockMode::kBestEffort:
      return "best-effort";
    case LockMode::kOff:
      return "off";
  }
  return "unknown";
}

StatusOr<LockMode> ParseLockMode(std::string_view name) {
  for (LockMode m : {LockMode::kRequired, LockMode::kBestEffort, LockMode::kOff}) {
    if (name == LockModeName(m)) return m;
  }
  return Status::InvalidArgument("--lock-memory=\"" + std::string(name) +
                                 "\": expected required, best-effort or off");
}

std::string_view PageStateName(PageState state) {
  switch (state) {
    case PageState::kFree:
      return "free";
    case PageState::kReserved:
      return "reserved";
    case PageState::kCommitted:
      return "committed";
    case PageState::kStaging:
      return "staging";
  }
  return "unknown";
}

MemoryLocker* MemoryLocker::Default() {
  static MemoryLocker* const locker = new PosixMemoryLocker();
  return locker;
}

StatusOr<PoolMemory> AllocateAnonymousPoolMemory(std::uint64_t bytes, bool huge_pages) {
  if (bytes == 0) return Status::InvalidArgument("pool memory of 0 bytes");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return Status::ResourceExhausted("mmap of " + FormatBytesExact(bytes) + " for the host pool: " +
                                     std::strerror(err) + "; lower --host-pool-bytes");
  }
  if (huge_pages) {
    // Advice only: without transparent huge pages the pool still works.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
  }
  PoolMemory memory;
  memory.bytes = std::span<std::byte>(static_cast<std::byte*>(p), bytes);
  memory.owner = std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  return memory;
}

std::string PreFaultReport::ToString() const {
  const double rate = micros == 0 ? 0.0 : static_cast<double>(bytes) / (micros / 1e6);
  return "pre-faulted " + FormatBytes(bytes) + " in " + FormatMicros(static_cast<double>(micros)) +
         (micros == 0 ? std::string() : " (" + FormatRate(rate) + ")");
}

Status ValidatePoolSizes(const HostPagePoolOptions& o) {
  if (o.page_bytes == 0 || !IsPowerOfTwo(o.page_bytes) || o.page_bytes < kMinHostPageBytes) {
    return Status::InvalidArgument("--host-page-bytes=" + std::to_string(o.page_bytes) +
                                   ": must be a power of two of at least " +
                                   FormatBytes(kMinHostPageBytes));
  }
  if (o.pool_bytes < o.page_bytes) {
    return Status::InvalidArgument(
        "--host-pool-bytes=" + FormatBytesExact(o.pool_bytes) +
        " holds no page of --host-page-bytes=" + FormatBytes(o.page_bytes) +
        ": pages = floor(pool / page) = 0; raise --host-pool-bytes");
  }
  if (o.pool_bytes / o.page_bytes > kMaxPages) {
    return Status::InvalidArgument("--host-pool-bytes=" + FormatBytesExact(o.pool_bytes) +
                                   " / --host-page-bytes=" + FormatBytes(o.page_bytes) + " = " +
                                   std::to_string(o.pool_bytes / o.page_bytes) +
                                   " pages, more than 2^32 - 1; raise --host-page-bytes");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<HostPagePool>> HostPagePool::Create(const HostPagePoolOptions& options,
                                                             PoolMemory memory,
                                                             MemoryLocker* locker) {
  KVF_RETURN_IF_ERROR(ValidatePoolSizes(options));
  if (locker == nullptr) locker = MemoryLocker::Default();
  if (memory.bytes.size() < options.pool_bytes) {
    return Status::InvalidArgument(
        "pool memory of " + FormatBytesExact(memory.bytes.size()) +
        " is shorter than --host-pool-bytes=" + FormatBytesExact(options.pool_bytes));
  }
  if (reinterpret_cast<std::uintptr_t>(memory.bytes.data()) % kTouchStride != 0) {
    return Status::InvalidArgument("pool memory is not aligned to 4096 bytes");
  }
  const std::uint64_t page_count = options.pool_bytes / options.page_bytes;
  const std::uint64_t bytes = page_count * options.page_bytes;
  std::span<std::byte> range = memory.bytes.first(bytes);

  bool locked = false;
  if (options.lock_mode == LockMode::kOff) {
    spdlog::info("host pool: pages are not locked (--lock-memory=off); they may be swapped out");
  } else {
    auto limit = locker->MemlockLimit();
    std::string refusal;
    if (!limit.ok()) {
      refusal = limit.status().ToString();
    } else if (limit->has_value() && **limit < bytes) {
      refusal = "--lock-memory=" + std::string(LockModeName(options.lock_mode)) +
                " needs RLIMIT_MEMLOCK >= pool bytes (pages x page bytes = " +
                std::to_string(page_count) + " x " + FormatBytes(options.page_bytes) + " = " +
                FormatBytesExact(bytes) + "), but RLIMIT_MEMLOCK is " + FormatBytesExact(**limit);
    } else {
      Status s = locker->Lock(range);
      if (s.ok()) {
        locked = true;
      } else {
        refusal = std::string(s.message());
      }
    }
    if (!locked) {
      if (options.lock_mode == LockMode::kRequired) {
        return Status::FailedPrecondition("host pool not locked: " + refusal + "; " +
                                          LockHint(bytes));
      }
      spdlog::warn("host pool: pages are not locked (--lock-memory=best-effort): {}", refusal);
    }
  }
  return std::unique_ptr<HostPagePool>(
      new HostPagePool(std::move(memory), options.page_bytes, page_count, locker, locked));
}

HostPagePool::HostPagePool(PoolMemory memory, std::uint64_t page_bytes, std::uint64_t page_count,
                           MemoryLocker* locker, bool locked)
    : memory_(std::move(memory)),
      page_bytes_(page_bytes),
      page_count_(page_count),
      locker_(locker),
      locked_(locked),
      states_(page_count, PageState::kFree),
      pins_(page_count, 0) {
  counts_.pages = page_count;
  counts_.free = page_count;
  InsertExtentLocked(0, static_cast<std::uint32_t>(page_count));
}

HostPagePool::~HostPagePool() {
  if (locked_) locker_->Unlock(memory());
}

PreFaultReport HostPagePool::PreFault(Env* env) {
  const std::span<std::byte> range = memory();
  const std::uint64_t start = env->NowMicros();
  for (std::uint64_t off = 0; off < range.size(); off += kTouchStride) {
    // The memory escapes (owner, transport), so these stores cannot be elided.
    range[off] = std::byte{0};
  }
  PreFaultReport report;
  report.bytes = range.size();
  report.micros = env->NowMicros() - start;
  return report;
}

void HostPagePool::InsertExtentLocked(std::uint32_t start, std::uint32_t length) {
  free_by_start_.emplace(start, length);
  free_by_size_.emplace(length, start);
}

void HostPagePool::EraseExtentLocked(std::uint32_t start, std::uint32_t length) {
  free_by_start_.erase(start);
  free_by_size_.erase({length, start});
}

void HostPagePool::CountState(PageState state, std::int64_t delta) {
  switch (state) {
    case PageState::kFree:
      counts_.free += delta;
      break;
    case PageState::kReserved:
      counts_.reserved += delta;
      break;
    case PageState::kCommitted:
      counts_.committed += delta;
      break;
    case PageState::kStaging:
      counts_.staging += delta;
      break;
  }
}

StatusOr<PageRuns> HostPagePool::Allocate(std::uint64_t pages, PageState state) {
  if (pages == 0) return Status::InvalidArgument("allocation of 0 pages");
  if (state != PageState::kReserved && state != PageState::kStaging) {
    return Status::InvalidArgument("pages are allocated as reserved or staging, not " +
                                   std::string(PageStateName(state)));
  }
  MutexLock lock(&mu_);
  PageRuns out;
  auto best = pages <= kMaxPages ? free_by_size_.lower_bound({static_cast<std::uint32_t>(pages), 0})
                                 : free_by_size_.end();
  if (best != free_by_size_.end()) {
    out.runs[0] = {best->second, static_cast<std::uint32_t>(pages)};
    out.size = 1;
  } else if (pages <= counts_.free) {
    // Gather the longest extents, longest first.
    std::uint64_t need = pages;
    for (auto it = free_by_size_.rbegin(); it != free_by_size_.rend() && need > 0; ++it) {
      if (out.size == kMaxRunsPerBlock) break;
      const std::uint32_t take =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(it->first, need));
      out.runs[out.size++] = {it->second, take};
      need -= take;
    }
    if (need > 0) out.size = 0;
  }
  if (out.empty()) {
    ++counts_.allocation_refusals;
    const std::uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    return Status::ResourceExhausted(
        "host pool: need " + std::to_string(pages) + " pages, " + std::to_string(counts_.free) +
        " of " + std::to_string(page_count_) + " free in " + std::to_string(free_by_start_.size()) +
        " extents, largest " + std::to_string(largest) + " (a block may span at most " +
        std::to_string(kMaxRunsPerBlock) + " runs)");
  }
  for (const PageRun& run : out) {
    const std::uint32_t length = free_by_start_.at(run.first);
    EraseExtentLocked(run.first, length);
    if (length > run.count) InsertExtentLocked(run.first + run.count, length - run.count);
    for (std::uint32_t p = run.first; p < run.first + run.count; ++p) states_[p] = state;
  }
  CountState(PageState::kFree, -static_cast<std::int64_t>(pages));
  CountState(state, static_cast<std::int64_t>(pages));
  ++counts_.allocations;
  if (out.size > 1) ++counts_.split_allocations;
  return out;
}

Status HostPagePool::CheckRunsLocked(const PageRuns& runs) const {
  if (runs.empty() || runs.size > kMaxRunsPerBlock) {
    return Status::FailedPrecondition("host pool: empty or oversized page list");
  }
  for (const PageRun& r : runs) {
    if (r.count == 0 || std::uint64_t{r.first} + r.count > page_count_) {
      return Status::FailedPrecondition("host pool: " + runs.ToString() + " outside " +
                                        std::to_string(page_count_) + " pages");
    }
  }
  return Status::OK();
}

Status HostPagePool::Transition(const PageRuns& runs, PageState from, PageState to) {
  if (to == PageState::kFree) return Status::FailedPrecondition("use Free to free pages");
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckRunsLocked(runs));
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (states_[p] != from) {
        return Status::FailedPrecondition("host pool: page " + std::to_string(p) + " is " +
                                          std::string(PageStateName(states_[p])) + ", not " +
                                          std::string(PageStateName(from)));
      }
    }
  }
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) states_[p] = to;
  }
  const auto n = static_cast<std::int64_t>(runs.TotalPages());
  CountState(from, -n);
  CountState(to, n);
  return Status::OK();
}

Status HostPagePool::Free(const PageRuns& runs) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckRunsLocked(runs));
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (states_[p] == PageState::kFree) {
        return Status::FailedPrecondition("host pool: page " + std::to_string(p) +
                                          " is free already");
      }
      if (pins_[p] != 0) {
        return Status::FailedPrecondition("host pool: page " + std::to_string(p) + " has " +
                                          std::to_string(pins_[p]) + " pins; not freed");
      }
    }
  }
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      CountState(states_[p], -1);
      states_[p] = PageState::kFree;
    }
    std::uint32_t start = r.first;
    std::uint32_t length = r.count;
    auto next = free_by_start_.lower_bound(start);
    if (next != free_by_start_.end() && next->first == start + length) {
      const std::uint32_t next_len = next->second;
      EraseExtentLocked(start + length, next_len);
      length += next_len;
    }
    auto after = free_by_start_.lower_bound(start);
    if (after != free_by_start_.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == start) {
        const std::uint32_t prev_start = prev->first;
        const std::uint32_t prev_len = prev->second;
        EraseExtentLocked(prev_start, prev_len);
        start = prev_start;
        length += prev_len;
      }
    }
    InsertExtentLocked(start, length);
  }
  counts_.free += runs.TotalPages();
  return Status::OK();
}

Status HostPagePool::Pin(const PageRuns& runs) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckRunsLocked(runs));
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (states_[p] == PageState::kFree) {
        return Status::FailedPrecondition("host pool: cannot pin free page " + std::to_string(p));
      }
    }
  }
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (pins_[p]++ == 0) ++counts_.leased;
    }
  }
  return Status::OK();
}

Status HostPagePool::Unpin(const PageRuns& runs) {
  MutexLock lock(&mu_);
  KVF_RETURN_IF_ERROR(CheckRunsLocked(runs));
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (pins_[p] == 0) {
        return Status::FailedPrecondition("host pool: page " + std::to_string(p) +
                                          " is not pinned");
      }
    }
  }
  for (const PageRun& r : runs) {
    for (std::uint32_t p = r.first; p < r.first + r.count; ++p) {
      if (--pins_[p] == 0) --counts_.leased;
    }
  }
  return Status::OK();
}

std::uint32_t HostPagePool::PinCount(std::uint32_t page) const {
  MutexLock lock(&mu_);
  return page < page_count_ ? pins_[page] : 0;
}

PageState HostPagePool::StateOf(std::uint32_t page) const {
  MutexLock lock(&mu_);
  return page < page_count_ ? states_[page] : PageState::kFree;
}

std::span<std::byte> HostPagePool::RunBytes(const PageRun& run) const {
  return memory_.bytes.subspan(std::uint64_t{run.first} * page_bytes_,
                               std::uint64_t{run.count} * page_bytes_);
}

std::uint32_t HostPagePool::Crc32c(const PageRuns& runs, std::uint64_t bytes) const {
  std::uint32_t crc = 0;
  for (const PageRun& r : runs) {
    if (bytes == 0) break;
    std::span<std::byte> span = RunBytes(r);
    const std::uint64_t n = std::min<std::uint64_t>(bytes, span.size());
    crc = crc32c::Extend(crc, span.data(), n);
    bytes -= n;
  }
  return crc;
}

std::uint32_t HostPagePool::SliceCrc32c(const PageRuns& runs, std::uint64_t bytes,
                                        std::uint32_t slices,
                                        std::vector<std::uint32_t>* out) const {
  out->assign(slices, 0);
  const std::uint64_t slice_bytes = bytes / slices;
  std::uint32_t slice = 0;
  std::uint64_t in_slice = 0;  // bytes of the current slice seen
  for (const PageRun& r : runs) {
    std::span<std::byte> span = RunBytes(r);
    std::uint64_t at = 0;
    while (at < span.size() && slice < slices) {
      const std::uint64_t n = std::min<std::uint64_t>(span.size() - at, slice_bytes - in_slice);
      (*out)[slice] = crc32c::Extend((*out)[slice], span.data() + at, n);
      at += n;
      in_slice += n;
      if (in_slice == slice_bytes) {
        ++slice;
        in_slice = 0;
      }
    }
    if (slice == slices) break;
  }
  const std::uint32_t shift = crc32c::ShiftFor(slice_bytes);
  std::uint32_t whole = (*out)[0];
  for (std::uint32_t s = 1; s < slices; ++s)
    whole = crc32c::CombineShifted(whole, (*out)[s], shift);
  return whole;
}

void HostPagePool::CopyIn(const PageRuns& runs, std::span<const std::byte> src) const {
  for (const PageRun& r : runs) {
    if (src.empty()) break;
    std::span<std::byte> span = RunBytes(r);
    const std::uint64_t n = std::min<std::uint64_t>(src.size(), span.size());
    std::memcpy(span.data(), src.data(), n);
    src = src.subspan(n);
  }
}

PagePoolCounts HostPagePool::Counts() const {
  MutexLock lock(&mu_);
  PagePoolCounts c = counts_;
  c.free_extents = free_by_start_.size();
  c.largest_free_extent = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return c;
}

StatusOr<std::string> DescribePoolArithmetic(const HostPagePoolOptions& options,
                                             std::span<const PoolModel> models,
                                             double high_watermark) {
  KVF_RETURN_IF_ERROR(ValidatePoolSizes(options));
  if (!(high_watermark > 0 && high_watermark <= 1)) {
    return Status::InvalidArgument("--host-high-watermark=" + std::to_string(high_watermark) +
                                   ": must be in (0, 1]");
  }
  const std::uint64_t pages = options.pool_bytes / options.page_bytes;
  const std::uint64_t page = options.page_bytes;
  const auto usable =
      static_cast<std::uint64_t>(std::floor(static_cast<double>(pages) * high_watermark));
  const std::uint64_t reserve = pages - usable;
  char wm[32];
  std::snprintf(wm, sizeof(wm), "%.3f", high_watermark);

  std::string out = "host pool: " + FormatBytesExact(options.pool_bytes) + " = " +
                    std::to_string(pages) + " pages x " + FormatBytes(page) + " (remainder " +
                    FormatBytesExact(options.pool_bytes - pages * page) +
                    "), lock-memory=" + std::string(LockModeName(options.lock_mode)) + "\n";
  out += "write reserve: " + std::to_string(reserve) + " pages (" +
         FormatBytesExact(reserve * page) + ") = " + std::to_string(pages) + " - floor(" +
         std::to_string(pages) + " x " + wm + ") kept free for in-flight writes by eviction\n";
  for (const PoolModel& m : models) {
    KVF_ASSIGN_OR_RETURN(const std::uint64_t block, m.fingerprint.BlockBytes());
    if (m.history_tokens == 0) {
      return Status::InvalidArgument("--history-tokens must be > 0");
    }
    const std::uint64_t per_block = (block + page - 1) / page;
    const std::uint64_t blocks = usable / per_block;
    const std::uint64_t tpb = m.fingerprint.tokens_per_block;
    const std::uint64_t blocks_per_history = (m.history_tokens + tpb - 1) / tpb;
    const std::string model =
        "model " + m.fingerprint.model_id + " layers [" +
        std::to_string(m.fingerprint.first_layer) + "," +
        std::to_string(m.fingerprint.first_layer + m.fingerprint.layer_count) + ")";
    const std::string formula =
        "blocks = floor(usable pages / pages per block) = floor(" + std::to_string(usable) + " / " +
        std::to_string(per_block) + ") = " + std::to_string(blocks) + ", pages per block = ceil(" +
        FormatBytesExact(block) + " / " + FormatBytes(page) + ") = " + std::to_string(per_block) +
        ", usable pages = floor(" + std::to_string(pages) + " x " + wm +
        ") = " + std::to_string(usable);
    if (blocks == 0) {
      return Status::InvalidArgument(
          "host pool cannot hold one block of " + model + ": " + formula +
          "; raise --host-pool-bytes to at least " +
          FormatBytesExact(static_cast<std::uint64_t>(
                               std::ceil(static_cast<double>(per_block) / high_watermark)) *
                           page));
    }
    out += model + ": block " + FormatBytesExact(block) + " = " + std::to_string(per_block) +
           " pages (" + FormatBytesExact(per_block * page - block) + " unused per block); " +
           formula + "; histories of " + std::to_string(m.history_tokens) +
           " tokens: " + std::to_string(blocks / blocks_per_history) + " = floor(" +
           std::to_string(blocks) + " / " + std::to_string(blocks_per_history) + " blocks)\n";
  }
  return out;
}

}  // namespace kvfabric::cache_host
