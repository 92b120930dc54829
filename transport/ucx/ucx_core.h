// Internals of the UCX transport (transport/ucx/ucx_transport.h): the
// progress thread with its worker, and the state it keeps per endpoint and
// per batch. Not a public interface; only ucx_transport.cc uses it.
//
// A UcxCore is one UCP worker with its progress thread. A transport has
// UcxTransportOptions::workers of them; they share one UCP context and one
// CoreGroup (the grants, and the list of cores). Each core is shared
// (std::shared_ptr) by the Transport object and by the Endpoints and
// RemoteRegions made on it, so those may outlive the Transport; the
// Transport's destructor calls Shutdown() on every core, after which its
// worker is gone and every operation reports Unavailable. Methods marked
// "progress thread" may only run on the core's own progress thread (inside a
// task given to Post/RunSync, or a UCX callback).
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/copy_pool.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"
#include "transport/transfer_batch.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_am_rma.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_populate.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::ucx::internal {

// `s` if it is Unavailable, else Unavailable carrying its text.
// OK stays OK.
inline Status AsUnavailable(const Status& s) {
  return s.ok() || s.IsUnavailable() ? s : Status::Unavailable(s.ToString());
}

class UcxCore;
struct EpState;
struct Waiter;

// A remote key unpacked on one endpoint. `rkey` is touched only on the
// progress thread; it is reset when the endpoint closes or the RemoteRegion
// goes away, whichever is first.
struct RkeyHolder {
  UniqueRkey rkey;             // progress thread
  std::weak_ptr<EpState> ep;   // progress thread
  const EpState* ep_identity;  // immutable: which endpoint it belongs to
  std::uint64_t address = 0;   // immutable: remote address of the range
  std::uint64_t length = 0;    // immutable
  std::uint64_t grant_id = 0;  // immutable: the owner's name for the range
  // Immutable: kRead/kWrite use UCX's get/put (truly one-sided for this
  // range); otherwise the owner-placed protocol of ucx_am_rma.h.
  bool one_sided = false;

  // Where the range is mapped into this process (ucp_rkey_ptr succeeded:
  // memory UCX allocated, reached over shared memory), so that Submit can
  // copy small batches on the caller's thread (ucx_transport.h,
  // inline_copy_max_bytes). Null if it does not map, and set to null, under
  // an exclusive map_mu, before `rkey` is destroyed (which unmaps it);
  // inline copies hold map_mu shared while they touch the mapping.
  std::shared_mutex map_mu;
  std::byte* mapped = nullptr;  // guarded by map_mu

  // Progress thread: forgets the mapping, waiting for inline copies still
  // using it, then destroys the key.
  void Reset() {
    {
      std::unique_lock<std::shared_mutex> lock(map_mu);
      mapped = nullptr;
    }
    rkey.reset();
  }
};

// A local region as its owner-side protocol sees it (ucx_am_rma.h). Shared
// by the MemoryRegion and the grants made from it.
struct OwnedRegion {
  std::byte* base = nullptr;  // immutable
  std::uint64_t size = 0;     // immutable
  // Peers' operations placing into or sending from the region (on any of
  // the transport's workers), and who waits for them to drain once the
  // region is going away.
  Mutex mu;
  int active KVF_GUARDED_BY(mu) = 0;
  std::vector<std::shared_ptr<EpState>> active_eps KVF_GUARDED_BY(mu);
  std::shared_ptr<Waiter> drained KVF_GUARDED_BY(mu);
  // Guarded by CoreGroup::grants_mu: the grant id of each exported
  // (offset, length), so re-exporting a range reuses its grant.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> grant_ids;
};

// One exported range: what an owner-placed operation may touch.
struct Grant {
  std::shared_ptr<OwnedRegion> region;
  std::uint64_t offset = 0;  // within the region
  std::uint64_t length = 0;
};

