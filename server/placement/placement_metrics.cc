#include "server/placement/placement_metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "core/bus_cost_model.h"
#include "core/prediction_error.h"
#include "server/cache_host/cache_host_metrics.h"

namespace kvfabric::placement {
namespace {

using cache_host::AppendFamily;
using cache_host::MetricSample;

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr std::string_view kPrefix = "kvfabric_placement_";

using Sample = MetricSample;

void Emit(std::vector<MetricFamily>& out, MetricType type, std::string_view name,
          std::string_view help, std::vector<Sample> samples) {
  AppendFamily(out, kPrefix, type, name, help, std::move(samples));
}

void Gauge(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
           std::vector<Sample> samples) {
  Emit(out, MetricType::Gauge, name, help, std::move(samples));
}

void Counter(std::vector<MetricFamily>& out, std::string_view name, std::string_view help,
             std::vector<Sample> samples) {
  Emit(out, MetricType::Counter, name, help, std::move(samples));
}

Sample S(double value, std::vector<ClientMetric::Label> labels = {}) {
  return Sample{value, std::move(labels)};
}

double D(std::uint64_t v) { return static_cast<double>(v); }

// `a - b`, or 0 if the counters were read at different moments and b overtook a.
std::uint64_t Minus(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

// Plan kinds with series, in enum order (PlanKindLabel names them).
constexpr std::array<PlanKind, 4> kPlanKinds = {PlanKind::kRecomputeAll, PlanKind::kFetchAll,
                                                PlanKind::kSplit, PlanKind::kMixed};

// The Prometheus histogram of `h` (bucket counts made cumulative; the last bucket is +Inf).
ClientMetric ErrorHistogram(const PredictionErrorHistogram::Snapshot& h,
                            std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram.sample_count = h.count;
  metric.histogram.sample_sum = h.sum;
  metric.histogram.bucket.reserve(PredictionErrorHistogram::kBuckets);
  std::uint64_t cumulative = 0;
  for (int i = 0; i < PredictionErrorHistogram::kBuckets; ++i) {
    cumulative += h.counts[static_cast<std::size_t>(i)];
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = i + 1 < PredictionErrorHistogram::kBuckets
                             ? PredictionErrorHistogram::kUpperBounds[static_cast<std::size_t>(i)]
                             : std::numeric_limits<double>::infinity();
    metric.histogram.bucket.push_back(bucket);
  }
  return metric;
}

// The two error figures of `h` as samples labelled stat="median" (estimated signed median) and
// stat="max" (worst |error|) on top of `labels`; none without scored samples, where both
// would read 0 and look like a perfect model.
void AppendErrorQuantiles(const PredictionErrorHistogram::Snapshot& h,
                          const std::vector<ClientMetric::Label>& labels,
                          std::vector<Sample>& out) {
  if (h.count == 0) return;
  std::vector<ClientMetric::Label> median = labels;
  median.push_back({"stat", "median"});
  std::vector<ClientMetric::Label> worst = labels;
  worst.push_back({"stat", "max"});
  out.push_back(S(h.median, std::move(median)));
  out.push_back(S(h.worst_abs, std::move(worst)));
}

void EmitPaths(const std::vector<CalibratedCostModel::PathReport>& paths,
               std::vector<MetricFamily>& out) {
  // Defaults first (they stand for every host without its own entry), then the pairs with the
  // most scored observations; ties by host, then path, so the set does not flap between scrapes.
  std::vector<const CalibratedCostModel::PathReport*> order;
  order.reserve(paths.size());
  for (const auto& p : paths) order.push_back(&p);
  const auto before = [](const CalibratedCostModel::PathReport* a,
                         const CalibratedCostModel::PathReport* b) {
    const bool da = a->host_id.empty();
    const bool db = b->host_id.empty();
    if (da != db) return da;
    if (a->error.count != b->error.count) return a->error.count > b->error.count;
    if (a->host_id != b->host_id) return a->host_id < b->host_id;
    return static_cast<int>(a->path) < static_cast<int>(b->path);
  };
  const std::size_t shown = std::min(order.size(), kMaxPathSeries);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    before);

  std::vector<Sample> error, observations, effective, alpha, beta, gain, noise, refits, changes,
      restores, slowed;
  for (std::size_t i = 0; i < shown; ++i) {
    const CalibratedCostModel::PathReport& p = *order[i];
    const std::vector<ClientMetric::Label> labels = {{"path", std::string(BusPathName(p.path))},
                                                     {"host", p.host_id}};
    AppendErrorQuantiles(p.error, labels, error);
    noise.push_back(S(p.noise_floor_ratio, labels));
    refits.push_back(S(D(p.provenance.refits), labels));
    changes.push_back(S(D(p.provenance.change_points), labels));
    restores.push_back(S(D(p.provenance.restores), labels));
    slowed.push_back(S(p.healthy ? 1.0 : 0.0, labels));
    observations.push_back(S(D(p.error.count), labels));
    effective.push_back(S(p.effective_observations, labels));
    alpha.push_back(S(p.parameters.alpha_us / 1e6, labels));
    beta.push_back(S(p.parameters.beta_bytes_per_s, labels));
    gain.push_back(S(p.parameters.concurrency_gain, labels));
  }

  Gauge(out, "path_entries",
        "(path, host) pairs the cost model has parameters for, including those beyond the 256 "
        "with their own path_* series.",
        {S(D(paths.size()))});
  Gauge(out, "path_error_ratio",
        "Out-of-sample error observed / predicted - 1 of the cost model per (path, host): "
        "stat median = estimated median (signed), max = worst |error|. Only pairs with scored "
        "observations; host \"\" = the path's default entry.",
        std::move(error));
  Counter(out, "path_observations_total",
          "Transfers scored against the cost model per (path, host).", std::move(observations));
  Gauge(out, "path_effective_observations",
        "Decayed observation weight the online refit of a (path, host) rests on; it replaces the "
        "parameters once it reaches the refit minimum.",
        std::move(effective));
  Gauge(out, "path_alpha_seconds",
        "Fixed cost per transfer (alpha) in force for a (path, host), in seconds.",
        std::move(alpha));
  Gauge(out, "path_beta_bytes_per_second",
        "Sustained bandwidth (beta) in force for a (path, host), in bytes per second.",
        std::move(beta));
  Gauge(out, "path_concurrency_gain",
        "How much more a (path, host) carries for several transfers at once than for one "
        "(together at most gain x beta, each at most beta), learned from transfers that moved "
        "beside other loads; 1 = shared as it is.",
        std::move(gain));
  Gauge(out, "path_noise_floor_ratio",
        "The calibration's noise floor of a (path, host): how far identical interleaved repeats "
        "spread (max(1 - p10, p90 - 1) of repeat/median); an error below it is the machine's. "
        "0 without a calibration file entry.",
        std::move(noise));
  Counter(out, "path_refits_total",
          "Times the online refit replaced a (path, host)'s parameters since they were last "
          "set.",
          std::move(refits));
  Counter(out, "path_change_points_total",
          "Times a (path, host) was rescaled after eight consecutive same-direction misses "
          "beyond 50%, or two beyond 4x and 20 ms (a path that turned slower or faster).",
          std::move(changes));
  Gauge(out, "path_slowed",
        "1 while a change point has slowed a (path, host) below figures transfers had confirmed, "
        "until a retrial or its own traffic brings it back to them (placement keeps those "
        "figures and retries them).",
        std::move(slowed));
  Counter(out, "path_restores_total",
          "Times a retrial found a slowed (path, host) recovered and restored its figures from "
          "before the slowdown.",
          std::move(restores));
}

void EmitModels(const std::vector<CalibratedCostModel::RecomputeReport>& models,
                std::vector<MetricFamily>& out) {
  std::vector<const CalibratedCostModel::RecomputeReport*> order;
  order.reserve(models.size());
  for (const auto& m : models) order.push_back(&m);
  const auto before = [](const CalibratedCostModel::RecomputeReport* a,
                         const CalibratedCostModel::RecomputeReport* b) {
    if (a->error.count != b->error.count) return a->error.count > b->error.count;
    return a->model_id < b->model_id;
  };
  const std::size_t shown = std::min(order.size(), kMaxModelSeries);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    before);

