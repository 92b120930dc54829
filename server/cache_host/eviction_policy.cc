#include "server/cache_host/eviction_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/block_format.h"
#include "core/bus_calibration.h"
#include "core/cost_defaults.h"
#include "core/mutex.h"
#include "core/units.h"

namespace kvfabric::cache_host {
namespace {

std::string Fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Percent(std::uint64_t part, std::uint64_t whole) {
  return Fixed(whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / whole, 1) + "%";
}

// Evicted-first order: score, then older access, then namespace, then key.
struct Scored {
  double score;
  const EvictionCandidate* c;
};
bool EvictsBefore(const Scored& a, const Scored& b) {
  return std::tie(a.score, a.c->last_access_us, a.c->ns, a.c->key) <
         std::tie(b.score, b.c->last_access_us, b.c->ns, b.c->key);
}

}  // namespace

std::string_view EvictionActionName(EvictionAction action) {
  switch (action) {
    case EvictionAction::kDropHostCopy:
      return "drop-host-copy";
    case EvictionAction::kDemote:
      return "demote";
    case EvictionAction::kEvict:
      return "evict";
  }
  return "unknown";
}

std::string LruPolicy::ExplainScore(const EvictionCandidate& c) const {
  return "lru: last access at " + std::to_string(c.last_access_us) + " us, " +
         std::to_string(c.hit_count) + " hits";
}

bool LruPolicy::WorthDemoting(const EvictionCandidate&, std::string* why) const {
  *why = "lru demotes every victim while an NVMe tier exists";
  return true;
}

CostAwareOptions DefaultCostAwareOptions() {
  CostAwareOptions o;
  o.host_fetch = cost_defaults::kRemoteToLocal;
  o.nvme_fetch = cost_defaults::kNvmeToHost;
  o.recompute = cost_defaults::kRecompute;
  return o;
}

CostAwareOptions CostAwareFromCalibration(const BusCalibration& calibration,
                                          std::string_view host_id, std::string_view model_id,
                                          std::string* sources) {
  CostAwareOptions o = DefaultCostAwareOptions();
  std::string said;
  auto path = [&](BusPath p, PathParameters* out) {
    const PathCalibration* best = nullptr;
    for (const PathCalibration& c : calibration.paths) {
      if (c.path != p) continue;
      if (c.host_id == host_id) {
        best = &c;
        break;
      }
      if (c.host_id.empty()) best = &c;
    }
    said += std::string(said.empty() ? "" : ", ") + std::string(BusPathArrowName(p)) + " ";
    if (best == nullptr) {
      said += "default";
      return;
    }
    *out = best->parameters;
    said += best->host_id.empty() ? "calibrated (every host)" : "calibrated (this host)";
  };
  path(BusPath::kRemoteHostToLocalHost, &o.host_fetch);
  path(BusPath::kNvmeToHost, &o.nvme_fetch);
  const RecomputeCalibration* model = nullptr;
  for (const RecomputeCalibration& r : calibration.recompute) {
    if (r.model_id == model_id) model = &r;
  }
  if (model == nullptr && calibration.recompute.size() == 1) model = &calibration.recompute[0];
  if (model != nullptr) {
    o.recompute = model->parameters;
    said += ", recompute calibrated (model " + model->model_id + ")";
  } else {
    said += ", recompute default";
  }
  if (sources != nullptr) *sources = said;
  return o;
}

Status CostAwarePolicy::Update(const CostAwareOptions& options) {
  auto good = [](const PathParameters& p) {
    return std::isfinite(p.alpha_us) && p.alpha_us >= 0 && std::isfinite(p.beta_bytes_per_s) &&
           p.beta_bytes_per_s > 0;
  };
  const RecomputeParameters& r = options.recompute;
  if (!good(options.host_fetch) || !good(options.nvme_fetch) || !RecomputeParametersValid(r)) {
    return Status::InvalidArgument(
        "cost-aware eviction figures: alphas and recompute constants must be finite and >= 0, "
        "betas finite and > 0");
  }
  MutexLock l(&mu_);
  o_ = options;
  return Status::OK();
}

CostAwareOptions CostAwarePolicy::options() const {
  MutexLock l(&mu_);
  return o_;
}

double CostAwarePolicy::Score(const EvictionCandidate& c) const {
  const CostAwareOptions o = options();
  const double saved = RecomputeMicros(o.recompute, c.tokens, static_cast<double>(c.token_offset)) -
                       FetchMicros(o.host_fetch, static_cast<double>(c.bytes));
  return saved / static_cast<double>(std::max<std::uint64_t>(c.resident_bytes, 1));
}

std::string CostAwarePolicy::ExplainScore(const EvictionCandidate& c) const {
  const CostAwareOptions o = options();
  const double per_mib = Score(c) * static_cast<double>(1 << 20);
  return "cost-aware: value = (" + ExplainRecompute(o.recompute, c.tokens, c.token_offset) + " - " +
         ExplainFetch(o.host_path, o.host_fetch, c.bytes) + ") / resident " +
         FormatBytesExact(c.resident_bytes) + " = " + FormatMicros(per_mib) +
         " per MiB of residency";
}

bool CostAwarePolicy::WorthDemoting(const EvictionCandidate& c, std::string* why) const {
  const CostAwareOptions o = options();
  const double recompute =
      RecomputeMicros(o.recompute, c.tokens, static_cast<double>(c.token_offset));
  const double from_nvme = FetchMicros(o.nvme_fetch, static_cast<double>(c.bytes)) +
                           FetchMicros(o.host_fetch, static_cast<double>(c.bytes));
  const bool worth = recompute > from_nvme;
  *why = std::string(worth ? "demoted" : "dropped") + ": t_recompute " + FormatMicros(recompute) +
         (worth ? " > " : " <= ") + "t_fetch(" +
         std::string(BusPathArrowName(BusPath::kNvmeToHost)) + ") + t_fetch(" +
         std::string(BusPathArrowName(o.host_path)) + ") = " + FormatMicros(from_nvme);
  return worth;
}

Status Watermarks::Validate() const {
  if (!(low > 0 && low <= high && high <= 1)) {
    return Status::InvalidArgument("--host-low-watermark=" + Fixed(low, 3) +
                                   " and --host-high-watermark=" + Fixed(high, 3) +
                                   ": need 0 < low <= high <= 1");
  }
  return Status::OK();
}

Status CompactKeepOptions::Validate(std::uint64_t pool_bytes) const {
  if (budget_bytes > pool_bytes) {
    return Status::InvalidArgument("--compact-keep-bytes " + FormatBytesExact(budget_bytes) +
                                   " is more than --host-pool-bytes " +
                                   FormatBytesExact(pool_bytes));
  }
  if (budget_bytes > 0 && (codec.empty() || codec_version == 0)) {
    return Status::InvalidArgument("--compact-keep-bytes " + FormatBytesExact(budget_bytes) +
                                   " needs the compact codec whose copies it keeps");
  }
  return Status::OK();
}

std::string_view CompactOutcomeName(CompactOutcome outcome) {
  switch (outcome) {
    case CompactOutcome::kNone:
      return "none";
    case CompactOutcome::kCopyKept:
      return "kept";
    case CompactOutcome::kCopyOverBudget:
      return "over_budget";
    case CompactOutcome::kCopyLastResort:
      return "last_resort";
  }
  return "unknown";
}

std::vector<EvictionDecision> PlanEviction(const EvictionPolicy& policy,
                                           std::vector<EvictionCandidate> candidates,
                                           const EvictionTrigger& t, std::uint64_t now_us) {
  std::vector<EvictionDecision> out;
  const std::uint64_t pages = t.pool_pages;
  const auto high = static_cast<std::uint64_t>(std::floor(pages * t.watermarks.high));
  const auto low = static_cast<std::uint64_t>(std::floor(pages * t.watermarks.low));
  const std::uint64_t free = pages - std::min(pages, t.occupied_pages);
  const bool over_high = t.occupied_pages > high;
  const bool needs_room = t.pages_needed > free;
  if (!over_high && !needs_room) return out;
  const std::uint64_t target = std::min(low, pages - std::min(pages, t.pages_needed));
  std::string trigger = "trigger: occupancy " + std::to_string(t.occupied_pages) + "/" +
                        std::to_string(pages) + " pages (" + Percent(t.occupied_pages, pages) + ")";
  if (over_high) {
    trigger += " > high watermark " + std::to_string(high) + " pages";
  }
  if (needs_room) {
    trigger += (over_high ? "; " : " ") + std::string("request needs ") +
               std::to_string(t.pages_needed) + " pages, " + std::to_string(free) + " free";
  }
  trigger += "; target <= " + std::to_string(target) + " pages = min(low watermark " +
             std::to_string(low) + ", pages - needed)";

  // Compact copies ("Compact copies" in the header): with B = 0 every role is
  // kNone and the plan is the two steps alone.
  const std::uint64_t budget = t.compact_keep_bytes;
  const std::size_t n = candidates.size();
  std::vector<Scored> scored(n);
  std::vector<CompactRole> role(n, CompactRole::kNone);
  std::vector<char> gone(n, 0);  // already decided in this pass
  for (std::size_t i = 0; i < n; ++i) {
    scored[i] = {policy.Score(candidates[i]), &candidates[i]};
    if (budget > 0) role[i] = candidates[i].compact_role;
  }
  auto after = [](const Scored& a, const Scored& b) { return EvictsBefore(b, a); };
  auto index_of = [&](const Scored& s) {
    return static_cast<std::size_t>(s.c - candidates.data());
  };
  // The kept copies in policy order, for displacing them over budget.
  std::vector<Scored> kept_heap;
  for (std::size_t i = 0; i < n; ++i) {
    if (role[i] == CompactRole::kKept) kept_heap.push_back(scored[i]);
  }
  std::make_heap(kept_heap.begin(), kept_heap.end(), after);
  std::uint64_t kept = t.compact_kept_bytes;
  auto arithmetic = [&](std::uint64_t copy) {
    return "kept " + FormatBytesExact(kept) + " + " + FormatBytesExact(copy) + " = " +
           FormatBytesExact(kept + copy) + (kept + copy <= budget ? " <= " : " > ") + "budget " +
           FormatBytesExact(budget) + " (--compact-keep-bytes)";
  };

  std::uint64_t occupied = t.occupied_pages;
  std::uint64_t nvme_budget = t.nvme_free_bytes;
  // How `c` leaves the host pool: its host copy is dropped when it is on NVMe
  // too, else it is demoted or evicted. Sets *why.
  auto leave = [&](const EvictionCandidate& c, std::string* why) {
    if (c.tier == BlockTier::kBoth) {
      *why = "the NVMe copy remains";
      return EvictionAction::kDropHostCopy;
    }
    if (t.nvme_enabled && policy.WorthDemoting(c, why)) {
      // What the record takes on NVMe: header and payload, padded to the
      // tier's unit.
      const std::uint64_t unit = std::max<std::uint64_t>(1, t.nvme_record_alignment);
      const std::uint64_t stored = (kBlockHeaderBytes + c.bytes + unit - 1) / unit * unit;
      if (stored <= nvme_budget) {
        nvme_budget -= stored;
        return EvictionAction::kDemote;
      }
      *why = "worth demoting, but the NVMe tier has " + FormatBytes(nvme_budget) + " free for " +
             FormatBytes(stored);
      return EvictionAction::kEvict;
    }
    if (!t.nvme_enabled) *why = t.nvme_off_reason.empty() ? "no NVMe tier" : t.nvme_off_reason;
    return EvictionAction::kEvict;
  };
  auto decision = [&](const Scored& s, std::uint32_t step) {
    const EvictionCandidate& c = *s.c;
    EvictionDecision d;
    d.time_us = now_us;
    d.ns = c.ns;
    d.key = c.key;
    d.step = step;
    d.pages = c.pages;
    d.score = s.score;
    gone[index_of(s)] = 1;
    occupied -= std::min(occupied, c.pages);
    return d;
  };
  // A copy that leaves over budget (with its exact block x, or displaced by
  // x's copy).
  auto over_budget = [&](const Scored& s, std::uint32_t step, const std::string& reason) {
    EvictionDecision d = decision(s, step);
    std::string why;
    d.action = leave(*s.c, &why);
    d.compact = CompactOutcome::kCopyOverBudget;
    d.explanation = std::string(EvictionActionName(d.action)) + " " + s.c->key.ToHex() + " (" +
                    std::to_string(s.c->pages) + " pages): compact copy over budget: " + reason +
                    "; by " + policy.ExplainScore(*s.c) + "; " + trigger + "; " + why;
    out.push_back(std::move(d));
  };

  static constexpr const char* kStepName[] = {
      "", " (host copies of blocks on NVMe)", " (host-only blocks)",
      " (compact copies kept or held: steps 1 and 2 had no candidate left)"};
  for (std::uint32_t step = 1; step <= 3 && occupied > target; ++step) {
    std::vector<Scored> heap;
    for (std::size_t i = 0; i < n; ++i) {
      if (gone[i]) continue;
      const bool copy = role[i] != CompactRole::kNone;
      const BlockTier tier = candidates[i].tier;
      const bool wanted = step == 3   ? copy
                          : step == 1 ? !copy && tier == BlockTier::kBoth
                                      : !copy && tier == BlockTier::kHost;
      if (wanted) heap.push_back(scored[i]);
    }
    // A min-heap by EvictsBefore: O(n) to build, O(log n) per victim taken.
    std::make_heap(heap.begin(), heap.end(), after);
    const std::uint64_t in_step = heap.size();
    std::uint64_t rank = 0;
    while (occupied > target && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), after);
      const Scored s = heap.back();
      heap.pop_back();
      if (gone[index_of(s)]) continue;  // left over budget earlier in this step
      const EvictionCandidate& c = *s.c;
      EvictionDecision d = decision(s, step);
      d.rank = ++rank;
      d.candidates = in_step;
      std::string why;
      d.action = leave(c, &why);
      if (step == 3) d.compact = CompactOutcome::kCopyLastResort;
      d.explanation = std::string(EvictionActionName(d.action)) + " " + c.key.ToHex() + " (" +
                      std::to_string(c.pages) + " pages): step " + std::to_string(step) +
                      kStepName[step] + ", rank " + std::to_string(rank) + " of " +
                      std::to_string(in_step) + " by " + policy.ExplainScore(c) + "; " + trigger +
                      "; " + why;
      if (role[index_of(s)] == CompactRole::kKept) kept -= std::min(kept, c.resident_bytes);

      const std::size_t ci = c.held_copy;
      if (step == 3 || ci >= n || role[ci] != CompactRole::kHeld || gone[ci]) {
        out.push_back(std::move(d));
        continue;
      }
      // x = c has a held copy: keep it within the budget.
      const Scored& copy = scored[ci];
      const std::uint64_t need = copy.c->resident_bytes;
      while (kept + need > budget && !kept_heap.empty()) {
        const Scored k = kept_heap.front();
        if (gone[index_of(k)] || role[index_of(k)] != CompactRole::kKept) {
          std::pop_heap(kept_heap.begin(), kept_heap.end(), after);
          kept_heap.pop_back();
          continue;
        }
        if (!EvictsBefore(k, copy)) break;  // the kept copies all rank after the new one
        std::pop_heap(kept_heap.begin(), kept_heap.end(), after);
        kept_heap.pop_back();
        const std::string reason = "makes room for " + copy.c->key.ToHex() + ", the copy of " +
                                   c.key.ToHex() +
                                   ", which the policy ranks after it: " + arithmetic(need);
        kept -= std::min(kept, k.c->resident_bytes);
        over_budget(k, step, reason);
      }
      const std::string copy_line =
          "compact copy " + copy.c->key.ToHex() + " (" + std::to_string(copy.c->pages) + " pages) ";
      if (kept + need <= budget) {
        d.compact = CompactOutcome::kCopyKept;
        d.compact_key = copy.c->key;
        d.explanation += "; " + copy_line + "stays in the host pool, kept: " + arithmetic(need);
        kept += need;
        role[ci] = CompactRole::kKept;
        kept_heap.push_back(copy);
        std::push_heap(kept_heap.begin(), kept_heap.end(), after);
        out.push_back(std::move(d));
        continue;
      }
      const std::string arith = arithmetic(need);
      d.explanation += "; " + copy_line + "leaves with it: " + arith;
      out.push_back(std::move(d));
      over_budget(copy, step,
                  "its exact block " + c.key.ToHex() + " leaves and " + arith +
                      ", with no kept copy ranked before it");
    }
  }
  return out;
}

