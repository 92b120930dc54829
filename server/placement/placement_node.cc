#include "server/placement/placement_node.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "core/mutex.h"
#include "server/placement/placement_node_internal.h"
#include "server/placement/rendezvous.h"

namespace kvfabric::placement {
namespace {

using internal::GoodPath;
using internal::GoodRecompute;
using internal::OverLimit;

std::uint64_t SaturatingAdd(std::uint64_t a, std::uint64_t b) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  return a > kMax - b ? kMax : a + b;
}

}  // namespace

StatusOr<std::unique_ptr<PlacementNode>> PlacementNode::Create(PlacementOptions options,
                                                               MembershipStore* membership,
                                                               Env* env) {
  if (membership == nullptr || env == nullptr) {
    return Status::InvalidArgument("placement node needs a membership store and an Env");
  }
  KVF_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<PlacementNode> node(new PlacementNode(std::move(options), membership, env));
  KVF_RETURN_IF_ERROR(node->Start());
  return node;
}

Status PlacementNode::ValidateOptions(const PlacementOptions& options) {
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
  if (options.plan_history < 1 || options.max_directory_entries < 1 ||
      options.max_admitted_plans < 1) {
    return Status::InvalidArgument(
        "plan_history, max_directory_entries and max_admitted_plans must be >= 1");
  }
  if (!std::isfinite(options.plan_deadline_factor) || options.plan_deadline_factor < 1) {
    return Status::InvalidArgument("plan_deadline_factor: must be finite and >= 1");
  }
  // A day at most: an interval is a promise to look again.
  constexpr std::chrono::milliseconds kMaxRetrialInterval = std::chrono::hours(24);
  if (options.retrial_interval.count() < 0 || options.retrial_interval > kMaxRetrialInterval ||
      (options.retrial_interval.count() > 0 &&
       (options.retrial_max_interval < options.retrial_interval ||
        options.retrial_max_interval > kMaxRetrialInterval))) {
    return Status::InvalidArgument(
        "retrial_interval: " + std::to_string(options.retrial_interval.count()) +
        " ms and retrial_max_interval: " + std::to_string(options.retrial_max_interval.count()) +
        " ms must satisfy 0 <= retrial_interval <= retrial_max_interval <= 24 h (0: no "
        "retrials)");
  }
  const std::pair<const char*, const PathParameters*> defaults[] = {
      {"remote_to_local", &options.remote_to_local},
      {"local_memcpy", &options.local_memcpy},
      {"nvme_to_host", &options.nvme_to_host},
      {"host_to_device", &options.host_to_device},
      {"client_ingest", &options.client_ingest}};
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
  return Status::OK();
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
      {BusPath::kHostToDevice, options_.host_to_device},
      {BusPath::kClientIngest, options_.client_ingest}};
  for (const auto& [path, p] : defaults) {
    if (!cost_model_.Path(path, "").ok()) {
      KVF_RETURN_IF_ERROR(cost_model_.SetPath(path, "", p, ParameterSource::kDefault));
    }
  }

  membership_->Watch([this](const MemberEvent& event) { OnMemberEvent(event); });
  KVF_ASSIGN_OR_RETURN(std::vector<Member> members, membership_->List());
  {
    MutexLock lock(&mu_);
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
    MutexLock lock(&maintenance_mu_);
    stopping_ = true;
  }
  maintenance_cv_.NotifyAll();
  if (maintenance_.joinable()) maintenance_.join();
  membership_->Watch(MemberWatcher{});
}

void PlacementNode::MaintenanceLoop() {
  MutexLock lock(&maintenance_mu_);
  while (!stopping_) {
    maintenance_cv_.WaitFor(&maintenance_mu_, options_.maintenance_interval,
                            [this]() KVF_REQUIRES(maintenance_mu_) { return stopping_; });
    if (stopping_) break;
    lock.Unlock();
    Maintain();
    lock.Lock();
  }
}

// ---- Membership ----

void PlacementNode::OnMemberEvent(const MemberEvent& event) {
  MutexLock lock(&mu_);
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
  DepartedHost gone;
  gone.record = it->second.record;
  gone.lease_expired = expired;
  gone.departed_unix_us = env_->WallMicros();
  gone.directory_blocks_dropped = dropped;
  departed_.push_back(std::move(gone));
  if (departed_.size() > kMaxDeparted) departed_.pop_front();
  if (it->second.lease_id != 0) host_by_lease_.erase(it->second.lease_id);
  hosts_.erase(it);
  {
    MutexLock retrial(&retrial_mu_);
    retrials_.erase(id);
  }
  if (expired) {
    ++counters_.lease_expiries;
  } else {
    ++counters_.members_left;
  }
  spdlog::info("member {} {}; {} directory entries dropped", id, expired ? "lease expired" : "left",
               dropped);
}

