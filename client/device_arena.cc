#include "client/device_arena.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "client/client_log.h"
#include "core/units.h"

namespace kvfabric::client {
namespace {

constexpr std::uint64_t kScratchAlignment = 256;

std::string Num(std::uint64_t v) { return std::to_string(v); }

}  // namespace

StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(std::uint64_t arena_bytes,
                                                           const DeviceArenaOptions& options) {
  const DeviceArenaSettingNames& names = options.setting_names;
  if (options.page_bytes == 0) {
    return Status::InvalidArgument("device arena: page size 0 (set " + names.page_bytes + ")");
  }
  if (options.staging_pages == 0) {
    return Status::InvalidArgument("device arena: 0 staging pages cannot stream a tile (set " +
                                   names.staging_pages + ")");
  }
  if (options.context_floor_pages == 0 ||
      options.context_floor_pages < 1 + std::uint64_t{options.hot_newest_pages}) {
    return Status::InvalidArgument(
        "device arena: context floor " + Num(options.context_floor_pages) +
        " pages < 1 sink page + " + Num(options.hot_newest_pages) + " hot newest pages (raise " +
        names.context_floor_pages +
        (names.hot_newest_pages.empty() ? "" : " or lower " + names.hot_newest_pages) + ")");
  }
  if (options.scratch_bytes > arena_bytes) {
    return Status::InvalidArgument(
        "device arena: scratch " + FormatBytesExact(options.scratch_bytes) + " > arena " +
        FormatBytesExact(arena_bytes) + " (" +
        (names.scratch_bytes.empty() ? "" : "lower " + names.scratch_bytes + " or ") + "raise " +
        names.arena_bytes + ")");
  }
  const std::uint64_t scratch =
      (options.scratch_bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  const std::uint64_t paged_bytes = arena_bytes > scratch ? arena_bytes - scratch : 0;
  const std::uint64_t pages = paged_bytes / options.page_bytes;
  const std::uint64_t needed =
      std::uint64_t{options.staging_pages} + std::uint64_t{options.context_floor_pages};
  if (pages < needed) {
    const std::uint64_t min_bytes = scratch + needed * options.page_bytes;
    return Status::InvalidArgument(
        "device arena: " + FormatBytesExact(arena_bytes) + " - scratch " + FormatBytes(scratch) +
        " holds " + Num(pages) + " pages of " + FormatBytes(options.page_bytes) + " < staging " +
        Num(options.staging_pages) + " + one context's floor " + Num(options.context_floor_pages) +
        " = " + Num(needed) + " pages: raise " + names.arena_bytes + " to at least " +
        FormatBytesExact(min_bytes) + ", or lower " + names.staging_pages + ", " +
        names.context_floor_pages + " or " + names.page_bytes);
  }
  const std::uint64_t pool = pages - options.staging_pages;
  if (pool > std::numeric_limits<std::uint32_t>::max()) {
    return Status::InvalidArgument("device arena: " + Num(pool) +
                                   " pool pages exceed 2^32 - 1 (raise " + names.page_bytes + ")");
  }
  std::unique_ptr<DeviceArena> arena(
      new DeviceArena(arena_bytes, options, scratch, static_cast<std::uint32_t>(pool)));
  Log().info("{}", arena->DescribeLayout());
  return arena;
}

DeviceArena::DeviceArena(std::uint64_t arena_bytes, const DeviceArenaOptions& options,
                         std::uint64_t scratch_bytes, std::uint32_t pool_pages)
    : arena_bytes_(arena_bytes),
      options_(options),
      scratch_bytes_(scratch_bytes),
      pool_pages_(pool_pages),
      staging_used_(options.staging_pages, false) {
  free_list_.reserve(pool_pages_);
  // Lowest page index popped first.
  for (std::uint32_t i = pool_pages_; i > 0; --i) free_list_.push_back(i - 1);
  m_.pool_pages = pool_pages_;
  m_.staging_pages = options.staging_pages;
}

std::string DeviceArena::DescribeLayout() const {
  const std::uint64_t page = options_.page_bytes;
  const std::uint64_t used =
      scratch_bytes_ + (std::uint64_t{options_.staging_pages} + pool_pages_) * page;
  return "device arena: " + FormatBytesExact(arena_bytes_) + " = scratch " +
         FormatBytes(scratch_bytes_) + " + staging " + Num(options_.staging_pages) +
         " pages + pool " + Num(pool_pages_) + " pages, of " + FormatBytesExact(page) +
         " each, + " + FormatBytes(arena_bytes_ - used) + " unused; contexts at floor " +
         Num(options_.context_floor_pages) +
         " pages that fit: " + Num(pool_pages_ / options_.context_floor_pages) +
         "; hot pages per context: 1 sink + " + Num(options_.hot_newest_pages) + " newest";
}

gpu::DeviceRange DeviceArena::PoolRange(std::uint32_t physical) const {
  const std::uint64_t page = options_.page_bytes;
  return {scratch_bytes_ + (std::uint64_t{options_.staging_pages} + physical) * page, page};
}

bool DeviceArena::IsHot(const Context& c, std::uint32_t logical_page) const {
  if (!c.active) return false;
  if (logical_page == 0) return true;
  return std::uint64_t{logical_page} + options_.hot_newest_pages >= c.frontier;
}

std::uint32_t DeviceArena::Reclaimable(const Context& c, Step step) const {
  const std::uint32_t target = c.budget.target;
  const std::uint32_t floor = c.budget.floor;
  if (step == Step::kBurst) return c.held > target ? c.held - target : 0;
  const std::uint32_t upto = std::min(c.held, target);
  return upto > floor ? upto - floor : 0;
}

std::uint32_t DeviceArena::CommittedLocked() const {
  std::uint32_t committed = 0;
  for (const auto& [id, c] : contexts_) committed += std::max(c->held, c->budget.floor);
  return committed;
}

DeviceArena::Context* DeviceArena::PickVictim(Step step, const Context* requester,
                                              std::uint64_t before_tick) {
  Context* best = nullptr;
  for (auto& [id, c] : contexts_) {
    if (c.get() == requester || Reclaimable(*c, step) == 0) continue;
    if (step == Step::kAboveFloor && c->last_active >= before_tick) continue;
    if (best == nullptr || c->last_active < best->last_active ||
        (c->last_active == best->last_active && c->id < best->id)) {
      best = c.get();
    }
  }
  return best;
}

bool DeviceArena::EvictColdest(Context& c) {
  Page* coldest = nullptr;
  for (std::uint32_t i = 0; i < c.pages.size(); ++i) {
    Page& p = c.pages[i];
    if (!p.resident || IsHot(c, i)) continue;
    if (coldest == nullptr || p.last_use < coldest->last_use) coldest = &p;
  }
  if (coldest == nullptr) return false;
  coldest->resident = false;
  free_list_.push_back(coldest->physical);
  --c.held;
  return true;
}

std::string DeviceArena::ArithmeticLocked() const {
  std::uint32_t held = 0, burst = 0, above_floor = 0;
  for (const auto& [id, c] : contexts_) {
    held += c->held;
    burst += Reclaimable(*c, Step::kBurst);
    above_floor += Reclaimable(*c, Step::kAboveFloor);
  }
  const std::uint32_t committed = CommittedLocked();
  return "pool " + Num(pool_pages_) + " = held " + Num(held) + " + committed-unmapped " +
         Num(committed - held) + " + free " + Num(pool_pages_ - committed) +
         "; reclaimable: burst " + Num(burst) + " + above-floor " + Num(above_floor) +
         "; staging " + Num(options_.staging_pages) + " pages separate; " + Num(contexts_.size()) +
         " contexts";
}

Status DeviceArena::FindPageFor(Context& c, std::uint32_t logical_page,
                                std::uint64_t previously_active) {
  const std::uint32_t committed = CommittedLocked();
  const std::uint32_t free = pool_pages_ - committed;
  if (c.held < c.budget.floor) return Status::OK();  // committed at admission
  const bool below_target = c.held < c.budget.target;
  const bool below_max = std::uint64_t{c.held} < std::uint64_t{c.budget.target} + c.budget.burst;
  if ((below_target || below_max) && free > 0) return Status::OK();
  if (below_target) {
    if (Context* v = PickVictim(Step::kBurst, &c, 0); v != nullptr && EvictColdest(*v)) {
      ++m_.reclaimed_burst;
      return Status::OK();
    }
    if (Context* v = PickVictim(Step::kAboveFloor, &c, previously_active);
        v != nullptr && EvictColdest(*v)) {
      ++m_.reclaimed_above_floor;
      return Status::OK();
    }
  }
  if (EvictColdest(c)) {
    ++m_.reclaimed_own;
    return Status::OK();
  }
  ++m_.page_refusals;
  Status s = Status::ResourceExhausted(
      "page for ctx " + Num(c.id) + " logical page " + Num(logical_page) + ": held " + Num(c.held) +
      " (floor " + Num(c.budget.floor) + ", target " + Num(c.budget.target) + ", burst " +
      Num(c.budget.burst) + "), free " + Num(free) +
      (below_max ? "" : " (not lendable: held >= target + burst)") +
      ", nothing reclaimable from others, and every resident page of ctx " + Num(c.id) +
      " is hot (1 sink + " + Num(options_.hot_newest_pages) + " newest); " + ArithmeticLocked());
  Log().warn("device arena: {}", s.message());
  return s;
}

Status DeviceArena::AdmitContext(std::uint64_t id, const ContextBudget& budget) {
  std::lock_guard<std::mutex> lock(mu_);
  if (budget.floor < 1 + std::uint64_t{options_.hot_newest_pages} || budget.target < budget.floor ||
      budget.logical_pages == 0) {
    return Status::InvalidArgument(
        "admit ctx " + Num(id) + ": floor " + Num(budget.floor) + ", target " + Num(budget.target) +
        ", logical pages " + Num(budget.logical_pages) + ": need floor >= 1 + hot newest " +
        Num(options_.hot_newest_pages) + ", target >= floor, logical pages > 0");
  }
  if (contexts_.count(id) != 0) {
    return Status::AlreadyExists("admit ctx " + Num(id) + ": already admitted");
  }
  const std::uint32_t free = pool_pages_ - CommittedLocked();
  if (budget.floor > free) {
    std::uint32_t reclaimable = 0;
    for (const auto& [cid, c] : contexts_) {
      reclaimable += Reclaimable(*c, Step::kBurst) + Reclaimable(*c, Step::kAboveFloor);
    }
    if (budget.floor > free + reclaimable) {
      ++m_.admission_refusals;
      Status s = Status::ResourceExhausted(
          "admit ctx " + Num(id) + ": floor " + Num(budget.floor) + " pages > free " + Num(free) +
          " + reclaimable " + Num(reclaimable) + " (" + ArithmeticLocked() +
          "); wait for a context to finish, lower the context floor (" +
          options_.setting_names.context_floor_pages + "), or raise " +
          options_.setting_names.arena_bytes);
      Log().warn("device arena: {}", s.message());
      return s;
    }
    std::uint32_t need = budget.floor - free;
    for (Step step : {Step::kBurst, Step::kAboveFloor}) {
      while (need > 0) {
        Context* v = PickVictim(step, nullptr, std::numeric_limits<std::uint64_t>::max());
        if (v == nullptr || !EvictColdest(*v)) break;
        ++(step == Step::kBurst ? m_.reclaimed_burst : m_.reclaimed_above_floor);
        --need;
      }
    }
    if (need > 0) return Status::Internal("admit ctx " + Num(id) + ": reclamation fell short");
  }
  auto c = std::make_unique<Context>();
  c->id = id;
  c->budget = budget;
  c->pages.resize(budget.logical_pages);
  c->last_active = ++tick_;
  contexts_.emplace(id, std::move(c));
  ++m_.admissions;
  return Status::OK();
}

Status DeviceArena::ReleaseContext(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return Status::NotFound("release ctx " + Num(id) + ": not admitted");
  for (Page& p : it->second->pages) {
    if (!p.resident) continue;
    free_list_.push_back(p.physical);
    ++m_.released_with_context;
  }
  contexts_.erase(it);
  return Status::OK();
}

Status DeviceArena::Touch(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return Status::NotFound("touch ctx " + Num(id) + ": not admitted");
  it->second->last_active = ++tick_;
  it->second->active = true;
  return Status::OK();
}

Status DeviceArena::SetActive(std::uint64_t id, bool active) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end())
    return Status::NotFound("set active ctx " + Num(id) + ": not admitted");
  it->second->active = active;
  return Status::OK();
}

