// TcpTransport: the Transport of transport/transport.h over kernel TCP
// sockets, for peers that have no RDMA and no shared memory between them.
//
// Why a second TCP path next to UCX's: on a TCP-only pair UCX emulates get and
// put with active messages, and on the development machines its bytes cost
// about twice what a plain socket's do (docs/benchmarks.md, cache_host_bench).
// This backend moves each payload with one kernel copy on each side, straight
// between registered memory and the socket: sendmsg from the source range,
// recv into the destination range, no bounce buffer. UCX stays the transport
// for RDMA and shared memory.
//
// Threads. `workers` progress threads (1..kMaxTcpWorkers), each with its own
// epoll set. The listener lives on the first; connections, accepted or
// connected, are spread over the workers in turn. Every byte of a connection
// is read and written by its worker, so handlers for one endpoint run on one
// thread, in order. Submit() only queues frames and wakes the worker.
//
// Wire. Each side first sends a 16-byte hello (magic "KVFT", version, the
// transport's random instance id). Then frames, each a 40-byte header
// (tcp_wire.h) followed by a message header and/or payload:
//   SEND       header + payload for the peer's MessageHandler
//   WRITE      payload for [offset, +length) of a range the peer exported;
//              the owner answers WRITE_ACK with a status once it is placed
//   READ       a request for such a range; the owner answers READ_DATA with
//              a status and the bytes
// Every size read from the socket is checked before it is used; a frame that
// breaks the protocol fails the connection (Unavailable, naming the fault).
// What a peer can make a receiver hold is bounded: 64 KiB of receive
// buffer, and at most 4,096 queued frames per connection, beyond which the
// worker stops reading that peer's requests until it reads the replies. An
// accepted connection that does not say hello within handshake_timeout is
// closed; out of descriptors, new connections are accepted and shed.
//
// Security. As over UCX's emulated paths, the owner places every kRead and
// kWrite: an export names a grant, a random 64-bit capability the owner
// keeps with the exported range, and the owner bounds-checks each request
// against it. Destroying a region revokes its grants; connections still moving
// its bytes are failed first, so its memory is never touched afterwards.
//
// Completion. kSend completes once its bytes are in the socket; kWrite once
// the owner acknowledged placement; kRead once its bytes landed. A peer that
// closes or dies fails in-flight entries with Unavailable. Cancel completes
// entries not yet on the wire (or awaiting a reply) with Cancelled; an entry
// whose bytes are moving finishes with its real outcome.
//
// Only MemoryKind::kHost is supported.
#ifndef KVFABRIC_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/tcp/tcp_tls.h"
#include "transport/transport.h"