bool PlacementNode::UsableLocked(const HostState& host) const { return !host.record.draining; }

Status PlacementNode::CheckNotDisplacingALiveMember(const MemberRecord& in,
                                                    std::string_view previous_token) const {
  MutexLock lock(&mu_);
  auto it = hosts_.find(in.host_id);
  if (it == hosts_.end()) return Status::OK();
  const HostState& host = it->second;
  const MemberRecord& live = host.record;
  // The member itself, registering again: it proves it with its token (its
  // incarnation and addresses are no secret: Health and ListHosts tell them).
  if (live.incarnation == in.incarnation && live.grpc_address == in.grpc_address &&
      live.transport_address == in.transport_address &&
      MembershipTokenMatches(live.token_digest, previous_token)) {
    return Status::OK();
  }
  // Live: heartbeats still arrive. A member heartbeats every ttl / 3; two
  // missed heartbeats mean its process is gone and a new incarnation may take
  // its place before the lease itself ends. A member learned from the store
  // (registered through another replica) counts as live until the store says
  // it left.
  const std::uint64_t now = env_->NowMicros();
  const std::uint64_t silent_us = host.renewed_at_us == 0 ? 0 : now - host.renewed_at_us;
  const std::uint64_t allowed_us = std::uint64_t{host.ttl_ms} * 2000 / 3;
  if (host.ttl_ms != 0 && silent_us > allowed_us) return Status::OK();
  return Status::FailedPrecondition(
      "host_id \"" + in.host_id + "\" is a live member (incarnation " +
      std::to_string(live.incarnation) + ", gRPC " + live.grpc_address + ", last heartbeat " +
      std::to_string(silent_us / 1000) + " ms ago): a Register of incarnation " +
      std::to_string(in.incarnation) + " at " + in.grpc_address +
      " may not replace it while it heartbeats (a restarted daemon registers once two "
      "heartbeats are missed, within 2/3 of its membership TTL; a live member changes its "
      "addresses through its own Heartbeat)");
}

StatusOr<RegisterResult> PlacementNode::Register(const MemberRecord& in, std::uint32_t ttl_ms,
                                                 std::string_view previous_token) {
  KVF_RETURN_IF_ERROR(ValidateMemberRecord(in));
  if (in.incarnation == 0) return Status::InvalidArgument("incarnation: must be non-zero");
  if (ttl_ms > options_.limits.max_ttl_ms) {
    return OverLimit("ttl_ms", ttl_ms, "max_ttl_ms", options_.limits.max_ttl_ms);
  }
  if (ttl_ms == 0) ttl_ms = options_.limits.default_ttl_ms;
  MemberRecord record = in;
  if (record.joined_unix_us == 0) record.joined_unix_us = env_->WallMicros();
  KVF_RETURN_IF_ERROR(CheckNotDisplacingALiveMember(in, previous_token));
  std::string token = NewMembershipToken();
  record.token_digest = MembershipTokenDigest(token);
  if (record.token_digest.empty()) return Status::Internal("membership token: SHA-256 failed");
  // Not under mu_: the store may call OnMemberEvent from inside Join.
  KVF_ASSIGN_OR_RETURN(const std::uint64_t lease_id,
                       membership_->Join(record, std::chrono::milliseconds(ttl_ms)));
  MutexLock lock(&mu_);
  HostState& host = UpsertMemberLocked(record, lease_id);
  host.last_heartbeat_unix_us = env_->WallMicros();
  host.renewed_at_us = env_->NowMicros();
  host.ttl_ms = ttl_ms;
  ++counters_.registrations;
  RegisterResult out;
  out.lease_id = lease_id;
  out.token = std::move(token);
  out.ttl_ms = ttl_ms;
  out.heartbeat_interval_ms = std::max<std::uint32_t>(1, ttl_ms / 3);
  out.full_report_requested = host.full_report_wanted;
  out.placement_incarnation = incarnation_;
  return out;
}

Status PlacementNode::CheckTokenLocked(std::uint64_t lease_id, std::string_view token) const {
  auto l = host_by_lease_.find(lease_id);
  if (l != host_by_lease_.end() &&
      MembershipTokenMatches(hosts_.at(l->second).record.token_digest, token)) {
    return Status::OK();
  }
  // One answer for a lease that is gone, unknown here, or quoted with
  // another token: nothing tells a guesser which.
  return Status::NotFound("membership lease " + std::to_string(lease_id) +
                          " is not known with that token: Register again and send a full report");
}

