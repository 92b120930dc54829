// MetricsServer: the HTTP endpoint serving /metrics, used by kvfabric-cached,
// kvfabric-placement and, when ClientOptions::metrics_address is set, by
// libkvfabric inside an engine's process.
//
// It is kvfabric's own small HTTP/1.1 server (one thread, poll(2), every
// connection closed after its response), not prometheus-cpp's civetweb
// Exposer: civetweb runs its workers on 100 KiB stacks, and glibc carves a
// thread's static TLS out of its stack, so in a process that also loads a
// library with large TLS (OpenBLAS: 60 KiB, as `kvfabric demo` and many
// engines do) the first scrape overflowed a worker's stack and killed the
// process. The registry and text format are still prometheus-cpp's (core).
//
// What a peer can make it hold is bounded: at most max_connections open
// connections (more are closed at once), a request of at most
// max_request_bytes (431 beyond), and request_timeout_ms for a connection's
// whole life, reading the request and writing the response (a client that
// sends slowly or reads slowly is cut off then; others are served meanwhile).
// GET and HEAD of /metrics answer 200 with the text format 0.0.4; any other
// path 404, any other method 405.
#ifndef KVFABRIC_METRICS_METRICS_SERVER_H_
#define KVFABRIC_METRICS_METRICS_SERVER_H_

#include <prometheus/collectable.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::metrics {

struct MetricsServerOptions {
  // Connections served at once; more are accepted and closed immediately.
  // Default 64.
  int max_connections = 64;
  // A connection's whole life: reading its request and writing the
  // response. Default 2000 ms (a scrape of a kvfabric process is a few
  // hundred KiB on loopback or a LAN).
  int request_timeout_ms = 2000;
  // The request line and headers, at most. Default 8 KiB.
  int max_request_bytes = 8192;
};

// OK when `address` has the shape MetricsServer::Start accepts ("off" is not
// an address); InvalidArgument naming --metrics-address otherwise. Binds
// nothing (--check-config).
Status ValidateMetricsAddress(const std::string& address);

// Owns the listening socket and its serving thread; the collectables are
// held weakly (one that is gone is skipped). Destroying the server stops
// serving and joins its thread at once.
// Thread safety: the accessors may be called from any thread.
class MetricsServer {
 public:
  // Listens on `address` ("HOST:PORT", "[V6]:PORT" with a numeric host; port
  // 0 picks a free port) and serves the families of `collectables` at
  // /metrics. InvalidArgument for an address of another shape or options out
  // of range; Unavailable, naming the address and --metrics-address, when it
  // cannot listen there (in use, not a local address).
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

  // Requests answered (any status) and connections closed because they were
  // over max_connections, over max_request_bytes or past request_timeout_ms.
  std::uint64_t requests_served() const { return served_.load(); }
  std::uint64_t connections_refused() const { return refused_.load(); }

 private:
  MetricsServer(std::string host, int port, int listen_fd, int wake_fd,
                std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                MetricsServerOptions options);
  void Loop();
  // The whole HTTP response to the request head `head`.
  std::string Respond(const std::string& head) const;

  const std::string host_;  // as in the address, brackets kept for IPv6
  const int port_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd: written to stop the loop
  const std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
  const MetricsServerOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> served_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace kvfabric::metrics

#endif  // KVFABRIC_METRICS_METRICS_SERVER_H_
