#include "server/placement_convert.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "server/cache_host_convert.h"

namespace kvfabric {

namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

std::string At(std::string_view field, std::size_t i) {
  return std::string(field) + "[" + Num(i) + "]";
}

}  // namespace

// ---------------------------------------------------------------- limits

placement::PlacementLimits PlacementLimitsFromProto(const v1::Limits& limits) {
  placement::PlacementLimits out;
  out.max_keys_per_batch = limits.max_keys_per_batch();
  out.max_chain_blocks = limits.max_chain_blocks();
  out.max_replicas = limits.max_replicas();
  out.max_namespace_bytes = limits.max_namespace_bytes();
  out.max_block_bytes = limits.max_block_bytes();
  out.max_ttl_ms = limits.max_ttl_ms();
  out.default_ttl_ms = limits.default_ttl_ms();
  out.max_explanation_bytes = limits.max_explanation_bytes();
  return out;
}

// ---------------------------------------------------------------- checks

Status CheckAtMost(std::string_view field, std::uint64_t n, std::string_view limit_name,
                   std::uint64_t max) {
  if (n <= max) return Status::OK();
  return Status::InvalidArgument(std::string(field) + ": " + Num(n) + " > " +
                                 std::string(limit_name) + " " + Num(max));
}

Status CheckChainSize(std::size_t n, const v1::Limits& limits) {
  if (n == 0) return Status::InvalidArgument("keys: 0, a chain needs at least 1 key");
  return CheckAtMost("keys", n, "max_chain_blocks", limits.max_chain_blocks());
}

Status CheckHostId(std::string_view host_id, std::string_view field, const v1::Limits& limits) {
  if (host_id.empty()) {
    return Status::InvalidArgument(std::string(field) + ": empty; a host_id is required");
  }
  if (host_id.size() > limits.max_host_id_bytes()) {
    return Status::InvalidArgument(std::string(field) + ": " + Num(host_id.size()) +
                                   " bytes > max_host_id_bytes " + Num(limits.max_host_id_bytes()));
  }
  return Status::OK();
}

Status CheckAddress(std::string_view address, std::string_view field, const v1::Limits& limits) {
  if (address.size() > limits.max_address_bytes()) {
    return Status::InvalidArgument(std::string(field) + ": " + Num(address.size()) +
                                   " bytes > max_address_bytes " + Num(limits.max_address_bytes()));
  }
  return Status::OK();
}

void TruncateUtf8(std::string* text, std::size_t max_bytes) {
  if (text->size() <= max_bytes) return;
  std::size_t end = max_bytes;
  // Back up over continuation bytes (10xxxxxx) to the start of the cut character.
  while (end > 0 && (static_cast<unsigned char>((*text)[end]) & 0xC0) == 0x80) --end;
  text->resize(end);
}

// ---------------------------------------------------------------- enums

StatusOr<Tier> TierFromProto(int tier, std::string_view field, bool allow_unspecified) {
  switch (tier) {
    case v1::TIER_HOST:
      return Tier::kHost;
    case v1::TIER_NVME:
      return Tier::kNvme;
    case v1::TIER_UNSPECIFIED:
      if (allow_unspecified) return Tier::kUnspecified;
      return Status::InvalidArgument(std::string(field) +
                                     ": unset (TIER_UNSPECIFIED); TIER_HOST or TIER_NVME required");
  }
  return Status::InvalidArgument(std::string(field) + ": unknown value " + std::to_string(tier));
}

v1::Tier TierToProto(Tier tier) {
  switch (tier) {
    case Tier::kHost:
      return v1::TIER_HOST;
    case Tier::kNvme:
      return v1::TIER_NVME;
    case Tier::kUnspecified:
      break;
  }
  return v1::TIER_UNSPECIFIED;
}

StatusOr<placement::BlockEventKind> BlockEventKindFromProto(int kind, std::string_view field) {
  if (kind == v1::BLOCK_EVENT_KIND_UNSPECIFIED) {
    return Status::InvalidArgument(std::string(field) +
                                   ": unset (BLOCK_EVENT_KIND_UNSPECIFIED); an event kind is "
                                   "required");
  }
  if (!v1::BlockEventKind_IsValid(kind)) {
    return Status::InvalidArgument(std::string(field) + ": unknown value " + std::to_string(kind));
  }
  // The values are equal (directory.h).
  return static_cast<placement::BlockEventKind>(kind);
}

