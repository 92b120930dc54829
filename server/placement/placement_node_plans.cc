// PlacementNode: plans (Plan, the plan history, ReportObservations). Their explanations are in
// placement_node_explain.cc.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/block_format.h"
#include "core/block_key.h"
#include "core/mutex.h"
#include "core/units.h"
#include "server/placement/placement_node.h"
#include "server/placement/placement_node_internal.h"

namespace kvfabric::placement {
namespace {

using internal::GoodPath;
using internal::GoodRecompute;
using internal::OverLimit;

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
    case BusPath::kClientIngest:
      return options_.client_ingest;
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
        "host_to_device: alpha_us must be finite and >= 0, beta_bytes_per_s finite and > 0, "
        "size factors in [0.25, 4]");
  }
  if (request.recompute && !GoodRecompute(*request.recompute)) {
    return Status::InvalidArgument("recompute: c0, c1, c2, c3 must be finite and >= 0");
  }
  if (request.engine_prefill && !GoodRecompute(*request.engine_prefill)) {
    return Status::InvalidArgument(
        "engine_prefill: c0, c1, c2, c3 must be finite and >= 0, split_serial_fraction in "
        "[0, 1]");
  }

  if (request.compact && (!std::isfinite(request.compact->extra_decode_us_per_token) ||
                          request.compact->extra_decode_us_per_token < 0)) {
    return Status::InvalidArgument(
        "accuracy.compact_extra_decode_us_per_token: must be finite and >= 0");
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
  // Blocks the accuracy policy lets the plan read compact (docs/compact.md): those ending at
  // least compact_after tokens before the request's last token. Their compact copies' replicas
  // join the block's list with representation compact_int8 (the client fetches a run by the
  // representation the plan gives it).
  std::vector<std::uint8_t> may_compact(chain.size(), 0);
  if (request.compact) {
    const std::uint64_t last =
        chain.back().prefix_tokens + chain.back().tokens + request.suffix_tokens;
    std::vector<BlockKey> compact_keys;
    std::vector<std::size_t> compact_at;
    for (std::size_t i = 0; i < chain.size(); ++i) {
      const std::uint64_t end = chain[i].prefix_tokens + chain[i].tokens;
      if (end > last || last - end < request.compact->after_tokens) continue;
      may_compact[i] = 1;
      compact_keys.push_back(CompactInt8BlockKey(chain[i].key));
      compact_at.push_back(i);
    }
    if (!compact_keys.empty()) {
      ChainLocations found;
      {
        MutexLock lock(&mu_);
        found = LocateLocked(request.ns, compact_keys);
      }
      std::vector<std::uint32_t> host_map(found.hosts.size());
      for (std::size_t h = 0; h < found.hosts.size(); ++h) {
        auto at = std::find_if(
            result.locations.hosts.begin(), result.locations.hosts.end(),
            [&](const MemberRecord& m) { return m.host_id == found.hosts[h].host_id; });
        if (at == result.locations.hosts.end()) {
          host_map[h] = static_cast<std::uint32_t>(result.locations.hosts.size());
          result.locations.hosts.push_back(found.hosts[h]);
        } else {
          host_map[h] = static_cast<std::uint32_t>(at - result.locations.hosts.begin());
        }
      }
      for (std::size_t c = 0; c < compact_keys.size(); ++c) {
        auto& block = result.locations.blocks[compact_at[c]];
        for (LocatedReplica r : found.blocks[c]) {
          // Only what a daemon published as a compact_int8 copy.
          if (r.representation != static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8)) {
            continue;
          }
          const bool dup = std::any_of(block.begin(), block.end(), [&](const LocatedReplica& x) {
            return x.representation == r.representation && x.host_index == host_map[r.host_index] &&
                   x.tier == r.tier;
          });
          if (dup) continue;
          r.host_index = host_map[r.host_index];
          block.push_back(r);
        }
      }
      // The cached prefix as this request may use it: exact or allowed compact copies.
      std::uint32_t prefix = 0;
      while (prefix < chain.size() && !result.locations.blocks[prefix].empty()) ++prefix;
      result.locations.cached_prefix_blocks = prefix;
    }
  }
  // The planner runs outside mu_: it is O(blocks x replicas) and reads only the cost model and
  // the path load, which synchronise themselves.
  PlannerInput in;
  in.client_id = request.client_id;
  in.suffix_tokens = request.suffix_tokens;
  in.include_explanation = request.include_explanation || options_.explain_every_plan;
  in.prefix_plans_only = request.prefix_plans_only;
  in.max_explanation_bytes = options_.limits.max_explanation_bytes;
  in.host_to_device = request.host_to_device
                          ? *request.host_to_device
                          : PathOrDefault(BusPath::kHostToDevice, request.client_id);
  in.client_ingest = PathOrDefault(BusPath::kClientIngest, request.client_id);
  if (request.engine_prefill && !request.model_id.empty()) {
    // Seeds (or replaces a default or earlier statement of) the model's entry; a model beyond
    // max_models is planned with the statement without being learned.
    const bool known = cost_model_.Recompute(request.model_id).ok();
    if (known || cost_model_.model_count() < options_.max_models) {
      cost_model_.StateRecompute(request.model_id, *request.engine_prefill).status().IgnoreError();
    }
  }
  if (request.recompute) {
    in.recompute = *request.recompute;
  } else {
    StatusOr<RecomputeParameters> fit = cost_model_.Recompute(request.model_id);
    in.recompute = fit.ok()                 ? *fit
                   : request.engine_prefill ? *request.engine_prefill
                                            : options_.recompute;
  }
  for (const MemberRecord& host : result.locations.hosts) {
    PlannerHost ph;
    ph.host_id = host.host_id;
    ph.local = !request.client_node.empty() && host.node_name == request.client_node;
    // A daemon on the client's node is read by memcpy only while nothing better is known: its
    // own data-plane entry (calibrated against it, or learned from the transfers clients
    // report, which are always of that path) is what reading it costs, whatever the transport
    // (the kernel TCP data plane on one host is not a memcpy).
    if (ph.local && cost_model_.HasOwnPath(BusPath::kRemoteHostToLocalHost, host.host_id)) {
      ph.local = false;
    }
    ph.transfer = PathOrDefault(ph.local ? BusPath::kLocalMemcpy : BusPath::kRemoteHostToLocalHost,
                                host.host_id);
    ph.nvme = PathOrDefault(BusPath::kNvmeToHost, host.host_id);
    in.hosts.push_back(std::move(ph));
  }
  ResolveSizeCurves(result.locations, chain, &in);
  in.blocks.resize(chain.size());
  for (std::size_t i = 0; i < chain.size(); ++i) {
    ChainBlock& b = in.blocks[i];
    b.tokens = chain[i].tokens;
    b.prefix_tokens = chain[i].prefix_tokens;
    b.bytes = chain[i].bytes;
    for (const LocatedReplica& r : result.locations.blocks[i]) {
      if (r.representation != static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8)) {
        b.replicas.push_back({r.host_index, r.tier});
      } else if (may_compact[i] && r.payload_bytes > 0) {
        // Exact mode never sees a compact copy, whatever `locations` listed.
        b.compact_replicas.push_back({r.host_index, r.tier});
        b.compact_bytes = r.payload_bytes;
      }
    }
    if (!b.compact_replicas.empty()) {
      const double steps =
          static_cast<double>(std::max<std::uint64_t>(1, request.compact->decode_steps));
      b.compact_penalty_us =
          static_cast<double>(b.tokens) * request.compact->extra_decode_us_per_token * steps;
    }
  }
  // A plan is made and its bytes admitted to the path load as one step: two plans made at once
  // would otherwise each price the paths as idle (the concurrent loads of several contexts).
  // Plans are O(blocks x replicas), so holding admission_mu_ across one costs little.
  std::uint64_t ticket = 0;
  PlanRecord record;
  {
    MutexLock admission(&admission_mu_);
    in.now_us = env_->NowMicros();
    // RETRIALS (placement_node.h): at most one host priced at its figures from before a
    // slowdown; if the plan would not fetch from it even so, it is made on the figures in force.
    PlannerHost saved;
    int retrial = ChooseRetrial(&in, &saved);
    KVF_ASSIGN_OR_RETURN(result.plan, planner_.MakePlan(in));
    if (retrial >= 0 &&
        std::none_of(result.plan.runs.begin(), result.plan.runs.end(), [&](const PlanRun& r) {
          return r.action == RunAction::kFetch &&
                 r.host_index == static_cast<std::uint32_t>(retrial);
        })) {
      in.hosts[static_cast<std::size_t>(retrial)] = std::move(saved);
      // Not counted as a retrial, but the host waits an interval before the next try: a host
      // whose other path is slowed without figures to retry would otherwise be planned twice
      // for every request.
      DeferRetrial(in.hosts[static_cast<std::size_t>(retrial)].host_id, in.now_us);
      retrial = -1;
      KVF_ASSIGN_OR_RETURN(result.plan, planner_.MakePlan(in));
    }
    // The inputs as this plan saw them: before its own bytes are queued.
    if (in.include_explanation) DescribePlanInputs(request, in, &record);
    if (retrial >= 0) BeginRetrial(in, retrial, &record);
    if (!result.plan.charges.empty()) {
      const double hold = result.plan.predicted_total_us * options_.plan_deadline_factor;
      const std::uint64_t deadline =
          env_->NowMicros() + options_.plan_deadline_slack_us +
          static_cast<std::uint64_t>(std::min(hold, 1e15));  // 1e15 µs: ~30 years, no overflow
      ticket = path_load_.Admit(result.plan.charges, in.now_us, deadline);
    }
  }
  for (const PlanRun& run : result.plan.runs) {
    std::vector<std::uint32_t>& fallbacks = result.fallback_host_indices.emplace_back();
    if (run.action != RunAction::kFetch) continue;
    // A fallback holds the run's blocks in the run's representation.
    const auto same_copy = [&](const LocatedReplica& r) {
      const bool compact =
          r.representation == static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8);
      return compact == run.compact;
    };
    for (const LocatedReplica& r : result.locations.blocks[run.first_block]) {
      if (!same_copy(r)) continue;
      if (r.host_index != run.host_index &&
          std::find(fallbacks.begin(), fallbacks.end(), r.host_index) == fallbacks.end()) {
        fallbacks.push_back(r.host_index);
      }
    }
    for (std::uint32_t b = run.first_block + 1;
         b < run.first_block + run.block_count && !fallbacks.empty(); ++b) {
      const auto& block = result.locations.blocks[b];
      std::erase_if(fallbacks, [&](std::uint32_t h) {
        return std::none_of(block.begin(), block.end(), [&](const LocatedReplica& r) {
          return r.host_index == h && same_copy(r);
        });
      });
    }
  }

  record.decided_unix_us = env_->WallMicros();
  record.kind = result.plan.kind;
  record.ns = request.ns;
  record.model_id = request.model_id;
  record.predicted_total_us = result.plan.predicted_total_us;
  record.alternatives = result.plan.alternatives;
  record.chain_blocks = static_cast<std::uint32_t>(chain.size());
  record.cached_prefix_blocks = result.plan.cached_prefix_blocks;
  record.suffix_tokens = request.suffix_tokens;
  record.host_to_device = in.host_to_device;
  record.client_ingest = in.client_ingest;
  record.recompute = in.recompute;
  // A split plan planned with the model's own entry teaches that entry its overlap when it
  // finishes (CalibratedCostModel::ObserveSplit).
  record.learn_split =
      result.plan.kind == PlanKind::kSplit && !request.recompute && !request.model_id.empty();
  if (request.include_explanation) {
    record.explanation = result.plan.explanation;
  } else {
    record.explanation = std::move(result.plan.explanation);
    result.plan.explanation.clear();
  }
  record.ticket = ticket;
  const bool not_admitted = ticket == 0 && !result.plan.charges.empty();
  MutexLock lock(&mu_);
  if (not_admitted) ++counters_.plans_not_admitted;
  if (!record.retrial_host.empty()) ++counters_.retrials;
  record.plan_id = next_plan_id_++;
  result.plan_id = record.plan_id;
  plans_bytes_ += PlanRecordBytes(record);
  plans_.push_back(std::move(record));
  TrimPlanHistoryLocked();
  ++counters_.plans;
  const auto kind = static_cast<std::size_t>(result.plan.kind);
  if (kind < counters_.plans_by_kind.size()) ++counters_.plans_by_kind[kind];
  if (result.plan.compact_blocks > 0) {
    ++counters_.plans_compact;
    counters_.compact_blocks_planned += result.plan.compact_blocks;
  }
  return result;
}

