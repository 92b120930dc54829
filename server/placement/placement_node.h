// PlacementNode: the core of the placement service `kvfabric-placement`, in kvfabric's own
// types, tested without gRPC. It ties together cluster membership (a borrowed MembershipStore:
// in-process or etcd), the block directory (directory.h, in memory, rebuilt from the daemons'
// reports), the calibrated bus cost model (core/calibrated_cost_model.h) with the path load of
// admitted plans (path_load.h), the planner (planner.h) and weighted rendezvous placement
// (rendezvous.h). The gRPC adapter only converts messages (enum values are equal) and maps
// Status codes; the binary only reads flags.
//
// Membership. Register joins the store under a lease and declares the daemon's incarnation to
// the directory; a new incarnation of a known host_id drops the old one's directory entries
// (its blocks count as absent until the new one reports them). A Register never replaces a
// live member (one whose heartbeats arrive) with another incarnation or address: until members
// authenticate, that would let anyone redirect a daemon's traffic; a restarted daemon takes its
// place once two heartbeats are missed. The node watches the store: a
// member that leaves or whose lease expires (kLeft) is forgotten with its directory entries,
// counted as a leave (Deregister) or a lease expiry. Maintain() reconciles with store->List()
// in case a watch event was missed (with MemoryMembershipStore, List also applies expiry).
// Between an expiry and the node hearing of it, a dead daemon may still be named as a source:
// that costs the client a failed lease and a fallback, never a wrong byte.
//
// Reports. ReportBlocks is idempotent per (host_id, incarnation, sequence): a sequence at or
// below the highest applied is acknowledged and ignored. A gap (sequence > highest + 1) is
// applied but asks for a full snapshot. A snapshot is a run of calls sharing a snapshot_id;
// on its last chunk the directory drops the host's entries the snapshot (or events since its
// start) did not mention, and the full-report request is cleared if no gap broke the snapshot.
//
// Locate and Plan see only live, non-draining members (a draining daemon grants no new leases)
// and count as accesses of the keys they find (hot keys for Place, the directory's LRU).
//
// Plans. Plan locates the chain (or takes the locations the client saw), builds the planner's
// input with each member's calibrated paths (memcpy for a member on the client's node), runs
// the planner outside the node's mutex, admits the plan's bytes into the PathLoad until
// ReportObservations(plan_finished) or the predicted end times Options::plan_deadline_factor
// plus plan_deadline_slack_us passes, and keeps the plan's explanation in a bounded history for
// Explain. ReportObservations scores the model per path
// and refits it online (CalibratedCostModel: out-of-sample error histograms, constant memory
// per path), compares the plan's observed and predicted totals, and drops stale directory
// entries the client met.
//
// RETRIALS. A path a change point rescaled slower gets fewer loads (plans route around it) and
// one that gets none never shows that it recovered (a throttle lifted, a partition healed). So
// when a plan's chain has replicas on a host whose remote->local (or memcpy) or NVMe path is
// slowed by more than the cost model's change_point_ratio against its figures from before the
// slowdown (CalibratedCostModel::HealthyBefore), and no load has reported a transfer of the host
// for Options::retrial_interval, that one plan is made on the figures from before (one host per
// plan; a plan that would not fetch from it anyway is made again on the figures in force, and
// the host's next try waits an interval). Its
// transfers of the host go to CalibratedCostModel::ObserveRetrial: a recovered path gets its
// figures back at once; one still slow was an ordinary observation, and the host's next retrial
// waits twice as long, up to Options::retrial_max_interval. The cost of a failed retrial is
// bounded by the client's straggler cut (client/straggler_cut.h): a stream far behind a plan made
// on healthy figures is cut early and its blocks recomputed. Explain names the retrial, and
// PlacementSnapshot counts them by outcome.
//
// Place chooses hosts for new blocks by weighted rendezvous over live, non-draining members
// (weight: free host + NVMe bytes), with Options::hot_replicas copies for keys the directory
// has seen accessed at least Options::hot_threshold times.
//
// Limits (kvfabric.v1.Limits) are checked at the door: a request over one is refused whole with
// InvalidArgument naming the limit and both numbers, e.g. "keys: 70000 > max_chain_blocks
// 65536".
//
// Thread safety: every public method may be called from any thread (gRPC handler threads, the
// store's watch thread, the maintenance thread). One mutex guards membership, the directory,
// the plan history and the counters; the cost model and the path load synchronise themselves
// (lock order: node, then cost model or path load). The node never calls the store while
// holding its mutex, because the store may call the node's watcher from inside that call.
#ifndef KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_H_
#define KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_H_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/block_key.h"
#include "core/bus_calibration.h"
#include "core/bus_cost_model.h"
#include "core/calibrated_cost_model.h"
#include "core/cost_defaults.h"
#include "core/env.h"
#include "core/mutex.h"
#include "core/prediction_error.h"
#include "core/status.h"
#include "core/statusor.h"
#include "server/placement/directory.h"
#include "server/placement/membership_store.h"
#include "server/placement/path_load.h"
#include "server/placement/planner.h"

