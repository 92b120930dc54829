#include "transport/ucx/ucx_core.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/mutex.h"
#include "core/socket_address.h"
#include "core/socket_owner.h"
#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx::internal {

using transport::BatchCompletion;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::MemoryRegion;
using transport::TransferOp;

void Waiter::Set(Status s) {
  MutexLock lock(&mu);
  if (done) return;
  done = true;
  status = std::move(s);
  cv.NotifyAll();
}

bool Waiter::WaitUntil(transport::Deadline deadline, Status* out) {
  MutexLock lock(&mu);
  if (!cv.WaitUntil(&mu, deadline, [this]() KVF_REQUIRES(mu) { return done; })) return false;
  *out = status;
  return true;
}

// ---------------------------------------------------------------------------
// Construction, the progress loop, shutdown.

static bool NamesRdma(const std::string& tls);

UcxCore::UcxCore(const UcxTransportOptions& options, std::shared_ptr<CoreGroup> group)
    : options_(options),
      group_(std::move(group)),
      rdma_configured_(NamesRdma(options.tls)),
      same_user_peers_only_(options.shared_memory_peers == SharedMemoryPeers::kSameUser &&
                            TlsUsesSharedMemory(options.tls)),
      copy_pool_(std::max(0, options.copy_threads)) {}

StatusOr<std::shared_ptr<UcxCore>> UcxCore::Create(const UcxTransportOptions& options,
                                                   std::shared_ptr<CoreGroup> group,
                                                   std::shared_ptr<UcpContext> context) {
  std::shared_ptr<UcxCore> core(new UcxCore(options, std::move(group)));
  if (context) {
    MutexLock lock(&core->mu_);  // no other thread yet; for the analysis
    core->context_ = std::move(context);
  } else {
    KVF_RETURN_IF_ERROR(core->InitContext());
  }
  Waiter started;
  core->thread_ = std::thread([c = core.get(), &started] { c->Loop(&started); });
  Status st;
  started.WaitUntil(transport::Deadline::max(), &st);
  if (!st.ok()) {
    core->thread_.join();
    return st;
  }
  return core;
}

static bool NamesSharedMemory(const std::string& tls) {
  for (const char* tl : {"sm", "mm", "posix", "sysv", "cma", "all"}) {
    const std::size_t at = tls.find(tl);
    if (at != std::string::npos) return true;
  }
  return false;
}

// Does the UCX transport list name an RDMA transport with one-sided RMA
// (UCX's names: rc, rc_v, rc_x, rc_verbs, rc_mlx5, dc, dc_x, dc_mlx5, ib)?
static bool NamesRdma(const std::string& tls) {
  if (!tls.empty() && tls.front() == '^') return false;  // an exclusion list
  std::size_t start = 0;
  while (start <= tls.size()) {
    std::size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    const std::string item = tls.substr(start, end - start);
    if (item == "ib" || item.rfind("rc", 0) == 0 || item.rfind("dc", 0) == 0) return true;
    start = end + 1;
  }
  return false;
}

