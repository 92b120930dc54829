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
#include "server/cache_host/cache_host_node.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

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

// The Prometheus text exposition format (version 0.0.4) of `families`, as
// served at /metrics. Pure; for tests and `kvfabric status`-style dumps.
std::string RenderText(const std::vector<prometheus::MetricFamily>& families);

// One sample of a metric family being built: its value and labels.
struct MetricSample {
  double value = 0;
  std::vector<prometheus::ClientMetric::Label> labels;
};

// Appends the family `prefix` + `name` (gauge or counter) with `samples` to
// `out`; nothing when there are no samples (a HELP line over nothing is noise
// to a reader). Shared by the cache host's and placement's collectors.
void AppendFamily(std::vector<prometheus::MetricFamily>& out, std::string_view prefix,
                  prometheus::MetricType type, std::string_view name, std::string_view help,
                  std::vector<MetricSample> samples);

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

struct MetricsServerOptions {
  // Serving threads, and the limit on each network read and write of a
  // request: a client that sends its request slowly or not at all holds one
  // thread for at most that long (a handful of such clients once made
  // /metrics unavailable with 2 threads and no limit).
  int threads = 8;
  int request_timeout_ms = 2000;
};

// The HTTP endpoint (prometheus-cpp's civetweb Exposer) serving /metrics.
// Owns the listening socket and its serving threads; the collectables are
// held weakly. Destroying the server stops serving and joins its threads;
// once a request has been served this takes about 2 s (civetweb's shutdown
// polls), so destroy it early in the daemon's shutdown, or in a test expect it.
// Thread safety: the accessors may be called from any thread.
class MetricsServer {
 public:
  // Listens on `address` ("HOST:PORT", "[V6]:PORT"; port 0 picks a free
  // port) and serves the families of `collectables` at /metrics.
  // InvalidArgument for an address of another shape; Unavailable, naming the
  // address and --metrics-address, when it cannot listen there (in use, not a
  // local address). Never throws.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
      MetricsServerOptions options = {});

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on (the chosen one when started with port 0).
  int port() const { return port_; }
  // "http://HOST:PORT/metrics"; a wildcard host (0.0.0.0, [::]) is written as
  // the loopback address, which always reaches it.
  std::string url() const;

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string host, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::string host_;  // as in the address, brackets kept for IPv6
  const int port_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_CACHE_HOST_METRICS_H_