namespace kvfabric::placement {

// kvfabric.v1.Limits as placement enforces them (the defaults are the proto's).
struct PlacementLimits {
  std::uint32_t max_keys_per_batch = 4096;  // Place keys, report events, observations
  std::uint32_t max_chain_blocks = 65536;   // Locate/Plan keys; at most kMaxPlannerChainBlocks
  std::uint32_t max_replicas = 8;           // Place replicas, directory replicas; at most 8
  std::uint32_t max_namespace_bytes = 256;
  std::uint64_t max_block_bytes = std::uint64_t{64} << 20;
  std::uint32_t max_ttl_ms = 600000;
  std::uint32_t default_ttl_ms = 30000;
  std::uint32_t max_explanation_bytes = 65536;
};

struct PlacementOptions {
  PlacementLimits limits;
  // Directory bound (max_replicas is taken from limits).
  std::size_t max_directory_entries = std::size_t{4} << 20;

  // Cost model. Every daemon's paths start at these defaults; `calibration` (a `kvfabric
  // calibrate` file, may be empty) replaces them per path and per host, and the online refit
  // specialises them per host from observations. The defaults are placeholders for a
  // 100 Gb/s fabric, PCIe 4 x16 and a datacentre NVMe drive: calibrate.
  // core/cost_defaults.h is their one source.
  PathParameters remote_to_local = cost_defaults::kRemoteToLocal;  // remote daemon -> client
  PathParameters local_memcpy = cost_defaults::kLocalMemcpy;       // daemon on the client's node
  PathParameters nvme_to_host = cost_defaults::kNvmeToHost;        // daemon NVMe -> daemon host
  PathParameters host_to_device = cost_defaults::kHostToDevice;    // client host -> device
  PathParameters client_ingest = cost_defaults::kClientIngest;     // all daemons -> one client
  // Recompute (prefill) of a model without a calibrated, stated or refitted fit.
  RecomputeParameters recompute = cost_defaults::kRecompute;
  BusCalibration calibration;
  CalibratedCostModel::Options cost_model;
  // Models whose recompute fit is learned online from observations. Default 64; observations
  // of further models are counted as unscored (bounds the cost model's memory).
  std::size_t max_models = 64;

  // Plans kept for Explain, newest first out of the ring last. Default 4096 plans and 16 MiB of
  // explanation text, whichever bound is hit first.
  std::size_t plan_history = 4096;
  std::size_t plan_history_bytes = std::size_t{16} << 20;
  // Format every plan's explanation (so Explain can answer later) even when the request did not
  // ask for it. Default true; false saves the formatting (a few µs per run) on busy services.
  bool explain_every_plan = true;
  // A plan's bytes leave the path load at ReportObservations(plan_finished) or at
  // predicted_total_us * factor + slack after it was made. Default 2 and 100 ms: a client
  // that never reports cannot inflate a path for long.
  double plan_deadline_factor = 2.0;
  std::uint64_t plan_deadline_slack_us = 100'000;
  // Plans whose bytes the path load holds at once (--max-admitted-plans). A plan made past it is
  // still answered, priced with the load there is, but not charged
  // (PlacementSnapshot::plans_not_admitted). Default 16384 (PathLoad::kDefaultMaxPlans).
  std::size_t max_admitted_plans = PathLoad::kDefaultMaxPlans;
  // RETRIALS (file comment): how long a host's slowed path goes without a transfer before a plan
  // tries it on its figures from before the slowdown, and the most that interval doubles to
  // while retrials find it still slow (--retrial-interval, --retrial-max-interval). Defaults 5 s
  // and 60 s: a failed retrial costs one load a few times its prediction (the straggler cut,
  // then recomputing; 0.2-0.5 s in cluster_planner_bench), so a path that stays slow costs one
  // such load per host a minute, and one that recovers is used again within a minute. 0 turns
  // retrials off.
  std::chrono::milliseconds retrial_interval{5000};
  std::chrono::milliseconds retrial_max_interval{60000};