Status UcxCore::InitContext() {
  // UCX's messages go to the process's logger from here on (not to stdout,
  // where a daemon's buffered output held them until exit), and a list naming
  // transports this machine lacks gets one warning saying which.
  RouteUcxLogs(options_.log_sink);
  (void)WarnAboutMissingUcxTransports(options_.tls, options_.tls_setting);
  ucp_config_t* raw_config = nullptr;
  // ucp_config_read also applies UCX_* variables of the process environment;
  // every key this transport depends on is then overridden below from Options.
  KVF_RETURN_IF_ERROR(
      StatusFromUcs(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read"));
  UniqueConfig config(raw_config);
  auto modify = [&](const char* key, const std::string& value) -> Status {
    return StatusFromUcs(ucp_config_modify(config.get(), key, value.c_str()),
                         std::string("ucp_config_modify(") + key + "=" + value + ")");
  };
  KVF_RETURN_IF_ERROR(modify("TLS", options_.tls));
  if (!options_.net_devices.empty())
    KVF_RETURN_IF_ERROR(modify("NET_DEVICES", options_.net_devices));
  // Without these two, UCP_ERR_HANDLING_MODE_PEER silently excludes the
  // shared-memory transports: mm (sysv/posix) needs MM_ERROR_HANDLING, and
  // CMA is used for rendezvous only if its memory domain claims
  // invalidation, which its MEMORY_INVALIDATE key turns on. The key is named
  // without the CMA_ prefix here: ucp_config_modify in UCX 1.13 matches
  // only a field's own name (and sub-table prefixes such as MM_), so
  // "CMA_MEMORY_INVALIDATE" matched nothing, UCX warned "invalid
  // configuration" and CMA stayed off (the UCX_CMA_MEMORY_INVALIDATE
  // environment variable does take the prefix). Measured with CMA on:
  // owner-placed writes on caller memory over shared memory 2 -> 4-6 GB/s.
  // Set only when the list has shared memory: UCX warns about keys no
  // transport of the list uses.
  if (NamesSharedMemory(options_.tls)) {
    KVF_RETURN_IF_ERROR(modify("MM_ERROR_HANDLING", "y"));
    KVF_RETURN_IF_ERROR(modify("MEMORY_INVALIDATE", "y"));
  }
  // UCX 1.13.1's protocol v2 shares the accept-then-AM hang (see the header).
  KVF_RETURN_IF_ERROR(modify("PROTO_ENABLE", "n"));
  // Listeners bind with SO_REUSEADDR: a daemon restarted after a crash gets
  // its port back at once instead of failing with "Device is busy" for as
  // long as its old connections sit in TIME-WAIT (about a minute). The key is
  // the connection managers' (UCX_TCP_CM_REUSEADDR in the environment): UCP
  // applies it to each CM's config, whose table nests it under "CM_";
  // "TCP_CM_REUSEADDR" and "REUSEADDR" match nothing there.
  KVF_RETURN_IF_ERROR(modify("CM_REUSEADDR", "y"));
  for (const auto& [k, v] : options_.ucx_config) KVF_RETURN_IF_ERROR(modify(k.c_str(), v));

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  // Memory is mapped and keys packed from caller threads while the progress
  // thread uses the worker: this makes UCX lock its context-level state.
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_init(&params, config.get(), &context), "ucp_init"));
  MutexLock lock(&mu_);  // no other thread yet (Create); for the analysis
  context_ = std::make_shared<UcpContext>(context);
  return Status::OK();
}

Status UcxCore::InitWorker() {
  ucp_worker_params_t wp = {};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  std::shared_ptr<UcpContext> context;
  {
    MutexLock lock(&mu_);  // Shutdown cannot run yet (Create waits for the start)
    context = context_;
  }
  ucp_worker_h worker = nullptr;
  KVF_RETURN_IF_ERROR(
      StatusFromUcs(ucp_worker_create(context->get(), &wp, &worker), "ucp_worker_create"));
  worker_.reset(worker);

  ucp_worker_attr_t attr = {};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_worker_query(worker, &attr), "ucp_worker_query"));
  max_header_bytes_ = std::min<std::size_t>(attr.max_am_header, transport::kMaxMessageHeaderBytes);

  KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_worker_get_efd(worker, &efd_), "ucp_worker_get_efd"));

  ucp_am_handler_param_t hp = {};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  hp.arg = this;
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kAmId, &UcxCore::OnAmThunk},
      {kRmaWriteAmId, &UcxCore::OnRmaWriteThunk},
      {kRmaReadAmId, &UcxCore::OnRmaReadThunk},
      {kRmaReplyAmId, &UcxCore::OnRmaReplyThunk},
  };
  for (const auto& [id, cb] : handlers) {
    hp.id = id;
    hp.cb = cb;
    KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_worker_set_am_recv_handler(worker, &hp),
                                      "ucp_worker_set_am_recv_handler"));
  }
  return Status::OK();
}

