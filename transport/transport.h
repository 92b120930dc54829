// Transport: moves the bytes of KV blocks between processes and machines.
//
// One interface, batch-shaped (Mooncake's submit-a-batch-then-poll), with
// backends: ucx/ (RDMA verbs on hardware, shared memory and TCP elsewhere),
// tcp/ (kernel TCP sockets for peers with neither RDMA nor shared memory:
// each payload is copied once on each side, straight between registered host
// memory and the socket), loopback_transport.h (in-process, for tests) and
// testing/ (fault injection around another backend). Control (what to move,
// leases, commits) travels over gRPC; a Transport only moves bytes and small
// messages.
//
// Objects and ownership
//   Transport      one per process side; owns its progress thread(s). Destroying
//                  it force-closes every endpoint and completes every batch.
//   MemoryRegion   a registered range of local memory, owned by whoever
//                  registered it (std::unique_ptr). REQUIRES: no transfer in
//                  flight names it when it is destroyed.
//   RemoteRegion   a peer's exported range, imported on one Endpoint; owned by
//                  the importer. REQUIRES: outlives transfers naming it.
//   Endpoint       a connection to one peer, owned by whoever connected or
//                  accepted it. Destroying it force-closes it.
//   TransferBatch  the handle of one Submit() (transport/transfer_batch.h);
//                  destroying it cancels what is still in flight and waits
//                  for every entry to finish, so nothing is ever leaked.
//
// What success means, per entry of a batch
//   kRead   the bytes of the remote range are in the local range.
//   kWrite  the bytes are placed in the peer's memory: the backend has a
//           remote completion (a flush), not merely a posted request.
//   kSend   the local payload may be reused; nothing more. OK does not say
//           that the peer received the message, that its MessageHandler ran
//           or that the payload was placed: tcp/ completes once the bytes are
//           written to the local socket, ucx/ when UCX completes the send
//           (a rendezvous payload once the peer fetched or dropped it),
//           loopback once the peer's handler returned; a payload the peer
//           Drops, or that does not fit where it Accepts it, still completes
//           OK. A message whose connection fails after its entry completed
//           may be lost with no error on either side. Nor are messages
//           promised to arrive in the order submitted (UCX does not promise
//           an order for active messages). A protocol that needs delivery
//           or order waits for a reply (a message or an RPC), as the cache
//           host's data plane does (server/cache_host/data_plane.h,
//           proto/transfer_wire.h): the daemon answers each request it can
//           parse, after the request's bytes moved, and a client sends an
//           import's next chunk only after the previous chunk's reply.
//   An entry that fails carries its own Status: Unavailable when the peer is
//   gone (a dead peer fails in-flight work; it never hangs), Cancelled when the
//   batch or the endpoint was cancelled or force-closed, DeadlineExceeded is
//   never an entry status (Wait's deadline does not cancel anything).
//   After a failed kRead the local range holds unspecified bytes.
//
// When a buffer may be reused
//   The local range of every entry belongs to the transport from Submit()
//   until that entry completes (any status): do not write a kWrite/kSend
//   source, nor read a kRead destination, before then. A kSend header is
//   copied during Submit() and may be reused at once.
//
// Security of the data plane
//   A remote region grants the importer access to one exported range of the
//   owner's memory, and backends say how that access is enforced. Kernel TCP
//   (transport/tcp/tcp_transport.h): the owner places every kRead and kWrite
//   and checks each against the exported range and a revocable grant. UCX
//   (transport/ucx/ucx_transport.h): over TCP and over shared memory on
//   caller memory, kRead and kWrite are placed by the owner, which checks
//   every request against the exported range and a revocable grant; only
//   memory UCX allocated itself (shared memory) and RDMA lanes use one-sided
//   get/put, which the importer alone bounds-checks (a UCX remote key covers
//   the whole registration). So kvfabric never exports a daemon's pool one-
//   sidedly to a peer it does not trust: clients export their staging ranges
//   to daemons, daemons push leased pages into them (kWrite) and pull the
//   bytes a client puts out of them (kRead), each after checking the lease.
//   Messages to a daemon carry no payload (server/cache_host/data_plane.h).
//
// Threads
//   Every method of Transport, Endpoint, MemoryRegion, RemoteRegion and
//   TransferBatch may be called from any thread. Handlers (AcceptHandler,
//   MessageHandler, IncomingMessage callbacks) run on a transport progress
//   thread: they must not block, must not call TransferBatch::Wait, and may
//   call Submit (which only queues work). A transport may have several
//   progress threads (UCX and TCP with workers > 1): handlers for different
//   endpoints may then run at once, so what they share needs a lock; those
//   for one endpoint run on one thread, one at a time, in the order their
//   messages arrived. Entries complete, and TransferBatch::OnDone callbacks
//   run, on whichever transport thread finished the work (possibly the
//   peer-facing one) or on the thread that cancelled or closed. Destroying an
//   Endpoint waits for a handler running for it to return, so
//   IncomingMessage::endpoint() stays valid while the handler runs;
//   Close(kForce) likewise waits for entries already executing, which is one
//   more reason handlers must not block.
#ifndef KVFABRIC_TRANSPORT_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/transfer_batch.h"

