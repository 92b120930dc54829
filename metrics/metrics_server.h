// MetricsServer: the HTTP endpoint serving /metrics (prometheus-cpp's
// civetweb Exposer), used by kvfabric-cached, kvfabric-placement and, when
// ClientOptions::metrics_address is set, by libkvfabric.
//
#ifndef KVFABRIC_METRICS_METRICS_SERVER_H_
#define KVFABRIC_METRICS_METRICS_SERVER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace kvfabric::metrics {

struct MetricsServerOptions {
  // Serving threads, and the limit on each network read and write of a
  // request: a client that sends its request slowly or not at all holds one
  // thread for at most that long (a handful of such clients once made
  // /metrics unavailable with 2 threads and no limit).
  int threads = 8;
  int request_timeout_ms = 2000;
};

// Owns the listening socket and its serving threads; the collectables are
// held weakly. Destroying the server stops serving and joins its threads;
// once a request has been served this takes about 2 s (civetweb's shutdown
// polls), so destroy it early in the daemon's shutdown, or in a test expect it.
// Thread safety: the accessors may be called from any thread.
// OK when `address` has the shape MetricsServer::Start accepts ("off" is not
// an address); InvalidArgument naming --metrics-address otherwise. Binds
// nothing (--check-config).
Status ValidateMetricsAddress(const std::string& address);

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

}  // namespace kvfabric::metrics

#endif  // KVFABRIC_METRICS_METRICS_SERVER_H_