UcxCore::~UcxCore() {
  Shutdown();
  // A core whose Init failed never started the thread; its worker (if any)
  // is destroyed by worker_'s destructor here, before context_.
}

std::shared_ptr<UcpContext> UcxCore::context() const {
  MutexLock lock(&mu_);
  return context_;
}

bool UcxCore::OnProgressThread() const {
  return progress_thread_id_.load() == std::this_thread::get_id();
}

bool UcxCore::Post(std::function<void()> fn) {
  const bool here = OnProgressThread();
  if (here && in_task_) {
    // Inside a task of RunQueued, which runs it next.
    its_posts_.push_back(std::move(fn));
    return true;
  }
  MutexLock lock(&mu_);
  if (!worker_alive_ || (stopping_ && !here)) return false;
  queue_.push_back(std::move(fn));
  // Signalled under mu_ so the worker cannot be destroyed meanwhile.
  if (!here) (void)ucp_worker_signal(worker_.get());
  return true;
}

bool UcxCore::PostRanked(std::uint32_t rank, std::function<void()> fn) {
  if (rank == 0) return Post(std::move(fn));
  const bool here = OnProgressThread();
  MutexLock lock(&mu_);
  if (!worker_alive_ || (stopping_ && !here)) return false;
  ranked_.push_back(RankedTask{rank, transport::Clock::now(), std::move(fn)});
  if (!here) (void)ucp_worker_signal(worker_.get());
  return true;
}

bool UcxCore::RunSync(const std::function<void()>& fn) {
  if (OnProgressThread()) {
    fn();
    return true;
  }
  auto w = std::make_shared<Waiter>();
  if (!Post([&fn, w] {
        fn();
        w->Set(Status::OK());
      })) {
    return false;
  }
  Status ignored;
  // The loop runs every queued task before it exits, so this returns.
  w->WaitUntil(transport::Deadline::max(), &ignored);
  return true;
}

bool UcxCore::RunQueued() {
  bool ran = false;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (queue_.empty()) return ran;
      running_.swap(queue_);
    }
    ran = true;
    for (auto& fn : running_) RunTask(fn);
    running_.clear();
  }
}

void UcxCore::RunTask(std::function<void()>& fn) {
  in_task_ = true;
  fn();
  in_task_ = false;
  // What it posted, now; what those post is queued (in_task_ is off).
  running_posts_.swap(its_posts_);
  for (auto& posted : running_posts_) posted();
  running_posts_.clear();
}

bool UcxCore::RunOneRanked() {
  std::function<void()> fn;
  {
    MutexLock lock(&mu_);
    if (ranked_.empty()) return false;
    // The first posted of the lowest rank (ranked_ is in posting order),
    // unless the first posted of all has waited its bound.
    std::size_t best = 0;
    for (std::size_t i = 1; i < ranked_.size(); ++i) {
      if (ranked_[i].rank < ranked_[best].rank) best = i;
    }
    if (transport::Clock::now() - ranked_.front().queued >= options_.max_rank_deferral) best = 0;
    fn = std::move(ranked_[best].fn);
    ranked_.erase(ranked_.begin() + static_cast<std::ptrdiff_t>(best));
  }
  RunTask(fn);
  return true;
}