  // Place: a key the directory has seen accessed at least hot_threshold times gets hot_replicas
  // copies when the request leaves replicas at 0 (else 1). Defaults 8 and 2.
  std::uint64_t hot_threshold = 8;
  std::uint32_t hot_replicas = 2;

  // Maintain() period on the node's own thread (lease reconciliation, path-load expiry).
  // Default 100 ms; 0: no thread (tests call Maintain()).
  std::chrono::milliseconds maintenance_interval{100};
  // Random id of this process start (RegisterResponse.placement_incarnation); 0: derived from
  // the wall clock.
  std::uint64_t incarnation = 0;
};

struct RegisterResult {
  std::uint64_t lease_id = 0;
  // The membership token (kMembershipTokenBytes) to quote with lease_id.
  std::string token;
  std::uint32_t ttl_ms = 0;
  std::uint32_t heartbeat_interval_ms = 0;  // ttl_ms / 3
  bool full_report_requested = false;
  std::uint64_t placement_incarnation = 0;
};

struct HeartbeatResult {
  std::uint32_t ttl_ms = 0;
  bool full_report_requested = false;
};

// One ReportBlocks call (kvfabric.v1.ReportBlocksRequest).
struct BlockReport {
  std::string host_id;
  std::uint64_t incarnation = 0;
  std::uint64_t lease_id = 0;
  std::string token;              // RegisterResult::token
  std::uint64_t sequence = 0;     // 1, 2, 3, ... per incarnation
  std::uint64_t snapshot_id = 0;  // non-zero: a chunk of a full snapshot
  bool snapshot_last = false;
  std::vector<BlockEvent> events;
};

struct ReportResult {
  std::uint64_t acked_sequence = 0;
  bool full_report_requested = false;
};

struct LocatedReplica {
  std::uint32_t host_index = 0;  // into ChainLocations::hosts
  Tier tier = Tier::kUnspecified;
  std::uint64_t payload_bytes = 0;
  std::uint8_t representation = 0;
};

struct ChainLocations {
  std::vector<MemberRecord> hosts;
  // One per key; replicas best first (host tier before NVMe, then least queued bytes).
  std::vector<std::vector<LocatedReplica>> blocks;
  std::uint32_t cached_prefix_blocks = 0;
};

struct ChainBlockSpec {
  BlockKey key;
  std::uint32_t tokens = 0;
  std::uint64_t prefix_tokens = 0;
  std::uint64_t bytes = 0;
};

struct PlanRequest {
  std::string ns;
  // Selects the recompute fit (ModelFingerprint.model_id); may be empty.
  std::string model_id;
  std::vector<ChainBlockSpec> chain;
  // The client's id (its host->device path resource in the path load).
  std::string client_id;
  // Compared with members' node_name: a member on the client's node is read by memcpy.
  std::string client_node;
  std::uint64_t suffix_tokens = 0;
  // Override the model's recompute fit / the client's host->device path for this plan.
  std::optional<RecomputeParameters> recompute;
  std::optional<PathParameters> host_to_device;
  // The engine's statement of its prefill constants (CalibratedCostModel::StateRecompute).
  std::optional<RecomputeParameters> engine_prefill;
  // Locations from an earlier Locate of the same keys, to plan on exactly what the client saw
  // (one block per key); unset: placement locates the chain itself.
  std::optional<ChainLocations> locations;
  bool include_explanation = false;
  // kvfabric.v1.PlanRequest.prefix_plans_only: no split plans.
  bool prefix_plans_only = false;
  // The accuracy policy (kvfabric.v1.AccuracyPolicy, docs/compact.md). nullopt: `exact`, and
  // compact copies are never offered to the planner (not even ones `locations` lists).
  struct CompactPolicy {
    // compact_after=N: a block ending at least N tokens before the request's last token
    // (chain + suffix_tokens) may be fetched as its compact_int8 copy.
    std::uint64_t after_tokens = 0;
    // The client's extra decode time per compact token per decode step, µs (finite, >= 0).
    double extra_decode_us_per_token = 0;
    // Decode steps that pay it; 0 counts as 1.
    std::uint64_t decode_steps = 0;
  };
  std::optional<CompactPolicy> compact;
};

struct PlanResult {
  std::uint64_t plan_id = 0;
  kvfabric::Plan plan;  // host indices resolve in locations.hosts
  ChainLocations locations;
  // One per plan run: for a fetch, the other hosts holding every block of the run, best first
  // (as the run's first block lists them); recompute is always the last fallback. Empty for a
  // recompute run.
  std::vector<std::vector<std::uint32_t>> fallback_host_indices;
};

struct TransferObservation {
  BusPath path = BusPath::kUnspecified;
  std::string host_id;  // empty for paths local to the client
  std::uint64_t bytes = 0;
  double observed_us = 0;
  // Moved while a prefill of the same load ran (kvfabric.v1.TransferObservation.beside_prefill):
  // not scored or fitted as the path alone.
  bool beside_prefill = false;
  // Bytes other loads moved over the same path meanwhile
  // (kvfabric.v1.TransferObservation.shared_bytes): the path's concurrency
  // gain g is learned from it, and the path is scored and fitted from
  // observed_us x min(1, g x bytes / (bytes + shared_bytes)), the share
  // counted down to 1/kMaxSharedShare (CalibratedCostModel::ObserveShared).
  std::uint64_t shared_bytes = 0;
};

struct RecomputeObservation {
  std::uint64_t tokens = 0;
  std::uint64_t prefix_tokens = 0;
  double observed_us = 0;
  // Ran beside the load's fetches (kvfabric.v1.RecomputeObservation.beside_fetch): not scored
  // or fitted as a prefill alone.
  bool beside_fetch = false;
};

struct StaleEntry {
  std::string host_id;
  BlockKey key;
};

// One ReportObservations call.
struct ObservationReport {
  std::string ns;
  std::uint64_t plan_id = 0;  // 0: none
  std::string model_id;
  std::vector<TransferObservation> transfers;
  std::vector<RecomputeObservation> recomputes;
  std::vector<StaleEntry> stale_entries;
  std::vector<std::uint32_t> fallback_runs;
  bool plan_finished = false;
  double observed_total_us = 0;  // plan_finished only; 0: unknown
};

struct ExplainTerm {
  std::string name;
  double value = 0;
  std::string unit;
};

// One plan of the history, for `kvfabric explain plan` without an id.
struct PlanSummary {
  std::uint64_t plan_id = 0;
  std::uint64_t decided_unix_us = 0;
  PlanKind kind = PlanKind::kUnspecified;
  std::string ns;
  std::string model_id;
  std::uint32_t chain_blocks = 0;
  std::uint32_t cached_prefix_blocks = 0;
  std::uint64_t suffix_tokens = 0;
  double predicted_total_us = 0;
  bool finished = false;
  std::optional<double> observed_total_us;  // once the client reported it finished
  // Once finished: how much later the plans admitted after it, sharing its paths, made its end
  // (PathLoad::AddedDelayUs); predicted_total_us + this is its prediction with them.
  std::optional<double> later_plans_delay_us;
};

struct PlanExplanation {
  std::uint64_t plan_id = 0;
  std::string ns;  // the namespace planned for (who may read the explanation)
  PlanKind kind = PlanKind::kUnspecified;
  std::string formula;
  std::string text;  // empty if Options::explain_every_plan is off and the request did not ask
  std::vector<ExplainTerm> terms;
  std::uint64_t decided_unix_us = 0;
  double predicted_total_us = 0;
  std::optional<double> observed_total_us;
  std::optional<double> later_plans_delay_us;  // as PlanSummary's
};

struct PlaceRequest {
  std::string ns;
  std::vector<BlockKey> keys;
  std::uint64_t payload_bytes = 0;
  std::uint32_t replicas = 0;  // 0: policy (1, or hot_replicas for hot keys)
  std::vector<std::string> exclude_host_ids;
};

struct PlaceResult {
  Status status;  // OK, Unavailable (no live host), ResourceExhausted (no room anywhere)
  std::vector<std::uint32_t> host_indices;  // best first, into PlaceResponse::hosts
  std::vector<double> scores;
  std::vector<std::uint32_t> existing_host_indices;
  bool hot = false;
};

struct PlaceResponse {
  std::vector<MemberRecord> hosts;
  std::vector<PlaceResult> results;
};

struct HostStatus {
  MemberRecord record;
  std::uint64_t lease_id = 0;
  std::uint64_t last_heartbeat_unix_us = 0;  // 0: none through this node yet
  // As last granted or renewed through this node; 0 if unknown (another replica's member).
  std::uint32_t lease_remaining_ms = 0;
  std::uint64_t directory_blocks = 0;
  std::uint64_t acked_sequence = 0;
  bool full_report_requested = false;
};

// Traffic clients reported on one bus path (every member, summed): what the
// cluster moved and how long it took, for `kvfabric status` and /metrics.
struct PathTraffic {
  std::uint64_t transfers = 0;
  std::uint64_t bytes = 0;
  double observed_us = 0;
};

// A member that left (deregistered, or its lease expired) recently: what
// `kvfabric status` shows as departed. Kept for the last kMaxDeparted.
struct DepartedHost {
  MemberRecord record;
  bool lease_expired = false;  // false: it deregistered (or left the store)
  std::uint64_t departed_unix_us = 0;
  std::uint64_t directory_blocks_dropped = 0;
};

// One live member's liveness as placement sees it (/metrics).
struct MemberLiveness {
  std::string host_id;
  std::uint64_t last_heartbeat_unix_us = 0;         // 0: none through this node yet
  std::optional<std::uint64_t> lease_remaining_us;  // unknown for a member of another replica
};

// Everything /metrics reports.
struct PlacementSnapshot {
  std::uint64_t uptime_us = 0;
  std::uint64_t live_hosts = 0;
  std::uint64_t draining_hosts = 0;
  DirectoryCounters directory;
  std::uint64_t registrations = 0;
  std::uint64_t heartbeats = 0;
  std::uint64_t heartbeats_not_found = 0;
  std::uint64_t deregistrations = 0;
  std::uint64_t members_left = 0;
  std::uint64_t lease_expiries = 0;
  std::uint64_t incarnations_replaced = 0;
  std::uint64_t reports = 0;
  std::uint64_t reports_duplicate = 0;
  std::uint64_t reports_gap = 0;
  std::uint64_t reports_not_found = 0;
  // Events of reports refused for a stale lease or incarnation (never applied).
  std::uint64_t report_events_ignored = 0;
  std::uint64_t snapshots_completed = 0;
  std::uint64_t locates = 0;
  std::uint64_t plans = 0;
  std::array<std::uint64_t, 5> plans_by_kind{};  // indexed by PlanKind
  // Plans with a run of compact copies (compact_after requests), and their compact blocks.
  std::uint64_t plans_compact = 0;
  std::uint64_t compact_blocks_planned = 0;
  std::uint64_t plans_admitted = 0;              // gauge: plans holding path load
  std::uint64_t plans_finished = 0;
  std::uint64_t split_observations = 0;  // CalibratedCostModel::ObserveSplit calls that counted
  std::uint64_t plans_expired = 0;  // path load released by deadline
  // Plans not charged to the path load: max_admitted_plans were admitted already.
  std::uint64_t plans_not_admitted = 0;
  std::uint64_t plan_history = 0;   // gauge
  std::uint64_t observations_unknown_plan = 0;
  // No parameters for the path or model, not a member, or over max_models.
  std::uint64_t observations_unscored = 0;
  // Prefill calls that ran beside their load's fetches (split fronts): left out of the prefill's
  // fit and error on purpose.
  std::uint64_t observations_beside_fetch = 0;
  // Transfers that moved beside a prefill of their load (split fetch sides): left out of the
  // paths' fits and errors on purpose.
  std::uint64_t observations_beside_prefill = 0;
  // Transfers that moved beside other loads over the same path
  // (shared_bytes > 0): scored and fitted at their share of the time.
  std::uint64_t observations_shared = 0;
  std::uint64_t fallback_runs = 0;
  // RETRIALS: plans made on a slowed host's figures from before its slowdown, and how their
  // transfers judged it; hosts with a slowed path now (gauge).
  std::uint64_t retrials = 0;
  std::uint64_t retrials_restored = 0;
  std::uint64_t retrials_still_slow = 0;
  std::uint64_t retrial_hosts = 0;
  std::uint64_t stale_reports = 0;
  std::uint64_t places = 0;
  std::uint64_t place_hot_keys = 0;
  // Indexed by BusPath (0..kMaxBusPath); transfers of members' and
  // client-local paths that were scored or not.
  std::array<PathTraffic, kMaxBusPath + 1> traffic{};
  // Live members by host_id, the first kMaxMemberSeries of them.
  std::vector<MemberLiveness> members;
  std::uint64_t wall_unix_us = 0;  // when the snapshot was taken
  // observed_total_us / predicted_total_us - 1 of finished plans.
  PredictionErrorHistogram::Snapshot plan_error;
  std::vector<CalibratedCostModel::PathReport> paths;
  std::vector<CalibratedCostModel::RecomputeReport> models;
};

class PlacementNode {
 public:
  // InvalidArgument naming the first option out of range (what Create refuses).
  static Status ValidateOptions(const PlacementOptions& options);
  // Loads the calibration over the default parameters, watches `membership`, learns its
  // current members (List) and starts the maintenance thread. InvalidArgument naming the
  // setting for options that cannot work. `membership` and `env` are borrowed and must outlive
  // the node.
  static StatusOr<std::unique_ptr<PlacementNode>> Create(PlacementOptions options,
                                                         MembershipStore* membership, Env* env);
  // Stops the maintenance thread and the watch.
  ~PlacementNode();
  PlacementNode(const PlacementNode&) = delete;
  PlacementNode& operator=(const PlacementNode&) = delete;