void PlacementNode::ResolveSizeCurves(const ChainLocations& locations,
                                      const std::vector<ChainBlockSpec>& chain, PlannerInput* in) {
  // What each source is expected to move: every block of the cached prefix split evenly over
  // the hosts holding an exact copy of it (the balanced assignment, planner.h), its NVMe part
  // where that host holds it on NVMe only. This is the size the client's observations of the
  // source will have (one per source and load, RecordTransfers), so the curve is read where it
  // was learned.
  std::vector<double> bytes(in->hosts.size(), 0.0);
  std::vector<double> nvme(in->hosts.size(), 0.0);
  double total = 0;
  const std::uint32_t prefix = std::min<std::uint32_t>(
      locations.cached_prefix_blocks, static_cast<std::uint32_t>(locations.blocks.size()));
  std::vector<std::uint32_t> holders;
  std::vector<bool> host_tier;
  for (std::uint32_t i = 0; i < prefix && i < chain.size(); ++i) {
    holders.clear();
    host_tier.clear();
    for (const LocatedReplica& r : locations.blocks[i]) {
      if (r.representation == static_cast<std::uint8_t>(BlockRepresentation::kCompactInt8)) {
        continue;
      }
      if (r.host_index >= in->hosts.size()) continue;
      const auto at = std::find(holders.begin(), holders.end(), r.host_index);
      if (at == holders.end()) {
        holders.push_back(r.host_index);
        host_tier.push_back(r.tier != Tier::kNvme);
      } else if (r.tier != Tier::kNvme) {
        host_tier[at - holders.begin()] = true;
      }
    }
    if (holders.empty()) continue;
    const double b = static_cast<double>(chain[i].bytes);
    total += b;
    const double share = b / static_cast<double>(holders.size());
    for (std::size_t h = 0; h < holders.size(); ++h) {
      bytes[holders[h]] += share;
      if (!host_tier[h]) nvme[holders[h]] += share;
    }
  }
  // A source the prefix does not use is priced at the whole prefix (any size would do; this one
  // keeps its explanation meaningful).
  auto resolve = [](PathParameters* p, double at, double* factor) {
    *factor = SizeFactor(*p, at);
    *p = AtSize(*p, at);
  };
  for (std::size_t h = 0; h < in->hosts.size(); ++h) {
    PlannerHost& ph = in->hosts[h];
    const double at = bytes[h] > 0 ? bytes[h] : total;
    const double at_nvme = nvme[h] > 0 ? nvme[h] : at;
    ph.expected_bytes = static_cast<std::uint64_t>(at);
    ph.expected_nvme_bytes = static_cast<std::uint64_t>(at_nvme);
    resolve(&ph.transfer, at, &ph.transfer_size_factor);
    resolve(&ph.nvme, at_nvme, &ph.nvme_size_factor);
  }
  in->expected_bytes = static_cast<std::uint64_t>(total);
  resolve(&in->host_to_device, total, &in->host_to_device_size_factor);
  resolve(&in->client_ingest, total, &in->client_ingest_size_factor);
}