namespace kvfabric::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Where registered memory lives. Numbered explicitly: it travels in exports.
enum class MemoryKind : std::uint8_t {
  kHost = 1,
  kDevice = 2,  // only where the backend supports it (not Debian's UCX build)
};

// Largest kSend header, in bytes (copied at Submit).
inline constexpr std::size_t kMaxMessageHeaderBytes = 1024;

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;

  // The registered bytes.
  virtual std::span<std::byte> bytes() const = 0;
  virtual MemoryKind kind() const = 0;

  // Opaque bytes that let a peer import [offset, offset + length) of this
  // region with Endpoint::ImportRegion and name it in kRead/kWrite entries.
  // The importer's transfers are bounds-checked against that range by the
  // importing transport; see "Security" above for what a hostile peer could do.
  // InvalidArgument if the range is outside the region.
  virtual StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const = 0;
};

class RemoteRegion {
 public:
  virtual ~RemoteRegion() = default;
  // Bytes addressable through this import (the exported range).
  virtual std::uint64_t length() const = 0;
};

enum class TransferOp : std::uint8_t {
  kRead = 1,   // remote range -> local range
  kWrite = 2,  // local range -> remote range
  kSend = 3,   // header + local range -> the peer's MessageHandler
};

// One entry of a batch. Pointers are borrowed (see "Objects and ownership").
struct Transfer {
  TransferOp op = TransferOp::kRead;
  MemoryRegion* local = nullptr;  // may be null for a kSend without payload
  std::uint64_t local_offset = 0;
  std::uint64_t length = 0;  // bytes of payload
  const RemoteRegion* remote = nullptr;  // kRead and kWrite only
  std::uint64_t remote_offset = 0;
  std::span<const std::byte> header;  // kSend only; at most kMaxMessageHeaderBytes
  // kRead/kWrite: asks for the CRC32C of the destination range after the
  // bytes landed. A backend that copies the bytes itself (UCX through a
  // shared-memory mapping; the in-process loopback) computes it in the same
  // pass as the copy (core/guarded_copy.h, GuardedCopyChecked) and reports it in
  // TransferResult::landed_crc32c; one that does not (NIC or kernel copies,
  // owner-placed transfers) leaves it empty, and the caller checks the bytes
  // itself. Lets a daemon check a block where it landed in a client's memory
  // for a fraction of a second pass (docs/protocol.md, kFetch flag bit 3).
  bool checksum = false;
  // Urgency: a batch's rank is its entries' lowest. A backend that queues
  // batches for a progress thread (UCX) starts a batch of rank 0 (the
  // default) in arrival order as ever, and one of a higher rank only when
  // nothing of rank 0 waits, lowest rank first (then arrival), unless one
  // waited past its deferral bound (UcxTransportOptions::max_rank_deferral).
  // A daemon ranks a kFetch's copy by the first layer it moves, so a load's
  // layer 0 overtakes other loads' later layers already queued. Backends
  // that start batches at once ignore it.
  std::uint32_t rank = 0;
};

// How an endpoint treats a failed peer. Explicit, never a backend default.
enum class PeerFailureMode : std::uint8_t {
  // A peer that dies or becomes unreachable fails every in-flight and later
  // entry on the endpoint with Unavailable (UCX: UCP_ERR_HANDLING_MODE_PEER).
  kFailInFlight = 1,
};