void UcxCore::Loop(Waiter* started) {
  progress_thread_id_.store(std::this_thread::get_id());
  Status init = InitWorker();
  if (!init.ok()) {
    listener_.reset();
    worker_.reset();
    started->Set(init);
    return;
  }
  {
    MutexLock lock(&mu_);
    worker_alive_ = true;
  }
  started->Set(Status::OK());
  ucp_worker_h worker = worker_.get();
  // Wake-ups: the event fd reports arrivals, but not that a peer drained a
  // queue our sends were blocked on (UCX's shared-memory FIFO and TCP send
  // path have no such event), nor that an owner-side reply of an emulated
  // get/put was held back. So while work is in flight or was seen within
  // active_window, sleeps are capped at active_poll_interval; after a burst
  // the thread first spins for progress_spin (see UcxTransportOptions).
  auto last_activity = transport::Clock::now();
  for (;;) {
    const bool ran = RunQueued();
    // Bounded so queued work is not starved by a stream of events.
    int events = 0;
    while (events < 256 && ucp_worker_progress(worker) != 0) ++events;
    {
      MutexLock lock(&mu_);
      if (!queue_.empty()) continue;
      if (stopping_) break;
    }
    // One ranked task per turn: arrivals during it are ranked before the
    // next (they went through ucp_worker_progress first).
    if (RunOneRanked()) {
      last_activity = transport::Clock::now();
      continue;
    }
    const auto now = transport::Clock::now();
    if (ran || events > 0) last_activity = now;
    const bool busy = !requests_.empty() || !awaiting_.empty();
    if (busy && now - last_activity < options_.progress_spin) continue;
    const bool active = busy || now - last_activity < options_.active_window;
    const ucs_status_t armed = ucp_worker_arm(worker);
    if (armed == UCS_ERR_BUSY) continue;  // events pending: progress again
    {
      // A task queued before ucp_worker_arm may have had its signal consumed
      // by the arm: look at the queue once more before sleeping.
      MutexLock lock(&mu_);
      if (!queue_.empty() || !ranked_.empty() || stopping_) continue;
    }
    pollfd pfd = {};
    pfd.fd = efd_;
    pfd.events = POLLIN;
    std::chrono::microseconds cap = armed == UCS_OK
                                        ? std::chrono::microseconds(options_.idle_poll_timeout)
                                        : std::chrono::microseconds(1000);
    if (active) cap = std::min(cap, options_.active_poll_interval);
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(cap);
    timespec ts = {};
    ts.tv_sec = static_cast<time_t>(secs.count());
    ts.tv_nsec = static_cast<long>(std::chrono::nanoseconds(cap - secs).count());
    (void)ppoll(&pfd, 1, &ts, nullptr);
  }
  DrainAndDestroyWorker();
}

void UcxCore::DrainAndDestroyWorker() {
  ucp_worker_h worker = worker_.get();
  const auto deadline = transport::Clock::now() + options_.shutdown_drain_timeout;
  while (!requests_.empty() && transport::Clock::now() < deadline) {
    RunQueued();
    while (RunOneRanked()) {
    }
    if (ucp_worker_progress(worker) == 0) {
      pollfd pfd = {efd_, POLLIN, 0};
      if (ucp_worker_arm(worker) == UCS_OK) (void)poll(&pfd, 1, 10);
    }
  }
  RunQueued();
  while (RunOneRanked()) RunQueued();
  // Requests UCX never completed: released to UCX (which then calls no
  // callback and frees them with the worker); their contexts are finished
  // here, completing what waits on them.
  while (!requests_.empty()) {
    auto [request, req] = *requests_.begin();
    FinishReq(req, request, UCS_ERR_CANCELED, 0);
  }
  for (auto& [id, a] : awaiting_) {
    a.op->completion->Complete(a.entry, Status::Cancelled("the UCX transport was destroyed"), 0);
  }
  awaiting_.clear();
  listener_.reset();
  {
    MutexLock lock(&mu_);
    worker_alive_ = false;
    queue_.clear();
    ranked_.clear();
  }
  worker_.reset();
}

void UcxCore::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!thread_.joinable()) return;
    RunSync([this] { TeardownOnProgressThread(); });
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      (void)ucp_worker_signal(worker_.get());
    }
    thread_.join();
    MutexLock lock(&mu_);
    context_.reset();
  });
}

