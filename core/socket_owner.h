// Who is on the other end of a TCP connection from this host: the Unix user
// that owns a local peer's socket, read from the kernel's socket tables.
//
// Why: UCX's shared-memory transports map the peer's memory (its FIFOs and
// segments). A peer that shrinks or unmaps what it shared can crash the
// process that attached it, and nothing in UCX guards that, so a daemon
// shares memory only with processes of its own user (who could kill it
// anyway). A UCX connection request carries only the peer's address; for a
// peer on this host, the kernel knows which user's socket holds it. Over a
// Unix socket SO_PEERCRED would say it; over TCP, /proc/net/tcp{,6} does
// (its uid column is the socket's owner, fixed when the socket was made).
//
// The lookup sees only this network namespace: a peer in another one (its
// socket is not listed) is reported NotFound, and callers refuse what they
// cannot attribute.
//
// Thread safety: free functions; any thread.
#ifndef KVFABRIC_CORE_SOCKET_OWNER_H_
#define KVFABRIC_CORE_SOCKET_OWNER_H_

#include <sys/socket.h>

#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Whether `address` (IPv4, IPv6 or IPv4-mapped IPv6) belongs to this host in
// this network namespace: a loopback address (127/8, ::1), or the address of
// one of its interfaces (getifaddrs). False for other families.
bool AddressIsOnThisHost(const sockaddr_storage& address);

// The uid owning the ESTABLISHED TCP socket whose local address is `peer`
// and whose remote port is `server_port`: the peer's end of a connection to
// a server of this host listening on that port. NotFound when no such socket
// is listed (the peer is in another network namespace, on another host, or
// gone); FailedPrecondition if two listed sockets match with different
// owners (not expected: it cannot be attributed); the errno of reading
// /proc otherwise.
StatusOr<std::uint32_t> TcpPeerSocketOwner(const sockaddr_storage& peer, std::uint16_t server_port);

// The parsing behind TcpPeerSocketOwner, for tests: finds the owner in the
// text of one /proc/net/tcp (`ipv6` false) or /proc/net/tcp6 table.
// NotFound, or FailedPrecondition as above.
StatusOr<std::uint32_t> SocketOwnerInProcNetTcp(std::string_view table, bool ipv6,
                                                const sockaddr_storage& peer,
                                                std::uint16_t server_port);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_SOCKET_OWNER_H_