std::size_t PlacementNode::PlanRecordBytes(const PlanRecord& record) {
  std::size_t terms = 0;
  for (const ExplainTerm& t : record.input_terms) terms += t.name.size() + t.unit.size();
  return sizeof(PlanRecord) + record.ns.size() + record.model_id.size() +
         record.retrial_host.size() + record.explanation.size() + record.inputs.size() +
         record.input_terms.size() * sizeof(ExplainTerm) + terms +
         record.alternatives.size() * sizeof(PlanAlternative);
}

void PlacementNode::TrimPlanHistoryLocked() {
  // The same PlanRecordBytes on the way out as on the way in: otherwise the
  // count drifts up and the history shrinks to one plan over time.
  while (plans_.size() > 1 &&
         (plans_.size() > options_.plan_history || plans_bytes_ > options_.plan_history_bytes)) {
    plans_bytes_ -= PlanRecordBytes(plans_.front());
    plans_.pop_front();
  }
}

std::size_t PlacementNode::PlanHistorySize() const {
  MutexLock lock(&mu_);
  return plans_.size();
}

std::vector<PlanSummary> PlacementNode::RecentPlans(std::size_t n, const std::string* ns) const {
  MutexLock lock(&mu_);
  std::vector<PlanSummary> out;
  for (auto it = plans_.rbegin(); it != plans_.rend() && out.size() < n; ++it) {
    if (ns != nullptr && it->ns != *ns) continue;
    PlanSummary s;
    s.plan_id = it->plan_id;
    s.decided_unix_us = it->decided_unix_us;
    s.kind = it->kind;
    s.ns = it->ns;
    s.model_id = it->model_id;
    s.chain_blocks = it->chain_blocks;
    s.cached_prefix_blocks = it->cached_prefix_blocks;
    s.suffix_tokens = it->suffix_tokens;
    s.predicted_total_us = it->predicted_total_us;
    s.finished = it->finished;
    s.observed_total_us = it->observed_total_us;
    s.later_plans_delay_us = it->later_plans_delay_us;
    out.push_back(std::move(s));
  }
  return out;
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
  // RETRIALS: the host this report's plan retried, judged by the first report with its transfers.
  std::string retrial_host;
  if (r.plan_id != 0) {
    MutexLock lock(&mu_);
    PlanRecord* plan = FindPlanLocked(r.plan_id);
    if (plan != nullptr && plan->ns == r.ns && !plan->retrial_host.empty() &&
        !plan->retrial_judged &&
        std::any_of(r.transfers.begin(), r.transfers.end(), [&](const TransferObservation& t) {
          return t.host_id == plan->retrial_host;
        })) {
      plan->retrial_judged = true;
      retrial_host = plan->retrial_host;
    }
  }
  std::uint64_t restored = 0;
  std::uint64_t still_slow = 0;
  std::vector<std::string> observed_hosts;  // by ordinary loads
  // The cost model synchronises itself; scoring and refitting happen outside mu_.
  std::uint64_t unscored = 0;
  std::uint64_t beside_fetch = 0;
  std::uint64_t beside_prefill = 0;
  std::uint64_t shared = 0;
  for (std::size_t i = 0; i < r.transfers.size(); ++i) {
    const TransferObservation& t = r.transfers[i];
    if (!member[i]) {
      ++unscored;
    } else if (!retrial_host.empty() && t.host_id == retrial_host &&
               t.path != BusPath::kHostToDevice && t.path != BusPath::kClientIngest) {
      // A retrial judges by every transfer of its host, one beside its prefill too (not fitted
      // then: ObserveRetrial).
      if (t.beside_prefill) ++beside_prefill;
      if (t.shared_bytes > 0) ++shared;
      StatusOr<RetrialJudgement> j = cost_model_.ObserveRetrial(
          t.path, t.host_id, t.bytes, t.shared_bytes, t.observed_us, t.beside_prefill);
      if (!j.ok()) {
        ++unscored;
        continue;
      }
      if (j->outcome == RetrialOutcome::kNotDegraded) continue;
      ++(j->outcome == RetrialOutcome::kRestored ? restored : still_slow);
      // At most one retrial per host and --retrial-interval: bounded.
      spdlog::info(
          "placement {:016x}: retrial of {}'s {}: {} in {}{} (its figures from before the "
          "slowdown predict {}, the slowed ones {}): {}",
          incarnation_, t.host_id, BusPathName(t.path), FormatBytes(t.bytes),
          FormatMicros(j->observed_us), t.beside_prefill ? " beside a prefill" : "",
          FormatMicros(j->healthy_us), FormatMicros(j->slowed_us),
          j->outcome == RetrialOutcome::kRestored ? "recovered, restored" : "still slow");
    } else if (t.beside_prefill) {
      // A split's fetch side, slowed by the prefill beside it: the split's own score covers it,
      // and fitting alpha and beta to it would count the overlap twice (once in them, once in s)
      // and price every later fetch-all as if a prefill ran beside it. (A stream the client cut
      // as a straggler is reported without the flag: that miss is the path's.) One no slower
      // than 1 + change_point_ratio times the figures confirms them all the same (retrials).
      ++beside_prefill;
      cost_model_.ObserveBesidePrefill(t.path, t.host_id, t.bytes, t.observed_us).IgnoreError();
    } else {
      if (!t.host_id.empty() && std::find(observed_hosts.begin(), observed_hosts.end(),
                                          t.host_id) == observed_hosts.end()) {
        observed_hosts.push_back(t.host_id);
      }
      // Beside other loads on the same path: it teaches the path's concurrency gain, and what
      // these bytes took of its time is fitted (the planner's path load shares the rest).
      double us = t.observed_us;
      if (t.shared_bytes > 0) {
        ++shared;
        StatusOr<double> own =
            cost_model_.ObserveShared(t.path, t.host_id, t.bytes, t.shared_bytes, t.observed_us);
        if (own.ok()) us *= *own;
      }
      if (!cost_model_.ObserveTransfer(t.path, t.host_id, t.bytes, us).ok()) ++unscored;
    }
  }
  if (!r.recomputes.empty()) {
    bool known = !r.model_id.empty() && cost_model_.Recompute(r.model_id).ok();
    if (!known && !r.model_id.empty() && cost_model_.model_count() < options_.max_models) {
      known =
          cost_model_.SetRecompute(r.model_id, options_.recompute, ParameterSource::kDefault).ok();
    }
    for (const RecomputeObservation& o : r.recomputes) {
      // A split's front, slowed by the fetch beside it: the split's own score covers it, and
      // fitting c0, c1, c2 to it would count the overlap twice (once in them, once in s).
      if (o.beside_fetch) {
        ++beside_fetch;
        continue;
      }
      if (!known ||
          !cost_model_.ObserveRecompute(r.model_id, o.tokens, o.prefix_tokens, o.observed_us)
               .ok()) {
        ++unscored;
      }
    }
  }

  if (!retrial_host.empty() || !observed_hosts.empty()) {
    JudgeRetrial(retrial_host, restored, still_slow, observed_hosts);
  }

  MutexLock lock(&mu_);
  if (!retrial_host.empty()) {
    counters_.retrials_restored += restored > 0 && still_slow == 0 ? 1 : 0;
    counters_.retrials_still_slow += still_slow > 0 ? 1 : 0;
  }
  counters_.observations_unscored += unscored;
  counters_.observations_beside_fetch += beside_fetch;
  counters_.observations_beside_prefill += beside_prefill;
  counters_.observations_shared += shared;
  for (std::size_t i = 0; i < r.transfers.size(); ++i) {
    const TransferObservation& t = r.transfers[i];
    const int path = static_cast<int>(t.path);
    if (!member[i] || path <= 0 || path > kMaxBusPath) continue;
    PathTraffic& traffic = counters_.traffic[static_cast<std::size_t>(path)];
    ++traffic.transfers;
    traffic.bytes += t.bytes;
    traffic.observed_us += t.observed_us;
  }
  counters_.fallback_runs += r.fallback_runs.size();
  for (const StaleEntry& s : r.stale_entries) {
    directory_.ReportStale(r.ns, s.key, s.host_id);
    ++counters_.stale_reports;
  }
  if (r.plan_id == 0) return Status::OK();
  PlanRecord* plan = FindPlanLocked(r.plan_id);
  // Another namespace's plan is unknown here: a tenant cannot finish, release or teach the
  // overlap of (or judge the retrial of) a plan it did not make.
  if (plan == nullptr || plan->ns != r.ns) {
    ++counters_.observations_unknown_plan;
    return Status::OK();
  }
  if (!r.fallback_runs.empty()) plan->fell_back = true;
  if (r.plan_finished && !plan->finished) {
    plan->finished = true;
    ++counters_.plans_finished;
    double later_delay_us = 0;
    if (plan->ticket != 0 && path_load_.Release(plan->ticket, env_->NowMicros(), &later_delay_us)) {
      plan->later_plans_delay_us = later_delay_us;
    }
    plan->ticket = 0;
    if (std::isfinite(r.observed_total_us) && r.observed_total_us > 0) {
      plan->observed_total_us = r.observed_total_us;
      plan_error_.Record(r.observed_total_us, plan->predicted_total_us);
      // A plan whose runs fell back did other work than planned: it says nothing of overlap.
      if (plan->learn_split && !plan->fell_back) {
        for (const PlanAlternative& a : plan->alternatives) {
          if (!a.chosen || a.kind != PlanKind::kSplit) continue;
          if (cost_model_
                  .ObserveSplit(plan->model_id, a.front_us, a.fetch_us, a.rest_us,
                                r.observed_total_us)
                  .ok()) {
            ++counters_.split_observations;
          }
        }
      }
    }
  }
  return Status::OK();
}

void PlacementNode::ReportPlanFinished(std::uint64_t plan_id) {
  ObservationReport r;
  r.plan_id = plan_id;
  {
    MutexLock lock(&mu_);
    if (const PlanRecord* plan = FindPlanLocked(plan_id); plan != nullptr) r.ns = plan->ns;
  }
  r.plan_finished = true;
  ReportObservations(r).IgnoreError();
}

StatusOr<CalibratedCostModel::ReloadCounts> PlacementNode::ReloadCalibration(
    const BusCalibration& calibration) {
  KVF_ASSIGN_OR_RETURN(CalibratedCostModel::ReloadCounts counts, cost_model_.Reload(calibration));
  spdlog::info(
      "placement {:016x}: calibration reloaded: {} paths and {} models replaced, {} "
      "entries kept",
      incarnation_, counts.paths, counts.models, counts.kept);
  return counts;
}

}  // namespace kvfabric::placement