void UcxCore::TeardownOnProgressThread() {
  listener_.reset();
  accept_handler_ = nullptr;
  message_handler_ = nullptr;
  std::vector<std::shared_ptr<EpState>> all;
  for (auto& [ep, s] : eps_) all.push_back(s);
  for (auto& s : all) {
    s->owner = nullptr;
    CloseEp(*s, /*force=*/true, /*by_user=*/true,
            Status::Unavailable("the UCX transport was destroyed"), nullptr);
  }
}

// ---------------------------------------------------------------------------
// Endpoints.

void UcxCore::Register(const std::shared_ptr<EpState>& s) { eps_[s->ep] = s; }

void UcxCore::OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* s = static_cast<EpState*>(arg);
  s->SetFailure(AsUnavailable(StatusFromUcs(status, "peer " + s->peer + " failed")));
  // UCX requires closing a failed endpoint; not from inside its callback.
  UcxCore* core = s->core;
  auto it = std::find_if(core->eps_.begin(), core->eps_.end(),
                         [s](const auto& kv) { return kv.second.get() == s; });
  if (it == core->eps_.end()) return;
  std::shared_ptr<EpState> keep = it->second;
  core->Post([core, keep] {
    core->CloseEp(*keep, /*force=*/true, /*by_user=*/false, keep->health(), nullptr);
  });
}

Status UcxCore::Listen(const std::string& address) {
  if (listener_) return Status::FailedPrecondition("already listening on " + listen_address());
  sockaddr_storage sa;
  socklen_t len = 0;
  KVF_RETURN_IF_ERROR(ParseSocketAddress(address, &sa, &len));
  ucp_listener_params_t p = {};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  p.sockaddr.addrlen = len;
  p.conn_handler.cb = &UcxCore::OnConnRequestThunk;
  p.conn_handler.arg = this;
  ucp_listener_h listener = nullptr;
  KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_listener_create(worker_.get(), &p, &listener),
                                    "ucp_listener_create(" + address + ")"));
  listener_.reset(listener);
  ucp_listener_attr_t attr = {};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  KVF_RETURN_IF_ERROR(StatusFromUcs(ucp_listener_query(listener, &attr), "ucp_listener_query"));
  std::uint16_t port = 0;
  if (attr.sockaddr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  } else if (attr.sockaddr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  }
  listen_port_.store(port);
  MutexLock lock(&mu_);
  listen_address_ = FormatSocketAddress(attr.sockaddr);
  return Status::OK();
}

std::string UcxCore::listen_address() const {
  MutexLock lock(&mu_);
  return listen_address_;
}

void UcxCore::OnConnRequestThunk(ucp_conn_request_h request, void* arg) {
  static_cast<UcxCore*>(arg)->OnConnRequest(request);
}

Status UcxCore::AdmitPeer(const sockaddr_storage& peer) const {
  if (!same_user_peers_only_ || !AddressIsOnThisHost(peer)) return Status::OK();
  StatusOr<std::uint32_t> owner = TcpPeerSocketOwner(peer, listen_port_.load());
  const std::uint32_t self = static_cast<std::uint32_t>(geteuid());
  if (!owner.ok()) {
    return Status::PermissionDenied(
        "a peer on this host whose user cannot be established (" +
        std::string(owner.status().message()) +
        "), and shared memory is only for processes of this process's user (uid " +
        std::to_string(self) + ")");
  }
  if (*owner != self) {
    return Status::PermissionDenied(
        "its socket belongs to uid " + std::to_string(*owner) + ", this process runs as uid " +
        std::to_string(self) +
        ": shared memory is only for processes of one user (a peer could crash this one by "
        "truncating what it shared)");
  }
  return Status::OK();
}

