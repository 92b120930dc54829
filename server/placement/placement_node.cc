#include "server/placement/placement_node.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "server/placement/rendezvous.h"

namespace kvfabric::placement {
namespace {

// "keys: 70000 > max_chain_blocks 65536".
Status OverLimit(std::string_view what, std::uint64_t got, std::string_view limit,
                 std::uint64_t max) {
  return Status::InvalidArgument(std::string(what) + ": " + std::to_string(got) + " > " +
                                 std::string(limit) + " " + std::to_string(max));
}

bool GoodPath(const PathParameters& p) {
  return std::isfinite(p.alpha_us) && p.alpha_us >= 0 && std::isfinite(p.beta_bytes_per_s) &&
         p.beta_bytes_per_s > 0;
}

bool GoodRecompute(const RecomputeParameters& r) {
  for (double v : {r.c0_us, r.c1_us_per_token, r.c2_us_per_token2}) {
    if (!std::isfinite(v) || v < 0) return false;
  }
  return true;
}

std::uint64_t SaturatingAdd(std::uint64_t a, std::uint64_t b) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  return a > kMax - b ? kMax : a + b;
}

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

StatusOr<std::unique_ptr<PlacementNode>> PlacementNode::Create(PlacementOptions options,
                                                               MembershipStore* membership,
                                                               Env* env) {
  if (membership == nullptr || env == nullptr) {
    return Status::InvalidArgument("placement node needs a membership store and an Env");
  }
  const PlacementLimits& l = options.limits;
  if (l.max_replicas < 1 || l.max_replicas > 8) {
    return Status::InvalidArgument("max_replicas: " + std::to_string(l.max_replicas) +
                                   " not in 1..8");
  }
  if (l.max_chain_blocks < 1 || l.max_chain_blocks > kMaxPlannerChainBlocks) {
    return Status::InvalidArgument("max_chain_blocks: " + std::to_string(l.max_chain_blocks) +
                                   " not in 1.." + std::to_string(kMaxPlannerChainBlocks));
  }
  if (l.max_keys_per_batch < 1 || l.max_block_bytes < 1) {
    return Status::InvalidArgument("max_keys_per_batch and max_block_bytes must be >= 1");
  }
  if (l.default_ttl_ms < 1 || l.default_ttl_ms > l.max_ttl_ms) {
    return Status::InvalidArgument("default_ttl_ms: " + std::to_string(l.default_ttl_ms) +
                                   " not in 1..max_ttl_ms " + std::to_string(l.max_ttl_ms));
  }
  if (options.hot_replicas < 1 || options.hot_replicas > l.max_replicas) {
    return Status::InvalidArgument("hot_replicas: " + std::to_string(options.hot_replicas) +
                                   " not in 1..max_replicas " + std::to_string(l.max_replicas));
  }
  if (options.plan_history < 1 || options.max_directory_entries < 1) {
    return Status::InvalidArgument("plan_history and max_directory_entries must be >= 1");
  }
  if (!std::isfinite(options.plan_deadline_factor) || options.plan_deadline_factor < 1) {
    return Status::InvalidArgument("plan_deadline_factor: must be finite and >= 1");
  }
  const std::pair<const char*, const PathParameters*> defaults[] = {
      {"remote_to_local", &options.remote_to_local},
      {"local_memcpy", &options.local_memcpy},
      {"nvme_to_host", &options.nvme_to_host},
      {"host_to_device", &options.host_to_device}};
  for (const auto& [name, p] : defaults) {
    if (!GoodPath(*p)) {
      return Status::InvalidArgument(std::string(name) +
                                     ": alpha_us must be finite and >= 0, beta_bytes_per_s "
                                     "finite and > 0");
    }
  }
  if (!GoodRecompute(options.recompute)) {
    return Status::InvalidArgument("recompute: c0, c1, c2 must be finite and >= 0");
  }
  std::unique_ptr<PlacementNode> node(new PlacementNode(std::move(options), membership, env));
  KVF_RETURN_IF_ERROR(node->Start());
  return node;
}

PlacementNode::PlacementNode(PlacementOptions options, MembershipStore* membership, Env* env)
    : options_(std::move(options)),
      membership_(membership),
      env_(env),
      start_us_(env->NowMicros()),
      incarnation_(options_.incarnation != 0
                       ? options_.incarnation
                       : SplitMix64(env->WallMicros() ^ env->NowMicros()) | 1),
      cost_model_(options_.cost_model),
      directory_(Directory::Options{options_.max_directory_entries, options_.limits.max_replicas}) {
}

Status PlacementNode::Start() {
  if (!options_.calibration.paths.empty() || !options_.calibration.recompute.empty()) {
    KVF_RETURN_IF_ERROR(cost_model_.Load(options_.calibration).WithContext("calibration"));
  }
  // Defaults for the paths the calibration did not give a default ("" host) entry for.
  const std::pair<BusPath, PathParameters> defaults[] = {
      {BusPath::kRemoteHostToLocalHost, options_.remote_to_local},
      {BusPath::kLocalMemcpy, options_.local_memcpy},
      {BusPath::kNvmeToHost, options_.nvme_to_host},
      {BusPath::kHostToDevice, options_.host_to_device}};
  for (const auto& [path, p] : defaults) {
    if (!cost_model_.Path(path, "").ok()) KVF_RETURN_IF_ERROR(cost_model_.SetPath(path, "", p));
  }

  membership_->Watch([this](const MemberEvent& event) { OnMemberEvent(event); });
  KVF_ASSIGN_OR_RETURN(std::vector<Member> members, membership_->List());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Member& m : members) UpsertMemberLocked(m.record, m.lease_id);
  }
  spdlog::info(
      "placement {:016x}: membership {} with {} members; cost model: {} calibrated paths, {} "
      "models; directory bound {} entries",
      incarnation_, membership_->name(), members.size(), options_.calibration.paths.size(),
      options_.calibration.recompute.size(), options_.max_directory_entries);
  if (options_.maintenance_interval.count() > 0) {
    maintenance_ = std::thread([this] { MaintenanceLoop(); });
  }
  return Status::OK();
}

