// Internals of the UCX transport (transport/ucx/ucx_transport.h): the
// progress thread with its worker, and the state it keeps per endpoint and
// per batch. Not a public interface; only ucx_transport.cc uses it.
//
// UcxCore is shared (std::shared_ptr) by the Transport object, every
// Endpoint and every RemoteRegion, so those may outlive the Transport; the
// Transport's destructor calls Shutdown(), after which the worker is gone and
// every operation reports Unavailable. Methods marked "progress thread" may
// only run there (inside a task given to Post/RunSync, or a UCX callback).
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "transport/transfer_batch.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::ucx::internal {

// The one active-message id kvfabric uses.
inline constexpr unsigned kAmId = 0x4b56;

// `s` if it is Unavailable, else Unavailable carrying its text.
// OK stays OK.
inline Status AsUnavailable(const Status& s) {
  return s.ok() || s.IsUnavailable() ? s : Status::Unavailable(s.ToString());
}

class UcxCore;
struct EpState;

// A remote key unpacked on one endpoint. `rkey` is touched only on the
// progress thread; it is reset when the endpoint closes or the RemoteRegion
// goes away, whichever is first.
struct RkeyHolder {
  UniqueRkey rkey;             // progress thread
  std::weak_ptr<EpState> ep;   // progress thread
  const EpState* ep_identity;  // immutable: which endpoint it belongs to
  std::uint64_t address = 0;   // immutable: remote address of the range
  std::uint64_t length = 0;    // immutable
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

  // OK while usable; the reason (Unavailable) once failed or closed.
  Status health() const {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  // Keeps the first reason.
  void SetFailure(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.ok()) failure = s;
  }

 private:
  mutable std::mutex mu;
  Status failure;  // guarded by mu
};

// One entry of a batch, validated and resolved by the Endpoint.
struct PreparedTransfer {
  transport::TransferOp op = transport::TransferOp::kRead;
  std::byte* local = nullptr;
  std::uint64_t length = 0;
  std::shared_ptr<RkeyHolder> rkey;  // kRead/kWrite
  std::uint64_t remote_address = 0;  // kRead/kWrite
  std::string header;                // kSend (kept alive until the send completes)
};

// One Submit(). Fields below `completion` are progress-thread only.
struct BatchOp {
  std::shared_ptr<transport::BatchCompletion> completion;
  std::shared_ptr<EpState> ep;
  std::vector<PreparedTransfer> entries;

  bool started = false;
  bool cancelled = false;
  std::vector<int> pending;            // outstanding UCX completions per entry
  std::vector<Status> status;          // first failure per entry
  std::unordered_set<void*> requests;  // in flight, for Cancel
};

// Completion of a one-off request driven by a caller thread (connect flush,
// graceful close).
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  Status status;      // guarded by mu
  void Set(Status s);
  // False at the deadline.
  bool WaitUntil(transport::Deadline deadline, Status* out);
};

using EndpointFactory =
    std::function<std::unique_ptr<transport::Endpoint>(std::shared_ptr<EpState>)>;

class UcxCore {
 public:
  // Creates the context and worker and starts the progress thread.
  static StatusOr<std::shared_ptr<UcxCore>> Create(const UcxTransportOptions& options);
  ~UcxCore();

  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  const UcxTransportOptions& options() const { return options_; }
  // Null after Shutdown().
  std::shared_ptr<UcpContext> context() const;
  std::size_t max_header_bytes() const { return max_header_bytes_; }