StatusOr<BusPath> BusPathFromProto(int path, std::string_view field) {
  if (path == v1::BUS_PATH_UNSPECIFIED) {
    return Status::InvalidArgument(std::string(field) +
                                   ": unset (BUS_PATH_UNSPECIFIED); a bus path is required");
  }
  if (!v1::BusPath_IsValid(path)) {
    return Status::InvalidArgument(std::string(field) + ": unknown value " + std::to_string(path));
  }
  // Values 1..6 are equal (core/bus_cost_model.h).
  return static_cast<BusPath>(path);
}

v1::PlanKind PlanKindToProto(PlanKind kind) {
  switch (kind) {
    case PlanKind::kRecomputeAll:
      return v1::PLAN_KIND_RECOMPUTE_ALL;
    case PlanKind::kFetchAll:
      return v1::PLAN_KIND_FETCH_ALL;
    case PlanKind::kSplit:
      return v1::PLAN_KIND_SPLIT;
    case PlanKind::kMixed:
      return v1::PLAN_KIND_MIXED;
    case PlanKind::kUnspecified:
      break;
  }
  return v1::PLAN_KIND_UNSPECIFIED;
}

v1::RunAction RunActionToProto(RunAction action) {
  switch (action) {
    case RunAction::kFetch:
      return v1::RUN_ACTION_FETCH;
    case RunAction::kRecompute:
      return v1::RUN_ACTION_RECOMPUTE;
    case RunAction::kUnspecified:
      break;
  }
  return v1::RUN_ACTION_UNSPECIFIED;
}

// ---------------------------------------------------------------- membership

StatusOr<MemberUpdate> TierUsageFromProto(
    const google::protobuf::RepeatedPtrField<v1::TierUsage>& tiers, std::string_view field) {
  MemberUpdate out;
  for (int i = 0; i < tiers.size(); ++i) {
    const v1::TierUsage& t = tiers.Get(i);
    const std::string f = At(field, i);
    KVF_ASSIGN_OR_RETURN(const Tier tier, TierFromProto(t.tier(), f + ".tier", false));
    std::optional<TierBytes>& slot = tier == Tier::kHost ? out.host : out.nvme;
    if (slot) {
      return Status::InvalidArgument(f + ".tier: " + v1::Tier_Name(t.tier()) +
                                     " listed twice; one entry per tier");
    }
    if (t.free_bytes() > t.capacity_bytes()) {
      return Status::InvalidArgument(f + ".free_bytes: " + Num(t.free_bytes()) +
                                     " > capacity_bytes " + Num(t.capacity_bytes()));
    }
    slot = TierBytes{t.capacity_bytes(), t.free_bytes()};
  }
  return out;
}

void ApplyMemberUpdate(const MemberUpdate& update, placement::MemberRecord* record) {
  if (update.host) {
    record->host_capacity_bytes = update.host->capacity_bytes;
    record->host_free_bytes = update.host->free_bytes;
  }
  if (update.nvme) {
    record->nvme_capacity_bytes = update.nvme->capacity_bytes;
    record->nvme_free_bytes = update.nvme->free_bytes;
  }
  if (update.draining) record->draining = *update.draining;
}

StatusOr<placement::MemberRecord> MemberRecordFromRegister(const v1::RegisterRequest& request,
                                                           const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckHostId(request.host_id(), "host_id", limits));
  if (request.incarnation() == 0) {
    return Status::InvalidArgument(
        "incarnation: 0; a random non-zero id of the process start "
        "is required");
  }
  KVF_RETURN_IF_ERROR(CheckAddress(request.grpc_address(), "grpc_address", limits));
  KVF_RETURN_IF_ERROR(CheckAddress(request.transport_address(), "transport_address", limits));
  KVF_RETURN_IF_ERROR(CheckAddress(request.node_name(), "node_name", limits));
  KVF_ASSIGN_OR_RETURN(const MemberUpdate tiers, TierUsageFromProto(request.tiers(), "tiers"));
  placement::MemberRecord out;
  out.host_id = request.host_id();
  out.incarnation = request.incarnation();
  out.grpc_address = request.grpc_address();
  out.transport_address = request.transport_address();
  out.node_name = request.node_name();
  ApplyMemberUpdate(tiers, &out);
  return out;
}