// What the workers of one transport share: the grants (an owner-placed
// request arriving on any worker may name any region's grant) and the cores
// themselves (the listener hands connection requests to the next worker; a
// revoked region closes its users' endpoints on their own workers).
struct CoreGroup {
  Mutex grants_mu;
  std::unordered_map<std::uint64_t, Grant> grants KVF_GUARDED_BY(grants_mu);

  // Every worker's core in order, set by CreateUcxTransport before the
  // transport is handed out and read-only afterwards. Weak: cores own the
  // group.
  std::vector<std::weak_ptr<UcxCore>> cores;
  std::atomic<std::size_t> next_accept{0};

  // The next core in turn for an accepted connection; null if it is gone.
  std::shared_ptr<UcxCore> NextForAccept();
  // The core `raw` as a shared_ptr; null if gone or not in the group.
  std::shared_ptr<UcxCore> Find(const UcxCore* raw) const;
  // Whether the calling thread is one of the group's progress threads.
  bool OnAnyProgressThread() const;
};

// One connection. Created and closed on the progress thread.
struct EpState {
  EpState(UcxCore* core_in, std::string peer_in) : core(core_in), peer(std::move(peer_in)) {}

  UcxCore* const core;
  const std::string peer;

  // Progress thread only.
  ucp_ep_h ep = nullptr;                           // null once closed
  bool closed_locally = false;                     // Close/teardown, not a peer failure
  transport::Endpoint* owner = nullptr;            // for IncomingMessage::endpoint()
  std::unordered_set<void*> inflight;              // UCX requests posted on `ep`
  std::vector<std::shared_ptr<RkeyHolder>> rkeys;  // unpacked on `ep`
  // False until the flush that follows ucp_ep_create completed. Work that
  // sends on the endpoint waits in `deferred` until then (the UCX 1.13.1
  // accept-then-send workaround, see ucx_transport.h) and runs in order.
  bool ready = false;
  std::vector<std::function<void()>> deferred;
  // Owner-placed operations of this endpoint awaiting the owner's reply.
  std::unordered_set<std::uint64_t> awaiting;

  // OK while usable; the reason (Unavailable) once failed or closed.
  Status health() const {
    MutexLock lock(&mu);
    return failure;
  }
  // Keeps the first reason.
  void SetFailure(const Status& s) {
    MutexLock lock(&mu);
    if (failure.ok()) failure = s;
  }

 private:
  mutable Mutex mu;
  Status failure KVF_GUARDED_BY(mu);
};

// One entry of a batch, validated and resolved by the Endpoint.
struct PreparedTransfer {
  transport::TransferOp op = transport::TransferOp::kRead;
  std::byte* local = nullptr;
  std::uint64_t length = 0;
  std::shared_ptr<RkeyHolder> rkey;  // kRead/kWrite
  std::uint64_t remote_address = 0;  // kRead/kWrite: for UCX get/put
  std::uint64_t remote_offset = 0;   // kRead/kWrite: within the granted range
  std::string header;                // kSend, or the RmaRequest (kept until the send completes)
  // Transfer::checksum. Where the entry is copied through a mapping, the
  // copy sets landed_crc32c (MappedRange points its CopyRange::crc here).
  bool checksum = false;
  std::uint32_t landed_crc32c = 0;
  // What the entry completes with: landed_crc32c if it was asked for (the
  // caller knows the entry was copied through its mapping).
  std::optional<std::uint32_t> LandedCrc() const {
    return checksum ? std::optional<std::uint32_t>(landed_crc32c) : std::nullopt;
  }
};

// One Submit(). Fields below `completion` are progress-thread only.
struct BatchOp {
  std::shared_ptr<transport::BatchCompletion> completion;
  std::shared_ptr<EpState> ep;
  std::vector<PreparedTransfer> entries;

  bool started = false;
  bool cancelled = false;               // by the user: UCS_ERR_CANCELED means Cancelled
  std::vector<int> pending;             // outstanding completions per entry
  std::vector<Status> status;           // first failure per entry
  std::unordered_set<void*> requests;   // in flight, for Cancel
  std::vector<std::uint64_t> awaiting;  // per entry: owner-placed request id, 0 if none
};

