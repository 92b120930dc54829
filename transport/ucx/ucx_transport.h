// The UCX backend of transport::Transport (transport/transport.h).
//
// What it is
//   One UCP context and `workers` UCP workers (default one), each driven by
//   one progress thread that the transport owns; endpoints are spread over
//   the workers (UcxTransportOptions::workers), and what follows holds per
//   worker. The worker is created UCS_THREAD_MODE_SINGLE with
//   UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP; only the progress
//   thread touches the worker, its endpoints, its listener and the remote
//   keys unpacked on it. Other threads hand work over through a
//   mutex-protected queue and wake the worker with ucp_worker_signal. When
//   idle the progress thread sleeps in poll(2) on the worker's event fd
//   (ucp_worker_get_efd + ucp_worker_arm); it spins only for a bounded
//   window (progress_spin) after an event while its own requests are in
//   flight, and caps its sleeps while transfers run (active_poll_interval).
//
// How each transfer maps onto UCX
//   kRead/kWrite take one of two paths, fixed per imported region when it is
//   imported (the rule, RkeyHolder::one_sided in ucx_core.cc):
//   - UCX's get/put, only where they are truly one-sided, so that the owner
//     takes no part: the exported range maps into the importer
//     (ucp_rkey_ptr succeeds: memory UCX allocated itself with
//     UCP_MEM_MAP_ALLOCATE, a SysV/POSIX segment, reached over shared
//     memory), or the transport list names RDMA transports (rc*, dc*, ib),
//     whose RMA lanes are hardware one-sided on any registered memory (not
//     testable here: no RDMA NIC). Over RDMA kRead is ucp_get_nbx; kWrite
//     is ucp_put_nbx, then one ucp_ep_flush_nbx per batch after all of its
//     puts: a kWrite entry completes OK only when that flush completed.
//     Where the range maps into this process the progress thread copies
//     through the mapping itself (UCX's get/put there are the same copy,
//     cut into bcopy fragments: ≈6.5-7.7 GB/s against ≈9 at 16-64 MiB).
//     Where the range maps into this process, a batch of at most
//     inline_copy_max_bytes whose entries are all such kRead/kWrite is
//     instead copied by Submit itself through the mapping, on the caller's
//     thread, and returned complete (see the option for the trade-off).
//   - everywhere else (TCP; shared memory on caller memory), owner-placed
//     active messages (transport/ucx/ucx_am_rma.h): kWrite sends the payload
//     with a {grant, offset, length, id} header; the owner's progress thread
//     bounds-checks it against the range it exported, places it (eager copy,
//     or a rendezvous receive straight into its region) and acknowledges;
//     the entry completes OK on the acknowledgement, i.e. once the bytes are
//     in the owner's memory. kRead asks the owner, which replies with the
//     bytes of its range (bounds-checked), received straight into the local
//     destination. Why not UCX's emulated get/put there: they do not
//     bounds-check, and UCX 1.13.1 aborts the memory *owner* ("Fatal:
//     unexpected error: Endpoint timeout" in ucp_put_handler /
//     ucp_get_req_handler) when its peer dies or force-closes with them in
//     flight, so a crashed client could take a daemon down. Measured here,
//     active messages are also faster on TCP (≈2-2.4 GB/s against ≈0.5-0.8
//     for emulated get/put).
//   kSend   ucp_am_send_nbx (UCP_AM_SEND_FLAG_REPLY) with the header and the
//           payload from the local region. The receiver's MessageHandler gets
//           an IncomingMessage; Accept copies eager data, or receives
//           rendezvous data with ucp_am_recv_data_nbx directly into the chosen
//           region; Drop releases it (a dropped rendezvous payload is never
//           fetched; the sender's entry still completes OK).
//   Entries complete with the Status of their UCX request (StatusFromUcs) or
//   of the owner's reply. Once the endpoint's peer failed every entry
//   completes Unavailable, including requests UCX purged as cancelled;
//   Cancelled means this side cancelled the batch or closed the endpoint.
//
// Endpoints use UCP_ERR_HANDLING_MODE_PEER with an error callback: a peer that
// dies or disconnects fails in-flight entries (UCX purges their requests;
// owner-placed entries waiting for a reply fail with it) and every later
// Submit with Unavailable; Endpoint::health() says so. Endpoints
// are made through the sockaddr connection manager: Listen uses
// ucp_listener_create, Connect uses ucp_ep_create with a peer address. The
// Endpoint object exists as soon as ucp_ep_create succeeded (an accepted one
// is handed to the AcceptHandler at once), so IncomingMessage::endpoint() is
// set for every message, even the first. Both sides flush a new endpoint
// before its first send, holding back sends (batches, owner replies) until
// the flush completed: the workaround for UCX 1.13.1 hanging on an active
// message over 100 bytes sent right after accept when the final lane is
// shared memory. Connect returns after that flush.
//
// Memory
//   RegisterMemory maps caller memory (ucp_mem_map). AllocateMemory lets UCX
//   allocate (UCP_MEM_MAP_ALLOCATE): on shared memory that is a SysV/posix
//   segment the peer maps and copies truly one-sidedly. Export packs a remote
//   key (ucp_rkey_pack) and a grant id in a versioned, checksummed encoding
//   (transport/ucx/ucx_export.h) with the exported range. The grant id is a
//   random 64-bit capability naming that range in the owner's table; the
//   owner checks every owner-placed operation against the granted range
//   itself and refuses the rest (InvalidArgument; Unavailable once the region
//   is destroyed, which revokes its grants and waits, up to a grace after
//   which it force-closes their endpoints, for peers' operations on it to
//   finish). The importer also checks every size when importing and
//   bounds-checks every kRead/kWrite before posting. One-sided get/put are
//   checked by the importer only and a remote key covers the whole
//   registration it was packed from: export UCX-allocated shared memory and
//   RDMA-registered memory to trusted peers only (see transport.h,
//   "Security"). kDevice memory is Unimplemented (Debian's UCX has no CUDA
//   transports).
//   Over shared memory the two sides also attach each other's UCX FIFOs and
//   segments, which a peer can truncate under the other (inside UCX, where no
//   guard reaches). So while `tls` uses shared memory a listener accepts
//   peers of its own host only when their connecting socket belongs to its
//   own user (UcxTransportOptions::shared_memory_peers, core/socket_owner.h),
//   rejecting others before UCX wires up a lane; peers on other hosts are
//   not affected.
//
// Cancellation and close
//   TransferBatch::Cancel completes entries not yet posted with Cancelled,
//   abandons owner-placed entries still waiting for the owner's reply
//   (Cancelled; a late reply is dropped, never placed), and asks UCX to
//   cancel posted requests (ucp_request_cancel). UCX cannot revoke every
//   posted send or receive: an entry whose request still uses its local
//   range completes when that request does, so the range is never reused
//   under UCX.
//   Close(kForce, deadline) cancels every batch as above, lets requests
//   still posted finish until the deadline, then force-closes the endpoint
//   (ucp_ep_close_nbx with UCP_EP_CLOSE_FLAG_FORCE), which completes what is
//   left Cancelled. Pass Clock::now() for an immediate close. Destroying an
//   Endpoint is Close(kForce, now + 1 s).
//   Close(kGraceful) waits for in-flight entries until the deadline, then
//   closes with a flush (ucp_ep_close_nbx without FORCE); past the deadline it
//   force-closes and returns DeadlineExceeded.
//   Destroying the transport force-closes every endpoint (the Endpoint
//   objects stay valid and report Unavailable), destroys the listener, stops
//   the progress thread and destroys the worker. The UCP context is destroyed
//   after the last MemoryRegion made by this transport.
//
// Threads
//   As transport.h says: every method may be called from any thread;
//   handlers run on the progress thread of the endpoint's worker (with
//   several workers, at once for endpoints on different ones). REQUIRES: the transport is not
//   destroyed from one of its own handlers, and a handler does not destroy a
//   TransferBatch that is still in flight (that waits). A MemoryRegion
//   destroyed on a progress thread cannot wait for peers using it: it
//   force-closes their endpoints at once.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/statusor.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_log.h"

