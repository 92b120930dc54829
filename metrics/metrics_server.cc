#include "metrics/metrics_server.h"

#include <prometheus/exposer.h>

#include <charconv>
#include <exception>
#include <string_view>
#include <utility>

// Under ThreadSanitizer: civetweb (prometheus-cpp's HTTP server, a system
// library built without TSan) formats dates with gmtime(), whose result is a
// static buffer in libc, from every worker thread; two requests timing out at
// once race on it (a garbled Date header at worst). The report is about
// third-party code this project does not build; suppress it for every binary
// that serves /metrics.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() { return "race:libcivetweb.so\n"; }
#endif

namespace kvfabric::metrics {
namespace {

struct ParsedAddress {
  std::string host;  // brackets kept for IPv6
  int port = 0;
};

Status BadAddress(const std::string& address, std::string_view why) {
  return Status::InvalidArgument("--metrics-address \"" + address + "\": " + std::string(why) +
                                 "; expected HOST:PORT or [IPV6]:PORT with a numeric address, "
                                 "e.g. 127.0.0.1:9464 (port 0 picks a free port)");
}

// Checks the shape civetweb's listening_ports would read as one plain HTTP
// port: anything else (a list, an "s" suffix for TLS, "r" for redirect) is
// refused rather than passed through.
StatusOr<ParsedAddress> ParseAddress(const std::string& address) {
  std::string_view rest = address;
  ParsedAddress parsed;
  if (!rest.empty() && rest.front() == '[') {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos || close == 1) {
      return BadAddress(address, "unterminated or empty [IPv6] host");
    }
    parsed.host = std::string(rest.substr(0, close + 1));
    rest.remove_prefix(close + 1);
    if (rest.empty() || rest.front() != ':') return BadAddress(address, "no :PORT");
  } else {
    const std::size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return BadAddress(address, "no :PORT");
    if (colon == 0) return BadAddress(address, "no host");
    parsed.host = std::string(rest.substr(0, colon));
    if (parsed.host.find(':') != std::string::npos) {
      return BadAddress(address, "an IPv6 host must be in brackets");
    }
    rest.remove_prefix(colon);
  }
  rest.remove_prefix(1);  // ':'
  if (parsed.host.find_first_of(", \t") != std::string::npos) {
    return BadAddress(address, "one address only");
  }
  const char* end = rest.data() + rest.size();
  const auto [ptr, ec] = std::from_chars(rest.data(), end, parsed.port);
  if (rest.empty() || rest.size() > 5 || ec != std::errc() || ptr != end || parsed.port < 0 ||
      parsed.port > 65535) {
    return BadAddress(address, "the port must be a number in [0, 65535]");
  }
  return parsed;
}

}  // namespace

Status ValidateMetricsAddress(const std::string& address) { return ParseAddress(address).status(); }

// ---- MetricsServer ----

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string host,
                             int port)
    : exposer_(std::move(exposer)), host_(std::move(host)), port_(port) {}

MetricsServer::~MetricsServer() = default;

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
    MetricsServerOptions options) {
  if (options.threads < 1 || options.request_timeout_ms < 1) {
    return Status::InvalidArgument("/metrics server: threads and request_timeout_ms must be >= 1");
  }
  KVF_ASSIGN_OR_RETURN(ParsedAddress parsed, ParseAddress(address));
  // prometheus-cpp reports a failed bind (and any other trouble starting
  // civetweb) by throwing; this is the one place those exceptions stop.
  std::unique_ptr<prometheus::Exposer> exposer;
  std::vector<int> ports;
  try {
    // Each request gets request_timeout_ms for every read and write: a client
    // that opens connections and sends headers slowly (or not at all) holds a
    // worker for that long, not forever, and with several workers a few such
    // clients cannot make /metrics unavailable.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", std::to_string(options.threads),
        "request_timeout_ms", std::to_string(options.request_timeout_ms)});
    // The Exposer creates the /metrics handler with its first collectable;
    // an empty weak_ptr makes sure there is one (serving an empty page).
    if (collectables.empty()) collectables.emplace_back();
    for (const auto& collectable : collectables) exposer->RegisterCollectable(collectable);
    ports = exposer->GetListeningPorts();
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot serve /metrics on \"" + address +
                               "\": the port is in use or the host is not an address of this "
                               "machine (prometheus-cpp: " +
                               e.what() +
                               "); choose another --metrics-address (port 0 picks a free one)");
  } catch (...) {
    return Status::Unavailable("cannot serve /metrics on \"" + address +
                               "\" (unknown error); choose another --metrics-address");
  }
  if (ports.size() != 1 || ports[0] <= 0) {
    return Status::Internal("/metrics server on \"" + address + "\" reports " +
                            std::to_string(ports.size()) + " listening ports, expected one");
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), std::move(parsed.host), ports[0]));
}

std::string MetricsServer::url() const {
  std::string host = host_;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  return "http://" + host + ":" + std::to_string(port_) + "/metrics";
}

}  // namespace kvfabric::metrics