// The copy `t` makes through its range's mapping (REQUIRES: t.rkey->mapped,
// held stable by the caller until the copy is done); checked into
// t.landed_crc32c when t.checksum.
CopyRange MappedRange(PreparedTransfer& t);

// The requester's record of one owner-placed operation awaiting its reply.
struct AwaitingRma {
  std::shared_ptr<BatchOp> op;
  std::size_t entry = 0;
  std::shared_ptr<EpState> ep;
};

// Completion of a one-off request driven by a caller thread (connect flush,
// graceful close).
struct Waiter {
  Mutex mu;
  CondVar cv;
  bool done KVF_GUARDED_BY(mu) = false;
  Status status KVF_GUARDED_BY(mu);
  void Set(Status s);
  // False at the deadline.
  bool WaitUntil(transport::Deadline deadline, Status* out);
};

using EndpointFactory =
    std::function<std::unique_ptr<transport::Endpoint>(std::shared_ptr<EpState>)>;

class UcxCore {
 public:
  // Creates the worker on `context` (or, if null, a new context from
  // `options`) and starts the progress thread. `group` is shared with the
  // transport's other cores.
  static StatusOr<std::shared_ptr<UcxCore>> Create(const UcxTransportOptions& options,
                                                   std::shared_ptr<CoreGroup> group,
                                                   std::shared_ptr<UcpContext> context);
  ~UcxCore();

  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  const UcxTransportOptions& options() const { return options_; }
  // Null after Shutdown().
  std::shared_ptr<UcpContext> context() const;
  std::size_t max_header_bytes() const { return max_header_bytes_; }

  // Any thread. Queues `fn` for the progress thread; false once shut down
  // (then `fn` is not run). From the progress thread it always queues; what
  // a queued task posts runs right after that task (see RunQueued).
  bool Post(std::function<void()> fn);
  // Any thread. As Post for rank 0; a higher rank queues `fn` as a ranked
  // task (UcxTransportOptions::max_rank_deferral): run when no plain task
  // waits, lowest rank then first posted, one per turn of the loop.
  bool PostRanked(std::uint32_t rank, std::function<void()> fn);
  // Any thread. Runs `fn` on the progress thread and waits for it (at once
  // when called there); false once shut down.
  bool RunSync(const std::function<void()>& fn);
  bool OnProgressThread() const;

  // Any thread but the progress thread. Force-closes every endpoint,
  // destroys the listener, stops the thread, destroys the worker and drops
  // this core's reference to the context. Idempotent.
  void Shutdown();

  // --- Progress thread only. ---
  void set_endpoint_factory(EndpointFactory f) { endpoint_factory_ = std::move(f); }
  // Creates the Endpoint object of `s` (accepted or connected) and records it
  // as `s`'s owner, so every message on `s` can be answered.
  std::unique_ptr<transport::Endpoint> MakeEndpoint(const std::shared_ptr<EpState>& s);
  void set_message_handler(transport::MessageHandler h) { message_handler_ = std::move(h); }
  // Every core of a listening transport has the accept handler: accepted
  // connections are spread over them.
  void set_accept_handler(transport::AcceptHandler h) { accept_handler_ = std::move(h); }
  // Listens with the accept handler already set (set_accept_handler).
  Status Listen(const std::string& address);
  // Creates a client endpoint and starts a flush whose outcome goes to `waiter`.
  StatusOr<std::shared_ptr<EpState>> Connect(const std::string& address,
                                             std::shared_ptr<Waiter> waiter);
  // Closes `s` (no-op if closed). Force cancels in-flight requests; graceful
  // flushes first. `by_user`: a Close or teardown (requests UCX cancels
  // complete Cancelled) rather than the peer's failure (Unavailable).
  // `waiter`, if set, learns when the close completed.
  void CloseEp(EpState& s, bool force, bool by_user, const Status& reason,
               std::shared_ptr<Waiter> waiter);
  void StartBatch(const std::shared_ptr<BatchOp>& op);
  void CancelBatch(const std::shared_ptr<BatchOp>& op);
  StatusOr<std::shared_ptr<RkeyHolder>> UnpackRkey(const std::shared_ptr<EpState>& s,
                                                   const std::string& packed, std::uint64_t address,
                                                   std::uint64_t length, std::uint64_t grant_id);
  void DestroyRkey(const std::shared_ptr<RkeyHolder>& holder);