  const PlacementOptions& options() const { return options_; }
  std::uint64_t incarnation() const { return incarnation_; }

  // ---- The Placement RPCs, in core types (see placement.proto) ----
  // ttl_ms 0: limits.default_ttl_ms. InvalidArgument for a bad record, a zero incarnation or a
  // TTL over limits.max_ttl_ms.
  // FailedPrecondition when `record.host_id` is a live member of another
  // incarnation or addresses, or of the same ones without its current token
  // as `previous_token` (CheckNotDisplacingALiveMember). Issues a new token.
  StatusOr<RegisterResult> Register(const MemberRecord& record, std::uint32_t ttl_ms,
                                    std::string_view previous_token = {});
  // NotFound if the lease is gone, unknown to this node, or `token` is not its
  // token (one answer for all three: register again and send a full report).
  // `updated` (may be null) replaces the member's record: free capacity,
  // draining.
  StatusOr<HeartbeatResult> Heartbeat(std::uint64_t lease_id, std::string_view token,
                                      const MemberRecord* updated);
  // Idempotent for the lease's holder; NotFound for a lease this node knows
  // with another token.
  Status Deregister(std::uint64_t lease_id, std::string_view token);
  // NotFound if the lease is not the host's current one, or report.token is
  // not its token.
  StatusOr<ReportResult> ReportBlocks(const BlockReport& report);
  // Counts as an access of every key found (hot-key detection, directory LRU).
  StatusOr<ChainLocations> Locate(std::string_view ns, std::span<const BlockKey> keys);
  StatusOr<PlanResult> Plan(const PlanRequest& request);
  Status ReportObservations(const ObservationReport& report);
  // The same as ReportObservations with only plan_finished. Idempotent.
  void ReportPlanFinished(std::uint64_t plan_id);
  // NotFound if the plan is unknown or aged out of the history.
  StatusOr<PlanExplanation> Explain(std::uint64_t plan_id) const;
  // The newest `n` plans of the history, newest first; `ns`'s only if given.
  std::vector<PlanSummary> RecentPlans(std::size_t n, const std::string* ns = nullptr) const;
  // Plans the history holds now (Snapshot().plan_history, without the rest).
  std::size_t PlanHistorySize() const;
  // A calibration file read again (SIGHUP, the ReloadCalibration RPC): its entries replace the
  // cost model's (CalibratedCostModel::Reload); membership, the directory, plans and the path
  // load are untouched. An invalid calibration changes nothing.
  StatusOr<CalibratedCostModel::ReloadCounts> ReloadCalibration(const BusCalibration& calibration);
  StatusOr<PlaceResponse> Place(const PlaceRequest& request);
  // Live members, sorted by host_id.
  std::vector<HostStatus> ListHosts() const;
  // Members that left lately, newest first (at most kMaxDeparted).
  static constexpr std::size_t kMaxDeparted = 32;
  // Members with liveness series of their own in Snapshot (sorted by id).
  static constexpr std::size_t kMaxMemberSeries = 256;
  std::vector<DepartedHost> RecentlyDeparted() const;
  PlacementSnapshot Snapshot() const;

