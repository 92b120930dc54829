// Conversions between the kvfabric.v1.Placement messages and the placement core types
// (server/placement/placement_node.h), and the wire-limit checks the gRPC adapter
// (server/placement_service.h) applies before it calls the node. The cache-host adapter's
// helpers (server/cache_host_convert.h: CheckBatchSize, CheckNamespace, CheckTtlMs, block keys,
// fingerprints, StatusToEntry) are reused, not repeated.
//
// Refusals, as placement.proto prescribes:
//   - whole-request: a limit of kvfabric.v1.Limits is exceeded, a key is not 32 bytes, a
//     fingerprint is incomplete, an enum names no value, a host index points outside its host
//     table. The *FromProto and Check* functions return InvalidArgument with a message naming
//     the field, the limit and both numbers, e.g. "keys: 70000 > max_chain_blocks 65536".
//   - per-entry: only Place has per-entry outcomes (PlaceResultsToProto: EntryStatus).
// Every `limits` argument is the full set in force (e.g. DefaultLimits()).
//
// What the core does not keep is dropped on the way in and absent on the way out: Register's
// failure_domain, transfer_modes and version, Heartbeat's load, a tier's committed, reserved,
// leased, staging and page bytes (MemberRecord holds capacity and free bytes per tier only).
//
// Thread safety: pure functions over values.
#ifndef KVFABRIC_SERVER_PLACEMENT_CONVERT_H_
#define KVFABRIC_SERVER_PLACEMENT_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/bus_cost_model.h"
#include "core/status.h"
#include "core/statusor.h"
#include "kvfabric/v1/common.pb.h"
#include "kvfabric/v1/placement.pb.h"
#include "proto/wire_limits.h"
#include "server/placement/placement_node.h"

namespace kvfabric {

// ---------------------------------------------------------------- limits

// The node's limits from the wire limits in force, so that the node and the adapter refuse
// at the same numbers (a binary builds both from one v1::Limits).
placement::PlacementLimits PlacementLimitsFromProto(const v1::Limits& limits);

// ---------------------------------------------------------------- checks

// OK if n <= max; else InvalidArgument "<field>: <n> > <limit_name> <max>".
Status CheckAtMost(std::string_view field, std::uint64_t n, std::string_view limit_name,
                   std::uint64_t max);

// OK if 1 <= n <= limits.max_chain_blocks (the keys of a Locate or Plan chain).
Status CheckChainSize(std::size_t n, const v1::Limits& limits);

// OK if host_id is non-empty and at most limits.max_host_id_bytes long.
Status CheckHostId(std::string_view host_id, std::string_view field, const v1::Limits& limits);

// OK if the address (or node name) is at most limits.max_address_bytes long; may be empty.
Status CheckAddress(std::string_view address, std::string_view field, const v1::Limits& limits);

// Cuts `text` to at most max_bytes without splitting a UTF-8 sequence (proto3 strings must
// stay valid UTF-8).
void TruncateUtf8(std::string* text, std::size_t max_bytes);

// ---------------------------------------------------------------- enums

// TIER_HOST and TIER_NVME; TIER_UNSPECIFIED only with `allow_unspecified`. InvalidArgument
// naming `field` otherwise.
StatusOr<Tier> TierFromProto(int tier, std::string_view field, bool allow_unspecified);
// The same value (placement's Tier numbers equal the proto's).
v1::Tier TierToProto(Tier tier);

// The proto's 1..7; InvalidArgument naming `field` for UNSPECIFIED or an unknown number.
StatusOr<placement::BlockEventKind> BlockEventKindFromProto(int kind, std::string_view field);

// BUS_PATH_* 1..6; InvalidArgument naming `field` for UNSPECIFIED or an unknown number.
StatusOr<BusPath> BusPathFromProto(int path, std::string_view field);

v1::PlanKind PlanKindToProto(PlanKind kind);
v1::RunAction RunActionToProto(RunAction action);

// ---------------------------------------------------------------- membership

// Capacity and free bytes of one tier, as MemberRecord keeps them.
struct TierBytes {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t free_bytes = 0;
};

// What Register or Heartbeat says about a member's tiers and serving state; unset fields leave
// the record as it is.
struct MemberUpdate {
  std::optional<TierBytes> host;  // TIER_HOST's usage, if listed
  std::optional<TierBytes> nvme;  // TIER_NVME's usage, if listed
  // SERVING: false; STARTING, DRAINING, NOT_SERVING: true (no new placements, not a fetch
  // source of new plans); unset for SERVING_STATUS_UNSPECIFIED.
  std::optional<bool> draining;