  // Any thread. Queues `fn` for the progress thread; false once shut down
  // (then `fn` is not run). From the progress thread it always queues.
  bool Post(std::function<void()> fn);
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
  void set_message_handler(transport::MessageHandler h) { message_handler_ = std::move(h); }
  Status Listen(const std::string& address, transport::AcceptHandler on_accept);
  // Creates a client endpoint and starts a flush whose outcome goes to `waiter`.
  StatusOr<std::shared_ptr<EpState>> Connect(const std::string& address,
                                             std::shared_ptr<Waiter> waiter);
  // Closes `s` (no-op if closed). Force cancels in-flight requests; graceful
  // flushes first. `waiter`, if set, learns when the close completed.
  void CloseEp(EpState& s, bool force, const Status& reason, std::shared_ptr<Waiter> waiter);
  void StartBatch(const std::shared_ptr<BatchOp>& op);
  void CancelBatch(const std::shared_ptr<BatchOp>& op);
  StatusOr<std::shared_ptr<RkeyHolder>> UnpackRkey(const std::shared_ptr<EpState>& s,
                                                   const std::string& packed, std::uint64_t address,
                                                   std::uint64_t length);
  void DestroyRkey(const std::shared_ptr<RkeyHolder>& holder);

  // Any thread.
  std::string listen_address() const;
  UcxTestCounters counters() const;

 private:
  struct OpCtx;
  struct RecvCtx;
  struct FlushCtx;
  class Incoming;

  explicit UcxCore(const UcxTransportOptions& options);
  // Caller thread: the context. Progress thread: the worker (UCX 1.13
  // asserts that a single-threaded worker is used by the thread that made it).
  Status InitContext();
  Status InitWorker();
  void Loop(Waiter* started);
  // Runs every queued task; true if there was one.
  bool RunQueued();
  void TeardownOnProgressThread();
  void DrainAndDestroyWorker();
  void Register(const std::shared_ptr<EpState>& s);
  // Flushes `s`'s endpoint; `done` runs on the progress thread (maybe inline).
  void FlushEp(const std::shared_ptr<EpState>& s, std::function<void(Status)> done);
  void OnConnRequest(ucp_conn_request_h request);
  ucs_status_t OnAm(const void* header, std::size_t header_length, void* data, std::size_t length,
                    const ucp_am_recv_param_t* param);
  // The Status of a failed request on `s`.
  Status EntryStatus(const EpState& s, ucs_status_t status, const char* what) const;
  void FinishEntry(BatchOp& op, std::size_t i, const Status& s);

  static void OnOpDone(void* request, ucs_status_t status, void* user_data);
  static void OnFlushDone(void* request, ucs_status_t status, void* user_data);
  static void OnCloseDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, std::size_t length, void* user_data);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnConnRequestThunk(ucp_conn_request_h request, void* arg);
  static ucs_status_t OnAmThunk(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* param);

  const UcxTransportOptions options_;
  std::size_t max_header_bytes_ = transport::kMaxMessageHeaderBytes;
  int efd_ = -1;

  mutable std::mutex mu_;
  std::shared_ptr<UcpContext> context_;  // guarded by mu_ (reset by Shutdown)
  UniqueWorker worker_;    // set before the thread starts; then progress thread (signals under mu_)
  bool stopping_ = false;  // guarded by mu_
  bool worker_alive_ = false;                // guarded by mu_: ucp_worker_signal allowed
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  std::string listen_address_;               // guarded by mu_
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
  std::unordered_set<void*> other_requests_;  // close/flush/recv requests in flight
  // Batch and receive requests posted and not yet completed: while any is
  // in flight the loop sleeps at most options_.active_poll_interval.
  std::int64_t inflight_requests_ = 0;

  // Test counters, relaxed: monotonic tallies read only by tests.
  std::atomic<std::uint64_t> eager_messages_{0};
  std::atomic<std::uint64_t> rendezvous_messages_{0};
};

// Request contexts: the user_data of UCX requests, owned by the request
// until its completion callback (or its inline completion) deletes them.
struct UcxCore::OpCtx {
  std::shared_ptr<BatchOp> op;
  std::vector<std::size_t> entries;  // entries this request counts for
  const char* what;                  // the UCX call, for messages
  void* request = nullptr;
};

struct UcxCore::FlushCtx {
  std::shared_ptr<EpState> ep;
  std::function<void(Status)> done;
  void* request = nullptr;
};

struct UcxCore::RecvCtx {
  UcxCore* core;
  std::function<void(Status)> on_placed;
  void* request = nullptr;
};

}  // namespace kvfabric::ucx::internal

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_CORE_H_