void RegisterResultToProto(const placement::RegisterResult& result, v1::RegisterResponse* out) {
  out->set_membership_lease_id(result.lease_id);
  out->set_membership_token(result.token);
  out->set_ttl_ms(result.ttl_ms);
  out->set_heartbeat_interval_ms(result.heartbeat_interval_ms);
  out->set_full_report_requested(result.full_report_requested);
  out->set_placement_incarnation(result.placement_incarnation);
}

StatusOr<MemberUpdate> HeartbeatUpdateFromProto(const v1::HeartbeatRequest& request,
                                                const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckHostId(request.host_id(), "host_id", limits));
  KVF_ASSIGN_OR_RETURN(MemberUpdate out, TierUsageFromProto(request.tiers(), "tiers"));
  switch (request.status()) {
    case v1::SERVING_STATUS_UNSPECIFIED:
      break;
    case v1::SERVING_STATUS_SERVING:
      out.draining = false;
      break;
    case v1::SERVING_STATUS_STARTING:
    case v1::SERVING_STATUS_DRAINING:
    case v1::SERVING_STATUS_NOT_SERVING:
      out.draining = true;
      break;
    default:
      return Status::InvalidArgument("status: unknown value " + std::to_string(request.status()));
  }
  return out;
}

void HostRefFromRecord(const placement::MemberRecord& record, v1::HostRef* out) {
  out->set_host_id(record.host_id);
  out->set_incarnation(record.incarnation);
  out->set_grpc_address(record.grpc_address);
  out->set_transport_address(record.transport_address);
  out->set_node_name(record.node_name);
}

StatusOr<placement::MemberRecord> MemberRecordFromHostRef(const v1::HostRef& ref,
                                                          std::string_view field,
                                                          const v1::Limits& limits) {
  const std::string f(field);
  KVF_RETURN_IF_ERROR(CheckHostId(ref.host_id(), f + ".host_id", limits));
  if (ref.incarnation() == 0) {
    return Status::InvalidArgument(f + ".incarnation: 0; hosts from Locate have a non-zero one");
  }
  KVF_RETURN_IF_ERROR(CheckAddress(ref.grpc_address(), f + ".grpc_address", limits));
  KVF_RETURN_IF_ERROR(CheckAddress(ref.transport_address(), f + ".transport_address", limits));
  KVF_RETURN_IF_ERROR(CheckAddress(ref.node_name(), f + ".node_name", limits));
  placement::MemberRecord out;
  out.host_id = ref.host_id();
  out.incarnation = ref.incarnation();
  out.grpc_address = ref.grpc_address();
  out.transport_address = ref.transport_address();
  out.node_name = ref.node_name();
  return out;
}

void TierUsageFromRecord(const placement::MemberRecord& record,
                         google::protobuf::RepeatedPtrField<v1::TierUsage>* out) {
  v1::TierUsage* host = out->Add();
  host->set_tier(v1::TIER_HOST);
  host->set_capacity_bytes(record.host_capacity_bytes);
  host->set_free_bytes(record.host_free_bytes);
  if (record.nvme_capacity_bytes == 0) return;
  v1::TierUsage* nvme = out->Add();
  nvme->set_tier(v1::TIER_NVME);
  nvme->set_capacity_bytes(record.nvme_capacity_bytes);
  nvme->set_free_bytes(record.nvme_free_bytes);
}

void HostStatusToProto(const placement::HostStatus& status, v1::HostStatus* out) {
  HostRefFromRecord(status.record, out->mutable_host());
  out->set_status(status.record.draining ? v1::SERVING_STATUS_DRAINING
                                         : v1::SERVING_STATUS_SERVING);
  TierUsageFromRecord(status.record, out->mutable_tiers());
  out->set_last_heartbeat_unix_us(status.last_heartbeat_unix_us);
  out->set_lease_remaining_ms(status.lease_remaining_ms);
  out->set_directory_blocks(status.directory_blocks);
}