namespace kvfabric::ucx {

// Which processes on this host a listener accepts while its transport list
// enables shared memory (TlsUsesSharedMemory). Numbered explicitly: it is a
// flag value.
enum class SharedMemoryPeers : std::uint8_t {
  // Only processes whose connecting socket belongs to this process's user
  // (core/socket_owner.h); others on this host are rejected before UCX wires
  // up a lane, peers on other hosts are not affected. Why: over UCX's
  // shared memory the listener attaches the peer's FIFOs and segments, and a
  // peer that truncates or unmaps them crashes it inside UCX, where no guard
  // reaches; a process of the same user could kill it anyway.
  kSameUser = 1,
  // Every peer: for hosts whose users all trust each other.
  kAnyUser = 2,
};

// Whether a UCX transport list lets UCX move bytes through shared memory
// between processes of one host: any of sm, shm, mm, sysv, posix, cma,
// knem, xpmem or all, a "^..." exclusion list that keeps sm/shm, or the
// empty list (UCX's default: every transport).
bool TlsUsesSharedMemory(const std::string& tls);

struct UcxTransportOptions {
  // UCX transport list (UCX's TLS setting), set with ucp_config_modify and
  // never read from the environment by this library. Default "sm,self,tcp":
  // shared memory between processes on one host, TCP across hosts. On an
  // RDMA cluster use e.g. "rc,ud,sm,self,tcp". Listener (sockaddr)
  // connections need "tcp" (or "all"); a list without it is rejected with
  // InvalidArgument.
  std::string tls = "sm,self,tcp";
  // Where `tls` came from, for the one warning naming the transports of the
  // list this machine lacks (ucx_log.h). Default "--ucx-tls".
  std::string tls_setting = "--ucx-tls";
  // Receives UCX's own log messages and that warning, one line each
  // (ucx_log.h; process-wide: the last transport created with a sink sets
  // it). Default empty: spdlog's default logger.
  UcxLogSink log_sink;

