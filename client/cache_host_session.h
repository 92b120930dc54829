// CacheHostSession: one client's session with one cache-host daemon, the only
// place the control-plane + data-plane sequences are written out:
//
//   Store     Reserve (gRPC) -> kPut (the daemon pulls the blocks from this
//             client's region) -> Commit with each block's CRC32C (gRPC).
//   Fetch     kFetch (data plane): the daemon leases the keys in its host
//             pool, pushes them into the region's slots and releases them, in
//             one round trip.
//   LeaseGet  Lease (gRPC; stages NVMe blocks into the pool, retried while
//             the daemon answers an entry Unavailable) -> kGet (the daemon
//             pushes the leased pages into the region's slots) -> Release.
//   Delete    Delete (gRPC).
//
// Every batch names its blocks' places in the session's region as slots:
// block k of a batch is at slot_offset + k * slot_bytes. The region is
// exported to the daemon once, at Open; the bytes of the slots a call names
// belong to the daemon until the call returns. Every count and size from
// the daemon is checked before bytes are used; per-entry results come back as
// Status (proto/grpc_status.h's one conversion).
//
// Ownership: a session owns its gRPC stub and shares its data-plane
// connection (client/data_plane_client.h); it borrows the DataPlaneClient and
// the region, which must outlive it. Sessions are handed out as shared_ptr so
// that a thread still using one after another thread gave up on its daemon
// (Close) holds valid memory and sees calls fail Unavailable.
//
// Threads: every method may be called from any thread, concurrently, as long
// as concurrent calls name disjoint slots.
#ifndef KVFABRIC_CLIENT_CACHE_HOST_SESSION_H_
#define KVFABRIC_CLIENT_CACHE_HOST_SESSION_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/admission_window.h"
#include "client/data_plane_client.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "proto/transfer_wire.h"
#include "security/grpc_security.h"
#include "transport/transport.h"