void DepartedHostToProto(const placement::DepartedHost& departed, v1::DepartedHost* out) {
  HostRefFromRecord(departed.record, out->mutable_host());
  out->set_reason(departed.lease_expired ? "lease_expired" : "deregistered");
  out->set_departed_unix_us(departed.departed_unix_us);
  out->set_directory_blocks_dropped(departed.directory_blocks_dropped);
}

void ClusterSummaryToProto(const placement::PlacementSnapshot& s, v1::ClusterSummary* out) {
  for (PlanKind kind :
       {PlanKind::kRecomputeAll, PlanKind::kFetchAll, PlanKind::kSplit, PlanKind::kMixed}) {
    v1::PlanKindCount* c = out->add_plans();
    c->set_kind(std::string(PlanKindLabel(kind)));
    c->set_plans(s.plans_by_kind[static_cast<std::size_t>(kind)]);
  }
  for (int p = 1; p <= kMaxBusPath; ++p) {
    const placement::PathTraffic& t = s.traffic[static_cast<std::size_t>(p)];
    if (t.transfers == 0 || !v1::BusPath_IsValid(p)) continue;
    v1::PathTrafficSummary* path = out->add_paths();
    path->set_path(static_cast<v1::BusPath>(p));
    path->set_transfers(t.transfers);
    path->set_bytes(t.bytes);
    path->set_observed_seconds(t.observed_us / 1e6);
  }
  out->set_plans_in_flight(s.plans_admitted);
  out->set_uptime_us(s.uptime_us);
}

// ---------------------------------------------------------------- reports

StatusOr<placement::BlockReport> BlockReportFromProto(const v1::ReportBlocksRequest& request,
                                                      const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckHostId(request.host_id(), "host_id", limits));
  KVF_RETURN_IF_ERROR(CheckAtMost("events", static_cast<std::size_t>(request.events_size()),
                                  "max_keys_per_batch", limits.max_keys_per_batch()));
  if (request.sequence() == 0) {
    return Status::InvalidArgument("sequence: 0; sequences start at 1 per incarnation");
  }
  placement::BlockReport out;
  out.host_id = request.host_id();
  out.incarnation = request.incarnation();
  out.lease_id = request.membership_lease_id();
  out.token = request.membership_token();
  out.sequence = request.sequence();
  out.snapshot_id = request.snapshot_id();
  out.snapshot_last = request.snapshot_last();
  out.events.reserve(request.events_size());
  for (int i = 0; i < request.events_size(); ++i) {
    const v1::BlockEvent& e = request.events(i);
    const std::string f = At("events", i);
    placement::BlockEvent event;
    KVF_ASSIGN_OR_RETURN(event.kind, BlockEventKindFromProto(e.kind(), f + ".kind"));
    const Status ns = CheckNamespace(e.namespace_(), limits);
    if (!ns.ok()) return ns.WithContext(f);
    event.ns = e.namespace_();
    KVF_ASSIGN_OR_RETURN(event.key, BlockKeyFromProto(e.block().key(), f + ".block.key"));
    // EVICTED may leave the tier unset: every tier (directory.h).
    KVF_ASSIGN_OR_RETURN(event.tier, TierFromProto(e.tier(), f + ".tier", true));
    KVF_RETURN_IF_ERROR(CheckAtMost(f + ".block.payload_bytes", e.block().payload_bytes(),
                                    "max_block_bytes", limits.max_block_bytes()));
    event.payload_bytes = e.block().payload_bytes();
    // Delete and evict events may carry a key only: 0 is "unknown" in the directory.
    if (e.block().representation() != v1::REPRESENTATION_UNSPECIFIED) {
      StatusOr<BlockRepresentation> r = RepresentationFromProto(e.block().representation());
      if (!r.ok()) return r.status().WithContext(f + ".block");
    }
    event.representation = static_cast<std::uint8_t>(e.block().representation());
    event.hit_count = e.hit_count();
    out.events.push_back(std::move(event));
  }
  return out;
}