  std::vector<Sample> error, observations, effective, c0, c1, c2, c3, noise, refits, split,
      split_error;
  for (std::size_t i = 0; i < shown; ++i) {
    const CalibratedCostModel::RecomputeReport& m = *order[i];
    const std::vector<ClientMetric::Label> labels = {{"model", m.model_id}};
    AppendErrorQuantiles(m.error, labels, error);
    noise.push_back(S(m.noise_floor_ratio, labels));
    refits.push_back(S(D(m.provenance.refits), labels));
    observations.push_back(S(D(m.error.count), labels));
    effective.push_back(S(m.effective_observations, labels));
    c0.push_back(S(m.parameters.c0_us / 1e6, labels));
    c1.push_back(S(m.parameters.c1_us_per_token / 1e6, labels));
    c2.push_back(S(m.parameters.c2_us_per_token2 / 1e6, labels));
    c3.push_back(S(m.parameters.c3_us_per_prefix_token / 1e6, labels));
    split.push_back(S(m.parameters.split_serial_fraction, labels));
    AppendErrorQuantiles(m.split_error, labels, split_error);
  }

  Gauge(out, "models",
        "Models the cost model has recompute parameters for, including those beyond the 256 "
        "with their own model_* series.",
        {S(D(models.size()))});
  Gauge(out, "model_error_ratio",
        "Out-of-sample error observed / predicted - 1 of a model's recompute (prefill) time: "
        "stat median = estimated median (signed), max = worst |error|. Only models with scored "
        "observations.",
        std::move(error));
  Counter(out, "model_observations_total",
          "Recomputes (prefills) scored against the cost model per model.",
          std::move(observations));
  Gauge(out, "model_effective_observations",
        "Decayed observation weight the online recompute refit of a model rests on.",
        std::move(effective));
  Gauge(out, "model_c0_seconds", "Fixed cost per recompute call (c0) in force, in seconds.",
        std::move(c0));
  Gauge(out, "model_c1_seconds_per_token",
        "Linear recompute cost (c1) in force, in seconds per token.", std::move(c1));
  Gauge(out, "model_c2_seconds_per_token_squared",
        "Quadratic (attention) recompute cost (c2) in force, in seconds per token squared.",
        std::move(c2));
  Gauge(out, "model_c3_seconds_per_prefix_token",
        "Per-call recompute cost per token of the prefix (c3: reading the prefix's K and V) in "
        "force, in seconds per token; 0 where not modelled.",
        std::move(c3));
  Gauge(out, "model_split_serial_fraction",
        "Part of a split plan's shorter side (prefill front or fetch) that does not overlap the "
        "longer one, in force: 0 = separate resources, 1 = serial. Fitted from finished split "
        "plans.",
        std::move(split));
  Gauge(out, "model_split_error_ratio",
        "Out-of-sample error observed / predicted - 1 of finished split plans' total time per "
        "model: stat median = estimated median (signed), max = worst |error|. Only models with "
        "scored split plans.",
        std::move(split_error));
  Gauge(out, "model_noise_floor_ratio",
        "The calibration's noise floor of a model's prefill probe; 0 without one.",
        std::move(noise));
  Counter(out, "model_refits_total",
          "Times the online refit replaced a model's recompute constants since they were last "
          "set.",
          std::move(refits));
}

}  // namespace

