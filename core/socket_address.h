// Socket addresses as kvfabric's transports write them: "ip:port" or
// "[ipv6]:port". One parser and one printer shared by the UCX and kernel-TCP
// backends, so both accept and print the same spellings.
#ifndef KVFABRIC_CORE_SOCKET_ADDRESS_H_
#define KVFABRIC_CORE_SOCKET_ADDRESS_H_

#include <sys/socket.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// "host:port" or "[ipv6]:port" (numeric port) -> sockaddr. InvalidArgument,
// naming the address, when it has no port or does not resolve.
Status ParseSocketAddress(const std::string& address, sockaddr_storage* out, socklen_t* len);

// sockaddr -> "ip:port" / "[ipv6]:port"; "unknown" for other families.
std::string FormatSocketAddress(const sockaddr_storage& sa);

// The entries of a comma-separated address list ("a:1, b:2", spaces around
// entries dropped), as clients and daemons take placement replicas.
// InvalidArgument naming `setting` (and the list) for an empty entry or more
// than `max` entries. Checks no entry's shape.
StatusOr<std::vector<std::string>> SplitAddressList(const std::string& list,
                                                    const std::string& setting, std::size_t max);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_SOCKET_ADDRESS_H_
