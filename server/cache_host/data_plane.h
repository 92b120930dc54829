// DataPlane: the cache-host daemon's side of the owner-driven data path
// (TRANSFER_MODE_OWNER_DRIVEN, proto/transfer_wire.h). It listens on the
// transport, keeps one record per connected client endpoint (the staging
// regions the client exported to it), and serves transfer requests:
//
//   kImportRegion  collects the chunks of a client's export and imports it
//                  (Endpoint::ImportRegion; every size checked by the transport)
//   kPut           kRead entries: client region -> reserved pool pages
//   kGet           kWrite entries: leased pool pages -> client region
//   kFetch         Lease (host pool only: CacheHostNode::Lease with
//                  host_only, no I/O), kWrite entries into the client's
//                  slots, Release, then kFetchReply with one result per key:
//                  one round trip instead of three (Lease and Release over
//                  gRPC around a kGet)
//   kStore         on a store worker (never the progress thread): Reserve
//                  (as gRPC Reserve: quotas, eviction, AlreadyExists), kRead
//                  entries from the client's region into the reserved pages,
//                  then, on a store worker again, Commit (the CRC32C check
//                  over the pages, layer CRCs) releasing whatever did not
//                  commit, then kStoreReply with one code per key: one round
//                  trip instead of three (Reserve and Commit over gRPC
//                  around a kPut)
//
// (one entry per run of ranges adjacent both in the pool and in the client's
// region, up to kMaxJoinedRangeBytes: JoinAdjacentRanges)
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
// cannot be parsed far enough to know whom to answer). A message carrying a
// payload has the payload dropped, never placed, and gets an InvalidArgument
// reply: payloads never travel as messages to a daemon (a put's bytes are
// pulled with kRead).
//
// Connections (DataPlaneOptions, each a flag of kvfabric-cached): at most
// max_connections endpoints in all and max_connections_per_host from one
// host (more are closed at accept); at most max_outstanding_per_connection
// requests in flight plus replies not yet delivered on one endpoint (a peer
// that keeps asking without reading its replies is disconnected, so what it
// can make the daemon hold is bounded); an endpoint with nothing in flight
// and no message for idle_timeout is closed; a transfer still running after
// transfer_timeout closes its endpoint, which completes the transfer
// (Cancelled) and so ends its lease brackets: a stalled peer cannot pin
// leases for longer than that. Closing happens in Sweep, never on the
// progress thread.
//
// Threads: handlers run on the transport's progress thread and never block;
// kStore's reserve and commit run on `store_threads` worker threads (a
// request waiting for one counts against its connection's
// max_outstanding_per_connection, so the queue is bounded);
// Sweep() (the node's maintenance thread) destroys endpoints whose peer failed
// once nothing is in flight on them, and frees finished batches. Close()
// force-closes every endpoint (in-flight entries complete Cancelled, their
// brackets are closed) and waits for every batch.
#ifndef KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_
#define KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "proto/transfer_wire.h"
#include "server/cache_host/data_sessions.h"
#include "transport/transport.h"

