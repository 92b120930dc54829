#include "metrics/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <iterator>
#include <string_view>
#include <utility>

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

// Checks for one plain HOST:PORT: anything else (a list, civetweb's "s"
// suffix for TLS or "r" for redirect that older configurations may carry) is
// refused rather than guessed at.
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

namespace {

using Clock = std::chrono::steady_clock;

Status CannotListen(const std::string& address, const std::string& why) {
  return Status::Unavailable("cannot serve /metrics on \"" + address + "\": " + why +
                             "; choose another --metrics-address (port 0 picks a free one)");
}

std::string StatusLine(int code, std::string_view reason, std::string_view extra_headers,
                       const std::string& body, bool head_only) {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) +
                    "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n" +
                    std::string(extra_headers) + "\r\n";
  if (!head_only) out += body;
  return out;
}

}  // namespace

MetricsServer::MetricsServer(std::string host, int port, int listen_fd, int wake_fd,
                             std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                             MetricsServerOptions options)
    : host_(std::move(host)),
      port_(port),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      collectables_(std::move(collectables)),
      options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
    MetricsServerOptions options) {
  if (options.max_connections < 1 || options.max_connections > 65536 ||
      options.request_timeout_ms < 1 || options.max_request_bytes < 256 ||
      options.max_request_bytes > (1 << 20)) {
    return Status::InvalidArgument(
        "/metrics server: max_connections must be in [1, 65536], request_timeout_ms >= 1 and "
        "max_request_bytes in [256, 1 MiB]");
  }
  KVF_ASSIGN_OR_RETURN(ParsedAddress parsed, ParseAddress(address));
  std::string host = parsed.host;
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(parsed.port);
  if (const int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    return CannotListen(
        address, std::string("the host is not a numeric address (") + ::gai_strerror(rc) + ")");
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    ::freeaddrinfo(found);
    return CannotListen(address, std::string("socket: ") + std::strerror(err));
  }
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::freeaddrinfo(found);
    ::close(fd);
    return CannotListen(address, std::string(std::strerror(err)) +
                                     " (the port is in use or the host is not an address of "
                                     "this machine)");
  }
  ::freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  int port = parsed.port;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    ::close(fd);
    return CannotListen(address, std::string("eventfd: ") + std::strerror(err));
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(parsed.host), port, fd, wake, std::move(collectables), options));
}

std::string MetricsServer::Respond(const std::string& head) const {
  const std::size_t eol = head.find_first_of("\r\n");
  const std::string line = head.substr(0, eol);
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    return StatusLine(400, "Bad Request", "", "malformed request line\n", false);
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return StatusLine(405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
                      "only GET and HEAD of /metrics\n", false);
  }
  if (path != "/metrics") {
    return StatusLine(404, "Not Found", "", "not found; the metrics are at /metrics\n", head_only);
  }
  std::vector<prometheus::MetricFamily> families;
  try {
    for (const auto& weak : collectables_) {
      if (std::shared_ptr<prometheus::Collectable> c = weak.lock()) {
        std::vector<prometheus::MetricFamily> more = c->Collect();
        std::move(more.begin(), more.end(), std::back_inserter(families));
      }
    }
    const std::string body = prometheus::TextSerializer().Serialize(families);
    std::string out =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
        "charset=utf-8\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (!head_only) out += body;
    return out;
  } catch (const std::exception& e) {
    return StatusLine(500, "Internal Server Error", "",
                      std::string("collecting the metrics failed: ") + e.what() + "\n", head_only);
  }
}

void MetricsServer::Loop() {
  struct Conn {
    int fd = -1;
    std::string in;
    std::string out;
    std::size_t sent = 0;
    bool writing = false;
    Clock::time_point deadline;
  };
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  const auto timeout = std::chrono::milliseconds(options_.request_timeout_ms);
  auto flush = [](Conn& c) {  // false once the connection is done (sent, or failed)
    while (c.sent < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
    }
    return false;
  };
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next = Clock::time_point::max();
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int wait_ms = -1;
    if (next != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
      wait_ms = static_cast<int>(std::max<std::int64_t>(0, left.count()));
    }
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0 || stop_.load()) break;
    const Clock::time_point now = Clock::now();
    // Existing connections first (fds[2 + i] is conns[i]).
    for (std::size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = fds[2 + i].revents;
      if (ev == 0) continue;
      bool keep = true;
      if (!c.writing) {
        char buf[4096];
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, static_cast<std::size_t>(n));
            if (c.in.size() > static_cast<std::size_t>(options_.max_request_bytes)) break;
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          keep = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // 0: the peer closed
          break;
        }
        std::size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) end = c.in.find("\n\n");
        const std::size_t head_bytes = end == std::string::npos ? c.in.size() : end;
        if (head_bytes <= static_cast<std::size_t>(options_.max_request_bytes) &&
            end != std::string::npos) {
          c.out = Respond(c.in.substr(0, end));
          c.writing = true;
          served_.fetch_add(1);
        } else if (head_bytes > static_cast<std::size_t>(options_.max_request_bytes)) {
          c.out = StatusLine(
              431, "Request Header Fields Too Large", "",
              "the request is over " + std::to_string(options_.max_request_bytes) + " bytes\n",
              false);
          c.writing = true;
          refused_.fetch_add(1);
        }
        if (c.writing) keep = flush(c);
      } else {
        keep = (ev & (POLLERR | POLLHUP | POLLNVAL)) == 0 && flush(c);
      }
      if (!keep) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    for (Conn& c : conns) {
      if (c.fd >= 0 && c.deadline <= now) {
        refused_.fetch_add(1);
        ::close(c.fd);
        c.fd = -1;
      }
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.fd < 0; }),
                conns.end());
    if (fds[1].revents != 0) {
      for (int accepted = 0; accepted < 64; ++accepted) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (conns.size() >= static_cast<std::size_t>(options_.max_connections)) {
          refused_.fetch_add(1);  // before the close a caller may be waiting on
          ::close(fd);
          continue;
        }
        Conn c;
        c.fd = fd;
        c.deadline = now + timeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (Conn& c : conns) ::close(c.fd);
}

std::string MetricsServer::url() const {
  std::string host = host_;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  return "http://" + host + ":" + std::to_string(port_) + "/metrics";
}

}  // namespace kvfabric::metrics