PlacementNode::~PlacementNode() {
  {
    std::lock_guard<std::mutex> lock(maintenance_mu_);
    stopping_ = true;
  }
  maintenance_cv_.notify_all();
  if (maintenance_.joinable()) maintenance_.join();
  membership_->Watch(MemberWatcher{});
}

void PlacementNode::MaintenanceLoop() {
  std::unique_lock<std::mutex> lock(maintenance_mu_);
  while (!stopping_) {
    maintenance_cv_.wait_for(lock, options_.maintenance_interval, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Maintain();
    lock.lock();
  }
}

// ---- Membership ----

void PlacementNode::OnMemberEvent(const MemberEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (event.kind) {
    case MemberEventKind::kJoined:
    case MemberEventKind::kUpdated:
      UpsertMemberLocked(event.record, 0);
      break;
    case MemberEventKind::kLeft: {
      auto it = hosts_.find(event.record.host_id);
      if (it != hosts_.end() && it->second.record.incarnation == event.record.incarnation) {
        RemoveMemberLocked(it->first, !it->second.leaving);
      }
      break;
    }
  }
}

PlacementNode::HostState& PlacementNode::UpsertMemberLocked(const MemberRecord& record,
                                                            std::uint64_t lease_id) {
  ++member_epoch_;
  auto it = hosts_.find(record.host_id);
  if (it == hosts_.end()) {
    it = hosts_.emplace(record.host_id, HostState{}).first;
    directory_.SetHostIncarnation(record.host_id, record.incarnation);
    spdlog::info("member {} joined: incarnation {:016x}, node '{}', {} host + {} NVMe bytes free",
                 record.host_id, record.incarnation, record.node_name, record.host_free_bytes,
                 record.nvme_free_bytes);
  } else if (it->second.record.incarnation != record.incarnation) {
    const std::size_t dropped = directory_.SetHostIncarnation(record.host_id, record.incarnation);
    ++counters_.incarnations_replaced;
    if (it->second.lease_id != 0) host_by_lease_.erase(it->second.lease_id);
    spdlog::info(
        "member {}: incarnation {:016x} replaces {:016x}; {} directory entries dropped until it "
        "reports them",
        record.host_id, record.incarnation, it->second.record.incarnation, dropped);
    it->second = HostState{};
  }
  HostState& host = it->second;
  host.record = record;
  if (lease_id != 0 && lease_id != host.lease_id) {
    if (host.lease_id != 0) host_by_lease_.erase(host.lease_id);
    host.lease_id = lease_id;
    host_by_lease_[lease_id] = record.host_id;
  }
  return host;
}

void PlacementNode::RemoveMemberLocked(const std::string& host_id, bool expired) {
  auto it = hosts_.find(host_id);
  if (it == hosts_.end()) return;
  ++member_epoch_;
  const std::string id = it->first;  // `host_id` may alias the key
  const std::size_t dropped = directory_.DropHost(id);
  if (it->second.lease_id != 0) host_by_lease_.erase(it->second.lease_id);
  hosts_.erase(it);
  if (expired) {
    ++counters_.lease_expiries;
  } else {
    ++counters_.members_left;
  }
  spdlog::info("member {} {}; {} directory entries dropped", id, expired ? "lease expired" : "left",
               dropped);
}

bool PlacementNode::UsableLocked(const HostState& host) const { return !host.record.draining; }

StatusOr<RegisterResult> PlacementNode::Register(const MemberRecord& in, std::uint32_t ttl_ms) {
  KVF_RETURN_IF_ERROR(ValidateMemberRecord(in));
  if (in.incarnation == 0) return Status::InvalidArgument("incarnation: must be non-zero");
  if (ttl_ms > options_.limits.max_ttl_ms) {
    return OverLimit("ttl_ms", ttl_ms, "max_ttl_ms", options_.limits.max_ttl_ms);
  }
  if (ttl_ms == 0) ttl_ms = options_.limits.default_ttl_ms;
  MemberRecord record = in;
  if (record.joined_unix_us == 0) record.joined_unix_us = env_->WallMicros();
  // Not under mu_: the store may call OnMemberEvent from inside Join.
  KVF_ASSIGN_OR_RETURN(const std::uint64_t lease_id,
                       membership_->Join(record, std::chrono::milliseconds(ttl_ms)));
  std::lock_guard<std::mutex> lock(mu_);
  HostState& host = UpsertMemberLocked(record, lease_id);
  host.last_heartbeat_unix_us = env_->WallMicros();
  host.renewed_at_us = env_->NowMicros();
  host.ttl_ms = ttl_ms;
  ++counters_.registrations;
  RegisterResult out;
  out.lease_id = lease_id;
  out.ttl_ms = ttl_ms;
  out.heartbeat_interval_ms = std::max<std::uint32_t>(1, ttl_ms / 3);
  out.full_report_requested = host.full_report_wanted;
  out.placement_incarnation = incarnation_;
  return out;
}

StatusOr<HeartbeatResult> PlacementNode::Heartbeat(std::uint64_t lease_id,
                                                   const MemberRecord* updated) {
  MemberRecord record;
  if (updated != nullptr) {
    KVF_RETURN_IF_ERROR(ValidateMemberRecord(*updated));
    record = *updated;
    std::lock_guard<std::mutex> lock(mu_);
    auto l = host_by_lease_.find(lease_id);
    if (l != host_by_lease_.end()) {
      const HostState& host = hosts_.at(l->second);
      if (record.host_id != host.record.host_id || record.incarnation != host.record.incarnation) {
        return Status::InvalidArgument(
            "lease " + std::to_string(lease_id) + " belongs to host_id \"" + host.record.host_id +
            "\" incarnation " + std::to_string(host.record.incarnation) + ", not \"" +
            record.host_id + "\" incarnation " + std::to_string(record.incarnation) +
            ": a new incarnation must Register");
      }
      if (record.joined_unix_us == 0) record.joined_unix_us = host.record.joined_unix_us;
    }
  }
  // Not under mu_: the store may call OnMemberEvent from inside KeepAlive.
  const Status status = membership_->KeepAlive(lease_id, updated ? &record : nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) {
    if (status.code() == StatusCode::kNotFound) ++counters_.heartbeats_not_found;
    return status;
  }
  ++counters_.heartbeats;
  HeartbeatResult out;
  auto l = host_by_lease_.find(lease_id);
  HostState* host = l == host_by_lease_.end() ? nullptr : &hosts_.at(l->second);
  if (host == nullptr && updated != nullptr) {
    // Registered through another placement replica: learn the lease now.
    host = &UpsertMemberLocked(record, lease_id);
  }
  if (host == nullptr) {
    out.full_report_requested = true;
    return out;
  }
  if (updated != nullptr) host->record = record;
  host->last_heartbeat_unix_us = env_->WallMicros();
  host->renewed_at_us = env_->NowMicros();
  out.ttl_ms = host->ttl_ms;
  out.full_report_requested = host->full_report_wanted;
  return out;
}

Status PlacementNode::Deregister(std::uint64_t lease_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto l = host_by_lease_.find(lease_id);
    if (l != host_by_lease_.end()) hosts_.at(l->second).leaving = true;
  }
  KVF_RETURN_IF_ERROR(membership_->Leave(lease_id));
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.deregistrations;
  auto l = host_by_lease_.find(lease_id);
  if (l != host_by_lease_.end()) RemoveMemberLocked(l->second, /*expired=*/false);
  return Status::OK();
}