  bool empty() const { return !host && !nvme && !draining; }
};

// The tier list of a RegisterRequest or HeartbeatRequest. InvalidArgument (prefixed `field`,
// e.g. "tiers[1]") for a tier that is unspecified or unknown, listed twice, or whose
// free_bytes exceed its capacity_bytes.
StatusOr<MemberUpdate> TierUsageFromProto(
    const google::protobuf::RepeatedPtrField<v1::TierUsage>& tiers, std::string_view field);
void ApplyMemberUpdate(const MemberUpdate& update, placement::MemberRecord* record);

// The member record a Register asks for: host_id, incarnation, addresses, node name and tier
// usage (an unlisted tier has no capacity). Refuses (whole-request) an empty or too long
// host_id, a zero incarnation, an address or node name over max_address_bytes, a bad tier list.
// The TTL is checked separately (CheckTtlMs).
StatusOr<placement::MemberRecord> MemberRecordFromRegister(const v1::RegisterRequest& request,
                                                           const v1::Limits& limits);
// Fills every field but limits (the adapter's).
void RegisterResultToProto(const placement::RegisterResult& result, v1::RegisterResponse* out);

// The record changes a Heartbeat carries (tiers, serving status), after checking its host_id
// and tier list.
StatusOr<MemberUpdate> HeartbeatUpdateFromProto(const v1::HeartbeatRequest& request,
                                                const v1::Limits& limits);

// A member as clients reach it, and back (a ChainLocations host table entry).
void HostRefFromRecord(const placement::MemberRecord& record, v1::HostRef* out);
// Refuses an empty or too long host_id, a zero incarnation, too long addresses; `field` prefixes
// the message (e.g. "locations.hosts[2]").
StatusOr<placement::MemberRecord> MemberRecordFromHostRef(const v1::HostRef& ref,
                                                          std::string_view field,
                                                          const v1::Limits& limits);

// TIER_HOST always; TIER_NVME if the member has NVMe capacity. Capacity and free bytes only.
void TierUsageFromRecord(const placement::MemberRecord& record,
                         google::protobuf::RepeatedPtrField<v1::TierUsage>* out);
// A draining member reads SERVING_STATUS_DRAINING (the core does not tell starting from
// draining), every other SERVING.
void HostStatusToProto(const placement::HostStatus& status, v1::HostStatus* out);
void DepartedHostToProto(const placement::DepartedHost& departed, v1::DepartedHost* out);
// The headline figures of ListHosts from a snapshot.
void ClusterSummaryToProto(const placement::PlacementSnapshot& snapshot, v1::ClusterSummary* out);

// ---------------------------------------------------------------- reports

// The report after the whole-request checks: host_id, events at most max_keys_per_batch, and
// per event its kind, namespace, 32-byte key, tier, payload_bytes (at most max_block_bytes) and
// representation (0 or a known value).
StatusOr<placement::BlockReport> BlockReportFromProto(const v1::ReportBlocksRequest& request,
                                                      const v1::Limits& limits);

// ---------------------------------------------------------------- locate and plan

void ChainLocationsToProto(const placement::ChainLocations& locations, v1::ChainLocations* out);
// Client-supplied locations (PlanRequest.locations) for a chain of `chain_blocks` keys: exactly
// one block per key, at most max_replicas replicas per block, every host_index inside the host
// table, every tier HOST or NVME. Whole-request InvalidArgument naming the field otherwise.
StatusOr<placement::ChainLocations> ChainLocationsFromProto(const v1::ChainLocations& locations,
                                                            std::size_t chain_blocks,
                                                            const v1::Limits& limits);

// The core plan request: the chain's blocks from the fingerprint (tokens_per_block tokens and
// BlockBytes() bytes each, block i after i * tokens_per_block tokens), the model id, the
// client's locations if set, and a client_paths entry for BUS_PATH_HOST_TO_DEVICE as the
// host->device override (DEVICE_TO_HOST is accepted and unused; other paths, or a path listed
// twice, are refused). `client_id` names the client's host->device link in the path load.
StatusOr<placement::PlanRequest> PlanRequestFromProto(const v1::PlanRequest& request,
                                                      std::string client_id,
                                                      const v1::Limits& limits);
// The plan's id, kind, runs (with their fallbacks), predicted total, alternatives, locations,
// and the explanation cut to limits.max_explanation_bytes.
void PlanResultToProto(const placement::PlanResult& result, const v1::Limits& limits,
                       v1::PlanResponse* out);

// ---------------------------------------------------------------- observations

// Refuses (whole-request) a namespace over its limit, an incomplete fingerprint (if one is
// set), more than max_keys_per_batch transfers, recomputes, stale entries or fallback runs, a
// transfer path that names no BusPath, a too long host_id, a stale key that is not 32 bytes.
StatusOr<placement::ObservationReport> ObservationReportFromProto(
    const v1::ReportObservationsRequest& request, const v1::Limits& limits);

// ---------------------------------------------------------------- explain

// EXPLAIN_KIND_PLAN with the formula, the text cut to limits.max_explanation_bytes, the terms
// and the decision time.
void PlanExplanationToProto(const placement::PlanExplanation& explanation, const v1::Limits& limits,
                            v1::ExplainResponse* out);

// ---------------------------------------------------------------- place

// Refuses (whole-request) a namespace over its limit, an incomplete fingerprint (if one is set),
// 0 or more than max_keys_per_batch keys, a key that is not 32 bytes, payload_bytes outside
// 1..max_block_bytes, replicas over max_replicas, more than max_keys_per_batch excluded hosts or
// a too long one, a client_node over max_address_bytes.
StatusOr<placement::PlaceRequest> PlaceRequestFromProto(const v1::PlaceRequest& request,
                                                        const v1::Limits& limits);
// The host table and one result per key, each with its EntryStatus.
void PlaceResponseToProto(const placement::PlaceResponse& response, v1::PlaceResponse* out);

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_CONVERT_H_