  // Listener side: which processes on this host may connect while `tls`
  // uses shared memory (see SharedMemoryPeers). Default kSameUser.
  SharedMemoryPeers shared_memory_peers = SharedMemoryPeers::kSameUser;
  // Called on a progress thread for each connection request the listener
  // rejects under shared_memory_peers, with the peer's address and why
  // (e.g. "its socket belongs to uid 65534, this process runs as uid 0").
  // Must not block. Default none: rejected silently.
  std::function<void(const std::string& peer, const Status& why)> on_rejected_peer;

  // UCX's NET_DEVICES: which network devices to use, e.g. "mlx5_0:1" to pin
  // a NIC per GPU (transport/verbs discovers them). Default empty: UCX's
  // own default (all devices). Not needed for TCP on loopback.
  std::string net_devices;

  // Idle progress-thread sleep, at most this long per poll(2) before it
  // re-checks its queue. Default 100 ms: wake-ups come from the event fd, so
  // this only bounds how long a missed wake-up could stall; shorter costs
  // idle CPU, longer costs nothing in the normal path.
  std::chrono::milliseconds idle_poll_timeout{100};

  // Progress-thread wake-ups while transfers run. UCX's event fd reports
  // arrivals, but not that a peer drained a queue our sends wait on (the
  // shared-memory FIFO, TCP send buffers) nor that an owner-side reply of an
  // emulated get/put was held back; sleeping until idle_poll_timeout then
  // stalls a transfer for that long (measured: 16 MiB emulated puts took
  // 100-400 ms, multiples of the idle timeout, before this cap existed).
  //
  // progress_spin: after any event, while this side has UCX requests in
  // flight, keep calling ucp_worker_progress without sleeping for this long.
  // Default 50 us. Longer shortens hand-offs on idle cores, but two spinning
  // processes on 2 cores stall each other (each spin steals the other's
  // time slice): keep it short. 0 disables spinning.
  std::chrono::microseconds progress_spin{50};
  // While requests are in flight, or an event was seen within
  // active_window, poll(2) sleeps at most active_poll_interval. Defaults
  // 100 us and 20 ms: ~10k cheap wake-ups/s only while busy; an idle
  // transport goes back to idle_poll_timeout after active_window.
  std::chrono::microseconds active_poll_interval{100};
  std::chrono::milliseconds active_window{20};

