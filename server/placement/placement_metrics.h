// PlacementMetrics: the Prometheus view of the placement service `kvfabric-placement`, served at
// /metrics by the cache host's MetricsServer (server/cache_host/cache_host_metrics.h; this file
// adds no server of its own).
//
// Collected, never counted here. At every scrape, Collect() calls the snapshot source (in the
// service: PlacementNode::Snapshot) and turns the PlacementSnapshot into metric families. The
// node's counters are the truth and this class keeps no copy of them, so every counter here is
// exactly the node's, and a scrape never double-books.
//
// Names follow the Prometheus conventions: prefix kvfabric_placement_, base units (seconds,
// bytes), counters and only counters end in _total, every family has a HELP line saying what it
// counts. The list, with the snapshot field behind each family, is PlacementFamilies in
// placement_metrics.cc; the main ones:
//   plans_total{kind}                  plans made, by kind: recompute-all, fetch-all, split,
//                                      mixed (the planner's fetch-prefix plans, PLAN_KIND_MIXED)
//   plan_error_ratio                   histogram of observed / predicted - 1 of finished plans,
//                                      buckets PredictionErrorHistogram::kUpperBounds
//   path_error_ratio{path,host,stat="median"|"max"}
//                                      the cost model's out-of-sample error per (path, host):
//                                      0.5 = estimated signed median, max = worst |error|
//   path_alpha_seconds, path_beta_bytes_per_second
//                                      the parameters in force per (path, host)
//   hosts{state="serving"|"draining"}  live daemons (they sum to the members with a lease)
//   directory_entries, directory_replicas, directory_evictions_total
//   lease_expiries_total, registrations_total, heartbeats_total{result}, reports_total{result},
//   stale_reports_total, fallback_runs_total, places_total, place_hot_keys_total, uptime_seconds
//
// Cardinality. Only the per-path and per-model families carry an unbounded label. A `host` label
// names a daemon's host_id, or is "" for the path's default entry (the calibration's figure for
// hosts without their own; "" is never a host_id); a `model` label names a model_id. At most
// kMaxPathSeries (path, host) pairs get series, defaults first, then the pairs with the most
// scored observations (ties by host, then path), so every path_* family has at most 256 series,
// except path_error_ratio, which has two per pair (stat median and max) and only for pairs with
// at least one scored observation. kvfabric_placement_path_entries counts all pairs, shown or
// not. Models alike, with kMaxModelSeries. The label values are UTF-8: host ids are checked at
// Register, model ids arrive in protobuf strings or calibration JSON, both UTF-8.
//
// Ownership and threads: hold it in a std::shared_ptr and hand MetricsServer a weak_ptr (the
// server skips it once it is gone). Collect() may be called from any thread, concurrently; it
// calls the snapshot source on the scraping thread, so the source must be callable from there
// (PlacementNode::Snapshot is).
#ifndef KVFABRIC_SERVER_PLACEMENT_PLACEMENT_METRICS_H_
#define KVFABRIC_SERVER_PLACEMENT_PLACEMENT_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "server/placement/placement_node.h"

namespace kvfabric::placement {

// Most (path, host) pairs with their own kvfabric_placement_path_* series.
inline constexpr std::size_t kMaxPathSeries = 256;
// Most models with their own kvfabric_placement_model_* series.
inline constexpr std::size_t kMaxModelSeries = 256;

// Turns one snapshot into metric families (what PlacementMetrics::Collect returns). Pure;
// exposed for tests and tools. Render them with cache_host::RenderText.
std::vector<prometheus::MetricFamily> PlacementFamilies(const PlacementSnapshot& snapshot);

class PlacementMetrics final : public prometheus::Collectable {
 public:
  using SnapshotSource = std::function<PlacementSnapshot()>;

  // `source` may be empty: then nothing is collected (tests; a service still starting).
  explicit PlacementMetrics(SnapshotSource source);
  ~PlacementMetrics() override;
  PlacementMetrics(const PlacementMetrics&) = delete;
  PlacementMetrics& operator=(const PlacementMetrics&) = delete;

  // PlacementFamilies(source()).
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const SnapshotSource source_;
};

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_PLACEMENT_METRICS_H_