StatusOr<PageGrant> DeviceArena::AcquirePage(std::uint64_t id, std::uint32_t logical_page) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end())
    return Status::NotFound("acquire page: ctx " + Num(id) + " not admitted");
  Context& c = *it->second;
  if (logical_page >= c.pages.size()) {
    return Status::OutOfRange("acquire page: ctx " + Num(id) + " logical page " +
                              Num(logical_page) + " >= " + Num(c.pages.size()) +
                              " logical pages of its budget");
  }
  // Step 2 compares the requester's recency before this request.
  const std::uint64_t previously_active = c.last_active;
  c.last_active = ++tick_;
  c.active = true;
  Page& page = c.pages[logical_page];
  if (page.resident) {
    page.last_use = tick_;
    ++m_.page_hits;
    return PageGrant{PoolRange(page.physical), false};
  }
  // The frontier moves before the search so that the new page and its
  // neighbours count as hot while a victim is chosen.
  const bool below_frontier = logical_page < c.frontier;
  const std::uint32_t old_frontier = c.frontier;
  c.frontier = std::max(c.frontier, logical_page + 1);
  if (Status s = FindPageFor(c, logical_page, previously_active); !s.ok()) {
    c.frontier = old_frontier;
    return s;
  }
  page.physical = free_list_.back();
  free_list_.pop_back();
  page.resident = true;
  page.last_use = tick_;
  ++c.held;
  ++m_.pages_mapped;
  if (below_frontier) {
    ++page.copy_ins;
    ++m_.copy_ins;
  }
  const std::uint32_t held = pool_pages_ - static_cast<std::uint32_t>(free_list_.size());
  m_.peak_held_pages = std::max(m_.peak_held_pages, held);
  return PageGrant{PoolRange(page.physical), below_frontier};
}