void UcxCore::OnConnRequest(ucp_conn_request_h request) {
  std::string peer = "unknown";
  ucp_conn_request_attr_t attr = {};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  const bool known = ucp_conn_request_query(request, &attr) == UCS_OK;
  if (known) peer = FormatSocketAddress(attr.client_address);
  if (!accept_handler_ || !endpoint_factory_) {
    Reject(request);
    return;
  }
  // Before UCX wires up a lane (and attaches the peer's shared memory).
  const Status admitted = !same_user_peers_only_ ? Status::OK()
                          : known                ? AdmitPeer(attr.client_address)
                                  : Status::PermissionDenied("the peer's address is unknown");
  if (!admitted.ok()) {
    rejected_peers_.fetch_add(1, std::memory_order_relaxed);
    if (options_.on_rejected_peer) options_.on_rejected_peer(peer, admitted);
    Reject(request);
    return;
  }
  // UCX lets a connection request be accepted on any worker of the context
  // (ucp_listener_conn_handler_t): the next core in turn creates the
  // endpoint on its own worker and thread.
  std::shared_ptr<UcxCore> self = group_->Find(this);
  std::shared_ptr<UcxCore> target = group_->NextForAccept();
  if (!target || target.get() == this) {
    Accept(request, peer, self);
    return;
  }
  if (!target->Post([t = target.get(), request, peer, self] { t->Accept(request, peer, self); })) {
    Reject(request);  // that worker is shutting down
  }
}

void UcxCore::Reject(ucp_conn_request_h request) {
  if (listener_) (void)ucp_listener_reject(listener_.get(), request);
}

void UcxCore::Accept(ucp_conn_request_h request, const std::string& peer,
                     const std::shared_ptr<UcxCore>& listener) {
  if (!accept_handler_ || !endpoint_factory_) {
    // Torn down meanwhile: the listener's core refuses it.
    if (listener && listener.get() != this) {
      listener->Post([l = listener.get(), request] { l->Reject(request); });
    } else {
      Reject(request);
    }
    return;
  }
  auto s = std::make_shared<EpState>(this, peer);
  ucp_ep_params_t p = {};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.conn_request = request;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &UcxCore::OnEpError;
  p.err_handler.arg = s.get();
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(worker_.get(), &p, &ep) != UCS_OK) return;  // UCX rejects it
  s->ep = ep;
  Register(s);
  // The Endpoint exists from here on, so a message arriving at once can be
  // answered; sends on it wait for the flush (StartReadyFlush).
  std::unique_ptr<Endpoint> endpoint = MakeEndpoint(s);
  StartReadyFlush(s, nullptr);
  accept_handler_(std::move(endpoint));
}

std::unique_ptr<Endpoint> UcxCore::MakeEndpoint(const std::shared_ptr<EpState>& s) {
  std::unique_ptr<Endpoint> endpoint = endpoint_factory_(s);
  s->owner = endpoint.get();
  return endpoint;
}

void UcxCore::WhenReady(EpState& s, std::function<void()> fn) {
  if (s.ready || s.ep == nullptr) {
    fn();
    return;
  }
  s.deferred.push_back(std::move(fn));
}

void UcxCore::StartReadyFlush(const std::shared_ptr<EpState>& s, std::function<void(Status)> done) {
  // UCX 1.13.1: an active message over 100 bytes sent right after accept
  // hangs when the final lane is shared memory; flushing the new endpoint
  // before its first send avoids it. On the connecting side the flush also
  // says that wire-up finished.
  // The rest runs from the queue: the flush may complete inside a UCX call
  // (ucp_ep_set_failed purging it), where closing the endpoint is not allowed.
  FlushEp(s, [this, s, done = std::move(done)](Status st) mutable {
    Post([this, s, done = std::move(done), st = std::move(st)] {
      if (!st.ok()) CloseEp(*s, /*force=*/true, /*by_user=*/false, AsUnavailable(st), nullptr);
      s->ready = true;
      std::vector<std::function<void()>> deferred;
      deferred.swap(s->deferred);
      for (auto& fn : deferred) fn();
      if (done) done(st);
    });
  });
}