  // Any thread: the owner side of exports (ucx_am_rma.h).
  // Names [offset, offset + length) of `region` for peers; the same range
  // of the same region gets the same id. REQUIRES: the range is in the region.
  std::uint64_t GrantRange(const std::shared_ptr<OwnedRegion>& region, std::uint64_t offset,
                           std::uint64_t length);
  // Revokes every grant of `region` and waits until no peer operation
  // places into or sends from it (force-closing, after `grace`, the
  // endpoints of those still running). Not on the progress thread.
  void RevokeRegion(const std::shared_ptr<OwnedRegion>& region, std::chrono::milliseconds grace);

  // Any thread.
  std::string listen_address() const;
  UcxTestCounters counters() const;
  // Any thread: copies `ranges` (through mappings the caller holds stable),
  // split across the copy pool (options().copy_threads), with streaming
  // stores when they add up to options().streaming_copy_min_bytes.
  // DataLoss if the memory of a range faulted (CopyPool::Copy).
  [[nodiscard]] Status CopyRanges(std::span<const CopyRange> ranges);
  // Any thread: populates `holder`'s mapping in the background, if it has
  // one and options().populate_imported_mappings (ucx_populate.h).
  void PopulateMapping(const std::shared_ptr<RkeyHolder>& holder);
  // Any thread: counts entries UcxEndpoint::Submit copied inline.
  void CountInline(std::uint64_t n) {
    inline_transfers_.fetch_add(n, std::memory_order_relaxed);
    one_sided_transfers_.fetch_add(n, std::memory_order_relaxed);
  }

 private:
  struct Req;
  class Incoming;

  UcxCore(const UcxTransportOptions& options, std::shared_ptr<CoreGroup> group);
  // Caller thread: the context. Progress thread: the worker (UCX 1.13
  // asserts that a single-threaded worker is used by the thread that made it).
  Status InitContext();
  Status InitWorker();
  void Loop(Waiter* started);
  // Runs every queued task; true if there was one.
  bool RunQueued();
  // Runs the ranked task due next (and what it posts) if any; true if it ran
  // one.
  bool RunOneRanked();
  // Runs `fn` as a task of the loop: what it posts runs right after it.
  void RunTask(std::function<void()>& fn);
  void TeardownOnProgressThread();
  void DrainAndDestroyWorker();
  void Register(const std::shared_ptr<EpState>& s);
  // Runs `fn` once `s` is ready (at once if it is; see EpState::ready).
  void WhenReady(EpState& s, std::function<void()> fn);
  // Flushes `s`'s endpoint; `done` runs on the progress thread (maybe inline).
  void FlushEp(const std::shared_ptr<EpState>& s, std::function<void(Status)> done);
  // Flushes a new endpoint, then marks it ready; `done` (if set) gets the outcome.
  void StartReadyFlush(const std::shared_ptr<EpState>& s, std::function<void(Status)> done);
  // Listener core: picks the core that accepts `request` (CoreGroup).
  void OnConnRequest(ucp_conn_request_h request);
  // Listener core: OK, or why a connection request from `peer` is refused
  // under options_.shared_memory_peers.
  Status AdmitPeer(const sockaddr_storage& peer) const;
  // The accepting core: creates the endpoint on its own worker. `listener`
  // is the core whose listener got the request (to reject it there).
  void Accept(ucp_conn_request_h request, const std::string& peer,
              const std::shared_ptr<UcxCore>& listener);
  // Listener core: refuses `request`.
  void Reject(ucp_conn_request_h request);
  ucs_status_t OnAm(const void* header, std::size_t header_length, void* data, std::size_t length,
                    const ucp_am_recv_param_t* param);
  // The endpoint a message came from, or null.
  std::shared_ptr<EpState> ReplyEp(const ucp_am_recv_param_t* param) const;
  // The Status of a failed request on `s`. UCS_ERR_CANCELED is Cancelled only
  // when the user cancelled (`user_cancelled`) or closed the endpoint;
  // otherwise UCX purged the request because the peer failed: Unavailable.
  Status EntryStatus(const EpState& s, ucs_status_t status, const char* what,
                     bool user_cancelled = false) const;
  void FinishEntry(BatchOp& op, std::size_t i, const Status& s,
                   std::optional<std::uint32_t> landed_crc32c = std::nullopt);

