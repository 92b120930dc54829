// DataPlaneClient: the client side of the owner-driven data path to cache-host
// daemons (proto/transfer_wire.h, server/cache_host/data_plane.h).
//
// A client exports its staging regions (memory it registered or allocated on
// its own transport) to each daemon it talks to, then asks the daemon to move
// bytes between those regions and the extents a gRPC Reserve or Lease granted:
// kPut pulls from the client's region into reserved pages, kGet pushes leased
// pages into the client's region. Fetch does a whole read by key (lease, kGet,
// release) in one data-plane round trip for blocks in the daemon's host pool;
// Store a whole write (reserve, pull, CRC check, commit) in one. A request
// completes when the daemon's reply
// arrives, i.e. after every byte moved (or failed); the region's bytes named
// by a request belong to the transport until then.
//
// Ownership: the client borrows the transport (which must outlive it and every
// connection). Connections are shared: Connect hands out a shared_ptr, the
// client keeps one per address for reuse, and a connection lives while anyone
// holds it, so a thread using a connection another thread dropped sees it
// fail (Unavailable) instead of touching freed memory. It installs the
// transport's message handler, so one DataPlaneClient serves every daemon
// connection of that transport. Methods taking a DaemonConnection* borrow it:
// REQUIRES the caller holds the shared_ptr for the duration of the call.
//
// Failure: a daemon that dies fails the endpoint; requests waiting on it
// complete Unavailable (checked while waiting), never hang.
//
// Threads: every method may be called from any thread; requests on one
// connection may be issued concurrently from several threads.
#ifndef KVFABRIC_CLIENT_DATA_PLANE_CLIENT_H_
#define KVFABRIC_CLIENT_DATA_PLANE_CLIENT_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "proto/transfer_wire.h"
#include "transport/transport.h"

namespace kvfabric::client {

// One daemon's data-plane connection (shared; see Ownership above).
class DaemonConnection;

// A data-plane session opened over gRPC (CacheHost.OpenDataSession,
// server/cache_host/data_sessions.h).
struct DataSessionCredentials {
  std::uint64_t id = 0;
  std::array<std::uint8_t, 32> secret{};
};

enum class DataOp : std::uint8_t {
  kPut = 1,  // client region -> daemon pool
  kGet = 2,  // daemon pool -> client region
};

class DataPlaneClient {
 public:
  // REQUIRES: `transport` has no message handler yet and outlives the client.
  static StatusOr<std::unique_ptr<DataPlaneClient>> Create(transport::Transport* transport);
  // Closes every connection (in-flight requests complete Cancelled/Unavailable).
  ~DataPlaneClient();
  DataPlaneClient(const DataPlaneClient&) = delete;
  DataPlaneClient& operator=(const DataPlaneClient&) = delete;

  // The connection to the daemon listening at `address` (made on first use,
  // then reused while healthy). Unavailable if it cannot be reached by
  // `deadline`. Connects to different addresses run concurrently; two
  // threads connecting to one address make one connection. With `session`,
  // a new connection first proves it (waits for the daemon's kChallenge,
  // answers kHello with the HMAC, waits for OK); PermissionDenied or
  // Unavailable when the daemon refuses it.
  StatusOr<std::shared_ptr<DaemonConnection>> Connect(
      const std::string& address, transport::Deadline deadline,
      const DataSessionCredentials* session = nullptr);

  // Exports `region` (whole) to the daemon of `conn` as `region_id` and waits
  // for the daemon to import it. Done once per (connection, region).
  Status ExportRegion(DaemonConnection* conn, std::uint32_t region_id,
                      const transport::MemoryRegion& region, transport::Deadline deadline);

  // Moves `ranges` (any number; sent as requests of at most
  // wire::kMaxRangesPerRequest ranges, all in flight at once) under the grant
  // (lease_id, token), between the daemon's pool and region `region_id`, and
  // waits for every reply. Returns the first error (a daemon's reply status,
  // Unavailable if the daemon died, DeadlineExceeded).
  Status Transfer(DaemonConnection* conn, DataOp op, std::uint64_t lease_id,
                  const std::array<std::uint8_t, 16>& token, std::uint32_t region_id,
                  std::span<const wire::TransferRange> ranges, transport::Deadline deadline);