// ---------------------------------------------------------------- locate and plan

void ChainLocationsToProto(const placement::ChainLocations& locations, v1::ChainLocations* out) {
  out->mutable_hosts()->Reserve(static_cast<int>(locations.hosts.size()));
  for (const placement::MemberRecord& host : locations.hosts) {
    HostRefFromRecord(host, out->add_hosts());
  }
  out->mutable_blocks()->Reserve(static_cast<int>(locations.blocks.size()));
  for (const std::vector<placement::LocatedReplica>& block : locations.blocks) {
    v1::BlockLocation* b = out->add_blocks();
    b->mutable_replicas()->Reserve(static_cast<int>(block.size()));
    for (const placement::LocatedReplica& r : block) {
      v1::Replica* replica = b->add_replicas();
      replica->set_host_index(r.host_index);
      replica->set_tier(TierToProto(r.tier));
      replica->set_payload_bytes(r.payload_bytes);
      replica->set_representation(static_cast<v1::Representation>(r.representation));
    }
  }
  out->set_cached_prefix_blocks(locations.cached_prefix_blocks);
}

StatusOr<placement::ChainLocations> ChainLocationsFromProto(const v1::ChainLocations& locations,
                                                            std::size_t chain_blocks,
                                                            const v1::Limits& limits) {
  if (static_cast<std::size_t>(locations.blocks_size()) != chain_blocks) {
    return Status::InvalidArgument("locations.blocks: " + Num(locations.blocks_size()) +
                                   " != " + Num(chain_blocks) + " keys (one location per key)");
  }
  placement::ChainLocations out;
  out.hosts.reserve(locations.hosts_size());
  for (int h = 0; h < locations.hosts_size(); ++h) {
    KVF_ASSIGN_OR_RETURN(
        placement::MemberRecord host,
        MemberRecordFromHostRef(locations.hosts(h), At("locations.hosts", h), limits));
    out.hosts.push_back(std::move(host));
  }
  out.blocks.resize(chain_blocks);
  bool prefix = true;
  for (int i = 0; i < locations.blocks_size(); ++i) {
    const v1::BlockLocation& block = locations.blocks(i);
    const std::string f = At("locations.blocks", i);
    KVF_RETURN_IF_ERROR(CheckAtMost(f + ".replicas",
                                    static_cast<std::size_t>(block.replicas_size()), "max_replicas",
                                    limits.max_replicas()));
    for (int r = 0; r < block.replicas_size(); ++r) {
      const v1::Replica& replica = block.replicas(r);
      const std::string rf = At(f + ".replicas", r);
      if (replica.host_index() >= out.hosts.size()) {
        return Status::InvalidArgument(rf + ".host_index: " + Num(replica.host_index()) +
                                       " >= " + Num(out.hosts.size()) + " hosts");
      }
      placement::LocatedReplica located;
      located.host_index = replica.host_index();
      KVF_ASSIGN_OR_RETURN(located.tier, TierFromProto(replica.tier(), rf + ".tier", false));
      located.payload_bytes = replica.payload_bytes();
      located.representation = static_cast<std::uint8_t>(
          std::clamp<int>(replica.representation(), 0, std::numeric_limits<std::uint8_t>::max()));
      out.blocks[i].push_back(located);
    }
    // Recomputed rather than trusted: the planner finds the prefix from the replicas anyway.
    if (prefix && block.replicas_size() > 0) {
      ++out.cached_prefix_blocks;
    } else {
      prefix = false;
    }
  }
  return out;
}