void PlacementNode::Maintain() {
  const std::size_t expired = path_load_.ReleaseExpired(env_->NowMicros());
  std::uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.plans_expired += expired;
    epoch = member_epoch_;
  }
  StatusOr<std::vector<Member>> members = membership_->List();
  if (!members.ok()) {
    spdlog::warn("membership {}: List failed: {}", membership_->name(),
                 members.status().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A membership change between List and here (Register, Deregister, a watch event) makes the
  // list stale for that host; reconcile on the next round instead.
  if (member_epoch_ != epoch) return;
  std::set<std::string, std::less<>> present;
  for (const Member& m : *members) {
    present.insert(m.record.host_id);
    auto it = hosts_.find(m.record.host_id);
    if (it == hosts_.end() || it->second.record.incarnation != m.record.incarnation ||
        it->second.lease_id != m.lease_id) {
      UpsertMemberLocked(m.record, m.lease_id);
    }
  }
  std::vector<std::string> gone;
  for (const auto& [id, host] : hosts_) {
    if (!present.contains(id)) gone.push_back(id);
  }
  for (const std::string& id : gone) RemoveMemberLocked(id, !hosts_.at(id).leaving);
}

// ---- Directory ----

Status PlacementNode::CheckNamespace(std::string_view ns) const {
  if (ns.size() > options_.limits.max_namespace_bytes) {
    return OverLimit("namespace bytes", ns.size(), "max_namespace_bytes",
                     options_.limits.max_namespace_bytes);
  }
  return Status::OK();
}

StatusOr<ReportResult> PlacementNode::ReportBlocks(const BlockReport& r) {
  if (r.events.size() > options_.limits.max_keys_per_batch) {
    return OverLimit("events", r.events.size(), "max_keys_per_batch",
                     options_.limits.max_keys_per_batch);
  }
  if (r.sequence == 0) return Status::InvalidArgument("sequence: must be >= 1");
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const BlockEvent& e = r.events[i];
    if (e.ns.size() > options_.limits.max_namespace_bytes) {
      return OverLimit("events[" + std::to_string(i) + "].namespace bytes", e.ns.size(),
                       "max_namespace_bytes", options_.limits.max_namespace_bytes);
    }
    if (e.payload_bytes > options_.limits.max_block_bytes) {
      return OverLimit("events[" + std::to_string(i) + "].payload_bytes", e.payload_bytes,
                       "max_block_bytes", options_.limits.max_block_bytes);
    }
  }
  const std::uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.reports;
  auto host_it = hosts_.find(r.host_id);
  auto lease_it = host_by_lease_.find(r.lease_id);
  if (host_it == hosts_.end() || lease_it == host_by_lease_.end() ||
      lease_it->second != r.host_id || host_it->second.record.incarnation != r.incarnation) {
    ++counters_.reports_not_found;
    counters_.report_events_ignored += r.events.size();
    return Status::NotFound("membership lease " + std::to_string(r.lease_id) +
                            " is not the current lease of host_id \"" + r.host_id +
                            "\" incarnation " + std::to_string(r.incarnation) +
                            ": Register again and send a full report");
  }
  HostState& host = host_it->second;
  ReportResult out;
  if (r.sequence <= host.acked_sequence) {
    ++counters_.reports_duplicate;
    out.acked_sequence = host.acked_sequence;
    out.full_report_requested = host.full_report_wanted;
    return out;
  }
  if (r.sequence != host.acked_sequence + 1) {
    ++counters_.reports_gap;
    host.full_report_wanted = true;
    if (host.snapshot_id != 0) host.snapshot_broken = true;
  }
  if (r.snapshot_id != 0 && r.snapshot_id != host.snapshot_id) {
    // A new snapshot is authoritative from its first chunk: what was lost before it does not
    // matter.
    directory_.BeginSnapshot(r.host_id);
    host.snapshot_id = r.snapshot_id;
    host.snapshot_broken = false;
  } else if (r.snapshot_id == 0 && host.snapshot_id != 0) {
    host.snapshot_id = 0;  // abandoned: the full-report request stands
  }
  directory_.Apply(r.host_id, r.incarnation, r.events, now);
  host.acked_sequence = r.sequence;
  if (r.snapshot_id != 0 && r.snapshot_last) {
    if (!host.snapshot_broken) {
      const std::size_t dropped = directory_.EndSnapshot(r.host_id);
      host.full_report_wanted = false;
      ++counters_.snapshots_completed;
      spdlog::info("member {}: full snapshot {} applied: {} directory entries, {} dropped",
                   r.host_id, r.snapshot_id, directory_.HostReplicas(r.host_id), dropped);
    }
    host.snapshot_id = 0;
    host.snapshot_broken = false;
  }
  out.acked_sequence = host.acked_sequence;
  out.full_report_requested = host.full_report_wanted;
  return out;
}