  // What to fetch by key (wire kFetch): each of `keys` is leased on the
  // daemon (host pool only), pushed into region `region_id` at
  // region_offset + i x slot_bytes (or, with slot_offsets, at
  // slot_offsets[i]: scattered slots), and released, in one round trip.
  struct FetchRequest {
    std::string ns;
    std::optional<std::array<std::uint8_t, wire::kFetchDigestBytes>> expected_fingerprint;
    std::span<const wire::FetchKey> keys;
    std::uint32_t region_id = 0;
    std::uint64_t region_offset = 0;
    std::uint64_t slot_bytes = 0;
    // Empty, or one offset per key (region_offset is then ignored).
    std::span<const std::uint64_t> slot_offsets;
    // layer_count 0: whole blocks; else only layer slices [first_layer,
    // first_layer + layer_count) of each block move, to its slot, and each
    // result's crc32c / payload_bytes are the range's.
    std::uint32_t first_layer = 0;
    std::uint32_t layer_count = 0;
    // kFetch flag bit 3: the daemon checks each key where it landed, where it
    // can (FetchKeyResult::landing_checked).
    bool check_landing = false;
  };
  // Sends `request` as kFetch messages of at most wire::kMaxFetchKeys keys, all
  // in flight at once, and waits for every reply. Returns one result per key
  // (OK: its bytes are in its slot; Unavailable: not in the daemon's host pool
  // now, lease it through gRPC), or the first request-wide error (then no
  // slot's bytes can be trusted).
  StatusOr<std::vector<wire::FetchKeyResult>> Fetch(DaemonConnection* conn,
                                                    const FetchRequest& request,
                                                    transport::Deadline deadline);

  // What to store by key (wire kStore): each entry's bytes, in region
  // `region_id`, are reserved on the daemon, pulled into its pool, checked
  // against the entry's CRC32C and committed, in one round trip. Every
  // block shares `ns` and `shape`.
  struct StoreRequest {
    std::string ns;
    wire::StoreShape shape;
    std::uint32_t ttl_ms = 0;  // 0: the daemon's default
    std::uint32_t region_id = 0;
    std::span<const wire::StoreEntry> entries;
  };
  // Sends `request` as kStore messages of at most wire::kMaxStoreKeys
  // entries, all in flight at once, and waits for every reply. One code per
  // entry (OK: committed; AlreadyExists: the daemon holds it already;
  // ResourceExhausted, DataLoss, InvalidArgument, ...), or the first
  // request-wide error (then any entry may or may not be stored). The
  // entries' bytes belong to the transport until this returns.
  StatusOr<std::vector<StatusCode>> Store(DaemonConnection* conn, const StoreRequest& request,
                                          transport::Deadline deadline);
  // Store one kStore message at a time, for callers that bound how many are
  // in flight (CacheHostSession::StoreByKey's admission window). StartStore
  // sends `request` (1 to wire::kMaxStoreKeys entries) and returns its
  // request id; FinishStore waits for that reply: one code per entry, or
  // the request-wide error. Every started request must be finished (its
  // entries' bytes belong to the transport until then).
  StatusOr<std::uint64_t> StartStore(DaemonConnection* conn, const StoreRequest& request);
  StatusOr<std::vector<StatusCode>> FinishStore(DaemonConnection* conn, std::uint64_t request_id,
                                                std::size_t entries, transport::Deadline deadline);

  // Closes `conn` (requests on it complete Unavailable) and forgets it, if it
  // is still the one kept for its address (a newer connection made by
  // another thread stays). Holders keep a closed, failing connection.
  void Disconnect(DaemonConnection* conn);

  // OK while `conn` is healthy; Unavailable (with the reason) once it failed
  // or was closed.
  Status Health(DaemonConnection* conn) const;

  // Connections kept for reuse (one per address).
  std::size_t connection_count() const;

  struct Pending;

 private:
  explicit DataPlaneClient(transport::Transport* transport);
  StatusOr<std::uint64_t> Send(DaemonConnection* conn, const wire::TransferMessage& message);
  // Waits for the reply to `request_id`, which must be of op `expect`; a
  // kFetchReply's or kStoreReply's results go to *fetch_results when given.
  Status Wait(DaemonConnection* conn, std::uint64_t request_id, transport::Deadline deadline,
              std::vector<wire::FetchKeyResult>* fetch_results = nullptr,
              wire::TransferOpCode expect = wire::TransferOpCode::kReply);
  void OnMessage(transport::IncomingMessage& msg);

  transport::Transport* const transport_;
  struct Slot;  // one address: its connect lock and its connection
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::shared_ptr<Slot>> connections_ KVF_GUARDED_BY(mu_);
  // A Pending's fields are under mu_ too.
  std::unordered_map<std::uint64_t, std::shared_ptr<Pending>> pending_ KVF_GUARDED_BY(mu_);
  // kChallenge nonces by endpoint, until a Connect with a session uses them
  // (or the connection is dropped).
  std::unordered_map<const transport::Endpoint*, std::array<std::uint8_t, wire::kHelloBytes>>
      challenges_ KVF_GUARDED_BY(mu_);
  // Proves `session` on `conn` (see Connect).
  Status Hello(DaemonConnection* conn, const DataSessionCredentials& session,
               transport::Deadline deadline);
  std::uint64_t next_request_ KVF_GUARDED_BY(mu_) = 1;
  std::shared_ptr<bool> alive_;  // handlers check it (the transport may outlive us)
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_DATA_PLANE_CLIENT_H_