StatusOr<placement::PlanRequest> PlanRequestFromProto(const v1::PlanRequest& request,
                                                      std::string client_id,
                                                      const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckNamespace(request.namespace_(), limits));
  KVF_RETURN_IF_ERROR(CheckChainSize(static_cast<std::size_t>(request.keys_size()), limits));
  KVF_RETURN_IF_ERROR(CheckAddress(request.client_node(), "client_node", limits));
  KVF_ASSIGN_OR_RETURN(const ModelFingerprint fingerprint,
                       FingerprintFromProto(request.fingerprint(), limits));
  KVF_ASSIGN_OR_RETURN(const std::uint64_t block_bytes, fingerprint.BlockBytes());
  if (block_bytes > limits.max_block_bytes()) {
    return Status::InvalidArgument("fingerprint: a block of " + Num(block_bytes) +
                                   " bytes > max_block_bytes " + Num(limits.max_block_bytes()));
  }
  KVF_ASSIGN_OR_RETURN(const std::vector<BlockKey> keys,
                       BlockKeysFromProto(request.keys(), "keys", /*distinct=*/false));

  placement::PlanRequest out;
  out.ns = request.namespace_();
  out.model_id = fingerprint.model_id;
  out.client_id = std::move(client_id);
  out.client_node = request.client_node();
  out.suffix_tokens = request.suffix_tokens();
  out.include_explanation = request.include_explanation();
  out.prefix_plans_only = request.prefix_plans_only();
  out.chain.reserve(keys.size());
  const std::uint32_t tokens = fingerprint.tokens_per_block;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out.chain.push_back({keys[i], tokens, std::uint64_t{tokens} * i, block_bytes});
  }
  for (int i = 0; i < request.client_paths_size(); ++i) {
    const v1::PathParameters& p = request.client_paths(i);
    const std::string f = At("client_paths", i);
    KVF_ASSIGN_OR_RETURN(const BusPath path, BusPathFromProto(p.path(), f + ".path"));
    if (path == BusPath::kDeviceToHost) continue;  // the planner reads nothing back
    if (path != BusPath::kHostToDevice) {
      return Status::InvalidArgument(f + ".path: " + v1::BusPath_Name(p.path()) +
                                     " is not a path on the client's machine (host <-> device)");
    }
    if (out.host_to_device) {
      return Status::InvalidArgument(f + ".path: BUS_PATH_HOST_TO_DEVICE listed twice");
    }
    // The node refuses non-finite or non-positive numbers, naming host_to_device.
    PathParameters h2d{p.alpha_us(), p.beta_bytes_per_s()};
    if (p.size_factors_size() != 0) {
      if (p.size_factors_size() != kSizeClasses) {
        return Status::InvalidArgument(f + ".size_factors: must hold 0 or " +
                                       std::to_string(kSizeClasses) + " factors, got " +
                                       std::to_string(p.size_factors_size()));
      }
      for (int k = 0; k < kSizeClasses; ++k) h2d.size_factors[k] = p.size_factors(k);
    }
    out.host_to_device = h2d;
  }
  if (request.has_locations()) {
    KVF_ASSIGN_OR_RETURN(out.locations,
                         ChainLocationsFromProto(request.locations(), keys.size(), limits));
  }
  if (request.has_accuracy() && request.accuracy().allow_compact()) {
    // The node refuses a non-finite or negative decode cost, naming the field.
    const v1::AccuracyPolicy& a = request.accuracy();
    out.compact = placement::PlanRequest::CompactPolicy{
        a.compact_after_tokens(), a.compact_extra_decode_us_per_token(), a.decode_steps()};
  }
  if (request.has_engine_prefill()) {
    // The node refuses non-finite or negative constants, naming engine_prefill.
    const v1::RecomputeParameters& r = request.engine_prefill();
    out.engine_prefill =
        RecomputeParameters{r.c0_us(), r.c1_us(), r.c2_us(), r.split_serial_fraction(), r.c3_us()};
  }
  return out;
}