ChainLocations PlacementNode::LocateLocked(std::string_view ns, std::span<const BlockKey> keys) {
  const std::vector<DirectoryEntry> entries =
      directory_.Lookup(ns, keys, /*touch=*/true, env_->NowMicros());
  ChainLocations out;
  out.blocks.resize(keys.size());
  std::unordered_map<std::string_view, std::uint32_t> index;
  std::vector<std::uint64_t> queued;  // per host index
  bool prefix = true;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto& block = out.blocks[i];
    for (const DirectoryReplica& r : entries[i].replicas) {
      auto h = hosts_.find(r.host_id);
      if (h == hosts_.end() || h->second.record.incarnation != r.incarnation ||
          !UsableLocked(h->second)) {
        continue;
      }
      auto [at, inserted] =
          index.try_emplace(h->first, static_cast<std::uint32_t>(out.hosts.size()));
      if (inserted) {
        out.hosts.push_back(h->second.record);
        queued.push_back(path_load_.QueuedBytes(BusPath::kRemoteHostToLocalHost, h->first));
      }
      block.push_back({at->second, r.best_tier(), r.payload_bytes, r.representation});
    }
    std::sort(block.begin(), block.end(), [&](const LocatedReplica& a, const LocatedReplica& b) {
      if (a.tier != b.tier) return a.tier == Tier::kHost;
      if (queued[a.host_index] != queued[b.host_index]) {
        return queued[a.host_index] < queued[b.host_index];
      }
      return out.hosts[a.host_index].host_id < out.hosts[b.host_index].host_id;
    });
    if (prefix && !block.empty()) {
      ++out.cached_prefix_blocks;
    } else {
      prefix = false;
    }
  }
  return out;
}

