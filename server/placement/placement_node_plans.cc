// PlacementNode: plans (Plan, the plan history, ReportObservations, Explain).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "server/placement/placement_node.h"
#include "server/placement/placement_node_internal.h"

namespace kvfabric::placement {
namespace {

using internal::GoodPath;
using internal::GoodRecompute;
using internal::OverLimit;

constexpr char kPlanFormula[] =
    "t_fetch(path, bytes) = alpha_us + bytes / beta_bytes_per_s * 1e6\n"
    "t_recompute(n, p) = c0 + c1 * n + c2 * n * (p + n / 2)\n"
    "recompute-all = t_recompute(T + S, 0)\n"
    "fetch-all = F(0, m) + t_recompute(T - P_m + S, P_m)\n"
    "split(k) = max(t_recompute(P_k, 0), F(k, m)) + t_recompute(T - P_m + S, P_m)\n"
    "fetch-prefix(j) = F(0, j) + t_recompute(T - P_j + S, P_j)\n"
    "F(a, b) = alpha_h2d + wait_h2d + sum over runs of (daemon alphas + queue wait + bytes / "
    "bottleneck beta)";

}  // namespace

// ---- Plans ----

PathParameters PlacementNode::PathOrDefault(BusPath path, std::string_view host_id) const {
  StatusOr<PathParameters> p = cost_model_.Path(path, host_id);
  if (p.ok()) return *p;
  switch (path) {
    case BusPath::kLocalMemcpy:
      return options_.local_memcpy;
    case BusPath::kNvmeToHost:
      return options_.nvme_to_host;
    case BusPath::kHostToDevice:
      return options_.host_to_device;
    default:
      return options_.remote_to_local;
  }
}

StatusOr<PlanResult> PlacementNode::Plan(const PlanRequest& request) {
  KVF_RETURN_IF_ERROR(CheckNamespace(request.ns));
  const auto& chain = request.chain;
  if (chain.empty()) return Status::InvalidArgument("keys: a chain needs at least 1 key");
  if (chain.size() > options_.limits.max_chain_blocks) {
    return OverLimit("keys", chain.size(), "max_chain_blocks", options_.limits.max_chain_blocks);
  }
  std::vector<BlockKey> keys;
  keys.reserve(chain.size());
  for (std::size_t i = 0; i < chain.size(); ++i) {
    if (chain[i].bytes > options_.limits.max_block_bytes) {
      return OverLimit("chain[" + std::to_string(i) + "].bytes", chain[i].bytes, "max_block_bytes",
                       options_.limits.max_block_bytes);
    }
    keys.push_back(chain[i].key);
  }
  if (request.host_to_device && !GoodPath(*request.host_to_device)) {
    return Status::InvalidArgument(
        "host_to_device: alpha_us must be finite and >= 0, beta_bytes_per_s finite and > 0");
  }
  if (request.recompute && !GoodRecompute(*request.recompute)) {
    return Status::InvalidArgument("recompute: c0, c1, c2 must be finite and >= 0");
  }

  PlanResult result;
  if (request.locations) {
    if (request.locations->blocks.size() != chain.size()) {
      return Status::InvalidArgument(
          "locations.blocks: " + std::to_string(request.locations->blocks.size()) +
          " != " + std::to_string(chain.size()) + " keys");
    }
    result.locations = *request.locations;  // the planner checks host indices and tiers
  } else {
    MutexLock lock(&mu_);
    result.locations = LocateLocked(request.ns, keys);
  }
  // The planner runs outside mu_: it is O(blocks x replicas) and reads only the cost model and
  // the path load, which synchronise themselves.
  PlannerInput in;
  in.client_id = request.client_id;
  in.suffix_tokens = request.suffix_tokens;
  in.include_explanation = request.include_explanation || options_.explain_every_plan;
  in.max_explanation_bytes = options_.limits.max_explanation_bytes;
  in.host_to_device = request.host_to_device
                          ? *request.host_to_device
                          : PathOrDefault(BusPath::kHostToDevice, request.client_id);
  if (request.recompute) {
    in.recompute = *request.recompute;
  } else {
    StatusOr<RecomputeParameters> fit = cost_model_.Recompute(request.model_id);
    in.recompute = fit.ok() ? *fit : options_.recompute;
  }
  for (const MemberRecord& host : result.locations.hosts) {
    PlannerHost ph;
    ph.host_id = host.host_id;
    ph.local = !request.client_node.empty() && host.node_name == request.client_node;
    ph.transfer = PathOrDefault(ph.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost,
                                host.host_id);
    ph.nvme = PathOrDefault(BusPath::kNvmeToHost, host.host_id);
    in.hosts.push_back(std::move(ph));
  }
  in.blocks.resize(chain.size());
  for (std::size_t i = 0; i < chain.size(); ++i) {
    ChainBlock& b = in.blocks[i];
    b.tokens = chain[i].tokens;
    b.prefix_tokens = chain[i].prefix_tokens;
    b.bytes = chain[i].bytes;
    for (const LocatedReplica& r : result.locations.blocks[i]) {
      b.replicas.push_back({r.host_index, r.tier});
    }
  }
  KVF_ASSIGN_OR_RETURN(result.plan, planner_.MakePlan(in));
  for (const PlanRun& run : result.plan.runs) {
    std::vector<std::uint32_t>& fallbacks = result.fallback_host_indices.emplace_back();
    if (run.action != RunAction::kFetch) continue;
    for (const LocatedReplica& r : result.locations.blocks[run.first_block]) {
      if (r.host_index != run.host_index &&
          std::find(fallbacks.begin(), fallbacks.end(), r.host_index) == fallbacks.end()) {
        fallbacks.push_back(r.host_index);
      }
    }
    for (std::uint32_t b = run.first_block + 1;
         b < run.first_block + run.block_count && !fallbacks.empty(); ++b) {
      const auto& block = result.locations.blocks[b];
      std::erase_if(fallbacks, [&](std::uint32_t h) {
        return std::none_of(block.begin(), block.end(),
                            [&](const LocatedReplica& r) { return r.host_index == h; });
      });
    }
  }

  PlanRecord record;
  record.decided_unix_us = env_->WallMicros();
  record.kind = result.plan.kind;
  record.predicted_total_us = result.plan.predicted_total_us;
  record.alternatives = result.plan.alternatives;
  record.chain_blocks = static_cast<std::uint32_t>(chain.size());
  record.cached_prefix_blocks = result.plan.cached_prefix_blocks;
  record.suffix_tokens = request.suffix_tokens;
  record.host_to_device = in.host_to_device;
  record.recompute = in.recompute;
  if (request.include_explanation) {
    record.explanation = result.plan.explanation;
  } else {
    record.explanation = std::move(result.plan.explanation);
    result.plan.explanation.clear();
  }
  if (!result.plan.charges.empty()) {
    const double hold = result.plan.predicted_total_us * options_.plan_deadline_factor;
    const std::uint64_t deadline =
        env_->NowMicros() + options_.plan_deadline_slack_us +
        static_cast<std::uint64_t>(std::min(hold, 1e15));  // 1e15 µs: ~30 years, no overflow
    record.ticket = path_load_.Admit(result.plan.charges, deadline);
  }
  MutexLock lock(&mu_);
  record.plan_id = next_plan_id_++;
  result.plan_id = record.plan_id;
  plans_bytes_ += sizeof(PlanRecord) + record.explanation.size() +
                  record.alternatives.size() * sizeof(PlanAlternative);
  plans_.push_back(std::move(record));
  TrimPlanHistoryLocked();
  ++counters_.plans;
  const auto kind = static_cast<std::size_t>(result.plan.kind);
  if (kind < counters_.plans_by_kind.size()) ++counters_.plans_by_kind[kind];
  return result;
}

void PlacementNode::TrimPlanHistoryLocked() {
  while (plans_.size() > 1 &&
         (plans_.size() > options_.plan_history || plans_bytes_ > options_.plan_history_bytes)) {
    const PlanRecord& old = plans_.front();
    plans_bytes_ -= sizeof(PlanRecord) + old.explanation.size() +
                    old.alternatives.size() * sizeof(PlanAlternative);
    plans_.pop_front();
  }
}

const PlacementNode::PlanRecord* PlacementNode::FindPlanLocked(std::uint64_t plan_id) const {
  if (plans_.empty() || plan_id < plans_.front().plan_id) return nullptr;
  const std::uint64_t at = plan_id - plans_.front().plan_id;
  return at < plans_.size() ? &plans_[at] : nullptr;
}

PlacementNode::PlanRecord* PlacementNode::FindPlanLocked(std::uint64_t plan_id) {
  return const_cast<PlanRecord*>(static_cast<const PlacementNode*>(this)->FindPlanLocked(plan_id));
}

Status PlacementNode::ReportObservations(const ObservationReport& r) {
  KVF_RETURN_IF_ERROR(CheckNamespace(r.ns));
  const std::uint32_t max = options_.limits.max_keys_per_batch;
  if (r.transfers.size() > max) {
    return OverLimit("transfers", r.transfers.size(), "max_keys_per_batch", max);
  }
  if (r.recomputes.size() > max) {
    return OverLimit("recomputes", r.recomputes.size(), "max_keys_per_batch", max);
  }
  if (r.stale_entries.size() > max) {
    return OverLimit("stale_entries", r.stale_entries.size(), "max_keys_per_batch", max);
  }
  for (std::size_t i = 0; i < r.transfers.size(); ++i) {
    const TransferObservation& t = r.transfers[i];
    const std::string w = "transfers[" + std::to_string(i) + "]";
    if (!IsValidBusPath(static_cast<int>(t.path))) {
      return Status::InvalidArgument(w + ".path: " + std::to_string(static_cast<int>(t.path)) +
                                     " is not a bus path");
    }
    if (t.bytes == 0) return Status::InvalidArgument(w + ".bytes: must be >= 1");
    if (!std::isfinite(t.observed_us) || t.observed_us <= 0) {
      return Status::InvalidArgument(w + ".observed_us: must be finite and > 0, got " +
                                     std::to_string(t.observed_us));
    }
  }
  for (std::size_t i = 0; i < r.recomputes.size(); ++i) {
    const RecomputeObservation& o = r.recomputes[i];
    const std::string w = "recomputes[" + std::to_string(i) + "]";
    if (o.tokens == 0) return Status::InvalidArgument(w + ".tokens: must be >= 1");
    if (!std::isfinite(o.observed_us) || o.observed_us <= 0) {
      return Status::InvalidArgument(w + ".observed_us: must be finite and > 0, got " +
                                     std::to_string(o.observed_us));
    }
  }

  // Only members' paths (and the client-local ones, host_id empty) are learned: the cost model
  // keeps an entry per (path, host), and clients must not be able to grow it without bound.
  std::vector<bool> member(r.transfers.size(), false);
  {
    MutexLock lock(&mu_);
    for (std::size_t i = 0; i < r.transfers.size(); ++i) {
      member[i] = r.transfers[i].host_id.empty() || hosts_.contains(r.transfers[i].host_id);
    }
  }
  // The cost model synchronises itself; scoring and refitting happen outside mu_.
  std::uint64_t unscored = 0;
  for (std::size_t i = 0; i < r.transfers.size(); ++i) {
    const TransferObservation& t = r.transfers[i];
    if (!member[i]) {
      ++unscored;
    } else if (!cost_model_.ObserveTransfer(t.path, t.host_id, t.bytes, t.observed_us).ok()) {
      ++unscored;
    }
  }
  if (!r.recomputes.empty()) {
    bool known = !r.model_id.empty() && cost_model_.Recompute(r.model_id).ok();
    if (!known && !r.model_id.empty() &&
        cost_model_.RecomputeReports().size() < options_.max_models) {
      known = cost_model_.SetRecompute(r.model_id, options_.recompute).ok();
    }
    for (const RecomputeObservation& o : r.recomputes) {
      if (!known ||
          !cost_model_.ObserveRecompute(r.model_id, o.tokens, o.prefix_tokens, o.observed_us)
               .ok()) {
        ++unscored;
      }
    }
  }

  MutexLock lock(&mu_);
  counters_.observations_unscored += unscored;
  counters_.fallback_runs += r.fallback_runs.size();
  for (const StaleEntry& s : r.stale_entries) {
    directory_.ReportStale(r.ns, s.key, s.host_id);
    ++counters_.stale_reports;
  }
  if (r.plan_id == 0) return Status::OK();
  PlanRecord* plan = FindPlanLocked(r.plan_id);
  if (plan == nullptr) {
    ++counters_.observations_unknown_plan;
    return Status::OK();
  }
  if (r.plan_finished && !plan->finished) {
    plan->finished = true;
    ++counters_.plans_finished;
    if (plan->ticket != 0) path_load_.Release(plan->ticket);
    plan->ticket = 0;
    if (std::isfinite(r.observed_total_us) && r.observed_total_us > 0) {
      plan->observed_total_us = r.observed_total_us;
      plan_error_.Record(r.observed_total_us, plan->predicted_total_us);
    }
  }
  return Status::OK();
}

void PlacementNode::ReportPlanFinished(std::uint64_t plan_id) {
  ObservationReport r;
  r.plan_id = plan_id;
  r.plan_finished = true;
  ReportObservations(r).IgnoreError();
}

StatusOr<PlanExplanation> PlacementNode::Explain(std::uint64_t plan_id) const {
  MutexLock lock(&mu_);
  const PlanRecord* plan = FindPlanLocked(plan_id);
  if (plan == nullptr) {
    return Status::NotFound("plan " + std::to_string(plan_id) +
                            " is unknown or aged out of the history (the last " +
                            std::to_string(plans_.size()) + " plans are kept; plan_history " +
                            std::to_string(options_.plan_history) + ")");
  }
  PlanExplanation out;
  out.plan_id = plan->plan_id;
  out.kind = plan->kind;
  out.formula = kPlanFormula;
  out.text = plan->explanation;
  out.decided_unix_us = plan->decided_unix_us;
  out.predicted_total_us = plan->predicted_total_us;
  out.observed_total_us = plan->observed_total_us;
  auto& t = out.terms;
  t.push_back({"chain_blocks", static_cast<double>(plan->chain_blocks), "blocks"});
  t.push_back({"m", static_cast<double>(plan->cached_prefix_blocks), "blocks"});
  t.push_back({"S", static_cast<double>(plan->suffix_tokens), "tokens"});
  t.push_back({"alpha_h2d", plan->host_to_device.alpha_us, "us"});
  t.push_back({"beta_h2d", plan->host_to_device.beta_bytes_per_s, "bytes/s"});
  t.push_back({"c0", plan->recompute.c0_us, "us"});
  t.push_back({"c1", plan->recompute.c1_us_per_token, "us/token"});
  t.push_back({"c2", plan->recompute.c2_us_per_token2, "us/token^2"});
  for (const PlanAlternative& a : plan->alternatives) {
    std::string name = "t_" + std::string(PlanKindName(a.kind));
    std::replace(name.begin(), name.end(), '-', '_');
    t.push_back({name, a.predicted_us, "us"});
  }
  t.push_back({"t_predicted", plan->predicted_total_us, "us"});
  if (plan->observed_total_us) t.push_back({"t_observed", *plan->observed_total_us, "us"});
  return out;
}

}  // namespace kvfabric::placement
