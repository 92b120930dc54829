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
  if (!good(options.host_fetch) || !good(options.nvme_fetch) || !std::isfinite(r.c0_us) ||
      r.c0_us < 0 || !std::isfinite(r.c1_us_per_token) || r.c1_us_per_token < 0 ||
      !std::isfinite(r.c2_us_per_token2) || r.c2_us_per_token2 < 0) {
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

  std::uint64_t occupied = t.occupied_pages;
  std::uint64_t nvme_budget = t.nvme_free_bytes;
  for (std::uint32_t step = 1; step <= 2 && occupied > target; ++step) {
    std::vector<Scored> heap;
    for (const EvictionCandidate& c : candidates) {
      const bool wanted = step == 1 ? c.tier == BlockTier::kBoth : c.tier == BlockTier::kHost;
      if (wanted) heap.push_back({policy.Score(c), &c});
    }
    // A min-heap by EvictsBefore: O(n) to build, O(log n) per victim taken.
    auto after = [](const Scored& a, const Scored& b) { return EvictsBefore(b, a); };
    std::make_heap(heap.begin(), heap.end(), after);
    const std::uint64_t in_step = heap.size();
    std::uint64_t rank = 0;
    while (occupied > target && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), after);
      const Scored s = heap.back();
      heap.pop_back();
      const EvictionCandidate& c = *s.c;
      EvictionDecision d;
      d.time_us = now_us;
      d.ns = c.ns;
      d.key = c.key;
      d.step = step;
      d.rank = ++rank;
      d.candidates = in_step;
      d.pages = c.pages;
      d.score = s.score;
      std::string why;
      if (step == 1) {
        d.action = EvictionAction::kDropHostCopy;
        why = "the NVMe copy remains";
      } else if (t.nvme_enabled && policy.WorthDemoting(c, &why)) {
        // What the record takes on NVMe: header and payload, padded to the
        // tier's unit.
        const std::uint64_t unit = std::max<std::uint64_t>(1, t.nvme_record_alignment);
        const std::uint64_t stored = (kBlockHeaderBytes + c.bytes + unit - 1) / unit * unit;
        if (stored <= nvme_budget) {
          d.action = EvictionAction::kDemote;
          nvme_budget -= stored;
        } else {
          d.action = EvictionAction::kEvict;
          why = "worth demoting, but the NVMe tier has " + FormatBytes(nvme_budget) +
                " free for " + FormatBytes(stored);
        }
      } else {
        d.action = EvictionAction::kEvict;
        if (!t.nvme_enabled) why = t.nvme_off_reason.empty() ? "no NVMe tier" : t.nvme_off_reason;
      }
      d.explanation = std::string(EvictionActionName(d.action)) + " " + c.key.ToHex() + " (" +
                      std::to_string(c.pages) + " pages): step " + std::to_string(step) +
                      (step == 1 ? " (host copies of blocks on NVMe)" : " (host-only blocks)") +
                      ", rank " + std::to_string(rank) + " of " + std::to_string(in_step) + " by " +
                      policy.ExplainScore(c) + "; " + trigger + "; " + why;
      occupied -= std::min(occupied, c.pages);
      out.push_back(std::move(d));
    }
  }
  return out;
}

void DecisionLog::Record(EvictionDecision decision) {
  MutexLock lock(&mu_);
  decision.sequence = next_sequence_++;
  ++counts_[static_cast<int>(decision.action) & 3];
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

}  // namespace kvfabric::cache_host