  // Inline copies. Where every kRead/kWrite entry of a batch targets a
  // range that maps into this process (memory UCX allocated, reached over
  // shared memory: ucp_rkey_ptr), and the batch moves at most this many
  // bytes, Submit copies the bytes itself on the caller's thread and returns
  // a batch that is already complete, instead of handing it to the progress
  // thread. That hand-off (queue, wake-up, completion, wake-up of the
  // waiter) costs ~0.05-0.1 ms here, as long as copying 1 MiB; the copy
  // itself is a plain memcpy from or into the mapping, the access UCX
  // documents for ucp_rkey_ptr. Never on the progress thread (handlers'
  // Submit only queues), never for kSend or for batches that mix in other
  // entries. The cost: Submit blocks for the copy, so a caller that wants
  // to overlap its own work with a large transfer keeps the batch above
  // this size; and an endpoint or region closing meanwhile waits for the
  // copy (bounded by this size). Default 16 MiB (~2-3 ms of copying here);
  // 0 disables.
  std::uint64_t inline_copy_max_bytes = std::uint64_t{16} << 20;

  // Populating imported mappings. When an imported region maps into this
  // process (memory UCX allocated, reached over shared memory), a background
  // thread fills in the mapping's page tables for every page the peer
  // already has (mincore), so the first copy into each page takes no minor
  // fault (a daemon's first load into a client's pages ran at half speed
  // without it). Costs page tables only (0.2% of the peer's resident bytes);
  // never allocates memory for the peer (ucx_populate.h). Default true;
  // kvfabric-cached --populate-imports.
  bool populate_imported_mappings = true;

  // When a batch copies at least this many bytes through mappings (inline
  // or on the progress thread), it uses streaming stores (core/stream_copy.h):
  // such a batch does not stay in the caches anyway, and streaming it
  // measured 1.4-1.8x memcpy's speed here (8-11 -> 11-18 GB/s); smaller
  // batches use memcpy, which wins when the bytes are cached and read again
  // soon. Default 8 MiB (a quarter of this machine's 32 MiB L3); 0 streams
  // every copy, UINT64_MAX none.
  std::uint64_t streaming_copy_min_bytes = std::uint64_t{8} << 20;

  // Ranked batches (transport::Transfer::rank): a batch of rank above 0
  // waits while batches of rank 0 are queued and starts lowest rank first,
  // one at a time with ucp_worker_progress between (so arrivals meanwhile
  // are ranked too); the oldest starts first instead once it has waited this
  // long, so a stream of urgent batches delays a ranked one by at most this
  // (plus the batch running). Default 20 ms: beyond the ~5 ms a daemon here
  // spends on eight loads' layer 0 (8 MiB each over two daemons), well under
  // a load of a 32K-token history (~30 ms alone, ~250 ms beside seven others).
  std::chrono::milliseconds max_rank_deferral{20};

  // Helper threads for copies through a mapping (core/copy_pool.h): the
  // thread that copies a batch (the progress thread, or the caller for an
  // inline batch) splits its bytes across itself and these. One thread
  // copies cold memory at one core's bandwidth (11-19 GB/s here), so a
  // daemon serving several clients over shared memory is limited by it.
  // Default 0 (the copying thread works alone); kvfabric-cached sets it from
  // --copy-threads.
  int copy_threads = 0;