  // Reconciles membership with the store (List) and releases expired plans' path load. Runs on
  // the maintenance thread every Options::maintenance_interval; tests call it directly. A round
  // whose List raced with a membership change skips the reconciliation (the watch has it).
  void Maintain();

 private:
  // OK unless `in` would replace a live member: a host_id whose heartbeats
  // still arrive (none missed twice) under another incarnation or address.
  // Until members authenticate, this is what keeps anyone who can reach
  // placement from redirecting a live daemon's Place and Plan traffic.
  Status CheckNotDisplacingALiveMember(const MemberRecord& in,
                                       std::string_view previous_token) const;
  // OK if this node knows `lease_id` and `token` is its token; else NotFound.
  Status CheckTokenLocked(std::uint64_t lease_id, std::string_view token) const KVF_REQUIRES(mu_);

  struct HostState {
    MemberRecord record;
    std::uint64_t lease_id = 0;
    std::uint64_t last_heartbeat_unix_us = 0;
    // Lease TTL granted through this node and when it was last renewed here (Env::NowMicros);
    // 0 for a member learned from the store (registered through another replica).
    std::uint32_t ttl_ms = 0;
    std::uint64_t renewed_at_us = 0;
    std::uint64_t acked_sequence = 0;
    bool full_report_wanted = true;
    std::uint64_t snapshot_id = 0;  // in progress
    bool snapshot_broken = false;   // a gap inside the snapshot in progress
    bool leaving = false;           // Deregister in progress: its kLeft is a leave, not an expiry
  };
  struct PlanRecord {
    std::uint64_t plan_id = 0;
    std::uint64_t decided_unix_us = 0;
    std::string ns;
    std::string model_id;
    PlanKind kind = PlanKind::kUnspecified;
    double predicted_total_us = 0;
    std::vector<PlanAlternative> alternatives;
    std::uint32_t chain_blocks = 0;
    std::uint32_t cached_prefix_blocks = 0;
    std::uint64_t suffix_tokens = 0;
    PathParameters host_to_device;
    PathParameters client_ingest;
    RecomputeParameters recompute;
    std::string explanation;
    // The cost model's inputs as they were when the plan was made (PlanInputs).
    std::string inputs;
    std::vector<ExplainTerm> input_terms;
    std::uint64_t ticket = 0;  // PathLoad ticket; 0 once released or if nothing was charged
    bool finished = false;
    std::optional<double> observed_total_us;
    std::optional<double> later_plans_delay_us;  // PlanSummary's, set when it finished
    // A split planned with the model's own cost-model entry: its measured total refits the
    // model's split overlap when it finishes.
    bool learn_split = false;
    bool fell_back = false;  // a report named fallback runs of this plan
    // RETRIALS: the host this plan retried (empty: none), and whether a report judged it.
    std::string retrial_host;
    bool retrial_judged = false;
  };
  // RETRIALS: a host with a slowed path, as the node times its retrials (env_ clock).
  struct RetrialState {
    std::uint64_t next_us = 0;      // no retrial before
    std::uint64_t interval_us = 0;  // doubles per retrial that finds the host still slow
    std::uint32_t still_slow = 0;   // such retrials in a row
  };
  // Hosts whose retrials are timed at once (a bound on retrials_: members only reach it).
  static constexpr std::size_t kMaxRetrialHosts = 4096;
  // The host of `in` whose slowed paths this plan should retry: their figures in `in` replaced by
  // those from before the slowdown (the ones in force saved in *saved), or -1.
  int ChooseRetrial(PlannerInput* in, PlannerHost* saved);
  // A plan made on `host`'s figures from before its slowdown would not fetch from it even so:
  // its next try waits an interval (not doubled; no retrial counted).
  void DeferRetrial(const std::string& host, std::uint64_t now_us);
  // The plan retried in->hosts[h]: starts its interval and notes it in `record`.
  void BeginRetrial(const PlannerInput& in, int h, PlanRecord* record);
  // After a report: a retried host's outcome, and hosts whose transfers an ordinary load just
  // reported (their retrials wait another interval).
  void JudgeRetrial(const std::string& host, std::uint64_t restored, std::uint64_t still_slow,
                    const std::vector<std::string>& observed_hosts);