void PlanResultToProto(const placement::PlanResult& result, const v1::Limits& limits,
                       v1::PlanResponse* out) {
  const kvfabric::Plan& plan = result.plan;
  out->set_plan_id(result.plan_id);
  out->set_kind(PlanKindToProto(plan.kind));
  out->mutable_runs()->Reserve(static_cast<int>(plan.runs.size()));
  for (std::size_t i = 0; i < plan.runs.size(); ++i) {
    const PlanRun& run = plan.runs[i];
    v1::PlanRun* r = out->add_runs();
    r->set_first_block(run.first_block);
    r->set_block_count(run.block_count);
    r->set_action(RunActionToProto(run.action));
    if (run.action == RunAction::kFetch) {
      r->set_host_index(run.host_index);
      r->set_tier(TierToProto(run.tier));
      r->set_representation(run.compact ? v1::REPRESENTATION_COMPACT_INT8
                                        : v1::REPRESENTATION_EXACT);
      if (i < result.fallback_host_indices.size()) {
        for (std::uint32_t h : result.fallback_host_indices[i]) r->add_fallback_host_indices(h);
      }
    }
    r->set_payload_bytes(run.payload_bytes);
    r->set_predicted_start_us(run.predicted_start_us);
    r->set_predicted_end_us(run.predicted_end_us);
  }
  out->set_predicted_total_us(plan.predicted_total_us);
  out->set_representation(static_cast<v1::RepresentationChoice>(plan.representation));
  out->set_compact_penalty_us(plan.compact_penalty_us);
  out->mutable_alternatives()->Reserve(static_cast<int>(plan.alternatives.size()));
  for (const PlanAlternative& a : plan.alternatives) {
    v1::PlanAlternative* alt = out->add_alternatives();
    alt->set_kind(PlanKindToProto(a.kind));
    alt->set_predicted_us(a.predicted_us);
    alt->set_split_blocks(a.split_blocks);
    alt->set_chosen(a.chosen);
  }
  ChainLocationsToProto(result.locations, out->mutable_locations());
  std::string explanation = plan.explanation;
  TruncateUtf8(&explanation, limits.max_explanation_bytes());
  out->set_explanation(std::move(explanation));
}

// ---------------------------------------------------------------- observations

StatusOr<placement::ObservationReport> ObservationReportFromProto(
    const v1::ReportObservationsRequest& request, const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckNamespace(request.namespace_(), limits));
  const std::uint32_t max = limits.max_keys_per_batch();
  KVF_RETURN_IF_ERROR(CheckAtMost("transfers", static_cast<std::size_t>(request.transfers_size()),
                                  "max_keys_per_batch", max));
  KVF_RETURN_IF_ERROR(CheckAtMost("recomputes", static_cast<std::size_t>(request.recomputes_size()),
                                  "max_keys_per_batch", max));
  KVF_RETURN_IF_ERROR(CheckAtMost("stale_entries",
                                  static_cast<std::size_t>(request.stale_entries_size()),
                                  "max_keys_per_batch", max));
  KVF_RETURN_IF_ERROR(CheckAtMost("fallback_runs",
                                  static_cast<std::size_t>(request.fallback_runs_size()),
                                  "max_keys_per_batch", max));
  placement::ObservationReport out;
  if (request.has_fingerprint()) {
    KVF_ASSIGN_OR_RETURN(const ModelFingerprint fingerprint,
                         FingerprintFromProto(request.fingerprint(), limits));
    out.model_id = fingerprint.model_id;
  }
  out.ns = request.namespace_();
  out.plan_id = request.plan_id();
  out.plan_finished = request.plan_finished();
  out.observed_total_us = request.observed_total_us();
  out.transfers.reserve(request.transfers_size());
  for (int i = 0; i < request.transfers_size(); ++i) {
    const v1::TransferObservation& t = request.transfers(i);
    const std::string f = At("transfers", i);
    placement::TransferObservation o;
    KVF_ASSIGN_OR_RETURN(o.path, BusPathFromProto(t.path(), f + ".path"));
    if (!t.host_id().empty()) KVF_RETURN_IF_ERROR(CheckHostId(t.host_id(), f + ".host_id", limits));
    o.host_id = t.host_id();
    o.bytes = t.bytes();
    o.observed_us = t.observed_us();
    o.beside_prefill = t.beside_prefill();
    o.shared_bytes = t.shared_bytes();
    out.transfers.push_back(std::move(o));
  }
  out.recomputes.reserve(request.recomputes_size());
  for (const v1::RecomputeObservation& r : request.recomputes()) {
    out.recomputes.push_back({r.tokens(), r.prefix_tokens(), r.observed_us(), r.beside_fetch()});
  }
  out.stale_entries.reserve(request.stale_entries_size());
  for (int i = 0; i < request.stale_entries_size(); ++i) {
    const v1::StaleEntry& s = request.stale_entries(i);
    const std::string f = At("stale_entries", i);
    placement::StaleEntry entry;
    KVF_RETURN_IF_ERROR(CheckHostId(s.host_id(), f + ".host_id", limits));
    entry.host_id = s.host_id();
    KVF_ASSIGN_OR_RETURN(entry.key, BlockKeyFromProto(s.key(), f + ".key"));
    out.stale_entries.push_back(std::move(entry));
  }
  out.fallback_runs.assign(request.fallback_runs().begin(), request.fallback_runs().end());
  return out;
}