StatusOr<HeartbeatResult> PlacementNode::Heartbeat(std::uint64_t lease_id, std::string_view token,
                                                   const MemberRecord* updated) {
  {
    MutexLock lock(&mu_);
    if (Status s = CheckTokenLocked(lease_id, token); !s.ok()) {
      ++counters_.heartbeats_not_found;
      return s;
    }
  }
  MemberRecord record;
  if (updated != nullptr) {
    KVF_RETURN_IF_ERROR(ValidateMemberRecord(*updated));
    record = *updated;
    MutexLock lock(&mu_);
    auto l = host_by_lease_.find(lease_id);
    if (l != host_by_lease_.end()) {
      const HostState& host = hosts_.at(l->second);
      record.token_digest = host.record.token_digest;  // a heartbeat never changes it
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
  MutexLock lock(&mu_);
  if (!status.ok()) {
    if (status.code() == StatusCode::kNotFound) ++counters_.heartbeats_not_found;
    return status;
  }
  ++counters_.heartbeats;
  HeartbeatResult out;
  auto l = host_by_lease_.find(lease_id);
  HostState* host = l == host_by_lease_.end() ? nullptr : &hosts_.at(l->second);
  if (host == nullptr) {  // it left between the token check and here
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

Status PlacementNode::Deregister(std::uint64_t lease_id, std::string_view token) {
  {
    MutexLock lock(&mu_);
    auto l = host_by_lease_.find(lease_id);
    // Gone already: idempotent. Known: only with its token.
    if (l == host_by_lease_.end()) {
      ++counters_.deregistrations;
      return Status::OK();
    }
    KVF_RETURN_IF_ERROR(CheckTokenLocked(lease_id, token));
    hosts_.at(l->second).leaving = true;
  }
  KVF_RETURN_IF_ERROR(membership_->Leave(lease_id));
  MutexLock lock(&mu_);
  ++counters_.deregistrations;
  auto l = host_by_lease_.find(lease_id);
  if (l != host_by_lease_.end()) RemoveMemberLocked(l->second, /*expired=*/false);
  return Status::OK();
}

void PlacementNode::Maintain() {
  const std::size_t expired = path_load_.ReleaseExpired(env_->NowMicros());
  std::uint64_t epoch;
  {
    MutexLock lock(&mu_);
    counters_.plans_expired += expired;
    epoch = member_epoch_;
  }
  StatusOr<std::vector<Member>> members = membership_->List();
  if (!members.ok()) {
    spdlog::warn("membership {}: List failed: {}", membership_->name(),
                 members.status().ToString());
    return;
  }
  MutexLock lock(&mu_);
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
  MutexLock lock(&mu_);
  ++counters_.reports;
  auto host_it = hosts_.find(r.host_id);
  auto lease_it = host_by_lease_.find(r.lease_id);
  if (host_it == hosts_.end() || lease_it == host_by_lease_.end() ||
      lease_it->second != r.host_id || host_it->second.record.incarnation != r.incarnation ||
      !MembershipTokenMatches(host_it->second.record.token_digest, r.token)) {
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
  const std::uint64_t now_us = env_->NowMicros();
  const std::vector<DirectoryEntry> entries = directory_.Lookup(ns, keys, /*touch=*/true, now_us);
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
        queued.push_back(path_load_.QueuedBytes(BusPath::kRemoteHostToLocalHost, h->first, now_us));
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
  MutexLock lock(&mu_);
  ++counters_.locates;
  return LocateLocked(ns, keys);
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
  MutexLock lock(&mu_);
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
  MutexLock lock(&mu_);
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

std::vector<DepartedHost> PlacementNode::RecentlyDeparted() const {
  MutexLock lock(&mu_);
  return std::vector<DepartedHost>(departed_.rbegin(), departed_.rend());
}

PlacementSnapshot PlacementNode::Snapshot() const {
  PlacementSnapshot s;
  {
    MutexLock lock(&mu_);
    s = counters_;
    s.uptime_us = env_->NowMicros() - start_us_;
    s.live_hosts = hosts_.size();
    const std::uint64_t now = env_->NowMicros();
    s.wall_unix_us = env_->WallMicros();
    for (const auto& [id, host] : hosts_) {
      s.draining_hosts += host.record.draining ? 1 : 0;
      if (s.members.size() >= kMaxMemberSeries) continue;
      MemberLiveness m;
      m.host_id = id;
      m.last_heartbeat_unix_us = host.last_heartbeat_unix_us;
      if (host.ttl_ms != 0) {
        const std::uint64_t end = host.renewed_at_us + std::uint64_t{host.ttl_ms} * 1000;
        m.lease_remaining_us = end > now ? end - now : 0;
      }
      s.members.push_back(std::move(m));
    }
    s.directory = directory_.counters();
    s.plan_history = plans_.size();
    s.plan_error = plan_error_.Get();
  }
  {
    MutexLock retrial(&retrial_mu_);
    s.retrial_hosts = retrials_.size();
  }
  s.plans_admitted = path_load_.admitted_plans();
  s.paths = cost_model_.PathReports();
  s.models = cost_model_.RecomputeReports();
  return s;
}

}  // namespace kvfabric::placement