namespace kvfabric::cache_host {

class CacheHostNode;

inline constexpr std::size_t kMaxRegionsPerPeer = 64;
inline constexpr std::size_t kMaxImportsInProgress = 4;
// Ranges of one request that continue each other both in the pool and in the
// client's region are moved as one transport entry of at most this many
// bytes (each range is still checked against the lease on its own; see
// JoinAdjacentRanges).
inline constexpr std::uint64_t kMaxJoinedRangeBytes = std::uint64_t{8} << 20;

// `ranges` with each range that continues the previous one both in the pool
// (pool_offset) and in the client's region (region_offset) joined to it, as
// long as the joined range stays within `max_bytes` (a single range longer
// than that is kept as it is). Order and bytes are unchanged.
//
// Why: blocks reserved together usually sit in adjacent pool pages and go to
// adjacent staging, so a 32 MiB batch of 256 KiB blocks becomes a few
// entries instead of 128. Measured (cache_host_bench, GET of 256 KiB
// blocks): over TCP each entry is one owner-placed active message with its
// own rendezvous, and joining took one connection from 2.9 to 4.5 GB/s and
// four from 2.2-2.5 to 4.0-4.3; over shared memory four connections went
// from 12.7 to 14.6 GB/s. Why a cap: over TCP a single 32 MiB entry is one
// rendezvous that nothing overlaps with (1.9 GB/s); 2-8 MiB entries all ran
// at 4.0-4.6 GB/s, and 8 MiB entries copied over shared memory as fast as
// unbounded ones.
std::vector<wire::TransferRange> JoinAdjacentRanges(std::span<const wire::TransferRange> ranges,
                                                    std::uint64_t max_bytes);

inline constexpr std::uint32_t kStoreMaxTtlMs = 600000;
inline constexpr std::uint32_t kStoreMaxChainBlocks = 65536;

struct DataPlaneOptions {
  // Sessions binding connections to authenticated gRPC callers
  // (data_sessions.h). Null: no kChallenge is sent and kHello is refused.
  std::shared_ptr<DataSessions> sessions;
  // A connection must prove a session (kHello) before anything else it
  // sends is read; anything else first closes it (--data-plane-auth=session).
  // Verified connections act for their session's tenant only: grants and
  // kFetches of other namespaces are refused as unknown.
  bool require_session = false;
  std::uint32_t max_connections = 4096;               // --max-data-connections
  std::uint32_t max_connections_per_host = 1024;      // --max-data-connections-per-host
  std::uint32_t max_outstanding_per_connection = 256;  // --max-requests-per-connection
  std::uint64_t idle_timeout_us = 300'000'000;         // --data-idle-timeout (5 min)
  std::uint64_t transfer_timeout_us = 30'000'000;      // --transfer-timeout (30 s)
  // Threads that reserve and commit kStore requests (the CRC check of the
  // bytes pulled runs there): --store-threads.
  std::uint32_t store_threads = 2;
  // kStore's bounds, as the gRPC service's (proto/wire_limits.h: kMaxTtlMs,
  // kMaxChainBlocks; cached_main.cc asserts they agree).
  std::uint32_t max_ttl_ms = kStoreMaxTtlMs;
  std::uint32_t max_chain_blocks = kStoreMaxChainBlocks;
};

// Counters since Start, for metrics and tests.
struct DataPlaneStats {
  std::uint64_t endpoints = 0;                // connected now
  std::uint64_t connections_refused = 0;      // over max_connections or ..._per_host
  std::uint64_t closed_idle = 0;              // idle_timeout
  std::uint64_t closed_overloaded = 0;        // over max_outstanding_per_connection
  std::uint64_t closed_transfer_timeout = 0;  // a transfer past transfer_timeout
  std::uint64_t closed_unauthenticated = 0;   // a request before kHello, or a bad proof
  std::uint64_t sessions_verified = 0;        // connections whose kHello was good
  std::uint64_t stores = 0;                   // kStore requests answered
  std::uint64_t stored_blocks = 0;            // blocks kStore committed
};

class DataPlane {
 public:
  // Installs the message handler on `transport` (REQUIRES: it has none yet)
  // and listens on `address`. `node` and `transport` are borrowed; the node
  // must outlive Close().
  // `clock` gives microseconds on a monotonic clock (the node's Env).
  static StatusOr<std::unique_ptr<DataPlane>> Start(CacheHostNode* node,
                                                    transport::Transport* transport,
                                                    const std::string& address,
                                                    DataPlaneOptions options,
                                                    std::function<std::uint64_t()> clock);
  // Close()s.
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  std::string address() const;
  std::uint64_t endpoints() const;
  DataPlaneStats stats() const;
  void Sweep();
  void Close();

  struct Impl;

 private:
  explicit DataPlane(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvfabric::cache_host

#endif  // KVFABRIC_SERVER_CACHE_HOST_DATA_PLANE_H_