// ---------------------------------------------------------------- explain

void PlanExplanationToProto(const placement::PlanExplanation& explanation, const v1::Limits& limits,
                            v1::ExplainResponse* out) {
  out->set_kind(v1::EXPLAIN_KIND_PLAN);
  out->set_formula(explanation.formula);
  std::string text = explanation.text;
  TruncateUtf8(&text, limits.max_explanation_bytes());
  out->set_text(std::move(text));
  out->mutable_terms()->Reserve(static_cast<int>(explanation.terms.size()));
  for (const placement::ExplainTerm& t : explanation.terms) {
    v1::ExplainTerm* term = out->add_terms();
    term->set_name(t.name);
    term->set_value(t.value);
    term->set_unit(t.unit);
  }
  out->set_decided_unix_us(explanation.decided_unix_us);
}

// ---------------------------------------------------------------- place

StatusOr<placement::PlaceRequest> PlaceRequestFromProto(const v1::PlaceRequest& request,
                                                        const v1::Limits& limits) {
  KVF_RETURN_IF_ERROR(CheckNamespace(request.namespace_(), limits));
  KVF_RETURN_IF_ERROR(
      CheckBatchSize("keys", static_cast<std::size_t>(request.keys_size()), limits));
  if (request.payload_bytes() == 0) {
    return Status::InvalidArgument("payload_bytes: 0; a block holds at least 1 byte");
  }
  KVF_RETURN_IF_ERROR(CheckAtMost("payload_bytes", request.payload_bytes(), "max_block_bytes",
                                  limits.max_block_bytes()));
  KVF_RETURN_IF_ERROR(
      CheckAtMost("replicas", request.replicas(), "max_replicas", limits.max_replicas()));
  KVF_RETURN_IF_ERROR(CheckAtMost("exclude_host_ids",
                                  static_cast<std::size_t>(request.exclude_host_ids_size()),
                                  "max_keys_per_batch", limits.max_keys_per_batch()));
  for (int i = 0; i < request.exclude_host_ids_size(); ++i) {
    KVF_RETURN_IF_ERROR(
        CheckHostId(request.exclude_host_ids(i), At("exclude_host_ids", i), limits));
  }
  KVF_RETURN_IF_ERROR(CheckAddress(request.client_node(), "client_node", limits));
  if (request.has_fingerprint()) {
    KVF_RETURN_IF_ERROR(FingerprintFromProto(request.fingerprint(), limits).status());
  }
  placement::PlaceRequest out;
  out.ns = request.namespace_();
  KVF_ASSIGN_OR_RETURN(out.keys, BlockKeysFromProto(request.keys(), "keys", /*distinct=*/false));
  out.payload_bytes = request.payload_bytes();
  out.replicas = request.replicas();
  out.exclude_host_ids.assign(request.exclude_host_ids().begin(), request.exclude_host_ids().end());
  return out;
}

void PlaceResponseToProto(const placement::PlaceResponse& response, v1::PlaceResponse* out) {
  out->mutable_hosts()->Reserve(static_cast<int>(response.hosts.size()));
  for (const placement::MemberRecord& host : response.hosts) {
    HostRefFromRecord(host, out->add_hosts());
  }
  out->mutable_results()->Reserve(static_cast<int>(response.results.size()));
  for (const placement::PlaceResult& r : response.results) {
    v1::PlaceResult* result = out->add_results();
    StatusToEntry(r.status, result->mutable_status());
    for (std::uint32_t h : r.host_indices) result->add_host_indices(h);
    for (double s : r.scores) result->add_scores(s);
    for (std::uint32_t h : r.existing_host_indices) result->add_existing_host_indices(h);
    result->set_hot(r.hot);
  }
}

}  // namespace kvfabric