  // UCP workers, each with its own progress thread. Default 1, at most
  // kMaxUcxWorkers. The workers share one UCP context (memory is mapped and
  // exported once, and any endpoint may use any region) and split the
  // endpoints: the listener, on the first worker, hands each accepted
  // connection to the next worker in turn (UCX lets a connection request be
  // accepted on any worker of the context), and Connect takes them in turn.
  // Why: a worker's thread moves every byte of its endpoints, and over TCP
  // that send path (the copy into the socket) fills one core at ~4.5 GB/s
  // here. A server with several clients gives the data path one worker per
  // core it can spare (kvfabric-cached --data-workers). With more than one,
  // handlers run on several threads at once. Copy helpers (copy_threads) are
  // per worker.
  int workers = 1;

  // Extra UCX configuration keys (UCX's names without the UCX_ prefix, e.g.
  // {"TCP_TX_SEG_SIZE", "64K"}), applied with ucp_config_modify after every
  // key above, so they override them. Default empty. For tuning and
  // benchmarks; an unknown key fails CreateUcxTransport with UCX's error.
  std::vector<std::pair<std::string, std::string>> ucx_config;

  // Time the progress thread keeps progressing, on shutdown, for close and
  // receive requests still outstanding after every endpoint was closed
  // before it destroys the worker anyway. Default 2 s.
  std::chrono::milliseconds shutdown_drain_timeout{2000};
};

inline constexpr int kMaxUcxWorkers = 64;

// Creates a UCX transport: reads UCX's defaults, then sets TLS and
// NET_DEVICES from `options`, MM_ERROR_HANDLING=y and CMA's
// MEMORY_INVALIDATE=y (without them UCP_ERR_HANDLING_MODE_PEER silently
// drops the shared-memory lanes) and PROTO_ENABLE=n (the 1.13 protocol v2
// shares the accept-then-send hang), and starts the progress thread.
// InvalidArgument for a TLS list without tcp or workers outside
// 1..kMaxUcxWorkers; the UCX error (StatusFromUcs)
// when the context or worker cannot be created.
StatusOr<std::unique_ptr<transport::Transport>> CreateUcxTransport(
    const UcxTransportOptions& options);

// Counters for tests (which AM receive path messages took). Not for
// production use; may change.
struct UcxTestCounters {
  std::uint64_t eager_messages = 0;
  std::uint64_t rendezvous_messages = 0;
  // kRead/kWrite entries posted as UCX get/put, and as owner-placed
  // active messages (requester side).
  std::uint64_t one_sided_transfers = 0;
  std::uint64_t owner_placed_transfers = 0;
  // kRead/kWrite entries Submit copied on the caller's thread through the
  // shared-memory mapping (inline_copy_max_bytes); also in
  // one_sided_transfers.
  std::uint64_t inline_transfers = 0;
  // Connection requests the listener rejected under shared_memory_peers.
  std::uint64_t rejected_peers = 0;
  // Imported mappings populated (populate_imported_mappings): bytes of the
  // peer's resident pages whose page-table entries were filled, and bytes
  // skipped because the peer had not touched them.
  std::uint64_t populated_bytes = 0;
  std::uint64_t populate_skipped_bytes = 0;

  UcxTestCounters& operator+=(const UcxTestCounters& o) {
    eager_messages += o.eager_messages;
    rendezvous_messages += o.rendezvous_messages;
    one_sided_transfers += o.one_sided_transfers;
    owner_placed_transfers += o.owner_placed_transfers;
    inline_transfers += o.inline_transfers;
    rejected_peers += o.rejected_peers;
    populated_bytes += o.populated_bytes;
    populate_skipped_bytes += o.populate_skipped_bytes;
    return *this;
  }
};
// REQUIRES: `t` was made by CreateUcxTransport.
UcxTestCounters TEST_GetCounters(const transport::Transport& t);

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_TRANSPORT_H_