namespace kvfabric::client {

struct CacheHostSessionOptions {
  // The daemon's name (for messages), gRPC address and data-plane address.
  // grpc_address is required; with an empty transport_address the data
  // plane is connected at the first grant, to the address the grant names.
  // An empty host_id is the gRPC address.
  std::string host_id;
  std::string grpc_address;
  std::string transport_address;
  // The daemon's admin listener (its --admin-address), where Delete is
  // served; empty: Delete goes to grpc_address and answers PERMISSION_DENIED.
  std::string admin_address;
  // Namespace (tenant) of every request; empty: the default tenant.
  std::string ns;
  // How the gRPC channels are secured (security/grpc_security.h); Open
  // fails naming the settings when neither TLS nor insecure is set.
  GrpcSecurityOptions security;
  // Deadline of each gRPC call and of each data-plane request.
  std::chrono::milliseconds rpc_timeout{5000};
  std::chrono::milliseconds transfer_timeout{30000};
  // The id the region is exported under on this daemon.
  std::uint32_t region_id = 1;
  // Further regions exported with it on every new data-plane connection
  // (id, region; each outlives the session), named by SlotLayout::region_id:
  // a client's history pool, which daemons write blocks into directly.
  std::vector<std::pair<std::uint32_t, const transport::MemoryRegion*>> extra_regions;
  // How often a Lease whose entries answer Unavailable is retried.
  int lease_retries = 3;
  // Set when the data plane may use shared memory (transport::
  // UsesSharedMemory): Open then asks the daemon who it runs as (Health) and
  // refuses one on this host under another user or IPC namespace with
  // FailedPrecondition naming `ucx_tls_setting` (and its value `ucx_tls`):
  // UCX would connect, then fail every transfer (shmat, process_vm_readv:
  // permission denied).
  bool check_shared_memory = false;
  // Set when the data plane is UCX (any transport list): Open then also
  // refuses a daemon on this host under another user whose UCX listener
  // admits only its own user (it would reject the connection), with
  // FailedPrecondition naming the kernel-TCP data plane as the way out.
  bool check_ucx_listener = false;
  std::string ucx_tls;
  std::string ucx_tls_setting = "ucx_tls";
  // FetchWithin's admission window: kFetch requests in flight on this
  // session from all its callers together, between 1 and this many.
  std::uint32_t max_fetches_in_flight = 32;
  // StoreByKey's admission window: kStore messages (of up to
  // wire::kMaxStoreKeys blocks) in flight on this session, between 1 and
  // this many.
  std::uint32_t max_stores_in_flight = 8;
};

// Where a batch's blocks sit: block k at offset + k * bytes of the session's
// region, or, with `offsets`, at offsets[k] of region `region_id` (scattered
// slots: a client's history pages, written where they will be read).
struct SlotLayout {
  SlotLayout() = default;
  SlotLayout(std::uint64_t offset_in, std::uint64_t bytes_in)
      : offset(offset_in), bytes(bytes_in) {}
  // Scattered slots of `bytes_in` each in region `region`.
  SlotLayout(std::span<const std::uint64_t> offsets_in, std::uint64_t bytes_in,
             std::uint32_t region)
      : bytes(bytes_in), offsets(offsets_in), region_id(region) {}
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::span<const std::uint64_t> offsets;  // empty, or one per block
  std::uint32_t region_id = 0;             // 0: the session's region
  // Fetch only: layer_count 0 moves whole blocks; else layer slices
  // [first_layer, first_layer + layer_count) of each, to its slot (which
  // then holds that range: `bytes` is its size).
  std::uint32_t first_layer = 0;
  std::uint32_t layer_count = 0;
  // Fetch only: ask the daemon to check each key's bytes where they landed
  // (kFetch flag bit 3; ReadResult::landing_checked says where it did).
  bool check_landing = false;
  std::uint64_t at(std::size_t k) const {
    return offsets.empty() ? offset + k * bytes : offsets[k];
  }
};

class CacheHostSession {
 public:
  // Creates the stub, connects the data plane and exports `region` (or
  // defers both to the first grant; see transport_address). Unavailable
  // naming the daemon if it cannot be reached by rpc_timeout.
  static StatusOr<std::shared_ptr<CacheHostSession>> Open(DataPlaneClient* data,
                                                          const transport::MemoryRegion& region,
                                                          CacheHostSessionOptions options);
  ~CacheHostSession();
  CacheHostSession(const CacheHostSession&) = delete;
  CacheHostSession& operator=(const CacheHostSession&) = delete;

  // One block to store: its descriptor (key, payload_bytes, fingerprint
  // digest, tokens) and the CRC32C of the bytes in its slot.
  struct StoreBlock {
    v1::BlockDescriptor descriptor;
    std::uint32_t crc32c = 0;
  };
  // Stores `blocks` (at most the daemon's max_keys_per_batch) whose bytes sit
  // in `slots`. Per block: OK (committed), AlreadyExists (the daemon already
  // held it: cached, nothing written), or why it was not stored. A
  // request-wide error (the daemon unreachable, the transfer failed, a reply
  // with the wrong count) is returned instead; then nothing can be assumed
  // committed. Uncommitted reservations are released (Commit's
  // release_uncommitted) or expire after ttl_ms on the daemon.
  StatusOr<std::vector<Status>> Store(const v1::ModelFingerprint& fingerprint,
                                      std::span<const StoreBlock> blocks, SlotLayout slots,
                                      std::uint32_t ttl_ms = 0);

  // Store in one data-plane round trip (kStore): the daemon reserves the
  // blocks, pulls their bytes from `slots` (whole blocks; slots.region_id or
  // the session's region), checks each CRC32C and commits, all without gRPC.
  // Same contract as Store; every descriptor must carry the 32-byte
  // fingerprint_digest (the daemon keeps it with the block) and the
  // fingerprint's shape. A daemon older than kStore drops the request: the
  // call then ends with DeadlineExceeded after transfer_timeout.
  //
  // Admission: the daemon reserves what a kStore names before it pulls it,
  // and refuses a block (ResourceExhausted) that would take its namespace
  // over --max-reserved-bytes-per-namespace or that finds the pool full. So
  // at most a window of kStore messages is in flight on the session, from
  // all callers together: it starts at 4, halves (down to 1) at each reply
  // that refused a block for room and grows by one after a window's worth of
  // replies that did not, up to options.max_stores_in_flight. Refused blocks
  // are sent again after a pause (1 ms doubling to 64 ms) for at most
  // transfer_timeout, then answered ResourceExhausted; *throttled counts the
  // refused blocks that were sent again.
  StatusOr<std::vector<Status>> StoreByKey(const v1::ModelFingerprint& fingerprint,
                                           std::span<const StoreBlock> blocks, SlotLayout slots,
                                           std::uint32_t ttl_ms = 0,
                                           std::uint64_t* throttled = nullptr);
  std::uint32_t store_window() const;