void DecisionLog::Record(EvictionDecision decision) {
  MutexLock lock(&mu_);
  decision.sequence = next_sequence_++;
  ++counts_[static_cast<int>(decision.action) & 3];
  ++compact_counts_[static_cast<int>(decision.compact) & 3];
  if (decision.compact == CompactOutcome::kCopyKept) {
    ++kept_counts_[static_cast<int>(decision.action) & 3];
  }
  if (ring_.size() == capacity_) ring_.pop_front();
  ring_.push_back(std::move(decision));
}

std::vector<EvictionDecision> DecisionLog::Find(const std::string& tenant,
                                              const BlockKey& key) const {
  MutexLock lock(&mu_);
  std::vector<EvictionDecision> out;
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it) {
    if (it->tenant == tenant && it->key == key) out.push_back(*it);
  }
  return out;
}

std::vector<EvictionDecision> DecisionLog::Recent(std::size_t n, const std::string* tenant) const {
  MutexLock lock(&mu_);
  std::vector<EvictionDecision> out;
  for (auto it = ring_.rbegin(); it != ring_.rend() && out.size() < n; ++it) {
    if (tenant == nullptr || it->tenant == *tenant) out.push_back(*it);
  }
  return out;
}

std::uint64_t DecisionLog::Count(EvictionAction action) const {
  MutexLock lock(&mu_);
  return counts_[static_cast<int>(action) & 3];
}

std::uint64_t DecisionLog::CountCompact(CompactOutcome outcome) const {
  MutexLock lock(&mu_);
  return compact_counts_[static_cast<int>(outcome) & 3];
}

std::uint64_t DecisionLog::CountCopyKept(EvictionAction action) const {
  MutexLock lock(&mu_);
  return kept_counts_[static_cast<int>(action) & 3];
}

}  // namespace kvfabric::cache_host