StatusOr<bool> DeviceArena::IsResident(std::uint64_t id, std::uint32_t logical_page) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end() || logical_page >= it->second->pages.size()) {
    return Status::NotFound("ctx " + Num(id) + " page " + Num(logical_page) + ": unknown");
  }
  return it->second->pages[logical_page].resident;
}

StatusOr<std::uint32_t> DeviceArena::CopyIns(std::uint64_t id, std::uint32_t logical_page) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end() || logical_page >= it->second->pages.size()) {
    return Status::NotFound("ctx " + Num(id) + " page " + Num(logical_page) + ": unknown");
  }
  return it->second->pages[logical_page].copy_ins;
}

StatusOr<gpu::DeviceRange> DeviceArena::AcquireStaging(std::uint32_t pages) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint32_t n = options_.staging_pages;
  std::uint32_t run = 0;
  for (std::uint32_t i = 0; i < n && pages > 0; ++i) {
    run = staging_used_[i] ? 0 : run + 1;
    if (run == pages) {
      const std::uint32_t first = i + 1 - pages;
      for (std::uint32_t j = first; j <= i; ++j) staging_used_[j] = true;
      m_.staging_in_use += pages;
      m_.peak_staging_in_use = std::max(m_.peak_staging_in_use, m_.staging_in_use);
      return gpu::DeviceRange{scratch_bytes_ + std::uint64_t{first} * options_.page_bytes,
                              std::uint64_t{pages} * options_.page_bytes};
    }
  }
  ++m_.staging_refusals;
  return Status::ResourceExhausted("staging: no run of " + Num(pages) + " free pages among " +
                                   Num(n) + " (" + Num(m_.staging_in_use) + " in use); raise " +
                                   options_.setting_names.staging_pages);
}

