// Socket addresses as kvfabric's transports write them: "ip:port" or
// "[ipv6]:port". One parser and one printer shared by the UCX and kernel-TCP
// backends, so both accept and print the same spellings.
#ifndef KVFABRIC_CORE_SOCKET_ADDRESS_H_
#define KVFABRIC_CORE_SOCKET_ADDRESS_H_

#include <sys/socket.h>

#include <string>

#include "core/status.h"

namespace kvfabric {

// "host:port" or "[ipv6]:port" (numeric port) -> sockaddr. InvalidArgument,
// naming the address, when it has no port or does not resolve.
Status ParseSocketAddress(const std::string& address, sockaddr_storage* out, socklen_t* len);

// sockaddr -> "ip:port" / "[ipv6]:port"; "unknown" for other families.
std::string FormatSocketAddress(const sockaddr_storage& sa);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_SOCKET_ADDRESS_H_