std::vector<MetricFamily> PlacementFamilies(const PlacementSnapshot& s) {
  std::vector<MetricFamily> out;
  out.reserve(64);

  // ---- Service and membership ----
  Gauge(out, "uptime_seconds", "Seconds since the placement service started.",
        {S(D(s.uptime_us) / 1e6)});
  Gauge(out, "hosts",
        "Live daemons (members with a lease) by state: serving, or draining (no new leases, "
        "not chosen by Locate, Plan or Place). The states sum to the live daemons.",
        {S(D(Minus(s.live_hosts, s.draining_hosts)), {{"state", "serving"}}),
         S(D(s.draining_hosts), {{"state", "draining"}})});
  std::vector<Sample> heartbeat_age, lease_left;
  for (const MemberLiveness& m : s.members) {
    const std::vector<ClientMetric::Label> host = {{"host", m.host_id}};
    if (m.last_heartbeat_unix_us != 0) {
      heartbeat_age.push_back(S(D(Minus(s.wall_unix_us, m.last_heartbeat_unix_us)) / 1e6, host));
    }
    if (m.lease_remaining_us) lease_left.push_back(S(D(*m.lease_remaining_us) / 1e6, host));
  }
  Gauge(out, "member_heartbeat_age_seconds",
        "Seconds since placement last heard a heartbeat from each live daemon (its liveness as "
        "placement sees it; the first 256 members by host id).",
        std::move(heartbeat_age));
  Gauge(out, "member_lease_remaining_seconds",
        "Seconds left of each live daemon's membership lease granted through this placement "
        "replica; at 0 the daemon is dropped with its directory entries.",
        std::move(lease_left));
  Counter(out, "registrations_total", "Register calls that granted a membership lease.",
          {S(D(s.registrations))});
  Counter(out, "heartbeats_total",
          "Heartbeats by outcome: ok = lease renewed, not_found = the lease was gone (the daemon "
          "must register again).",
          {S(D(s.heartbeats), {{"result", "ok"}}),
           S(D(s.heartbeats_not_found), {{"result", "not_found"}})});
  Counter(out, "deregistrations_total", "Deregister calls that succeeded.",
          {S(D(s.deregistrations))});
  Counter(out, "members_left_total",
          "Members forgotten because they left the membership store (Deregister, here or through "
          "another replica), with their directory entries.",
          {S(D(s.members_left))});
  Counter(out, "lease_expiries_total",
          "Members forgotten because their membership lease expired (no heartbeat within the "
          "TTL), with their directory entries.",
          {S(D(s.lease_expiries))});
  Counter(out, "incarnations_replaced_total",
          "Registrations of a known host_id with a new incarnation (a restarted daemon); the old "
          "incarnation's directory entries are dropped.",
          {S(D(s.incarnations_replaced))});

  // ---- Block reports ----
  Counter(
      out, "reports_total",
      "ReportBlocks calls by outcome: applied, duplicate = sequence already applied "
      "(acknowledged, ignored), not_found = not the host's current lease or incarnation "
      "(refused).",
      {S(D(Minus(s.reports, s.reports_duplicate + s.reports_not_found)), {{"result", "applied"}}),
       S(D(s.reports_duplicate), {{"result", "duplicate"}}),
       S(D(s.reports_not_found), {{"result", "not_found"}})});
  Counter(out, "report_gaps_total",
          "Applied reports whose sequence skipped one or more (a report was lost); each asks the "
          "daemon for a full snapshot.",
          {S(D(s.reports_gap))});
  Counter(out, "report_events_ignored_total",
          "Block events of reports refused as not_found (never applied).",
          {S(D(s.report_events_ignored))});
  Counter(out, "snapshots_completed_total",
          "Full snapshots applied whole (their last chunk arrived with no gap inside).",
          {S(D(s.snapshots_completed))});

  // ---- Directory ----
  const DirectoryCounters& d = s.directory;
  Gauge(out, "directory_entries", "Blocks (namespace, key) the directory holds.",
        {S(D(d.entries))});
  Gauge(out, "directory_replicas", "Replicas (daemon copies) over all directory entries.",
        {S(D(d.replicas))});
  Gauge(out, "directory_hosts", "Daemons the directory holds an incarnation for.", {S(D(d.hosts))});
  Gauge(out, "directory_namespaces", "Namespaces that ever had a directory entry.",
        {S(D(d.namespaces))});
  Counter(out, "directory_evictions_total",
          "Directory entries dropped, least recently accessed first, to stay within "
          "--max-directory-entries.",
          {S(D(d.entries_evicted))});
  Counter(out, "directory_events_total",
          "Block events that reached the directory, by result: applied, ignored_incarnation = "
          "from an unknown host or an old incarnation, malformed = unspecified kind or tier.",
          {S(D(d.events_applied), {{"result", "applied"}}),
           S(D(d.events_ignored_incarnation), {{"result", "ignored_incarnation"}}),
           S(D(d.events_ignored_malformed), {{"result", "malformed"}})});
  Counter(out, "directory_events_without_replica_total",
          "Applied events that removed or changed a replica the directory did not have "
          "(reordered or lost reports; harmless).",
          {S(D(d.events_without_replica))});
  Counter(out, "directory_replicas_refused_total",
          "Replicas not recorded because their entry already had max_replicas.",
          {S(D(d.replicas_refused))});
  Counter(out, "directory_replicas_dropped_total",
          "Replicas removed other than by their daemon's events: host = with their daemon (it "
          "left, expired or restarted), snapshot = not in the daemon's full snapshot, stale = a "
          "client found the block missing.",
          {S(D(d.replicas_dropped_with_host), {{"reason", "host"}}),
           S(D(d.replicas_dropped_by_snapshot), {{"reason", "snapshot"}}),
           S(D(d.stale_replicas_removed), {{"reason", "stale"}})});
  Counter(out, "directory_stale_reports_unmatched_total",
          "Stale-entry reports naming a replica the directory no longer had.",
          {S(D(d.stale_reports_unmatched))});

  // ---- Locate, Plan, Place ----
  Counter(out, "locates_total", "Locate calls answered.", {S(D(s.locates))});
  std::vector<Sample> plans;
  for (const PlanKind kind : kPlanKinds) {
    plans.push_back(S(D(s.plans_by_kind[static_cast<std::size_t>(kind)]),
                      {{"kind", std::string(PlanKindLabel(kind))}}));
  }
  const std::uint64_t unspecified =
      s.plans_by_kind[static_cast<std::size_t>(PlanKind::kUnspecified)];
  if (unspecified != 0) plans.push_back(S(D(unspecified), {{"kind", "unspecified"}}));
  Counter(out, "plans_total",
          "Plans made, by kind: recompute_all, fetch_all (fetch the cached prefix), split "
          "(recompute a head while fetching the rest), mixed (any other mix, e.g. fetch a shorter "
          "prefix).",
          std::move(plans));
  Counter(out, "plans_compact_total",
          "Plans with at least one run of compact copies (requests under a compact_after "
          "accuracy policy; docs/compact.md).",
          {S(D(s.plans_compact))});
  Counter(out, "compact_blocks_planned_total",
          "Blocks plans fetch as their compact copies instead of exact ones.",
          {S(D(s.compact_blocks_planned))});
  Gauge(out, "plans_in_flight",
        "Plans whose bytes are charged to the path load (neither reported finished nor past "
        "their deadline).",
        {S(D(s.plans_admitted))});
  Counter(out, "plans_finished_total", "Plans the client reported finished.",
          {S(D(s.plans_finished))});
  Counter(out, "split_observations_total",
          "Finished split plans (no fallbacks, planned with the model's own entry) that scored "
          "and refitted their model's split overlap.",
          {S(D(s.split_observations))});
  Counter(out, "plans_expired_total",
          "Plans whose path load was released at their deadline (the client did not report "
          "them finished in time).",
          {S(D(s.plans_expired))});
  Counter(out, "plans_not_admitted_total",
          "Plans answered but not charged to the path load: --max-admitted-plans plans held it "
          "already.",
          {S(D(s.plans_not_admitted))});
  Gauge(out, "plan_history_plans", "Plans kept for Explain.", {S(D(s.plan_history))});

  MetricFamily plan_error;
  plan_error.name = std::string(kPrefix) + "plan_error_ratio";
  plan_error.help =
      "Error of finished plans' predicted total time: observed / predicted - 1 (0.03 = took 3% "
      "longer than predicted).";
  plan_error.type = MetricType::Histogram;
  plan_error.metric.push_back(ErrorHistogram(s.plan_error));
  out.push_back(std::move(plan_error));
  std::vector<Sample> plan_quantiles;
  AppendErrorQuantiles(s.plan_error, {}, plan_quantiles);
  Gauge(out, "plan_error_stat_ratio",
        "Error observed / predicted - 1 of finished plans: stat median = estimated median "
        "(signed), max = worst |error|. Absent before the first scored plan.",
        std::move(plan_quantiles));
  Counter(out, "plan_error_unscored_total",
          "Finished plans with an observed time whose prediction could not be scored "
          "(predicted time not positive and finite).",
          {S(D(s.plan_error.unscored))});

  // ---- Observations ----
  Counter(out, "observations_unknown_plan_total",
          "ReportObservations calls naming a plan that is unknown or aged out of the history.",
          {S(D(s.observations_unknown_plan))});
  Counter(out, "observations_unscored_total",
          "Observed transfers and recomputes not scored: no parameters for the path or model, "
          "not a member, or a model beyond max_models (PlacementOptions, default 64).",
          {S(D(s.observations_unscored))});
  Counter(out, "observations_beside_fetch_total",
          "Prefill calls that ran beside their load's fetches (split fronts), left out of the "
          "prefill model's fit and error: the split prediction's overlap term covers them.",
          {S(D(s.observations_beside_fetch))});
  Counter(out, "observations_beside_prefill_total",
          "Transfers that moved beside a prefill of their load (split fetch sides), left out of "
          "the paths' fits and errors: the split prediction's overlap term covers them.",
          {S(D(s.observations_beside_prefill))});
  Counter(out, "observations_shared_total",
          "Transfers that moved beside other loads of their client over the same path, fitted "
          "and scored at their share of the time (bytes / (bytes + shared bytes)).",
          {S(D(s.observations_shared))});
  Counter(out, "fallback_runs_total",
          "Plan runs a client could not complete as planned and fell back (another replica or "
          "recompute).",
          {S(D(s.fallback_runs))});
  Counter(out, "retrials_total",
          "Plans made on a slowed daemon's figures from before its slowdown, to learn whether it "
          "recovered (--retrial-interval).",
          {S(D(s.retrials))});
  Counter(out, "retrials_judged_total",
          "Retrial plans whose transfers found the daemon's slowed paths recovered (restored: "
          "their figures from before are back) or still slow (the next retrial waits twice as "
          "long).",
          {S(D(s.retrials_restored), {{"outcome", "restored"}}),
           S(D(s.retrials_still_slow), {{"outcome", "still_slow"}})});
  Gauge(out, "retrial_hosts", "Daemons with a slowed path whose retrials placement is timing now.",
        {S(D(s.retrial_hosts))});
  Counter(out, "stale_reports_total",
          "Directory entries clients reported stale (the daemon answered NOT_FOUND).",
          {S(D(s.stale_reports))});
  Counter(out, "places_total", "Place calls answered.", {S(D(s.places))});
  std::vector<Sample> traffic_bytes, traffic_seconds, traffic_transfers;
  for (int p = 1; p <= kMaxBusPath; ++p) {
    const PathTraffic& t = s.traffic[static_cast<std::size_t>(p)];
    if (t.transfers == 0) continue;
    const std::vector<ClientMetric::Label> labels = {
        {"path", std::string(BusPathName(static_cast<BusPath>(p)))}};
    traffic_bytes.push_back(S(D(t.bytes), labels));
    traffic_seconds.push_back(S(t.observed_us / 1e6, labels));
    traffic_transfers.push_back(S(D(t.transfers), labels));
  }
  Counter(out, "path_traffic_bytes_total",
          "Bytes clients reported moving per bus path, every member summed (the cluster's "
          "bandwidth per path: rate of this over rate of path_traffic_seconds_total).",
          std::move(traffic_bytes));
  Counter(out, "path_traffic_seconds_total",
          "Time the reported transfers took per bus path, summed, in seconds.",
          std::move(traffic_seconds));
  Counter(out, "path_traffic_transfers_total", "Transfers clients reported per bus path.",
          std::move(traffic_transfers));
  Counter(out, "place_hot_keys_total",
          "Keys in Place calls the directory counts as hot (given extra replicas).",
          {S(D(s.place_hot_keys))});

  // ---- Cost model ----
  EmitPaths(s.paths, out);
  EmitModels(s.models, out);
  return out;
}

PlacementMetrics::PlacementMetrics(SnapshotSource source) : source_(std::move(source)) {}

PlacementMetrics::~PlacementMetrics() = default;

std::vector<MetricFamily> PlacementMetrics::Collect() const {
  if (!source_) return {};
  return PlacementFamilies(source_());
}

}  // namespace kvfabric::placement