Status DeviceArena::ReleaseStaging(gpu::DeviceRange range) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t page = options_.page_bytes;
  const std::uint64_t end = scratch_bytes_ + std::uint64_t{options_.staging_pages} * page;
  if (range.offset < scratch_bytes_ || (range.offset - scratch_bytes_) % page != 0 ||
      range.bytes == 0 || range.bytes % page != 0 || range.offset + range.bytes > end) {
    return Status::InvalidArgument("release staging: range [" + Num(range.offset) + ", +" +
                                   Num(range.bytes) + ") is not a run of staging pages");
  }
  const std::uint64_t first = (range.offset - scratch_bytes_) / page;
  const std::uint64_t count = range.bytes / page;
  for (std::uint64_t j = first; j < first + count; ++j) {
    if (!staging_used_[j]) {
      return Status::FailedPrecondition("release staging: page " + Num(j) + " is not in use");
    }
  }
  for (std::uint64_t j = first; j < first + count; ++j) staging_used_[j] = false;
  m_.staging_in_use -= static_cast<std::uint32_t>(count);
  return Status::OK();
}

DeviceArenaMetrics DeviceArena::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceArenaMetrics m = m_;
  m.contexts = static_cast<std::uint32_t>(contexts_.size());
  m.held_pages = pool_pages_ - static_cast<std::uint32_t>(free_list_.size());
  m.committed_pages = CommittedLocked();
  m.free_pages = pool_pages_ - m.committed_pages;
  return m;
}

}  // namespace kvfabric::client
