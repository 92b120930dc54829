#include "core/socket_owner.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "core/errno_status.h"

namespace kvfabric {
namespace {

constexpr std::string_view kEstablished = "01";  // TCP_ESTABLISHED in the st column

// An address in both spellings the tables use: IPv4 (when it is one, or an
// IPv4-mapped IPv6 address) and IPv6 (an IPv4 address mapped).
struct PeerForms {
  std::optional<std::uint32_t> v4;    // s_addr, as the table prints it
  std::array<std::uint32_t, 4> v6{};  // s6_addr32, as the table prints it
  std::uint16_t port = 0;
};

std::optional<PeerForms> FormsOf(const sockaddr_storage& sa) {
  PeerForms f;
  in6_addr v6{};
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    f.v4 = in->sin_addr.s_addr;
    f.port = ntohs(in->sin_port);
    v6.s6_addr[10] = 0xff;
    v6.s6_addr[11] = 0xff;
    std::memcpy(&v6.s6_addr[12], &in->sin_addr, 4);
  } else if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    v6 = in6->sin6_addr;
    f.port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      std::uint32_t a = 0;
      std::memcpy(&a, &v6.s6_addr[12], 4);
      f.v4 = a;
    }
  } else {
    return std::nullopt;
  }
  std::memcpy(f.v6.data(), &v6, sizeof(v6));
  return f;
}

bool ParseHex32(std::string_view text, std::uint32_t* out) {
  if (text.size() != 8) return false;
  std::uint32_t v = 0;
  for (char c : text) {
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= static_cast<std::uint32_t>(c - '0');
    } else if (c >= 'A' && c <= 'F') {
      v |= static_cast<std::uint32_t>(c - 'A' + 10);
    } else if (c >= 'a' && c <= 'f') {
      v |= static_cast<std::uint32_t>(c - 'a' + 10);
    } else {
      return false;
    }
  }
  *out = v;
  return true;
}

// "ADDR:PORT" of one table column: whether it is `addr` (4 words for IPv6,
// the first for IPv4) and, when `port` is set, that port.
bool ColumnIs(std::string_view column, bool ipv6, const std::uint32_t* addr,
              std::optional<std::uint16_t> port) {
  const std::size_t colon = column.find(':');
  if (colon == std::string_view::npos || column.size() - colon - 1 != 4) return false;
  const std::string_view a = column.substr(0, colon);
  if (a.size() != (ipv6 ? 32u : 8u)) return false;
  if (addr != nullptr) {
    for (std::size_t w = 0; w < a.size() / 8; ++w) {
      std::uint32_t v = 0;
      if (!ParseHex32(a.substr(w * 8, 8), &v) || v != addr[w]) return false;
    }
  }
  std::uint32_t p = 0;
  const std::string pad = "0000" + std::string(column.substr(colon + 1));
  if (!ParseHex32(pad, &p)) return false;
  return !port.has_value() || p == *port;
}

StatusOr<std::string> ReadTable(const char* path) {
  std::ifstream in(path);
  if (!in) return StatusFromErrno(errno, std::string("open ") + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsLoopback(const PeerForms& f) {
  if (f.v4.has_value()) return (ntohl(*f.v4) >> 24) == 127;
  in6_addr v6;
  std::memcpy(&v6, f.v6.data(), sizeof(v6));
  return IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

bool AddressIsOnThisHost(const sockaddr_storage& address) {
  const std::optional<PeerForms> peer = FormsOf(address);
  if (!peer.has_value()) return false;
  if (IsLoopback(*peer)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    sockaddr_storage sa{};
    if (i->ifa_addr->sa_family == AF_INET) {
      std::memcpy(&sa, i->ifa_addr, sizeof(sockaddr_in));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      std::memcpy(&sa, i->ifa_addr, sizeof(sockaddr_in6));
    } else {
      continue;
    }
    const std::optional<PeerForms> mine = FormsOf(sa);
    local = mine.has_value() && mine->v6 == peer->v6;
  }
  freeifaddrs(list);
  return local;
}

StatusOr<std::uint32_t> SocketOwnerInProcNetTcp(std::string_view table, bool ipv6,
                                                const sockaddr_storage& peer,
                                                std::uint16_t server_port) {
  const std::optional<PeerForms> f = FormsOf(peer);
  if (!f.has_value()) return Status::InvalidArgument("peer address is neither IPv4 nor IPv6");
  if (!ipv6 && !f->v4.has_value()) return Status::NotFound("an IPv6 peer is not in /proc/net/tcp");
  const std::uint32_t v4 = f->v4.value_or(0);
  const std::uint32_t* want = ipv6 ? f->v6.data() : &v4;
  std::optional<std::uint32_t> owner;
  std::size_t start = 0;
  while (start < table.size()) {
    std::size_t end = table.find('\n', start);
    if (end == std::string_view::npos) end = table.size();
    std::istringstream fields{std::string(table.substr(start, end - start))};
    start = end + 1;
    // sl local rem st tx:rx tr:when retrnsmt uid ...
    std::string sl, local, remote, st, queues, timer, retransmits, uid;
    if (!(fields >> sl >> local >> remote >> st >> queues >> timer >> retransmits >> uid)) continue;
    if (st != kEstablished || !ColumnIs(local, ipv6, want, f->port) ||
        !ColumnIs(remote, ipv6, nullptr, server_port)) {
      continue;
    }
    std::uint32_t u = 0;
    const auto [ptr, ec] = std::from_chars(uid.data(), uid.data() + uid.size(), u);
    if (ec != std::errc() || ptr != uid.data() + uid.size()) continue;
    if (owner.has_value() && *owner != u) {
      return Status::FailedPrecondition("two sockets at that address have different owners");
    }
    owner = u;
  }
  if (!owner.has_value()) return Status::NotFound("no established socket at that address");
  return *owner;
}

StatusOr<std::uint32_t> TcpPeerSocketOwner(const sockaddr_storage& peer,
                                           std::uint16_t server_port) {
  Status read_error;
  int read = 0;
  for (const auto& [path, ipv6] : {std::pair{"/proc/net/tcp", false}, {"/proc/net/tcp6", true}}) {
    StatusOr<std::string> table = ReadTable(path);
    if (!table.ok()) {
      read_error = table.status();
      continue;
    }
    ++read;
    StatusOr<std::uint32_t> owner = SocketOwnerInProcNetTcp(*table, ipv6, peer, server_port);
    if (owner.ok() || owner.status().code() != StatusCode::kNotFound) return owner;
  }
  if (read == 0) return read_error;
  return Status::NotFound("no established socket at that address in this network namespace");
}

}  // namespace kvfabric
