// DataPlane: the cache-host daemon's side of the owner-driven data path
// (TRANSFER_MODE_OWNER_DRIVEN, proto/transfer_wire.h). It listens on the
// transport, keeps one record per connected client endpoint (the staging
// regions the client exported to it), and serves transfer requests:
//
//   kImportRegion  collects the chunks of a client's export and imports it
//                  (Endpoint::ImportRegion; every size checked by the transport)
//   kPut           kRead entries: client region -> reserved pool pages
//   kGet           kWrite entries: leased pool pages -> client region
//
// Every request is checked by the node first (CacheHostNode::BeginTransfer:
// grant, access token, ranges inside the grant's blocks) and bracketed in the
// lease table until its bytes have moved, so expiry never recycles a page a
// transfer is still touching. A request's reply (kReply) is sent only after
// every entry of its batch completed: for a put, OK means the bytes are in the
// pool; for a get, that they were placed in the client's memory (kWrite's
// remote completion). The pool is never exported: the daemon moves the bytes.
//
// Bounds: at most kMaxRegionsPerPeer imported regions and kMaxImportsInProgress
// partial imports per endpoint; a request naming an unknown region, a range
// outside it or a malformed message gets an error reply (or is dropped if it
// cannot be parsed far enough to know whom to answer). Messages carrying a
// payload are dropped: payloads never travel as messages to a daemon.
//
// Threads: handlers run on the transport's progress thread and never block;
// Sweep() (the node's maintenance thread) destroys endpoints whose peer failed
// once nothing is in flight on them, and frees finished batches. Close()
// force-closes every endpoint (in-flight entries complete Cancelled, their
// brackets are closed) and waits for every batch.
#ifndef KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_
#define KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/transport.h"

namespace kvfabric::cache_host {

class CacheHostNode;

inline constexpr std::size_t kMaxRegionsPerPeer = 64;
inline constexpr std::size_t kMaxImportsInProgress = 4;

class DataPlane {
 public:
  // Installs the message handler on `transport` (REQUIRES: it has none yet)
  // and listens on `address`. `node` and `transport` are borrowed; the node
  // must outlive Close().
  static StatusOr<std::unique_ptr<DataPlane>> Start(CacheHostNode* node,
                                                    transport::Transport* transport,
                                                    const std::string& address);
  // Close()s.
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  std::string address() const;
  std::uint64_t endpoints() const;
  void Sweep();
  void Close();

  struct Impl;

 private:
  explicit DataPlane(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_