enum class CloseMode : std::uint8_t {
  kGraceful = 1,  // wait (until the deadline) for in-flight entries, flush, disconnect
  kForce = 2,     // cancel in-flight entries (they complete Cancelled), disconnect
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;  // force-closes if still open

  // The peer's address as the transport knows it (for logs).
  virtual std::string peer_address() const = 0;

  // OK while the peer is reachable; Unavailable (with the reason) once it has
  // failed or the endpoint was closed.
  virtual Status health() const = 0;

  // Imports bytes produced by the peer's MemoryRegion::Export.
  // InvalidArgument if they are malformed (every size in them is checked).
  virtual StatusOr<std::unique_ptr<RemoteRegion>> ImportRegion(std::string_view exported) = 0;

  // Starts every entry of `transfers`. The batch is validated first: an entry
  // whose local or remote range is out of bounds, a kSend header over
  // kMaxMessageHeaderBytes or a missing region makes the whole call fail with
  // InvalidArgument and nothing is started. After a peer failure or after
  // this endpoint was closed, Submit either succeeds with every entry
  // completing Unavailable or fails with Unavailable; nothing is moved.
  virtual StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers) = 0;

  // Returns when every entry submitted before the call has completed, or
  // DeadlineExceeded.
  virtual Status Flush(Deadline deadline) = 0;

  // Closes the endpoint. After it returns every entry ever submitted on it
  // has completed (OK, or Cancelled/Unavailable). kGraceful falls back to
  // kForce when the deadline passes and then returns DeadlineExceeded.
  virtual Status Close(CloseMode mode, Deadline deadline) = 0;
};

// A message that arrived (a peer's kSend). The handler must either Accept the
// payload into local memory or Drop it, exactly once, before returning;
// messages without payload need neither.
class IncomingMessage {
 public:
  virtual ~IncomingMessage() = default;

  // The endpoint it arrived on, for replies; null if that endpoint is gone.
  virtual Endpoint* endpoint() const = 0;
  virtual std::span<const std::byte> header() const = 0;
  virtual std::uint64_t payload_length() const = 0;

  // Places the payload at [offset, offset + payload_length()) of `region`
  // (InvalidArgument if it does not fit; the payload is then dropped) and
  // calls `on_placed` on a progress thread once the bytes are there (OK), or
  // with the failure (Unavailable if the peer died meanwhile).
  virtual Status Accept(MemoryRegion* region, std::uint64_t offset,
                        std::function<void(Status)> on_placed) = 0;

  // Discards the payload (e.g. the lease it names is unknown).
  virtual void Drop() = 0;
};

using AcceptHandler = std::function<void(std::unique_ptr<Endpoint>)>;
using MessageHandler = std::function<void(IncomingMessage&)>;

class Transport {
 public:
  virtual ~Transport() = default;

  // e.g. "ucx(tls=tcp)", "loopback".
  virtual std::string name() const = 0;

  // Registers caller-owned memory. REQUIRES: `bytes` outlives the region.
  virtual StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(std::span<std::byte> bytes,
                                                                 MemoryKind kind) = 0;

  // Allocates and registers `size` bytes owned by the region (freed with it).
  // Backends allocate where transfers are fastest (UCX over shared memory:
  // memory UCX maps itself is truly one-sided; user memory is emulated).
  virtual StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(std::uint64_t size,
                                                                 MemoryKind kind) = 0;

  // Receives every message arriving on any endpoint of this transport.
  // REQUIRES: called before Listen/Connect, at most once.
  virtual void SetMessageHandler(MessageHandler handler) = 0;

  // Accepts connections on `address` ("127.0.0.1:0" picks a port; see
  // listen_address()). Each accepted endpoint is handed to `on_accept`.
  virtual Status Listen(const std::string& address, AcceptHandler on_accept) = 0;

  // The address peers connect to, once Listen succeeded ("ip:port").
  virtual std::string listen_address() const = 0;

  // Connects to a peer's listen address.
  virtual StatusOr<std::unique_ptr<Endpoint>> Connect(const std::string& address,
                                                      PeerFailureMode mode,
                                                      Deadline deadline) = 0;
};

}  // namespace kvfabric::transport

#endif  // KVFABRIC_TRANSPORT_TRANSPORT_H_
