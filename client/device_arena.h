// DeviceArena: the bounded device working set. It carves one Device arena of
// explicit size into fixed-size pages and decides, with arithmetic it can
// print, which context holds which page.
//
// Layout of the arena (byte offsets from its start):
//   [0, scratch)                      kernel scratch (queries, per-tile outputs
//                                     and LSEs), handed out by the caller
//   [scratch, + staging × page)       staging pages for streamed tiles
//                                     (AcquireStaging / ReleaseStaging)
//   [.., + pool × page)               the pool: pages lent to contexts
//   the remainder (< one page)        unused
// `scratch` is DeviceArenaOptions::scratch_bytes rounded up to 256 bytes.
//
// Budgets. Every context is admitted with a floor (pages it needs to run,
// committed at admission even before they are mapped), a target (pages it may
// hold by right) and a burst (pages above target it may borrow while they are
// free). Admission does the arithmetic first and refuses with a Status whose
// message carries the formula with its numbers; the refusal is logged once.
//
// Reclamation, in this fixed order, each step counted in DeviceArenaMetrics:
//   1. burst pages (held above target) of other contexts, least recently
//      active context first;
//   2. pages between floor and target of other contexts that were active less
//      recently than the requester (for an admission: of every context), least
//      recently active first;
//   3. the requester's own coldest page (it recycles its own history).
// A context grows into step 1 and 2 only while it is below its target; above
// target it borrows free pages only, and otherwise recycles its own (step 3).
// Within a victim the page with the oldest use is taken (ties: lowest logical
// index). Never reclaimed: pages at or below a context's floor, and hot pages of
// an active context: its attention-sink page (logical page 0) and its
// `hot_newest_pages` newest pages (the frontier is one past the highest logical
// page ever acquired).
//
// Residency: each context tracks, per logical page, whether it is resident and
// how often it was copied in. Acquiring a non-resident page below the frontier
// returns copy_in = true (the caller copies the history in, once); acquiring it
// again while resident returns copy_in = false.
//
// Ownership: the arena does not own the Device or its memory; it hands out
// DeviceRange offsets. Thread safety: every method may be called from any
// thread (one internal mutex). AdmitContext allocates (call at admission, not
// per step); AcquirePage, Touch, AcquireStaging and ReleaseStaging allocate
// nothing.
#ifndef KVFABRIC_CLIENT_DEVICE_ARENA_H_
#define KVFABRIC_CLIENT_DEVICE_ARENA_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "gpu/kernel_args.h"

namespace kvfabric::client {

// How a refusal spells each setting it tells the caller to change: by default
// the flags (the C++ API's names, as in the comments below); an API that
// exposes the settings under other names sets its own, so that its caller
// reads the name it wrote (the C API: "options->device_staging_pages").
// scratch_bytes and hot_newest_pages may be empty: settings that API does not
// expose, which its refusals then do not suggest. The others must be named.
struct DeviceArenaSettingNames {
  std::string arena_bytes = "--device-arena-bytes";  // Device's arena (DeviceOptions)
  std::string page_bytes = "--device-page-bytes";
  std::string staging_pages = "--device-staging-pages";
  std::string scratch_bytes = "--device-scratch-bytes";
  std::string context_floor_pages = "--device-context-floor-pages";
  std::string hot_newest_pages = "--device-hot-newest-pages";
};

// The flag names below are the settings a refusal tells the operator to change
// (unless setting_names says otherwise).
struct DeviceArenaOptions {
  // Bytes per page (--device-page-bytes). No default: 0 is refused. Larger pages
  // mean fewer copies and more waste in partly filled pages.
  std::uint64_t page_bytes = 0;
  // Pages reserved for staging streamed tiles (--device-staging-pages). No
  // default: 0 is refused. Two tiles' worth double-buffers the stream.
  std::uint32_t staging_pages = 0;
  // Bytes at the start of the arena for kernel scratch (--device-scratch-bytes).
  // Default 0.
  std::uint64_t scratch_bytes = 0;
  // The floor of one context, in pages (--device-context-floor-pages): start-up
  // refuses an arena that cannot hold one such floor plus the staging pages,
  // and prints how many contexts at this floor fit. No default: 0 is refused.
  std::uint32_t context_floor_pages = 0;
  // Newest pages of each active context kept hot, besides its attention-sink
  // page (--device-hot-newest-pages). Default 1. Every floor must be at least
  // 1 + hot_newest_pages.
  std::uint32_t hot_newest_pages = 1;
  // The names refusals use for the settings above.
  DeviceArenaSettingNames setting_names;
};

struct ContextBudget {
  std::uint32_t floor = 0;   // pages needed to run; >= 1 + hot_newest_pages
  std::uint32_t target = 0;  // pages held by right; >= floor
  std::uint32_t burst = 0;   // pages above target borrowed while free
  // Logical pages the context may address: [0, logical_pages). Sizes the
  // residency table (allocated at admission).
  std::uint32_t logical_pages = 0;
};

// Counters since creation, and the current state. Plain values (a snapshot).
struct DeviceArenaMetrics {
  std::uint64_t admissions = 0;
  std::uint64_t admission_refusals = 0;
  std::uint64_t page_refusals = 0;          // AcquirePage refused
  std::uint64_t pages_mapped = 0;           // logical pages given a physical page
  std::uint64_t page_hits = 0;              // AcquirePage of a resident page
  std::uint64_t copy_ins = 0;               // mappings below the frontier
  std::uint64_t reclaimed_burst = 0;        // step 1
  std::uint64_t reclaimed_above_floor = 0;  // step 2
  std::uint64_t reclaimed_own = 0;          // step 3
  std::uint64_t released_with_context = 0;  // pages returned by ReleaseContext
  std::uint64_t staging_refusals = 0;