  PlacementNode(PlacementOptions options, MembershipStore* membership, Env* env);
  Status Start();

  void OnMemberEvent(const MemberEvent& event);
  HostState& UpsertMemberLocked(const MemberRecord& record, std::uint64_t lease_id)
      KVF_REQUIRES(mu_);
  void RemoveMemberLocked(const std::string& host_id, bool expired) KVF_REQUIRES(mu_);
  bool UsableLocked(const HostState& host) const KVF_REQUIRES(mu_);
  ChainLocations LocateLocked(std::string_view ns, std::span<const BlockKey> keys)
      KVF_REQUIRES(mu_);
  void TrimPlanHistoryLocked() KVF_REQUIRES(mu_);
  // What a record counts against plan_history_bytes (added and removed alike).
  static std::size_t PlanRecordBytes(const PlanRecord& record);
  const PlanRecord* FindPlanLocked(std::uint64_t plan_id) const KVF_REQUIRES(mu_);
  // Resolves every path's size curve in `in` at the bytes the plan is expected to move over it
  // (AtSize; PlannerHost::expected_bytes says how that is estimated).
  static void ResolveSizeCurves(const ChainLocations& locations,
                                const std::vector<ChainBlockSpec>& chain, PlannerInput* in);
  // Each path's and the recompute model's parameters, provenance, error and queued bytes, as
  // text and terms, for Explain.
  void DescribePlanInputs(const PlanRequest& request, const PlannerInput& in, PlanRecord* record);
  PlanRecord* FindPlanLocked(std::uint64_t plan_id) KVF_REQUIRES(mu_);