  // Requests (ucx_core_ops.cc). Every non-blocking call goes through
  // Track: it handles the three outcomes (done inline, error, in flight),
  // including a completion callback that ran before the call returned.
  Req* NewReq(std::shared_ptr<EpState> ep, std::shared_ptr<BatchOp> op,
              std::function<void(ucs_status_t, std::size_t)> done);
  void Track(Req* r, ucs_status_ptr_t request, std::size_t inline_length);
  void FinishReq(Req* r, void* request, ucs_status_t status, std::size_t length);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, std::size_t length, void* user_data);
  static void FillParam(Req* r, ucp_request_param_t* p, bool recv);

  // Owner-placed kRead/kWrite (ucx_am_rma.cc).
  void PostRmaRequest(const std::shared_ptr<BatchOp>& op, std::size_t i);
  void FailAwaiting(EpState& s, const Status& why);
  void CancelAwaiting(BatchOp& op);
  ucs_status_t OnRmaRequest(bool write, const void* header, std::size_t header_length, void* data,
                            std::size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t OnRmaReply(const void* header, std::size_t header_length, void* data,
                          std::size_t length, const ucp_am_recv_param_t* param);
  void SendRmaReply(const std::shared_ptr<EpState>& s, std::uint64_t request_id, StatusCode code,
                    const std::shared_ptr<OwnedRegion>& region, const std::byte* data,
                    std::uint64_t length);
  void EndRegionOp(const std::shared_ptr<OwnedRegion>& region, const std::shared_ptr<EpState>& s);
  // The region and the address of [offset, offset + length) of grant `id`,
  // or the refusal.
  StatusCode ResolveGrant(std::uint64_t id, std::uint64_t offset, std::uint64_t length,
                          std::shared_ptr<OwnedRegion>* region, std::byte** at);

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnConnRequestThunk(ucp_conn_request_h request, void* arg);
  static ucs_status_t OnAmThunk(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnRmaWriteThunk(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* param);
  static ucs_status_t OnRmaReadThunk(void* arg, const void* header, std::size_t header_length,
                                     void* data, std::size_t length,
                                     const ucp_am_recv_param_t* param);
  static ucs_status_t OnRmaReplyThunk(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* param);

  const UcxTransportOptions options_;
  // Populates imported mappings (options_.populate_imported_mappings).
  MappingPopulator populator_;
  const std::shared_ptr<CoreGroup> group_;
  const bool rdma_configured_;  // options_.tls names an RDMA transport
  // options_.tls uses shared memory and shared_memory_peers is kSameUser.
  const bool same_user_peers_only_;
  // The listener's port, once listening (read by OnConnRequest).
  std::atomic<std::uint16_t> listen_port_{0};
  CopyPool copy_pool_;  // options_.copy_threads helpers (0: copies alone)
  std::size_t max_header_bytes_ = transport::kMaxMessageHeaderBytes;
  int efd_ = -1;

  mutable Mutex mu_;
  std::shared_ptr<UcpContext> context_ KVF_GUARDED_BY(mu_);  // reset by Shutdown
  UniqueWorker worker_;  // set before the thread starts; then progress thread (signals under mu_)
  bool stopping_ KVF_GUARDED_BY(mu_) = false;
  bool worker_alive_ KVF_GUARDED_BY(mu_) = false;  // ucp_worker_signal allowed
  // Tasks for the progress thread, swapped into running_ (the progress
  // thread's own) and run there; both keep their capacity, so the loop
  // allocates nothing once warm (a deque allocated on every construction).
  std::vector<std::function<void()>> queue_ KVF_GUARDED_BY(mu_);
  std::vector<std::function<void()>> running_;
  // Progress thread only: while a task of running_ runs (in_task_), what it
  // posts goes to its_posts_ and runs right after it, before the rest of the
  // batch: a kFetch's copy completes by posting its reply's send, and a
  // daemon with four requests queued sent every reply only after the fourth
  // copy (layer 0 of a 32-layer load: the first daemon's replies reached the
  // client 0.3-1.1 ms after their copies). Tasks those post are queued as
  // usual, so a task that posts itself again cannot keep the thread from
  // ucp_worker_progress.
  bool in_task_ = false;
  std::vector<std::function<void()>> its_posts_;
  std::vector<std::function<void()>> running_posts_;
  // PostRanked's tasks, in posting order (a handful: one per batch a peer's
  // requests left queued, which the daemon's per-peer bound limits).
  struct RankedTask {
    std::uint32_t rank = 0;
    transport::Clock::time_point queued;
    std::function<void()> fn;
  };
  std::vector<RankedTask> ranked_ KVF_GUARDED_BY(mu_);
  std::string listen_address_ KVF_GUARDED_BY(mu_);
  std::thread thread_;
  std::once_flag shutdown_once_;
  // Written once by the progress thread at start; read by OnProgressThread.
  // seq_cst (default) is fine: it is read rarely.
  std::atomic<std::thread::id> progress_thread_id_{};

  // Progress thread only.
  UniqueListener listener_;
  transport::AcceptHandler accept_handler_;
  transport::MessageHandler message_handler_;
  EndpointFactory endpoint_factory_;
  std::unordered_map<ucp_ep_h, std::shared_ptr<EpState>> eps_;
  // Every UCX request in flight with its context (close requests with a
  // null context). While any is in flight the loop sleeps at most
  // options_.active_poll_interval; the drain at shutdown waits for them.
  std::unordered_map<void*, Req*> requests_;
  // Owner-placed operations awaiting their reply, by request id.
  std::unordered_map<std::uint64_t, AwaitingRma> awaiting_;
  std::uint64_t next_rma_id_ = 1;

  // Test counters, relaxed: monotonic tallies read only by tests.
  std::atomic<std::uint64_t> eager_messages_{0};
  std::atomic<std::uint64_t> rendezvous_messages_{0};
  std::atomic<std::uint64_t> one_sided_transfers_{0};
  std::atomic<std::uint64_t> owner_placed_transfers_{0};
  std::atomic<std::uint64_t> inline_transfers_{0};
  std::atomic<std::uint64_t> rejected_peers_{0};
};

// The user_data of every UCX request but close: owned by the core from
// NewReq until FinishReq deletes it.
struct UcxCore::Req {
  UcxCore* core = nullptr;
  std::shared_ptr<EpState> ep;  // tracked in ep->inflight if set
  std::shared_ptr<BatchOp> op;  // tracked in op->requests if set
  std::function<void(ucs_status_t, std::size_t)> done;
  // The callback ran while the call that posted the request had not yet
  // returned (UCX does this, e.g. on a failed endpoint): Track finishes it.
  bool posting = true;
  bool completed_early = false;
  ucs_status_t early_status = UCS_OK;
  std::size_t early_length = 0;
};

}  // namespace kvfabric::ucx::internal

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_