namespace kvfabric::tcp {

namespace internal {
class Core;
}  // namespace internal

inline constexpr int kMaxTcpWorkers = 64;

// TcpTransportOptions::send_buffer_bytes: let the transport choose (see
// there), or leave the kernel's autotuning.
inline constexpr int kSendBufferAuto = 0;
inline constexpr int kKernelAutotuning = -1;
// What kSendBufferAuto sets for a peer on this host.
inline constexpr int kSameHostSendBufferBytes = 256 << 10;

// "auto" -> kSendBufferAuto, "kernel" -> kKernelAutotuning, or a byte size
// ("256KiB", "1MiB", 65536) of 4 KiB..64 MiB; InvalidArgument naming
// `setting` otherwise.
StatusOr<int> ParseSendBuffer(std::string_view text, std::string_view setting);
// The inverse, for logs: "auto", "kernel" or e.g. "256 KiB".
std::string SendBufferName(int send_buffer_bytes);
// The SO_SNDBUF to set on a connection (0: none, the kernel autotunes).
int SendBufferFor(int send_buffer_bytes, bool peer_on_this_host);
// Whether the peer of connected socket `fd` is on this host: a loopback
// address (127/8, ::1, ::ffff:127.0.0.0/104) or the socket's own local
// address. False when `fd` is not connected.
bool PeerOnThisHost(int fd);

// Largest SO_MAX_PACING_RATE a TcpTransport sets (1 TB/s).
inline constexpr std::uint64_t kMaxPacingRate = std::uint64_t{1} << 40;

struct TcpTransportOptions {
  // Progress threads (1..kMaxTcpWorkers). A daemon serving several clients
  // gives each core one (kvfabric-cached --data-workers).
  int workers = 1;
  // SO_SNDBUF of every connection: kSendBufferAuto (the default),
  // kKernelAutotuning, or a size of 4 KiB..64 MiB. Auto sets
  // kSameHostSendBufferBytes when the peer is on this host (a loopback
  // address, or the connection's own local address) and leaves the kernel's
  // autotuning otherwise. Why: on one host the sender's copy into the socket
  // and the receiver's copy out of it share the caches; autotuning lets
  // several MiB per connection wait in between and go cold, where 256 KiB
  // keeps them warm (four loopback connections through kvfabric-cached:
  // GET 4.4-5.1 GB/s autotuned, 4.9-7.6 with 256 KiB send buffers, PUT
  // 2.4-3.9 against 2.8-4.6; docs/benchmarks.md). Across a network the
  // buffer must cover bandwidth x delay, which autotuning does.
  int send_buffer_bytes = kSendBufferAuto;
  // SO_RCVBUF of every connection: 0 (the default) leaves the kernel's
  // autotuning, else 4 KiB..64 MiB. A small receive buffer makes sender and
  // receiver take turns (128 KiB buffers on both sides slowed one connection
  // to 1.4-3.6 GB/s).
  int receive_buffer_bytes = 0;
  // An accepted connection must send its hello within this time, or it is
  // closed: idle sockets from strangers do not pile up (1 ms..1 h).
  std::chrono::milliseconds handshake_timeout{10'000};
  // Accepted connections that have not said hello yet, across workers; more
  // are closed at accept (1..1,048,576). Each holds a descriptor and a
  // 64 KiB receive buffer until its hello or handshake_timeout, so this
  // bounds what a stranger opening sockets in a loop can make a listener
  // hold (10,000 such sockets took a daemon from 88 to 238 MiB of RSS
  // before). Default 1024.
  std::uint32_t max_handshakes = 1024;
  // TLS on every connection (tcp_tls.h); null (the default): plaintext. A
  // listener needs its certificate, a connecting side its CA. Both ends of a
  // connection must agree.
  std::shared_ptr<const TcpTls> tls;
  // SO_MAX_PACING_RATE of every connection, in bytes per second: the kernel
  // paces each connection's sends to at most this rate (a link slower than
  // the wire, for benchmarks and fault tests, as `tc tbf` would make it
  // without root). 0 (the default): no cap. At most 2^40 (1 TB/s).
  std::uint64_t max_pacing_rate_bytes_per_s = 0;

  // InvalidArgument naming the field when out of range.
  Status Validate() const;
};

class TcpTransport final : public transport::Transport {
 public:
  // Use CreateTcpTransport.
  explicit TcpTransport(std::shared_ptr<internal::Core> core);
  // Closes the listener, force-closes every endpoint (their entries complete
  // Cancelled, the peers' Unavailable), then stops the workers.
  ~TcpTransport() override;

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  std::string name() const override;
  StatusOr<std::unique_ptr<transport::MemoryRegion>> RegisterMemory(
      std::span<std::byte> bytes, transport::MemoryKind kind) override;
  StatusOr<std::unique_ptr<transport::MemoryRegion>> AllocateMemory(
      std::uint64_t size, transport::MemoryKind kind) override;
  void SetMessageHandler(transport::MessageHandler handler) override;
  // "ip:port" ("127.0.0.1:0" picks a port). FailedPrecondition if listening.
  Status Listen(const std::string& address, transport::AcceptHandler on_accept) override;
  std::string listen_address() const override;
  // Connects and exchanges hellos before `deadline` (DeadlineExceeded
  // otherwise); Unavailable when refused or when the peer is not a kvfabric
  // TCP transport: a wrong hello, or none within 3 s of connecting (a UCX
  // listener accepts and stays silent).
  StatusOr<std::unique_ptr<transport::Endpoint>> Connect(const std::string& address,
                                                         transport::PeerFailureMode mode,
                                                         transport::Deadline deadline) override;

  // Changes max_pacing_rate_bytes_per_s for every connection now open and
  // every later one (0 lifts the cap). InvalidArgument above 2^40.
  Status SetMaxPacingRate(std::uint64_t bytes_per_s);

  // Test hook. While stalled, the workers read nothing from established
  // connections, so work peers aimed at this transport stays in flight
  // (it can still be cancelled, closed or failed). Accepting goes on.
  void TEST_StallPeerWork(bool stalled);

 private:
  std::shared_ptr<internal::Core> core_;
};

StatusOr<std::unique_ptr<TcpTransport>> CreateTcpTransport(const TcpTransportOptions& options);

}  // namespace kvfabric::tcp

#endif  // KVFABRIC_TRANSPORT_TCP_TCP_TRANSPORT_H_
