// CacheHostMetrics: the Prometheus view of the cache-host daemon, served at
// /metrics by MetricsServer.
//
// Two sources, so that nothing is counted twice:
//  - Collected. At every scrape, Collect() calls the snapshot source (in the
//    daemon: CacheHostNode::Snapshot) and turns the CacheHostSnapshot into
//    metric families. The node's own counters are the truth; this class keeps
//    no copy of them, so a counter here is exactly the node's and a restarted
//    scrape never double-books.
//  - Observed. Data-plane transfers are not in the snapshot: ObserveTransfer
//    (shaped like TransferObserver) feeds latency and size histograms and
//    byte and failure counters, labelled direction="put" (client writes into
//    the pool) or "get" (client reads from it). Failed transfers count only in
//    kvfabric_cache_host_transfer_failures_total; the histograms and the byte
//    counter describe transfers that completed.
//
// Names follow the Prometheus conventions: prefix kvfabric_cache_host_, base
// units (bytes, seconds), counters end in _total, every family has a HELP line
// saying what it counts. The list, with the snapshot field behind each family,
// is SnapshotFamilies in cache_host_metrics.cc.
//
// Cardinality. Per-namespace families (kvfabric_cache_host_namespace_*) carry a
// `namespace` label whose value is the tenant name. They are opt-in (tenant
// names are not every scraper's business): only the `namespace_series`
// largest namespaces (--metrics-namespace-series, default 0, at most
// kMaxNamespaceSeries; host + reserved + NVMe bytes, ties by name) get series,
// the rest are summed into
// kvfabric_cache_host_namespace_other_bytes{tier} so that totals still add up,
// and kvfabric_cache_host_namespaces gives the count of all of them. Tenant
// names that are not valid UTF-8 are repaired (U+FFFD) for the exposition.
//
// Ownership and threads: hold it in a std::shared_ptr and hand MetricsServer a
// weak_ptr (the server skips it once it is gone). Collect() and
// ObserveTransfer() may be called from any thread, concurrently; Collect()
// calls the snapshot source on the scraping thread, so the source must be
// callable from there. ObserveTransfer never blocks for long (prometheus-cpp
// histograms take a short mutex) and allocates nothing.
#ifndef KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_METRICS_H_
#define KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "metrics/exposition.h"
#include "metrics/metrics_server.h"
#include "server/cache_host/cache_host_node.h"

namespace kvfabric::cache_host {

// Most namespaces with their own kvfabric_cache_host_namespace_* series.
inline constexpr std::size_t kMaxNamespaceSeries = 256;

// Upper bounds of kvfabric_cache_host_transfer_seconds: 50 us to 10 s in
// 1-2.5-5 steps (17 buckets plus +Inf).
const std::vector<double>& TransferSecondsBuckets();
// Upper bounds of kvfabric_cache_host_transfer_size_bytes: 4 KiB to 256 MiB,
// powers of 4 (9 buckets plus +Inf).
const std::vector<double>& TransferSizeBuckets();

// Turns one snapshot into metric families (what CacheHostMetrics::Collect
// adds to the transfer families). Pure; exposed for tests and tools.
// `namespace_series`: how many of the largest namespaces get series of their
// own (see "Cardinality").
std::vector<prometheus::MetricFamily> SnapshotFamilies(
    const CacheHostSnapshot& snapshot, std::size_t namespace_series = kMaxNamespaceSeries);

class CacheHostMetrics final : public prometheus::Collectable {
 public:
  using SnapshotSource = std::function<CacheHostSnapshot()>;

  // `source` may be empty: then only the transfer families are collected
  // (tests; a daemon still starting).
  // `namespace_series`: see "Cardinality" (0: none, the default of the daemon).
  explicit CacheHostMetrics(SnapshotSource source, std::size_t namespace_series = 0);
  ~CacheHostMetrics() override;
  CacheHostMetrics(const CacheHostMetrics&) = delete;
  CacheHostMetrics& operator=(const CacheHostMetrics&) = delete;

  // The snapshot families (SnapshotFamilies of source()) followed by the
  // transfer families.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Records one data-plane transfer: `write` is a put, `bytes` its payload,
  // `micros` its duration, `status` its outcome. Matches TransferObserver.
  void ObserveTransfer(bool write, std::uint64_t bytes, std::uint64_t micros, const Status& status);

  // A TransferObserver that forwards to ObserveTransfer while this object
  // lives and does nothing after (it holds a weak_ptr).
  // REQUIRES: this object is owned by a std::shared_ptr (`self`).
  static TransferObserver ObserverFor(const std::shared_ptr<CacheHostMetrics>& self);

 private:
  struct Direction {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Histogram* size = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* failures = nullptr;
  };

  const SnapshotSource source_;
  const std::size_t namespace_series_;
  // Owns the transfer families; the pointers below point into it.
  const std::shared_ptr<prometheus::Registry> registry_;
  Direction put_;
  Direction get_;
};

// Served by metrics::MetricsServer (metrics/metrics_server.h); these names
// are kept for the daemon's code.
using metrics::AppendFamily;
using metrics::MetricSample;
using metrics::MetricsServer;
using metrics::MetricsServerOptions;
using metrics::RenderText;

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_METRICS_H_