StatusOr<ChainLocations> PlacementNode::Locate(std::string_view ns,
                                               std::span<const BlockKey> keys) {
  KVF_RETURN_IF_ERROR(CheckNamespace(ns));
  if (keys.empty()) return Status::InvalidArgument("keys: a chain needs at least 1 key");
  if (keys.size() > options_.limits.max_chain_blocks) {
    return OverLimit("keys", keys.size(), "max_chain_blocks", options_.limits.max_chain_blocks);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.locates;
  return LocateLocked(ns, keys);
}

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
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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
  return const_cast<PlanRecord*>(std::as_const(*this).FindPlanLocked(plan_id));
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
    std::lock_guard<std::mutex> lock(mu_);
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

  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
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

// ---- Place ----

StatusOr<PlaceResponse> PlacementNode::Place(const PlaceRequest& request) {
  KVF_RETURN_IF_ERROR(CheckNamespace(request.ns));
  const PlacementLimits& l = options_.limits;
  if (request.keys.empty()) return Status::InvalidArgument("keys: at least 1 key is needed");
  if (request.keys.size() > l.max_keys_per_batch) {
    return OverLimit("keys", request.keys.size(), "max_keys_per_batch", l.max_keys_per_batch);
  }
  if (request.replicas > l.max_replicas) {
    return OverLimit("replicas", request.replicas, "max_replicas", l.max_replicas);
  }
  if (request.payload_bytes == 0) return Status::InvalidArgument("payload_bytes: must be >= 1");
  if (request.payload_bytes > l.max_block_bytes) {
    return OverLimit("payload_bytes", request.payload_bytes, "max_block_bytes", l.max_block_bytes);
  }
  if (request.exclude_host_ids.size() > l.max_keys_per_batch) {
    return OverLimit("exclude_host_ids", request.exclude_host_ids.size(), "max_keys_per_batch",
                     l.max_keys_per_batch);
  }
  const std::set<std::string_view, std::less<>> excluded(request.exclude_host_ids.begin(),
                                                         request.exclude_host_ids.end());
  PlaceResponse out;
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.places;
  std::unordered_map<std::string_view, std::uint32_t> index;
  const auto add_host = [&](const HostState& host) {
    auto [at, inserted] =
        index.try_emplace(host.record.host_id, static_cast<std::uint32_t>(out.hosts.size()));
    if (inserted) out.hosts.push_back(host.record);
    return at->second;
  };
  std::vector<RendezvousCandidate> candidates;
  std::size_t draining = 0, eligible = 0;
  std::uint64_t most_free = 0;
  for (const auto& [id, host] : hosts_) {
    if (!UsableLocked(host)) {
      ++draining;
      continue;
    }
    if (excluded.contains(id)) continue;
    ++eligible;
    const std::uint64_t free =
        SaturatingAdd(host.record.host_free_bytes, host.record.nvme_free_bytes);
    most_free = std::max(most_free, free);
    if (free < request.payload_bytes) continue;
    const std::uint32_t at = add_host(host);
    candidates.push_back({at, HostHash(id), static_cast<double>(std::max<std::uint64_t>(free, 1)),
                          host.record.host_id});
  }
  // The candidates' host_id views point into hosts_, stable while mu_ is held.
  const std::vector<DirectoryEntry> entries =
      directory_.Lookup(request.ns, request.keys, /*touch=*/false, 0);
  out.results.resize(request.keys.size());
  for (std::size_t i = 0; i < request.keys.size(); ++i) {
    PlaceResult& res = out.results[i];
    res.hot = entries[i].hit_count >= options_.hot_threshold;
    if (res.hot) ++counters_.place_hot_keys;
    for (const DirectoryReplica& r : entries[i].replicas) {
      auto h = hosts_.find(r.host_id);
      if (h != hosts_.end() && h->second.record.incarnation == r.incarnation) {
        res.existing_host_indices.push_back(add_host(h->second));
      }
    }
    if (eligible == 0) {
      res.status = Status::Unavailable(
          "no live, non-draining daemon to place on: " + std::to_string(hosts_.size()) + " live, " +
          std::to_string(draining) + " draining, " +
          std::to_string(request.exclude_host_ids.size()) + " excluded");
      continue;
    }
    if (candidates.empty()) {
      res.status = Status::ResourceExhausted(
          "no daemon has " + std::to_string(request.payload_bytes) +
          " bytes free for the block (most free: " + std::to_string(most_free) + " bytes)");
      continue;
    }
    const std::uint32_t wanted =
        request.replicas != 0 ? request.replicas : (res.hot ? options_.hot_replicas : 1);
    for (const RendezvousChoice& c : RendezvousTop(candidates, request.keys[i], wanted)) {
      res.host_indices.push_back(c.index);
      res.scores.push_back(c.score);
    }
  }
  return out;
}

// ---- Status ----

std::vector<HostStatus> PlacementNode::ListHosts() const {
  const std::uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HostStatus> out;
  out.reserve(hosts_.size());
  for (const auto& [id, host] : hosts_) {
    HostStatus s;
    s.record = host.record;
    s.lease_id = host.lease_id;
    s.last_heartbeat_unix_us = host.last_heartbeat_unix_us;
    s.directory_blocks = directory_.HostReplicas(id);
    s.acked_sequence = host.acked_sequence;
    if (host.ttl_ms != 0) {
      const std::uint64_t end = host.renewed_at_us + std::uint64_t{host.ttl_ms} * 1000;
      s.lease_remaining_ms = static_cast<std::uint32_t>(end > now ? (end - now) / 1000 : 0);
    }
    s.full_report_requested = host.full_report_wanted;
    out.push_back(std::move(s));
  }
  return out;
}

PlacementSnapshot PlacementNode::Snapshot() const {
  PlacementSnapshot s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = counters_;
    s.uptime_us = env_->NowMicros() - start_us_;
    s.live_hosts = hosts_.size();
    for (const auto& [id, host] : hosts_) s.draining_hosts += host.record.draining ? 1 : 0;
    s.directory = directory_.counters();
    s.plan_history = plans_.size();
    s.plan_error = plan_error_.Get();
  }
  s.plans_admitted = path_load_.admitted_plans();
  s.paths = cost_model_.PathReports();
  s.models = cost_model_.RecomputeReports();
  return s;
}

}  // namespace kvfabric::placement