  // What a read found for one key.
  struct ReadResult {
    Status status;             // OK: the bytes are in the key's slot
    std::uint32_t crc32c = 0;  // as committed (check it before use)
    std::uint64_t payload_bytes = 0;
    v1::Tier tier = v1::TIER_HOST;  // where the daemon read it from
    // Fetch with SlotLayout::check_landing: the daemon read the bytes back in
    // the slot right after writing them and they matched crc32c.
    bool landing_checked = false;
  };
  // kFetch of `keys` (32 bytes each) into `slots`. Per key: OK, Unavailable
  // (not in the daemon's host pool now: LeaseGet stages it), NotFound, or
  // another refusal. `expected_digest`: the model fingerprint digest the
  // blocks must carry (empty: not checked).
  StatusOr<std::vector<ReadResult>> Fetch(std::span<const wire::FetchKey> keys,
                                          std::string_view expected_digest, SlotLayout slots);

  // Fetch with admission, for callers that share the session (a client's
  // concurrent loads): at most a window of requests is in flight. The window
  // starts at 4, halves (down to 1) whenever the daemon refuses a request for
  // its per-namespace lease bound (ResourceExhausted: the leases in flight
  // would pin more than --max-leased-bytes-per-namespace) and grows by one
  // after a window's worth of accepted requests, up to
  // options.max_fetches_in_flight: additive increase, multiplicative decrease,
  // so the session settles at what the daemon admits. A refused request waits
  // for a slot and a pause (1 ms doubling to 64 ms) and is asked again, for
  // at most `patience`; *throttled counts the refusals. Waiting requests are
  // admitted earliest layer first (slots.first_layer; a whole block ranks
  // with layer 0), then in arrival order (client/admission_window.h). Other
  // answers as Fetch.
  StatusOr<std::vector<ReadResult>> FetchWithin(std::span<const wire::FetchKey> keys,
                                                std::string_view expected_digest, SlotLayout slots,
                                                std::chrono::milliseconds patience,
                                                std::uint64_t* throttled);
  std::uint32_t fetch_window() const;
  // Payload bytes FetchWithin and LeaseGetWithin moved in all, for every
  // caller of this session: a load's stream reads it at its start and end to
  // tell placement how many bytes other loads moved over the same daemon
  // meanwhile (TransferObservation.shared_bytes).
  std::uint64_t bytes_moved() const { return bytes_moved_.load(std::memory_order_relaxed); }

  // A lease as its holder names it to the daemon: id and access token (the
  // daemon refuses an id without its token).
  struct HeldLease {
    std::uint64_t lease_id = 0;
    std::string access_token;
  };
  // Lease (retrying Unavailable entries), kGet of every leased key into its
  // slot, Release. Per key as Fetch (OK entries' payload_bytes equal
  // slots.bytes, checked). With `kept` the lease is not released and goes to
  // *kept (the caller Releases it); otherwise it is released whatever
  // happens.
  StatusOr<std::vector<ReadResult>> LeaseGet(std::span<const std::string> keys,
                                             std::string_view expected_digest, std::uint32_t ttl_ms,
                                             SlotLayout slots, HeldLease* kept = nullptr);
  // LeaseGet through FetchWithin's admission window: a lease pins pool pages
  // under the same per-namespace bound as a kFetch, so it takes a slot of
  // the window, and one the daemon refuses for that bound is asked again
  // after a pause (for at most `patience`; *throttled counts the refusals)
  // instead of failing its blocks into a fallback.
  StatusOr<std::vector<ReadResult>> LeaseGetWithin(std::span<const std::string> keys,
                                                   std::string_view expected_digest,
                                                   std::uint32_t ttl_ms, SlotLayout slots,
                                                   std::chrono::milliseconds patience,
                                                   std::uint64_t* throttled);
  Status Release(const HeldLease& lease);