StatusOr<std::shared_ptr<EpState>> UcxCore::Connect(const std::string& address,
                                                    std::shared_ptr<Waiter> waiter) {
  sockaddr_storage sa;
  socklen_t len = 0;
  KVF_RETURN_IF_ERROR(ParseSocketAddress(address, &sa, &len));
  auto s = std::make_shared<EpState>(this, address);
  ucp_ep_params_t p = {};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  p.sockaddr.addrlen = len;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &UcxCore::OnEpError;
  p.err_handler.arg = s.get();
  ucp_ep_h ep = nullptr;
  KVF_RETURN_IF_ERROR(AsUnavailable(
      StatusFromUcs(ucp_ep_create(worker_.get(), &p, &ep), "ucp_ep_create(" + address + ")")));
  s->ep = ep;
  Register(s);
  // The flush completes once wire-up did: then the endpoint is usable.
  StartReadyFlush(s, [waiter](Status st) { waiter->Set(std::move(st)); });
  return s;
}

void UcxCore::FlushEp(const std::shared_ptr<EpState>& s, std::function<void(Status)> done) {
  if (s->ep == nullptr) {
    done(AsUnavailable(s->health()));
    return;
  }
  Req* r = NewReq(s, nullptr, [this, s, done = std::move(done)](ucs_status_t st, std::size_t) {
    done(st == UCS_OK ? Status::OK() : EntryStatus(*s, st, "ucp_ep_flush_nbx"));
  });
  ucp_request_param_t p = {};
  FillParam(r, &p, /*recv=*/false);
  Track(r, ucp_ep_flush_nbx(s->ep, &p), 0);
}

void UcxCore::CloseEp(EpState& s, bool force, bool by_user, const Status& reason,
                      std::shared_ptr<Waiter> waiter) {
  if (s.ep == nullptr) {
    if (waiter) waiter->Set(Status::OK());
    return;
  }
  s.SetFailure(reason);
  if (by_user) s.closed_locally = true;
  ucp_ep_h ep = s.ep;
  auto it = eps_.find(ep);
  std::shared_ptr<EpState> keep = it != eps_.end() ? it->second : nullptr;
  if (force) {
    // Receive-side requests can be cancelled; sends are purged by the force
    // close below, which completes them with UCS_ERR_CANCELED.
    std::vector<void*> inflight(s.inflight.begin(), s.inflight.end());
    for (void* req : inflight) ucp_request_cancel(worker_.get(), req);
  }
  Req* r = NewReq(nullptr, nullptr, [keep, waiter](ucs_status_t st, std::size_t) {
    if (waiter) waiter->Set(StatusFromUcs(st, "ucp_ep_close_nbx"));
  });
  ucp_request_param_t p = {};
  FillParam(r, &p, /*recv=*/false);
  if (force) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &p);
  s.ep = nullptr;
  if (it != eps_.end()) eps_.erase(it);
  // Keys unpacked on the endpoint go with it.
  for (auto& holder : s.rkeys) holder->Reset();
  s.rkeys.clear();
  // Owner-placed operations awaiting a reply on it will never get one, and
  // work deferred until it was ready now fails.
  FailAwaiting(s, AsUnavailable(s.health()));
  std::vector<std::function<void()>> deferred;
  deferred.swap(s.deferred);
  for (auto& fn : deferred) fn();
  Track(r, req, 0);
}

// ---------------------------------------------------------------------------
// Remote keys.

