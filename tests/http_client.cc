#include "tests/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvfabric::testing {

std::string HostPort(std::string_view url) {
  const std::size_t scheme = url.find("//");
  std::string_view s = scheme == std::string_view::npos ? url : url.substr(scheme + 2);
  return std::string(s.substr(0, s.find('/')));
}

std::string UrlEncode(std::string_view value) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

StatusOr<HttpResponse> HttpRequest(const std::string& address, const std::string& method,
                                   const std::string& path, const std::string& body,
                                   std::chrono::milliseconds timeout) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("no :PORT in " + address);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    return Status::InvalidArgument("not an IPv4 address: " + address);
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable("socket: " + std::string(std::strerror(errno)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto fail = [fd](Status s) {
    close(fd);
    return s;
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return fail(Status::Unavailable("connect " + address + ": " + std::strerror(errno)));
  }
  std::string request = method + " " + path + " HTTP/1.0\r\nHost: " + address + "\r\n";
  if (method == "POST") {
    request += "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n";
  }
  request += "\r\n" + body;
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return fail(Status::Unavailable("send to " + address));
    sent += static_cast<std::size_t>(n);
  }
  std::string raw;
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return fail(Status::DeadlineExceeded(method + " " + path + " at " + address));
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(Status::Unavailable("read from " + address));
    if (n == 0) break;
    raw.append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  const std::size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || raw.size() < 12) {
    return Status::Unavailable("not an HTTP response from " + address + ": " + raw.substr(0, 80));
  }
  HttpResponse r;
  r.status = std::atoi(raw.c_str() + 9);
  r.body = raw.substr(end + 4);
  return r;
}

}  // namespace kvfabric::testing
