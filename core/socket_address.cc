#include "core/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace kvfabric {

Status ParseSocketAddress(const std::string& address, sockaddr_storage* out, socklen_t* len) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument("address \"" + address + "\" is not \"host:port\"");
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument("cannot resolve \"" + address + "\": " + gai_strerror(rc));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return Status::OK();
}

std::string FormatSocketAddress(const sockaddr_storage& sa) {
  char host[INET6_ADDRSTRLEN] = {};
  unsigned port = 0;
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "unknown";
}

StatusOr<std::vector<std::string>> SplitAddressList(const std::string& list,
                                                    const std::string& setting, std::size_t max) {
  std::vector<std::string> out;
  for (std::size_t start = 0; start <= list.size();) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string address = list.substr(start, end - start);
    address.erase(0, address.find_first_not_of(" \t"));
    address.erase(address.find_last_not_of(" \t") + 1);
    if (address.empty()) {
      return Status::InvalidArgument(setting + " \"" + list + "\" has an empty entry");
    }
    out.push_back(std::move(address));
    start = end + 1;
  }
  if (out.size() > max) {
    return Status::InvalidArgument(setting + " names " + std::to_string(out.size()) +
                                   " replicas; at most " + std::to_string(max));
  }
  return out;
}

}  // namespace kvfabric