  Status CheckNamespace(std::string_view ns) const;
  PathParameters PathOrDefault(BusPath path, std::string_view host_id) const;
  void MaintenanceLoop();

  const PlacementOptions options_;
  MembershipStore* const membership_;
  Env* const env_;
  const std::uint64_t start_us_;
  const std::uint64_t incarnation_;

  CalibratedCostModel cost_model_;
  PathLoad path_load_{options_.max_admitted_plans};
  const Planner planner_{&path_load_};
  // Held across making a plan and admitting its bytes to path_load_ (never with mu_).
  Mutex admission_mu_;
  // RETRIALS' timing; taken last (after admission_mu_ or mu_), never calls out.
  mutable Mutex retrial_mu_;
  std::map<std::string, RetrialState, std::less<>> retrials_ KVF_GUARDED_BY(retrial_mu_);

  mutable Mutex mu_;
  Directory directory_ KVF_GUARDED_BY(mu_);
  std::map<std::string, HostState, std::less<>> hosts_ KVF_GUARDED_BY(mu_);
  std::unordered_map<std::uint64_t, std::string> host_by_lease_ KVF_GUARDED_BY(mu_);
  std::deque<PlanRecord> plans_ KVF_GUARDED_BY(mu_);  // ids consecutive
  std::size_t plans_bytes_ KVF_GUARDED_BY(mu_) = 0;
  std::uint64_t next_plan_id_ KVF_GUARDED_BY(mu_) = 1;
  // Bumped by every membership change; Maintain skips a List result that raced with one.
  std::uint64_t member_epoch_ KVF_GUARDED_BY(mu_) = 0;
  PredictionErrorHistogram plan_error_ KVF_GUARDED_BY(mu_);
  PlacementSnapshot counters_ KVF_GUARDED_BY(mu_);  // counters only
  // Recently departed members, oldest first, at most kMaxDeparted.
  std::deque<DepartedHost> departed_ KVF_GUARDED_BY(mu_);

  Mutex maintenance_mu_;
  CondVar maintenance_cv_;
  bool stopping_ KVF_GUARDED_BY(maintenance_mu_) = false;
  std::thread maintenance_;
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_PLACEMENT_NODE_H_