  std::uint32_t pool_pages = 0;
  std::uint32_t staging_pages = 0;
  std::uint32_t contexts = 0;
  std::uint32_t held_pages = 0;       // mapped pool pages
  std::uint32_t committed_pages = 0;  // sum over contexts of max(held, floor)
  std::uint32_t free_pages = 0;       // pool - committed
  std::uint32_t peak_held_pages = 0;
  std::uint32_t staging_in_use = 0;
  std::uint32_t peak_staging_in_use = 0;
};

struct PageGrant {
  gpu::DeviceRange range;  // the physical page
  bool copy_in = false;    // the caller must copy this page's history in
};

class DeviceArena {
 public:
  // Validates `options` against `arena_bytes` (usually Device::arena_bytes()),
  // logs the start-up arithmetic (DescribeLayout), and refuses with
  // InvalidArgument, naming the setting, a page size of 0, no staging pages, a
  // floor of 0 or below 1 + hot_newest_pages, or an arena that cannot hold one
  // context's floor plus the staging pages.
  static StatusOr<std::unique_ptr<DeviceArena>> Create(std::uint64_t arena_bytes,
                                                       const DeviceArenaOptions& options);

  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Admits context `id` with `budget`, committing its floor (reclaiming from
  // others in the fixed order if needed) and marking it active and most recent.
  // InvalidArgument for a bad budget, AlreadyExists for a known id,
  // ResourceExhausted (formula in the message, logged once) if the floor does
  // not fit even after reclamation.
  Status AdmitContext(std::uint64_t id, const ContextBudget& budget);
  // Returns every page of `id` to the pool. NotFound for an unknown id.
  Status ReleaseContext(std::uint64_t id);

  // Marks `id` most recently active (and active). NotFound for an unknown id.
  Status Touch(std::uint64_t id);
  // An inactive context's hot pages become reclaimable (never below floor).
  Status SetActive(std::uint64_t id, bool active);

  // Maps logical page `logical_page` of `id` (see the class comment) and marks
  // it most recently used. OutOfRange beyond the budget's logical_pages;
  // ResourceExhausted (formula, logged once) when no page can be found.
  StatusOr<PageGrant> AcquirePage(std::uint64_t id, std::uint32_t logical_page);

  // Residency of a logical page, and how often it was copied in.
  StatusOr<bool> IsResident(std::uint64_t id, std::uint32_t logical_page) const;
  StatusOr<std::uint32_t> CopyIns(std::uint64_t id, std::uint32_t logical_page) const;

  // `pages` contiguous staging pages (first fit). ResourceExhausted when the
  // staging region has no such run. REQUIRES: pages > 0.
  StatusOr<gpu::DeviceRange> AcquireStaging(std::uint32_t pages);
  // REQUIRES: `range` came from AcquireStaging and is not yet released.
  Status ReleaseStaging(gpu::DeviceRange range);

  // The scratch region [0, scratch_bytes rounded up).
  gpu::DeviceRange scratch() const { return {0, scratch_bytes_}; }
  std::uint64_t page_bytes() const { return options_.page_bytes; }
  DeviceArenaMetrics metrics() const;

  // The start-up arithmetic, one line.
  std::string DescribeLayout() const;

 private:
  struct Page {
    std::uint32_t physical = 0;  // index into the pool; valid while resident
    bool resident = false;
    std::uint32_t copy_ins = 0;
    std::uint64_t last_use = 0;
  };
  struct Context {
    std::uint64_t id = 0;
    ContextBudget budget;
    std::vector<Page> pages;
    std::uint32_t held = 0;
    std::uint32_t frontier = 0;  // one past the highest logical page acquired
    std::uint64_t last_active = 0;
    bool active = true;
  };
  enum class Step { kBurst, kAboveFloor };

  DeviceArena(std::uint64_t arena_bytes, const DeviceArenaOptions& options,
              std::uint64_t scratch_bytes, std::uint32_t pool_pages);

  bool IsHot(const Context& c, std::uint32_t logical_page) const;
  // Pages `c` can give up in `step`.
  std::uint32_t Reclaimable(const Context& c, Step step) const;
  // Least recently active context other than `requester` with a page to give
  // in `step`, active before `before_tick`; nullptr if none.
  Context* PickVictim(Step step, const Context* requester, std::uint64_t before_tick);
  // Unmaps the coldest non-hot resident page of `c` and returns it to the
  // free list. False if `c` has none.
  bool EvictColdest(Context& c);
  // Makes sure the free list holds a page for `c`: free pages, then steps 1-3
  // per the class comment. `previously_active` is c's recency before this
  // request (step 2 takes only from contexts less recent than that).
  Status FindPageFor(Context& c, std::uint32_t logical_page, std::uint64_t previously_active);
  std::uint32_t CommittedLocked() const;
  std::string ArithmeticLocked() const;
  gpu::DeviceRange PoolRange(std::uint32_t physical) const;

  const std::uint64_t arena_bytes_;
  const DeviceArenaOptions options_;
  const std::uint64_t scratch_bytes_;
  const std::uint32_t pool_pages_;

  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Context>> contexts_;  // GUARDED_BY(mu_)
  std::vector<std::uint32_t> free_list_;  // GUARDED_BY(mu_); capacity pool_pages_
  std::vector<bool> staging_used_;        // GUARDED_BY(mu_)
  std::uint64_t tick_ = 0;                // GUARDED_BY(mu_)
  DeviceArenaMetrics m_;                  // GUARDED_BY(mu_); counters only
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_DEVICE_ARENA_H_
