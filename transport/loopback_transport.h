// LoopbackTransport: an in-process Transport for unit tests.
//
// Transports created on the same LoopbackNetwork reach each other by name:
// Listen("loopback:<name>") binds <name> on that network ("loopback:0" picks a
// fresh unique name; listen_address() returns the one bound), and Connect()
// with that address links one endpoint on each side. Nothing crosses a process
// boundary and no sockets are used, but every rule of transport/transport.h is
// honoured for real:
//
//   - each transport owns one worker (progress) thread;
//   - work is done by the transport that owns the remote memory, the way UCX's
//     emulated get/put are: a kRead or kWrite entry is queued on the peer's
//     worker, which memcpys between the two ranges; a kSend entry is handed to
//     the peer's MessageHandler on the peer's worker, and Accept() copies the
//     payload straight out of the sender's range. So an entry stays in flight
//     until the peer progresses, and TEST_StallPeerWork() can hold it there;
//   - an entry completes (BatchCompletion::Complete) on the thread that
//     finished it: the peer's worker for work that ran, or the thread that
//     called Cancel/Close or destroyed a transport for work that did not;
//   - exports name (transport, region, range); an import is only accepted on an
//     endpoint connected to the exporting transport, every transfer is
//     bounds-checked at Submit against the imported range, and a region the
//     owner has destroyed fails later transfers with Unavailable;
//   - a closed or destroyed peer endpoint, or a destroyed peer transport, fails
//     the other side's in-flight and later entries with Unavailable, and its
//     health() turns Unavailable; Cancel and Close(kForce) complete pending
//     entries with Cancelled; destroying a TransferBatch or a transport waits
//     until every entry completed.
//
// Only MemoryKind::kHost is supported. Connect's deadline is not needed (a
// connection is made at once); the accept handler runs on the listener's
// worker shortly after Connect returns.
//
// Thread safety: as transport.h says, every method may be called from any
// thread; handlers run on the receiving transport's worker thread.
#ifndef KVFABRIC_TRANSPORT_LOOPBACK_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_LOOPBACK_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/transport.h"

namespace kvfabric::transport {

namespace loopback_internal {
class Core;
class Registry;
}  // namespace loopback_internal

// The "network" loopback transports find each other on: a registry of bound
// names. Tests create one per test so that names never collide across tests.
// Transports keep what they need of it alive, so it may be destroyed before
// them. Thread-safe.
class LoopbackNetwork {
 public:
  LoopbackNetwork();
  ~LoopbackNetwork();

  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

 private:
  friend class LoopbackTransport;
  std::shared_ptr<loopback_internal::Registry> registry_;
};

struct LoopbackOptions {
  // The network to listen on and connect through. Required (no process-wide
  // default, so tests cannot see each other's listeners).
  LoopbackNetwork* network = nullptr;
};

class LoopbackTransport final : public Transport {
 public:
  // Use CreateLoopbackTransport. REQUIRES: options.network != nullptr.
  explicit LoopbackTransport(const LoopbackOptions& options);
  // Force-closes every endpoint (their entries complete Cancelled, the peers'
  // Unavailable), waits for every entry, then stops the worker.
  ~LoopbackTransport() override;

  LoopbackTransport(const LoopbackTransport&) = delete;
  LoopbackTransport& operator=(const LoopbackTransport&) = delete;

  std::string name() const override { return "loopback"; }
  StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(std::span<std::byte> bytes,
                                                         MemoryKind kind) override;
  StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(std::uint64_t size,
                                                         MemoryKind kind) override;
  void SetMessageHandler(MessageHandler handler) override;
  // `address` is "loopback:<name>" or "loopback:0". AlreadyExists if the name
  // is bound on this network; FailedPrecondition if already listening.
  Status Listen(const std::string& address, AcceptHandler on_accept) override;
  std::string listen_address() const override;
  // Unavailable if nothing listens on `address` on this network.
  StatusOr<std::unique_ptr<Endpoint>> Connect(const std::string& address, PeerFailureMode mode,
                                              Deadline deadline) override;

  // Test hook. While stalled, this transport's worker does not start work that
  // peers aimed at it (their reads and writes of its memory, their messages to
  // it); that work stays in flight (it can still be cancelled, closed or failed)
  // and starts once the stall is lifted. Accepting connections goes on.
  void TEST_StallPeerWork(bool stalled);

 private:
  std::shared_ptr<loopback_internal::Core> core_;
};

// Returns a new loopback transport, or InvalidArgument if options.network is null.
StatusOr<std::unique_ptr<LoopbackTransport>> CreateLoopbackTransport(
    const LoopbackOptions& options);

}  // namespace kvfabric::transport

#endif  // KVFABRIC_TRANSPORT_LOOPBACK_TRANSPORT_H_
