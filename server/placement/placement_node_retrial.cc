// PlacementNode's retrials of slowed paths (placement_node.h, RETRIALS).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "server/placement/placement_node.h"

namespace kvfabric::placement {
namespace {

// The path that carries a host's host-pool blocks to the client.
BusPath TransferPath(const PlannerHost& h) {
  return h.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost;
}

std::uint64_t Micros(std::chrono::milliseconds ms) {
  return static_cast<std::uint64_t>(ms.count()) * 1000;
}

}  // namespace

int PlacementNode::ChooseRetrial(PlannerInput* in, PlannerHost* saved) {
  if (options_.retrial_interval.count() <= 0) return -1;
  const double ratio = 1 + options_.cost_model.change_point_ratio;
  // A slowed path's figures from before its slowdown, resolved at the bytes the plan expects
  // to move over it as the ones in force were (ResolveSizeCurves), with their size factor
  // there, if the slowdown is still beyond change_point_ratio there.
  struct Resolved {
    PathParameters parameters;
    double size_factor = 1;
  };
  auto healthy = [&](BusPath path, const std::string& host, const PathParameters& now,
                     std::uint64_t at) -> std::optional<Resolved> {
    std::optional<PathParameters> before = cost_model_.HealthyBefore(path, host);
    if (!before) return std::nullopt;
    const double bytes = static_cast<double>(std::max<std::uint64_t>(at, 1));
    Resolved r{AtSize(*before, bytes), SizeFactor(*before, bytes)};
    if (FetchMicros(now, bytes) <= ratio * FetchMicros(r.parameters, bytes)) return std::nullopt;
    return r;
  };
  for (std::size_t h = 0; h < in->hosts.size(); ++h) {
    PlannerHost& ph = in->hosts[h];
    const std::optional<Resolved> transfer =
        healthy(TransferPath(ph), ph.host_id, ph.transfer, ph.expected_bytes);
    const std::optional<Resolved> nvme =
        healthy(BusPath::kNvmeToHost, ph.host_id, ph.nvme, ph.expected_nvme_bytes);
    MutexLock lock(&retrial_mu_);
    auto it = retrials_.find(ph.host_id);
    if (!transfer && !nvme) {
      if (it != retrials_.end()) retrials_.erase(it);  // recovered by its own traffic
      continue;
    }
    if (it == retrials_.end()) {
      // First seen slowed: its first retrial comes an interval from now.
      if (retrials_.size() < kMaxRetrialHosts) {
        const std::uint64_t interval = Micros(options_.retrial_interval);
        retrials_.emplace(ph.host_id, RetrialState{in->now_us + interval, interval, 0});
      }
      continue;
    }
    if (in->now_us < it->second.next_us) continue;
    *saved = ph;
    if (transfer) {
      ph.transfer = transfer->parameters;
      ph.transfer_size_factor = transfer->size_factor;
    }
    if (nvme) {
      ph.nvme = nvme->parameters;
      ph.nvme_size_factor = nvme->size_factor;
    }
    return static_cast<int>(h);
  }
  return -1;
}

void PlacementNode::DeferRetrial(const std::string& host, std::uint64_t now_us) {
  MutexLock lock(&retrial_mu_);
  auto it = retrials_.find(host);
  if (it != retrials_.end()) it->second.next_us = now_us + it->second.interval_us;
}

void PlacementNode::BeginRetrial(const PlannerInput& in, int h, PlanRecord* record) {
  const PlannerHost& ph = in.hosts[static_cast<std::size_t>(h)];
  RetrialState state;
  {
    MutexLock lock(&retrial_mu_);
    auto it = retrials_.find(ph.host_id);
    if (it == retrials_.end()) return;  // removed as a member meanwhile
    it->second.next_us = in.now_us + it->second.interval_us;
    state = it->second;
  }
  record->retrial_host = ph.host_id;
  if (!in.include_explanation) return;
  char b[320];
  std::snprintf(b, sizeof(b),
                "  retrial of %s: a change point slowed its paths and no load has used them for "
                "%s; this plan prices them at their figures from before the slowdown (above), to "
                "learn whether they recovered (%u retrials in a row found them still slow; the "
                "next waits %s, doubling while they are, up to %s)\n",
                ph.host_id.c_str(),
                FormatMicros(static_cast<double>(Micros(options_.retrial_interval))).c_str(),
                state.still_slow, FormatMicros(static_cast<double>(state.interval_us)).c_str(),
                FormatMicros(static_cast<double>(Micros(options_.retrial_max_interval))).c_str());
  record->inputs += b;
  record->input_terms.push_back(
      {"retrial_still_slow:" + ph.host_id, static_cast<double>(state.still_slow), "retrials"});
}

void PlacementNode::JudgeRetrial(const std::string& host, std::uint64_t restored,
                                 std::uint64_t still_slow,
                                 const std::vector<std::string>& observed_hosts) {
  // Whether the host still has a slowed path, asked before taking retrial_mu_.
  bool slowed = false;
  if (!host.empty() && still_slow == 0 && restored > 0) {
    for (BusPath p :
         {BusPath::kRemoteHostToLocalHost, BusPath::kLocalMemcpy, BusPath::kNvmeToHost}) {
      slowed = slowed || cost_model_.HealthyBefore(p, host).has_value();
    }
  }
  const std::uint64_t now = env_->NowMicros();
  MutexLock lock(&retrial_mu_);
  for (const std::string& h : observed_hosts) {
    auto it = retrials_.find(h);
    if (it != retrials_.end()) {
      it->second.next_us = std::max(it->second.next_us, now + it->second.interval_us);
    }
  }
  if (host.empty()) return;
  auto it = retrials_.find(host);
  if (it == retrials_.end()) return;
  RetrialState& s = it->second;
  if (still_slow > 0) {
    ++s.still_slow;
    s.interval_us = std::min(2 * s.interval_us, Micros(options_.retrial_max_interval));
    s.next_us = now + s.interval_us;
  } else if (restored > 0 && !slowed) {
    retrials_.erase(it);
  } else if (restored > 0) {
    s = RetrialState{now + Micros(options_.retrial_interval), Micros(options_.retrial_interval), 0};
  }
}

}  // namespace kvfabric::placement