StatusOr<std::shared_ptr<RkeyHolder>> UcxCore::UnpackRkey(const std::shared_ptr<EpState>& s,
                                                          const std::string& packed,
                                                          std::uint64_t address,
                                                          std::uint64_t length,
                                                          std::uint64_t grant_id) {
  if (s->ep == nullptr) return AsUnavailable(s->health());
  // ucp_ep_rkey_unpack takes no length: UCX 1.13's packed key is a memory
  // domain bitmap followed by at most 64 entries of at most 255 bytes each,
  // so a copy padded with zeros to that size keeps a malformed key from
  // reading past our buffer.
  std::string padded = packed;
  padded.resize(packed.size() + 64 * 256 + 64, '\0');
  ucp_rkey_h rkey = nullptr;
  Status st = StatusFromUcs(ucp_ep_rkey_unpack(s->ep, padded.data(), &rkey), "ucp_ep_rkey_unpack");
  if (!st.ok()) return Status::InvalidArgument(st.ToString());
  auto holder = std::make_shared<RkeyHolder>();
  holder->rkey.reset(rkey);
  holder->ep = s;
  holder->ep_identity = s.get();
  holder->address = address;
  holder->length = length;
  holder->grant_id = grant_id;
  // UCX's get/put are truly one-sided (the owner takes no part, so neither
  // its bounds nor its survival depend on them) in two cases; everything
  // else uses the owner-placed protocol (ucx_am_rma.h):
  //  - the range maps into this process (ucp_rkey_ptr): memory UCX allocated
  //    itself (UCP_MEM_MAP_ALLOCATE, a SysV/POSIX segment) reached over
  //    shared memory;
  //  - the transport list names RDMA transports (rc/dc): their RMA lanes are
  //    hardware one-sided on any registered memory. Untested here (no RDMA
  //    NIC); a deployment that mixes RDMA and TCP peers gets UCX's choice.
  void* mapped = nullptr;
  const bool maps = ucp_rkey_ptr(rkey, address, &mapped) == UCS_OK && mapped != nullptr;
  holder->one_sided = rdma_configured_ || maps;
  if (maps) holder->mapped = static_cast<std::byte*>(mapped);
  s->rkeys.push_back(holder);
  return holder;
}

void UcxCore::DestroyRkey(const std::shared_ptr<RkeyHolder>& holder) {
  holder->Reset();
  if (auto s = holder->ep.lock()) {
    s->rkeys.erase(std::remove(s->rkeys.begin(), s->rkeys.end(), holder), s->rkeys.end());
  }
}

std::shared_ptr<UcxCore> CoreGroup::NextForAccept() {
  if (cores.empty()) return nullptr;
  return cores[next_accept.fetch_add(1, std::memory_order_relaxed) % cores.size()].lock();
}

std::shared_ptr<UcxCore> CoreGroup::Find(const UcxCore* raw) const {
  for (const auto& weak : cores) {
    std::shared_ptr<UcxCore> core = weak.lock();
    if (core.get() == raw) return core;
  }
  return nullptr;
}

bool CoreGroup::OnAnyProgressThread() const {
  for (const auto& weak : cores) {
    std::shared_ptr<UcxCore> core = weak.lock();
    if (core && core->OnProgressThread()) return true;
  }
  return false;
}

UcxTestCounters UcxCore::counters() const {
  UcxTestCounters c;
  c.eager_messages = eager_messages_.load(std::memory_order_relaxed);
  c.rendezvous_messages = rendezvous_messages_.load(std::memory_order_relaxed);
  c.one_sided_transfers = one_sided_transfers_.load(std::memory_order_relaxed);
  c.owner_placed_transfers = owner_placed_transfers_.load(std::memory_order_relaxed);
  c.inline_transfers = inline_transfers_.load(std::memory_order_relaxed);
  c.rejected_peers = rejected_peers_.load(std::memory_order_relaxed);
  const MappingPopulator::Stats p = populator_.stats();
  c.populated_bytes = p.bytes_populated;
  c.populate_skipped_bytes = p.bytes_not_resident;
  return c;
}

void UcxCore::PopulateMapping(const std::shared_ptr<RkeyHolder>& holder) {
  if (!options_.populate_imported_mappings) return;
  {
    std::shared_lock<std::shared_mutex> mapping(holder->map_mu);
    if (holder->mapped == nullptr) return;
  }
  populator_.Enqueue(holder);
}

}  // namespace kvfabric::ucx::internal