  // Deletes `keys`; per key OK or NotFound or the refusal. An administrative
  // RPC: it goes to options.admin_address (PermissionDenied without one).
  StatusOr<std::vector<Status>> Delete(std::span<const std::string> keys);

  // Closes the data-plane connection: in-flight and later calls fail
  // Unavailable. Idempotent.
  void Close();
  // OK while the data-plane connection is healthy.
  Status health() const;

  // The namespace of calls started from now on (options.ns at first).
  void SetNamespace(const std::string& ns);

  const std::string& host_id() const { return o_.host_id; }
  const std::string& grpc_address() const { return o_.grpc_address; }
  const std::string& transport_address() const { return o_.transport_address; }
  // For the calls this type does not wrap (Health, Stats) and for tests that
  // speak the raw protocol: the stub, and the data-plane connection (made now
  // if it was deferred and an address is configured).
  v1::CacheHost::Stub& stub() { return *stub_; }
  StatusOr<DaemonConnection*> DataConnection() { return Connection(""); }
  std::unique_ptr<grpc::ClientContext> RpcContext() const;

 private:
  // FetchWithin's loop around `call` (a kFetch or a LeaseGet), admitted at
  // `rank` (AdmissionWindow::Acquire).
  template <typename Request>
  StatusOr<std::vector<ReadResult>> WithinWindow(std::uint32_t rank,
                                                 std::chrono::milliseconds patience,
                                                 std::uint64_t* throttled, const Request& request);

  CacheHostSession(DataPlaneClient* data, CacheHostSessionOptions options);
  Status Call(const char* rpc, const grpc::Status& g) const;
  // check_shared_memory, check_ucx_listener: the daemon's identity against
  // this process's.
  Status CheckSharedMemory();
  transport::Deadline TransferDeadline() const;
  // The data-plane connection, made (and the region exported) on first use
  // to the configured address, else to `grant_address`.
  StatusOr<DaemonConnection*> Connection(const std::string& grant_address);

  DataPlaneClient* const data_;
  CacheHostSessionOptions o_;  // immutable after Open (ns: see ns_)
  std::string Namespace() const;
  const transport::MemoryRegion* region_ = nullptr;
  std::unique_ptr<v1::CacheHost::Stub> stub_;
  std::unique_ptr<v1::CacheHost::Stub> admin_stub_;  // null without admin_address
  mutable Mutex conn_mu_;
  std::string ns_ KVF_GUARDED_BY(conn_mu_);
  // Set once; the pointer stays valid while the session lives.
  std::shared_ptr<DaemonConnection> conn_ KVF_GUARDED_BY(conn_mu_);
  bool closed_ KVF_GUARDED_BY(conn_mu_) = false;
  // Admission windows (client/admission_window.h), both starting at 4.
  AdmissionWindow fetches_;  // kFetch requests and leases, earliest layer first
  AdmissionWindow stores_;   // kStore messages
  std::atomic<std::uint64_t> bytes_moved_{0};
  // One pass of StoreByKey over `entries` through the window: codes[i] for
  // entries[i], or the first request-wide error (every message sent is
  // answered or failed before it returns).
  Status StoreRound(DaemonConnection* conn, const DataPlaneClient::StoreRequest& base,
                    std::span<const wire::StoreEntry> entries,
                    std::chrono::steady_clock::time_point give_up, std::vector<StatusCode>* codes);
};

// The gRPC channel every kvfabric client opens to a daemon or placement:
// 16 MiB messages each way.
StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& address,
                                                     const GrpcSecurityOptions& security);

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_CACHE_HOST_SESSION_H_
