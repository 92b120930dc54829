#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errno_status.h"
#include "core/socket_address.h"
#include "transport/tcp/tcp_wire.h"

namespace kvfabric::tcp {

using transport::BatchCompletion;
using transport::Deadline;
using transport::Endpoint;
using transport::IncomingMessage;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;
using wire::FrameHeader;
using wire::FrameType;

namespace internal {

class Conn;
class Worker;

// Replies (READ_DATA, WRITE_ACK) a connection may have queued before its
// worker stops reading from it: every READ or WRITE a peer sends queues one,
// so a peer that sends requests and never reads the replies would otherwise
// grow the queue (and the pins READ_DATA frames hold) without bound.
// Reading resumes once they are down to half. Only replies count: a side
// that sends many requests of its own keeps reading, so the two ends cannot
// wait on each other as long as requests go one way, as in kvfabric's data
// plane (the daemon reads and writes, the client answers).
constexpr std::size_t kMaxQueuedReplies = 4096;

// Registered memory and the pins that keep it from being revoked while a
// worker moves its bytes for a peer (or into it for an accepted message).
struct RegionState {
  std::byte* base = nullptr;
  std::uint64_t size = 0;
  std::mutex mu;
  std::condition_variable cv;
  int pins = 0;          // guarded by mu
  bool revoked = false;  // guarded by mu

  bool Pin() {
    std::lock_guard<std::mutex> lock(mu);
    if (revoked) return false;
    ++pins;
    return true;
  }
  void Unpin() {
    std::lock_guard<std::mutex> lock(mu);
    if (--pins == 0) cv.notify_all();
  }
};

// A held pin, released when destroyed or reset.
class PinRef {
 public:
  PinRef() = default;
  explicit PinRef(std::shared_ptr<RegionState> r) : r_(std::move(r)) {}
  PinRef(PinRef&& o) noexcept : r_(std::move(o.r_)) {}
  PinRef& operator=(PinRef&& o) noexcept {
    reset();
    r_ = std::move(o.r_);
    return *this;
  }
  ~PinRef() { reset(); }
  void reset() {
    if (r_) r_->Unpin();
    r_.reset();
  }
  const RegionState* get() const { return r_.get(); }

 private:
  std::shared_ptr<RegionState> r_;
};

struct Grant {
  std::shared_ptr<RegionState> region;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// An entry's outcome, reported after every lock is released.
struct Outcome {
  std::shared_ptr<BatchCompletion> batch;
  std::size_t index = 0;
  std::uint64_t id = 0;
  Status status;
  std::uint64_t bytes = 0;
};

// Where one entry of a batch stands, for cancellation.
struct EntryRef {
  std::shared_ptr<BatchCompletion> batch;
  std::size_t index = 0;
  std::uint64_t tag = 0;  // the batch's number on its connection
  std::uint64_t id = 0;   // the entry's number on its connection
};

struct TxFrame {
  std::vector<std::byte> head;  // frame header (+ message header)
  const std::byte* payload = nullptr;
  std::uint64_t payload_len = 0;
  std::uint64_t sent = 0;  // bytes of head + payload written
  FrameType type = FrameType::kSend;
  bool has_entry = false;  // SEND, WRITE, READ of a local batch
  bool is_reply = false;   // READ_DATA, WRITE_ACK: counted in replies_queued_
  EntryRef entry;
  PinRef pin;  // READ_DATA: the source region
};

struct PendingRead {
  EntryRef entry;
  std::byte* dest = nullptr;
  std::uint64_t length = 0;
  bool landing = false;  // its bytes are being received: not cancellable
};

struct PendingWrite {
  EntryRef entry;
  std::uint64_t length = 0;
};

Status ReplyStatus(std::uint8_t code, std::string_view op) {
  const auto c = static_cast<StatusCode>(code);
  if (c == StatusCode::kOk) return Status::OK();
  std::string why;
  if (c == StatusCode::kUnavailable) {
    why = "the peer no longer grants that range (never exported, or its region was destroyed)";
  } else if (c == StatusCode::kOutOfRange) {
    why = "the range is outside what the peer exported";
  } else {
    why = "the peer refused it";
  }
  return Status(c, std::string(op) + ": " + why);
}

class Core {
 public:
  explicit Core(const TcpTransportOptions& options);
  ~Core();

  Status Start();
  void Shutdown();

  std::shared_ptr<Worker> NextWorker();
  std::uint64_t instance() const { return instance_; }
  const TcpTransportOptions& options() const { return options_; }

  // Grants.
  std::uint64_t NewGrant(std::shared_ptr<RegionState> region, std::uint64_t offset,
                         std::uint64_t length);
  // The region and the address of [offset, +length) of `grant`, pinned; or
  // the status code the owner answers with.
  StatusCode Resolve(std::uint64_t grant, std::uint64_t offset, std::uint64_t length,
                     PinRef* pin, std::byte** where);
  void Revoke(const std::shared_ptr<RegionState>& region);

  void ApplySocketOptions(int fd) const;

  transport::MessageHandler handler;                    // set before Listen/Connect
  transport::AcceptHandler on_accept;                   // set by Listen
  std::atomic<bool> stalled{false};
  std::vector<std::shared_ptr<Worker>> workers;         // fixed after Start
  std::mutex mu;
  int listen_fd = -1;                                   // guarded by mu
  std::string listen_address;                           // guarded by mu

 private:
  const TcpTransportOptions options_;
  std::uint64_t instance_ = 0;
  std::atomic<unsigned> next_worker_{0};
  std::unordered_map<std::uint64_t, Grant> grants_;  // guarded by mu
  std::mt19937_64 rng_;                              // guarded by mu
};

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  explicit Worker(Core* core) : core_(core) {}
  ~Worker();

  Status Start();
  // Runs `fn` on the worker thread. false once the worker stopped.
  bool Post(std::function<void()> fn);
  // Runs `fn` here when on the worker thread (or after it stopped), else
  // posts it and waits for it.
  void RunAndWait(const std::function<void()>& fn);
  bool OnThread() const { return std::this_thread::get_id() == thread_id_; }
  void Stop();

  // Worker thread only.
  void Adopt(std::shared_ptr<Conn> conn);
  // Adopt, for an accepted connection: it must say hello within the
  // transport's handshake_timeout.
  void AdoptAccepted(std::shared_ptr<Conn> conn);
  void Forget(Conn* conn);
  void SetInterest(Conn* conn, int fd, std::uint32_t events);
  void WatchListener(int fd);
  void FailAll(const Status& status);
  void FailConnsPinning(const RegionState* region);
  void RefreshInterest();
  Core* core() const { return core_; }

 private:
  void Loop();
  void AcceptAll();

  Core* const core_;
  int epfd_ = -1;
  int wakefd_ = -1;
  int listen_fd_ = -1;  // worker thread only
  std::thread thread_;
  std::thread::id thread_id_;
  std::mutex mu_;
  std::vector<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  bool stopped_ = false;                      // guarded by mu_
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;  // worker thread only
  // Accepted connections still owing their hello, oldest first, with the
  // time by which it must come (worker thread only).
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::weak_ptr<Conn>>> handshakes_;
  // A spare descriptor, given up to accept and shed a connection when the
  // process is out of descriptors (else the listener stays readable and the
  // loop spins). Worker with the listener only.
  int spare_fd_ = -1;
};

class TcpRegion;

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(int fd, std::shared_ptr<Worker> worker, std::string peer, bool accepted,
       std::uint64_t peer_instance)
      : fd_(fd),
        worker_(std::move(worker)),
        peer_(std::move(peer)),
        peer_instance_(peer_instance),
        hello_done_(!accepted),
        rbuf_(64 << 10) {}
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Any thread.
  std::string peer() const { return peer_; }
  std::uint64_t peer_instance() const { return peer_instance_; }
  Status health() const {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }
  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers);
  Status Flush(Deadline deadline);
  Status Close(transport::CloseMode mode, Deadline deadline);
  void CancelBatch(std::uint64_t tag);
  void SetEndpoint(Endpoint* ep) {
    std::lock_guard<std::mutex> lock(mu_);
    endpoint_ = ep;
  }
  Endpoint* endpoint() const {
    std::lock_guard<std::mutex> lock(mu_);
    return endpoint_;
  }
  const std::shared_ptr<Worker>& worker() const { return worker_; }

  // Worker thread only.
  void Started(bool send_hello);
  void OnReadable();
  void Pump();
  void Fail(const Status& entries, const Status& health);
  bool Pins(const RegionState* region);
  void RefreshInterest();
  // Fails an accepted connection whose hello has not come (worker thread).
  void HandshakeExpired();
  bool hello_done() const { return hello_done_; }
  int fd() const { return fd_; }

 private:
  enum class Phase { kHello, kHeader, kPayload };
  enum class Sink { kDiscard, kMessage, kWrite, kReadData };

  // Reads and handles frames; true when it stopped for fairness (a byte or
  // frame budget) rather than for want of bytes.
  bool ReadSome();
  bool Fill();
  bool DispatchHeader(const FrameHeader& h, std::span<const std::byte> message_header);
  void PayloadDone();
  void Enqueue(std::unique_ptr<TxFrame> frame);  // worker thread, replies
  void Finish(std::vector<Outcome>& outcomes);
  bool Closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  void ProtocolError(const Status& why);

  const int fd_;
  const std::shared_ptr<Worker> worker_;
  const std::string peer_;
  std::uint64_t peer_instance_;  // set before the endpoint exists

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status health_;                   // guarded by mu_
  bool closing_ = false;            // guarded by mu_: no new entries
  bool closed_ = false;             // guarded by mu_
  bool tx_scheduled_ = false;       // guarded by mu_: the worker will pump
  bool want_write_ = false;         // guarded by mu_: waiting for EPOLLOUT
  Endpoint* endpoint_ = nullptr;    // guarded by mu_
  std::uint64_t next_id_ = 1;       // guarded by mu_
  std::uint64_t next_tag_ = 1;      // guarded by mu_
  std::deque<std::unique_ptr<TxFrame>> txq_;                // guarded by mu_
  std::size_t replies_queued_ = 0;                          // guarded by mu_
  std::unordered_map<std::uint64_t, PendingRead> reads_;    // guarded by mu_
  std::unordered_map<std::uint64_t, PendingWrite> writes_;  // guarded by mu_
  std::set<std::uint64_t> outstanding_;                     // guarded by mu_

  // Receive state: worker thread only.
  bool hello_done_;
  bool read_paused_ = false;  // too many replies queued (kMaxQueuedReplies)
  std::uint32_t interest_ = 0;
  std::vector<std::byte> rbuf_;
  std::size_t rstart_ = 0, rend_ = 0;
  Phase phase_ = Phase::kHeader;
  Sink sink_ = Sink::kDiscard;
  std::byte* dest_ = nullptr;
  std::uint64_t remaining_ = 0, received_ = 0;
  std::uint64_t rx_id_ = 0;
  StatusCode rx_code_ = StatusCode::kOk;
  PinRef rx_pin_;
  std::function<void(Status)> on_placed_;
};

std::unique_ptr<Endpoint> NewEndpoint(std::shared_ptr<Conn> conn);

// --- regions -------------------------------------------------------------

class TcpRegion final : public MemoryRegion {
 public:
  TcpRegion(std::shared_ptr<Core> core, std::span<std::byte> bytes, bool owned)
      : core_(std::move(core)), state_(std::make_shared<RegionState>()), owned_(owned) {
    state_->base = bytes.data();
    state_->size = bytes.size();
  }
  ~TcpRegion() override {
    core_->Revoke(state_);
    if (owned_) ::munmap(state_->base, state_->size);
  }
  std::span<std::byte> bytes() const override { return {state_->base, state_->size}; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  StatusOr<std::string> Export(std::uint64_t offset, std::uint64_t length) const override {
    if (offset > state_->size || length > state_->size - offset) {
      return Status::InvalidArgument("export of [" + std::to_string(offset) + ", +" +
                                     std::to_string(length) + ") outside a region of " +
                                     std::to_string(state_->size) + " bytes");
    }
    const std::uint64_t grant = core_->NewGrant(state_, offset, length);
    return wire::EncodeExport({.instance = core_->instance(), .grant = grant, .length = length});
  }
  const std::shared_ptr<RegionState>& state() const { return state_; }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<RegionState> state_;
  const bool owned_;
};

class TcpRemoteRegion final : public RemoteRegion {
 public:
  TcpRemoteRegion(const Conn* conn, std::uint64_t grant, std::uint64_t length)
      : conn_(conn), grant_(grant), length_(length) {}
  std::uint64_t length() const override { return length_; }
  const Conn* conn() const { return conn_; }
  std::uint64_t grant() const { return grant_; }

 private:
  const Conn* conn_;
  const std::uint64_t grant_;
  const std::uint64_t length_;
};

// --- core ----------------------------------------------------------------

Core::Core(const TcpTransportOptions& options) : options_(options) {
  std::random_device rd;
  rng_.seed((std::uint64_t{rd()} << 32) ^ rd());
  while (instance_ == 0) instance_ = rng_();
}

Core::~Core() { Shutdown(); }

Status Core::Start() {
  for (int i = 0; i < options_.workers; ++i) {
    auto w = std::make_shared<Worker>(this);
    KVF_RETURN_IF_ERROR(w->Start());
    workers.push_back(std::move(w));
  }
  return Status::OK();
}

void Core::Shutdown() {
  // Last to first: the listener (on the first worker) outlives the others.
  for (auto it = workers.rbegin(); it != workers.rend(); ++it) {
    (*it)->RunAndWait([w = it->get()] {
      w->FailAll(Status::Cancelled("the transport was destroyed"));
    });
    (*it)->Stop();
  }
  std::lock_guard<std::mutex> lock(mu);
  if (listen_fd >= 0) ::close(listen_fd);
  listen_fd = -1;
}

std::shared_ptr<Worker> Core::NextWorker() {
  return workers[next_worker_.fetch_add(1, std::memory_order_relaxed) % workers.size()];
}

std::uint64_t Core::NewGrant(std::shared_ptr<RegionState> region, std::uint64_t offset,
                             std::uint64_t length) {
  std::lock_guard<std::mutex> lock(mu);
  std::uint64_t id = 0;
  while (id == 0 || grants_.count(id) != 0) id = rng_();
  grants_[id] = Grant{std::move(region), offset, length};
  return id;
}

StatusCode Core::Resolve(std::uint64_t grant, std::uint64_t offset, std::uint64_t length,
                         PinRef* pin, std::byte** where) {
  std::shared_ptr<RegionState> region;
  std::uint64_t base = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = grants_.find(grant);
    if (it == grants_.end()) return StatusCode::kUnavailable;
    if (offset > it->second.length || length > it->second.length - offset) {
      return StatusCode::kOutOfRange;
    }
    region = it->second.region;
    base = it->second.offset + offset;
  }
  if (!region->Pin()) return StatusCode::kUnavailable;
  *where = region->base + base;
  *pin = PinRef(std::move(region));
  return StatusCode::kOk;
}

void Core::Revoke(const std::shared_ptr<RegionState>& region) {
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = grants_.begin(); it != grants_.end();) {
      it = it->second.region == region ? grants_.erase(it) : std::next(it);
    }
  }
  {
    std::lock_guard<std::mutex> lock(region->mu);
    region->revoked = true;
    if (region->pins == 0) return;
  }
  // Connections moving its bytes are failed: their frames cannot be cut short.
  for (const auto& w : workers) {
    w->RunAndWait([w = w.get(), r = region.get()] { w->FailConnsPinning(r); });
  }
  std::unique_lock<std::mutex> lock(region->mu);
  region->cv.wait(lock, [&] { return region->pins == 0; });
}

void Core::ApplySocketOptions(int fd) const {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (options_.socket_buffer_bytes > 0) {
    const int b = options_.socket_buffer_bytes;
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
}

// --- worker --------------------------------------------------------------

Worker::~Worker() {
  if (spare_fd_ >= 0) ::close(spare_fd_);
  if (OnThread()) {
    thread_.detach();  // the last reference went away on this thread
  } else {
    Stop();
  }
  if (epfd_ >= 0) ::close(epfd_);
  if (wakefd_ >= 0) ::close(wakefd_);
}

Status Worker::Start() {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) return StatusFromErrno(errno, "epoll_create1 for a TCP worker");
  wakefd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakefd_ < 0) return StatusFromErrno(errno, "eventfd for a TCP worker");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = this;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0) {
    return StatusFromErrno(errno, "epoll_ctl of a TCP worker's eventfd");
  }
  thread_ = std::thread([this] { Loop(); });
  thread_id_ = thread_.get_id();
  return Status::OK();
}

bool Worker::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || stopping_) return false;
    tasks_.push_back(std::move(fn));
  }
  const std::uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof(one));
  return true;
}

void Worker::RunAndWait(const std::function<void()>& fn) {
  if (OnThread()) {
    fn();
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  const bool posted = Post([&] {
    fn();
    std::lock_guard<std::mutex> lock(m);
    done = true;
    cv.notify_all();
  });
  if (!posted) {
    // Stopped (or stopping: Stop joins the thread before returning, so this
    // waits for it): nothing runs there any more.
    Stop();
    fn();
    return;
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done; });
}

void Worker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopping_ = true;
  }
  if (OnThread()) return;  // the loop sees stopping_ after this task
  const std::uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void Worker::Adopt(std::shared_ptr<Conn> conn) {
  Conn* raw = conn.get();
  conns_[raw] = std::move(conn);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = raw;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, raw->fd(), &ev) != 0) {
    const Status s = StatusFromErrno(errno, "epoll_ctl ADD of a connection");
    raw->Fail(Status::Unavailable(s.message()), Status::Unavailable(s.message()));
    return;
  }
  raw->RefreshInterest();
}

void Worker::AdoptAccepted(std::shared_ptr<Conn> conn) {
  handshakes_.emplace_back(std::chrono::steady_clock::now() + core_->options().handshake_timeout,
                           conn);
  Adopt(std::move(conn));
}

void Worker::Forget(Conn* conn) {
  (void)::epoll_ctl(epfd_, EPOLL_CTL_DEL, conn->fd(), nullptr);
  conns_.erase(conn);
}

void Worker::SetInterest(Conn* conn, int fd, std::uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = conn;
  (void)::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void Worker::WatchListener(int fd) {
  listen_fd_ = fd;
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  (void)::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
}

void Worker::FailAll(const Status& status) {
  std::vector<std::shared_ptr<Conn>> all;
  for (auto& [raw, c] : conns_) all.push_back(c);
  for (auto& c : all) c->Fail(status, Status::Unavailable("the transport was destroyed"));
  if (listen_fd_ >= 0) (void)::epoll_ctl(epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  listen_fd_ = -1;
}

void Worker::FailConnsPinning(const RegionState* region) {
  std::vector<std::shared_ptr<Conn>> hit;
  for (auto& [raw, c] : conns_) {
    if (c->Pins(region)) hit.push_back(c);
  }
  const Status s = Status::Unavailable("a region this connection was moving was destroyed");
  for (auto& c : hit) c->Fail(s, s);
}

void Worker::RefreshInterest() {
  std::vector<std::shared_ptr<Conn>> all;
  for (auto& [raw, c] : conns_) all.push_back(c);
  for (auto& c : all) {
    c->RefreshInterest();
    c->OnReadable();
  }
}

void Worker::AcceptAll() {
  for (;;) {
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
      // Out of descriptors: shed the connection (its peer sees it closed)
      // rather than leave it pending and the listener readable forever.
      ::close(spare_fd_);
      const int shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (shed >= 0) ::close(shed);
      spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      continue;
    }
    if (fd < 0) return;  // EAGAIN, or a connection that went away meanwhile
    core_->ApplySocketOptions(fd);
    std::shared_ptr<Worker> w = core_->NextWorker();
    auto conn = std::make_shared<Conn>(fd, w, FormatSocketAddress(sa), /*accepted=*/true, 0);
    auto start = [conn] {
      conn->worker()->AdoptAccepted(conn);
      conn->Started(/*send_hello=*/true);
    };
    if (w.get() == this) {
      start();
    } else if (!w->Post(start)) {
      return;  // shutting down: the conn closes its fd
    }
  }
}

void Worker::Loop() {
  epoll_event events[64];
  for (;;) {
    // Hellos that did not come in time fail their connections; the wait
    // ends by the next such deadline.
    int timeout_ms = -1;
    const auto now = std::chrono::steady_clock::now();
    while (!handshakes_.empty()) {
      auto& [deadline, weak] = handshakes_.front();
      std::shared_ptr<Conn> c = weak.lock();
      if (c == nullptr || c->hello_done()) {
        handshakes_.pop_front();
      } else if (deadline <= now) {
        handshakes_.pop_front();
        c->HandshakeExpired();
      } else {
        timeout_ms = static_cast<int>(
            std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count());
        break;
      }
    }
    const int n = ::epoll_wait(epfd_, events, 64, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == this) {
        std::uint64_t v;
        (void)!::read(wakefd_, &v, sizeof(v));
        std::vector<std::function<void()>> tasks;
        {
          std::lock_guard<std::mutex> lock(mu_);
          tasks.swap(tasks_);
        }
        for (auto& t : tasks) t();
        continue;
      }
      if (tag == &listen_fd_) {
        if (listen_fd_ >= 0) AcceptAll();
        continue;
      }
      auto it = conns_.find(static_cast<Conn*>(tag));
      if (it == conns_.end()) continue;  // failed earlier in this round
      std::shared_ptr<Conn> c = it->second;
      if (events[i].events & EPOLLOUT) c->Pump();
      if ((events[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) && core_->stalled.load()) {
        // Stalled, nothing is read; a peer that went away still fails the
        // connection (its unread requests have no one to answer).
        const Status s = Status::Unavailable("peer " + c->peer() + " closed the connection");
        c->Fail(s, s);
      } else if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        c->OnReadable();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && tasks_.empty()) break;
  }
  // Whatever is still here fails now (Shutdown failed them already).
  std::vector<std::shared_ptr<Conn>> rest;
  for (auto& [raw, c] : conns_) rest.push_back(c);
  for (auto& c : rest) {
    c->Fail(Status::Cancelled("the transport was destroyed"),
            Status::Unavailable("the transport was destroyed"));
  }
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
}

// --- connection: sending -------------------------------------------------

std::unique_ptr<TxFrame> MakeFrame(const FrameHeader& h, std::span<const std::byte> message_header) {
  auto f = std::make_unique<TxFrame>();
  f->type = h.type;
  f->head.resize(wire::kFrameHeaderBytes + message_header.size());
  wire::EncodeFrameHeader(h, std::span<std::byte, wire::kFrameHeaderBytes>(f->head.data(),
                                                                          wire::kFrameHeaderBytes));
  if (!message_header.empty()) {
    std::memcpy(f->head.data() + wire::kFrameHeaderBytes, message_header.data(),
                message_header.size());
  }
  return f;
}

Status CheckRange(const MemoryRegion* local, std::uint64_t offset, std::uint64_t length,
                  std::size_t i) {
  const std::uint64_t size = local->bytes().size();
  if (offset > size || length > size - offset) {
    return Status::InvalidArgument("entry " + std::to_string(i) + ": local range [" +
                                   std::to_string(offset) + ", +" + std::to_string(length) +
                                   ") outside a region of " + std::to_string(size) + " bytes");
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<TransferBatch>> Conn::Submit(std::span<const Transfer> transfers) {
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const std::string at = "entry " + std::to_string(i);
    if (t.op != TransferOp::kRead && t.op != TransferOp::kWrite && t.op != TransferOp::kSend) {
      return Status::InvalidArgument(at + ": unknown op");
    }
    if (t.op == TransferOp::kSend) {
      if (t.header.size() > transport::kMaxMessageHeaderBytes) {
        return Status::InvalidArgument(at + ": message header of " +
                                       std::to_string(t.header.size()) + " bytes over " +
                                       std::to_string(transport::kMaxMessageHeaderBytes));
      }
      if (t.length > 0 && t.local == nullptr) {
        return Status::InvalidArgument(at + ": payload without a local region");
      }
    } else {
      if (t.local == nullptr) return Status::InvalidArgument(at + ": no local region");
      const auto* remote = dynamic_cast<const TcpRemoteRegion*>(t.remote);
      if (remote == nullptr || remote->conn() != this) {
        return Status::InvalidArgument(at + ": remote region not imported on this endpoint");
      }
      if (t.remote_offset > remote->length() || t.length > remote->length() - t.remote_offset) {
        return Status::InvalidArgument(at + ": remote range [" + std::to_string(t.remote_offset) +
                                       ", +" + std::to_string(t.length) +
                                       ") outside an import of " +
                                       std::to_string(remote->length()) + " bytes");
      }
    }
    if (t.local != nullptr) KVF_RETURN_IF_ERROR(CheckRange(t.local, t.local_offset, t.length, i));
  }

  std::uint64_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tag = next_tag_++;
  }
  std::weak_ptr<Conn> weak = weak_from_this();
  auto batch = std::make_shared<BatchCompletion>(transfers.size(), [weak, tag] {
    if (std::shared_ptr<Conn> c = weak.lock()) c->CancelBatch(tag);
  });
  std::vector<Outcome> refused;
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      const Transfer& t = transfers[i];
      EntryRef e{batch, i, tag, next_id_++};
      if (closed_ || closing_) {
        refused.push_back({batch, i, 0,
                           health_.ok() ? Status::Unavailable("endpoint to " + peer_ + " is closed")
                                        : health_,
                           0});
        continue;
      }
      std::byte* local =
          t.local == nullptr ? nullptr : t.local->bytes().data() + t.local_offset;
      FrameHeader h;
      std::unique_ptr<TxFrame> f;
      if (t.op == TransferOp::kSend) {
        h.type = FrameType::kSend;
        h.message_header_bytes = static_cast<std::uint16_t>(t.header.size());
        h.length = t.length;
        f = MakeFrame(h, t.header);
        f->payload = local;
        f->payload_len = t.length;
      } else {
        const auto* remote = static_cast<const TcpRemoteRegion*>(t.remote);
        h.type = t.op == TransferOp::kWrite ? FrameType::kWrite : FrameType::kRead;
        h.id = e.id;
        h.grant = remote->grant();
        h.offset = t.remote_offset;
        h.length = t.length;
        f = MakeFrame(h, {});
        if (t.op == TransferOp::kWrite) {
          f->payload = local;
          f->payload_len = t.length;
        } else {
          reads_[e.id] = PendingRead{e, local, t.length, false};
        }
      }
      f->has_entry = true;
      f->entry = e;
      outstanding_.insert(e.id);
      txq_.push_back(std::move(f));
    }
    if (!txq_.empty() && !tx_scheduled_) {
      tx_scheduled_ = true;
      post = true;
    }
  }
  if (post) {
    std::weak_ptr<Conn> w = weak_from_this();
    if (!worker_->Post([w] {
          if (auto c = w.lock()) c->Pump();
        })) {
      // The worker stopped: the transport is going away.
      worker_->RunAndWait([this] {
        Fail(Status::Unavailable("the transport was destroyed"),
             Status::Unavailable("the transport was destroyed"));
      });
    }
  }
  Finish(refused);
  return std::make_unique<TransferBatch>(std::move(batch));
}

void Conn::Finish(std::vector<Outcome>& outcomes) {
  for (Outcome& o : outcomes) o.batch->Complete(o.index, std::move(o.status), o.bytes);
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Outcome& o : outcomes) {
      if (o.id != 0) any |= outstanding_.erase(o.id) > 0;
    }
    if (any) cv_.notify_all();
  }
  outcomes.clear();
}

void Conn::Pump() {
  std::vector<Outcome> done;
  Status failure;
  bool blocked = false;  // the socket is full: EPOLLOUT resumes
  bool resume = false;   // reading was paused and the queue has drained
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    while (!txq_.empty()) {
      TxFrame& f = *txq_.front();
      const std::uint64_t head = f.head.size();
      iovec iov[2];
      int n = 0;
      if (f.sent < head) {
        iov[n++] = {f.head.data() + f.sent, head - f.sent};
        if (f.payload_len > 0) iov[n++] = {const_cast<std::byte*>(f.payload), f.payload_len};
      } else {
        iov[n++] = {const_cast<std::byte*>(f.payload) + (f.sent - head),
                    f.payload_len - (f.sent - head)};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      const ssize_t k = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (!want_write_) {
            want_write_ = true;
            interest_ |= EPOLLOUT;
            worker_->SetInterest(this, fd_, interest_);
          }
          blocked = true;  // frames finished before this one still complete below
          break;
        }
        failure = StatusFromErrno(errno, "send to " + peer_);
        break;
      }
      f.sent += static_cast<std::uint64_t>(k);
      if (f.sent < head + f.payload_len) continue;
      if (f.has_entry && f.type == FrameType::kSend) {
        done.push_back({f.entry.batch, f.entry.index, f.entry.id, Status::OK(), f.payload_len});
      } else if (f.has_entry && f.type == FrameType::kWrite) {
        writes_[f.entry.id] = PendingWrite{f.entry, f.payload_len};
      }
      if (f.is_reply) --replies_queued_;
      txq_.pop_front();
    }
    if (read_paused_ && replies_queued_ <= kMaxQueuedReplies / 2) resume = true;
    if (failure.ok() && !blocked) {
      tx_scheduled_ = false;
      if (want_write_) {
        want_write_ = false;
        interest_ &= ~EPOLLOUT;
        worker_->SetInterest(this, fd_, interest_);
      }
    }
  }
  Finish(done);
  if (!failure.ok()) {
    Fail(Status::Unavailable(failure.message()), Status::Unavailable(failure.message()));
    return;
  }
  if (resume) {
    read_paused_ = false;
    RefreshInterest();
    std::weak_ptr<Conn> w = weak_from_this();
    worker_->Post([w] {
      if (auto c = w.lock()) c->OnReadable();
    });
  }
}

void Conn::Enqueue(std::unique_ptr<TxFrame> frame) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (frame->type == FrameType::kReadData || frame->type == FrameType::kWriteAck) {
    frame->is_reply = true;
    ++replies_queued_;
  }
  txq_.push_back(std::move(frame));
  tx_scheduled_ = true;
}

// --- connection: receiving -----------------------------------------------

void Conn::RefreshInterest() {
  std::uint32_t want = EPOLLRDHUP;
  if (!hello_done_ || (!worker_->core()->stalled.load() && !read_paused_)) want |= EPOLLIN;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    if (want_write_) want |= EPOLLOUT;
    if (want == interest_) return;
    interest_ = want;
  }
  worker_->SetInterest(this, fd_, want);
}

void Conn::HandshakeExpired() {
  if (hello_done_) return;
  const Status s = Status::Unavailable("peer " + peer_ + " sent no kvfabric TCP hello in time");
  Fail(s, s);
}

void Conn::Started(bool send_hello) {
  if (send_hello) {
    auto f = std::make_unique<TxFrame>();
    const auto hello = wire::EncodeHello(worker_->core()->instance());
    f->head.assign(hello.begin(), hello.end());
    f->type = FrameType::kSend;  // raw hello bytes: no entry, not a reply
    Enqueue(std::move(f));
    Pump();
  }
  if (!hello_done_) phase_ = Phase::kHello;
}

bool Conn::Fill() {
  if (rstart_ == rend_) rstart_ = rend_ = 0;
  if (rend_ == rbuf_.size()) {
    std::memmove(rbuf_.data(), rbuf_.data() + rstart_, rend_ - rstart_);
    rend_ -= rstart_;
    rstart_ = 0;
  }
  for (;;) {
    const ssize_t k = ::recv(fd_, rbuf_.data() + rend_, rbuf_.size() - rend_, MSG_DONTWAIT);
    if (k > 0) {
      rend_ += static_cast<std::size_t>(k);
      return true;
    }
    if (k == 0) {
      const Status s = Status::Unavailable("peer " + peer_ + " closed the connection");
      Fail(s, s);
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    const Status s = Status::Unavailable(StatusFromErrno(errno, "receive from " + peer_).message());
    Fail(s, s);
    return false;
  }
}

void Conn::ProtocolError(const Status& why) {
  const Status s =
      Status::Unavailable("protocol error from " + peer_ + ": " + std::string(why.message()));
  Fail(s, s);
}

void Conn::OnReadable() {
  if (ReadSome()) {
    // Stopped for fairness with frames maybe already buffered here: epoll
    // would not report them again, so come back after the others' turn.
    std::weak_ptr<Conn> w = weak_from_this();
    worker_->Post([w] {
      if (auto c = w.lock()) c->OnReadable();
    });
  }
  // Replies queued while reading (READ_DATA, WRITE_ACK) go out now, however
  // reading stopped: nothing else would send them.
  bool pump = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pump = !closed_ && !txq_.empty() && !want_write_;
  }
  if (pump) Pump();
}

bool Conn::ReadSome() {
  std::uint64_t budget = 16 << 20;  // bytes per call: other connections get a turn
  int frames = 0;
  while (!Closed()) {
    if (hello_done_ && worker_->core()->stalled.load()) return false;
    if (read_paused_) return false;
    if (phase_ == Phase::kHeader) {
      std::lock_guard<std::mutex> lock(mu_);
      if (replies_queued_ >= kMaxQueuedReplies) read_paused_ = true;
    }
    if (read_paused_) {
      // The peer is not reading our replies: stop reading its requests
      // until the queue drains (Pump resumes us).
      RefreshInterest();
      return false;
    }
    if (phase_ == Phase::kPayload) {
      const std::uint64_t buffered = std::min<std::uint64_t>(rend_ - rstart_, remaining_);
      if (buffered > 0) {
        if (dest_ != nullptr) std::memcpy(dest_ + received_, rbuf_.data() + rstart_, buffered);
        rstart_ += buffered;
        received_ += buffered;
        remaining_ -= buffered;
      }
      while (remaining_ > 0) {
        std::byte* to = dest_ != nullptr ? dest_ + received_ : rbuf_.data();
        const std::uint64_t want =
            dest_ != nullptr ? remaining_ : std::min<std::uint64_t>(remaining_, rbuf_.size());
        rstart_ = rend_ = 0;
        const ssize_t k = ::recv(fd_, to, want, MSG_DONTWAIT);
        if (k > 0) {
          received_ += static_cast<std::uint64_t>(k);
          remaining_ -= static_cast<std::uint64_t>(k);
          if (static_cast<std::uint64_t>(k) >= budget) {
            budget = 0;
          } else {
            budget -= static_cast<std::uint64_t>(k);
          }
          if (budget == 0 && remaining_ > 0) return true;
          continue;
        }
        if (k == 0) {
          const Status s = Status::Unavailable("peer " + peer_ + " closed the connection");
          Fail(s, s);
          return false;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        const Status s =
            Status::Unavailable(StatusFromErrno(errno, "receive from " + peer_).message());
        Fail(s, s);
        return false;
      }
      PayloadDone();
      phase_ = Phase::kHeader;
      if (budget == 0 || ++frames >= 64) return true;
      continue;
    }
    if (phase_ == Phase::kHello) {
      if (rend_ - rstart_ < wire::kHelloBytes) {
        if (!Fill()) return false;
        continue;
      }
      StatusOr<std::uint64_t> instance =
          wire::DecodeHello(std::span<const std::byte>(rbuf_.data() + rstart_, wire::kHelloBytes));
      rstart_ += wire::kHelloBytes;
      if (!instance.ok()) {
        ProtocolError(instance.status());
        return false;
      }
      peer_instance_ = *instance;
      hello_done_ = true;
      phase_ = Phase::kHeader;
      RefreshInterest();
      std::unique_ptr<Endpoint> ep = NewEndpoint(shared_from_this());
      SetEndpoint(ep.get());
      if (worker_->core()->on_accept) {
        worker_->core()->on_accept(std::move(ep));
      }
      continue;
    }
    // A frame header, and a message header after it.
    if (rend_ - rstart_ < wire::kFrameHeaderBytes) {
      if (!Fill()) return false;
      continue;
    }
    StatusOr<FrameHeader> h = wire::DecodeFrameHeader(
        std::span<const std::byte, wire::kFrameHeaderBytes>(rbuf_.data() + rstart_,
                                                            wire::kFrameHeaderBytes));
    if (!h.ok()) {
      ProtocolError(h.status());
      return false;
    }
    const std::size_t whole = wire::kFrameHeaderBytes + h->message_header_bytes;
    if (rend_ - rstart_ < whole) {
      if (!Fill()) return false;
      continue;
    }
    const std::span<const std::byte> message_header(rbuf_.data() + rstart_ + wire::kFrameHeaderBytes,
                                                    h->message_header_bytes);
    if (!DispatchHeader(*h, message_header)) return false;
    rstart_ += whole;
    if (phase_ == Phase::kHeader && ++frames >= 64) return true;
  }
  return false;
}

class TcpIncomingMessage final : public IncomingMessage {
 public:
  TcpIncomingMessage(Endpoint* ep, std::span<const std::byte> header, std::uint64_t length)
      : ep_(ep), header_(header), length_(length) {}
  Endpoint* endpoint() const override { return ep_; }
  std::span<const std::byte> header() const override { return header_; }
  std::uint64_t payload_length() const override { return length_; }
  Status Accept(MemoryRegion* region, std::uint64_t offset,
                std::function<void(Status)> on_placed) override {
    if (decided_) return Status::FailedPrecondition("message payload already accepted or dropped");
    decided_ = true;
    auto* r = dynamic_cast<TcpRegion*>(region);
    if (r == nullptr) {
      return Status::InvalidArgument("Accept into a region of another transport");
    }
    const std::uint64_t size = r->bytes().size();
    if (offset > size || length_ > size - offset) {
      return Status::InvalidArgument("payload of " + std::to_string(length_) +
                                     " bytes does not fit at offset " + std::to_string(offset) +
                                     " of a region of " + std::to_string(size) + " bytes");
    }
    if (!r->state()->Pin()) return Status::Unavailable("Accept into a region being destroyed");
    pin_ = PinRef(r->state());
    dest_ = r->bytes().data() + offset;
    on_placed_ = std::move(on_placed);
    return Status::OK();
  }
  void Drop() override { decided_ = true; }

  std::byte* dest_ = nullptr;
  PinRef pin_;
  std::function<void(Status)> on_placed_;

 private:
  Endpoint* const ep_;
  const std::span<const std::byte> header_;
  const std::uint64_t length_;
  bool decided_ = false;
};

bool Conn::DispatchHeader(const FrameHeader& h, std::span<const std::byte> message_header) {
  Core* core = worker_->core();
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  received_ = 0;
  remaining_ = h.length;
  rx_id_ = h.id;
  rx_code_ = StatusCode::kOk;
  switch (h.type) {
    case FrameType::kSend: {
      TcpIncomingMessage m(endpoint(), message_header, h.length);
      if (core->handler) {
        core->handler(m);
      } else {
        m.Drop();
      }
      if (Closed()) return false;  // the handler closed or destroyed the endpoint
      if (m.dest_ != nullptr) {
        sink_ = Sink::kMessage;
        dest_ = m.dest_;
        rx_pin_ = std::move(m.pin_);
        on_placed_ = std::move(m.on_placed_);
      }
      break;
    }
    case FrameType::kWrite: {
      PinRef pin;
      std::byte* where = nullptr;
      rx_code_ = core->Resolve(h.grant, h.offset, h.length, &pin, &where);
      sink_ = Sink::kWrite;
      if (rx_code_ == StatusCode::kOk) {
        dest_ = where;
        rx_pin_ = std::move(pin);
      }
      break;
    }
    case FrameType::kRead: {
      PinRef pin;
      std::byte* where = nullptr;
      FrameHeader reply;
      reply.type = FrameType::kReadData;
      reply.id = h.id;
      reply.status = static_cast<std::uint8_t>(core->Resolve(h.grant, h.offset, h.length, &pin,
                                                              &where));
      reply.length = reply.status == 0 ? h.length : 0;
      std::unique_ptr<TxFrame> f = MakeFrame(reply, {});
      if (reply.status == 0) {
        f->payload = where;
        f->payload_len = h.length;
        f->pin = std::move(pin);
      }
      Enqueue(std::move(f));
      remaining_ = 0;  // a request carries no payload
      return true;
    }
    case FrameType::kWriteAck: {
      std::vector<Outcome> done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = writes_.find(h.id);
        if (it != writes_.end()) {
          Status s = ReplyStatus(h.status, "kWrite to " + peer_);
          const std::uint64_t bytes = s.ok() ? it->second.length : 0;
          done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id,
                          std::move(s), bytes});
          writes_.erase(it);
        }
      }
      Finish(done);
      return true;
    }
    case FrameType::kReadData: {
      std::vector<Outcome> done;
      Status bad;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = reads_.find(h.id);
        if (it != reads_.end()) {
          if (h.status != 0) {
            if (h.length != 0) {
              bad = Status::InvalidArgument("READ_DATA with an error status and a payload");
            } else {
              done.push_back({it->second.entry.batch, it->second.entry.index,
                              it->second.entry.id, ReplyStatus(h.status, "kRead from " + peer_),
                              0});
              reads_.erase(it);
            }
          } else if (h.length != it->second.length) {
            bad = Status::InvalidArgument("READ_DATA of " + std::to_string(h.length) +
                                          " bytes for a read of " +
                                          std::to_string(it->second.length));
          } else {
            it->second.landing = true;
            sink_ = Sink::kReadData;
            dest_ = it->second.dest;
          }
        }
      }
      if (!bad.ok()) {
        ProtocolError(bad);
        return false;
      }
      Finish(done);
      break;
    }
  }
  phase_ = Phase::kPayload;
  if (remaining_ == 0) {
    // Nothing to receive: complete now (the header is consumed by the caller).
    PayloadDone();
    phase_ = Phase::kHeader;
  }
  return true;
}

void Conn::PayloadDone() {
  std::vector<Outcome> done;
  switch (sink_) {
    case Sink::kDiscard:
      break;
    case Sink::kMessage: {
      rx_pin_.reset();
      auto cb = std::move(on_placed_);
      on_placed_ = nullptr;
      if (cb) cb(Status::OK());
      break;
    }
    case Sink::kWrite: {
      rx_pin_.reset();
      FrameHeader ack;
      ack.type = FrameType::kWriteAck;
      ack.id = rx_id_;
      ack.status = static_cast<std::uint8_t>(rx_code_);
      Enqueue(MakeFrame(ack, {}));
      break;
    }
    case Sink::kReadData: {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = reads_.find(rx_id_);
      if (it != reads_.end()) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id,
                        Status::OK(), it->second.length});
        reads_.erase(it);
      }
      break;
    }
  }
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  Finish(done);
}

// --- connection: cancel, close, fail ------------------------------------

void Conn::CancelBatch(std::uint64_t tag) {
  std::vector<Outcome> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Status c = Status::Cancelled("batch cancelled");
    for (auto it = txq_.begin(); it != txq_.end();) {
      TxFrame& f = **it;
      if (f.has_entry && f.entry.tag == tag && f.sent == 0) {
        if (f.type != FrameType::kRead) {
          done.push_back({f.entry.batch, f.entry.index, f.entry.id, c, 0});
        }
        it = txq_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = reads_.begin(); it != reads_.end();) {
      if (it->second.entry.tag == tag && !it->second.landing) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id, c, 0});
        it = reads_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = writes_.begin(); it != writes_.end();) {
      if (it->second.entry.tag == tag) {
        done.push_back({it->second.entry.batch, it->second.entry.index, it->second.entry.id, c, 0});
        it = writes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  Finish(done);
}

Status Conn::Flush(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t upto = next_id_;
  const bool ok = cv_.wait_until(lock, deadline, [&] {
    return outstanding_.empty() || *outstanding_.begin() >= upto;
  });
  if (!ok) {
    return Status::DeadlineExceeded("flush of the endpoint to " + peer_ + ": " +
                                    std::to_string(outstanding_.size()) + " entries in flight");
  }
  return Status::OK();
}

Status Conn::Close(transport::CloseMode mode, Deadline deadline) {
  Status result;
  if (mode == transport::CloseMode::kGraceful) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    if (!Flush(deadline).ok()) {
      result = Status::DeadlineExceeded("graceful close of the endpoint to " + peer_ +
                                        " ran past its deadline; closed by force");
    }
  }
  std::shared_ptr<Conn> self = shared_from_this();
  worker_->RunAndWait([self] {
    self->Fail(Status::Cancelled("endpoint closed"),
               Status::Unavailable("endpoint to " + self->peer() + " was closed"));
  });
  return result;
}

bool Conn::Pins(const RegionState* region) {
  if (rx_pin_.get() == region) return true;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : txq_) {
    if (f->pin.get() == region) return true;
  }
  return false;
}

void Conn::Fail(const Status& entries, const Status& health) {
  std::vector<Outcome> done;
  std::deque<std::unique_ptr<TxFrame>> frames;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    health_ = health;
    frames.swap(txq_);
    replies_queued_ = 0;
    for (auto& f : frames) {
      if (f->has_entry && f->type != FrameType::kRead) {
        done.push_back({f->entry.batch, f->entry.index, f->entry.id, entries, 0});
      }
    }
    for (auto& [id, r] : reads_) done.push_back({r.entry.batch, r.entry.index, id, entries, 0});
    for (auto& [id, w] : writes_) done.push_back({w.entry.batch, w.entry.index, id, entries, 0});
    reads_.clear();
    writes_.clear();
  }
  worker_->Forget(this);
  ::shutdown(fd_, SHUT_RDWR);
  frames.clear();  // releases READ_DATA pins
  rx_pin_.reset();
  auto cb = std::move(on_placed_);
  on_placed_ = nullptr;
  sink_ = Sink::kDiscard;
  dest_ = nullptr;
  if (cb) cb(entries.code() == StatusCode::kCancelled ? Status::Cancelled(entries.message())
                                                      : Status::Unavailable(entries.message()));
  Finish(done);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

// --- endpoint --------------------------------------------------------------

class TcpEndpoint final : public Endpoint {
 public:
  explicit TcpEndpoint(std::shared_ptr<Conn> conn) : conn_(std::move(conn)) {}
  ~TcpEndpoint() override {
    conn_->SetEndpoint(nullptr);
    (void)conn_->Close(transport::CloseMode::kForce, Deadline::min());
  }
  std::string peer_address() const override { return conn_->peer(); }
  Status health() const override { return conn_->health(); }
  StatusOr<std::unique_ptr<RemoteRegion>> ImportRegion(std::string_view exported) override {
    KVF_ASSIGN_OR_RETURN(wire::ExportToken t, wire::DecodeExport(exported));
    if (t.instance != conn_->peer_instance()) {
      return Status::InvalidArgument(
          "export comes from another transport than this endpoint's peer " + conn_->peer());
    }
    return std::unique_ptr<RemoteRegion>(new TcpRemoteRegion(conn_.get(), t.grant, t.length));
  }
  StatusOr<std::unique_ptr<TransferBatch>> Submit(std::span<const Transfer> transfers) override {
    return conn_->Submit(transfers);
  }
  Status Flush(Deadline deadline) override { return conn_->Flush(deadline); }
  Status Close(transport::CloseMode mode, Deadline deadline) override {
    return conn_->Close(mode, deadline);
  }

 private:
  std::shared_ptr<Conn> conn_;
};

std::unique_ptr<Endpoint> NewEndpoint(std::shared_ptr<Conn> conn) {
  return std::make_unique<TcpEndpoint>(std::move(conn));
}

}  // namespace internal

// --- transport -------------------------------------------------------------

using internal::Conn;
using internal::Core;

Status TcpTransportOptions::Validate() const {
  if (workers < 1 || workers > kMaxTcpWorkers) {
    return Status::InvalidArgument("TCP transport workers = " + std::to_string(workers) +
                                   ": must be 1.." + std::to_string(kMaxTcpWorkers));
  }
  if (handshake_timeout < std::chrono::milliseconds(1) || handshake_timeout > std::chrono::hours(1)) {
    return Status::InvalidArgument("TCP handshake timeout of " +
                                   std::to_string(handshake_timeout.count()) +
                                   " ms: must be 1 ms..1 h");
  }
  if (socket_buffer_bytes != 0 && (socket_buffer_bytes < 4096 || socket_buffer_bytes > (64 << 20))) {
    return Status::InvalidArgument("TCP socket buffer of " + std::to_string(socket_buffer_bytes) +
                                   " bytes: must be 0 (kernel autotuning) or 4 KiB..64 MiB");
  }
  return Status::OK();
}

TcpTransport::TcpTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}

TcpTransport::~TcpTransport() { core_->Shutdown(); }

std::string TcpTransport::name() const {
  const int n = core_->options().workers;
  return "tcp(kernel sockets, " + std::to_string(n) + (n == 1 ? " worker)" : " workers)");
}

StatusOr<std::unique_ptr<MemoryRegion>> TcpTransport::RegisterMemory(std::span<std::byte> bytes,
                                                                     MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return Status::InvalidArgument("the TCP transport registers host memory only");
  }
  if (bytes.empty()) return Status::InvalidArgument("registration of 0 bytes");
  return std::unique_ptr<MemoryRegion>(new internal::TcpRegion(core_, bytes, /*owned=*/false));
}

StatusOr<std::unique_ptr<MemoryRegion>> TcpTransport::AllocateMemory(std::uint64_t size,
                                                                     MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return Status::InvalidArgument("the TCP transport allocates host memory only");
  }
  if (size == 0) return Status::InvalidArgument("allocation of 0 bytes");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return StatusFromErrno(errno, "mmap of " + std::to_string(size) + " bytes for the TCP transport");
  }
  return std::unique_ptr<MemoryRegion>(new internal::TcpRegion(
      core_, std::span<std::byte>(static_cast<std::byte*>(p), size), /*owned=*/true));
}

void TcpTransport::SetMessageHandler(transport::MessageHandler handler) {
  core_->handler = std::move(handler);
}

Status TcpTransport::Listen(const std::string& address, transport::AcceptHandler on_accept) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  KVF_RETURN_IF_ERROR(ParseSocketAddress(address, &sa, &len));
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->listen_fd >= 0) return Status::FailedPrecondition("already listening");
  const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return StatusFromErrno(errno, "socket for listening on " + address);
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(fd, 128) != 0) {
    const Status s = StatusFromErrno(errno, "listen on " + address);
    ::close(fd);
    return s;
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  core_->listen_fd = fd;
  core_->listen_address = FormatSocketAddress(bound);
  core_->on_accept = std::move(on_accept);
  const std::shared_ptr<internal::Worker>& w = core_->workers.front();
  w->RunAndWait([w = w.get(), fd] { w->WatchListener(fd); });
  return Status::OK();
}

std::string TcpTransport::listen_address() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->listen_address;
}

namespace {

// How long Connect waits for the peer's hello once connected.
constexpr std::chrono::seconds kHelloTimeout{3};

// Waits for `events` on `fd` until `deadline`.
Status WaitFd(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - transport::Clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded(what + ": deadline passed");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r > 0) return Status::OK();
    if (r < 0 && errno != EINTR) return StatusFromErrno(errno, what);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Endpoint>> TcpTransport::Connect(const std::string& address,
                                                          transport::PeerFailureMode mode,
                                                          Deadline deadline) {
  if (mode != transport::PeerFailureMode::kFailInFlight) {
    return Status::InvalidArgument("unknown peer failure mode");
  }
  sockaddr_storage sa{};
  socklen_t len = 0;
  KVF_RETURN_IF_ERROR(ParseSocketAddress(address, &sa, &len));
  const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return StatusFromErrno(errno, "socket to " + address);
  auto fail = [fd](Status s) {
    ::close(fd);
    return s;
  };
  core_->ApplySocketOptions(fd);
  const std::string what = "connect to " + address;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    if (errno != EINPROGRESS) return fail(Status::Unavailable(StatusFromErrno(errno, what).message()));
    Status s = WaitFd(fd, POLLOUT, deadline, what);
    if (!s.ok()) return fail(s);
    int err = 0;
    socklen_t elen = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) return fail(Status::Unavailable(StatusFromErrno(err, what).message()));
  }
  const auto hello = wire::EncodeHello(core_->instance());
  std::size_t sent = 0;
  while (sent < hello.size()) {
    const ssize_t k = ::send(fd, hello.data() + sent, hello.size() - sent, MSG_NOSIGNAL);
    if (k > 0) {
      sent += static_cast<std::size_t>(k);
    } else if (errno == EAGAIN || errno == EINTR) {
      Status s = WaitFd(fd, POLLOUT, deadline, what);
      if (!s.ok()) return fail(s);
    } else {
      return fail(Status::Unavailable(StatusFromErrno(errno, what).message()));
    }
  }
  // A kvfabric TCP peer sends its hello as soon as it accepts; a listener
  // that accepts and stays silent (a UCX data plane) is not one.
  const Deadline hello_deadline = std::min(deadline, transport::Clock::now() + kHelloTimeout);
  std::array<std::byte, wire::kHelloBytes> peer_hello{};
  std::size_t got = 0;
  while (got < peer_hello.size()) {
    const ssize_t k = ::recv(fd, peer_hello.data() + got, peer_hello.size() - got, 0);
    if (k > 0) {
      got += static_cast<std::size_t>(k);
    } else if (k == 0) {
      return fail(Status::Unavailable(what + ": the peer closed before its hello"));
    } else if (errno == EAGAIN || errno == EINTR) {
      Status s = WaitFd(fd, POLLIN, hello_deadline, what + " (waiting for the peer's hello)");
      if (s.code() == StatusCode::kDeadlineExceeded && hello_deadline < deadline) {
        return fail(Status::Unavailable(
            what + ": the peer accepted but sent no kvfabric TCP hello within " +
            std::to_string(kHelloTimeout.count()) +
            " s; is it a UCX data plane? Both ends must use the same data transport "
            "(--data-transport)"));
      }
      if (!s.ok()) return fail(s);
    } else {
      return fail(Status::Unavailable(StatusFromErrno(errno, what).message()));
    }
  }
  StatusOr<std::uint64_t> instance = wire::DecodeHello(peer_hello);
  if (!instance.ok()) return fail(instance.status().WithContext(what));
  std::shared_ptr<internal::Worker> w = core_->NextWorker();
  auto conn = std::make_shared<Conn>(fd, w, FormatSocketAddress(sa), /*accepted=*/false, *instance);
  auto ep = internal::NewEndpoint(conn);
  conn->SetEndpoint(ep.get());
  if (!w->Post([conn] { conn->worker()->Adopt(conn); conn->Started(false); })) {
    return Status::Unavailable("the TCP transport is shutting down");
  }
  return ep;
}

void TcpTransport::TEST_StallPeerWork(bool stalled) {
  core_->stalled.store(stalled);
  for (const auto& w : core_->workers) {
    w->RunAndWait([w = w.get()] { w->RefreshInterest(); });
  }
}

StatusOr<std::unique_ptr<TcpTransport>> CreateTcpTransport(const TcpTransportOptions& options) {
  KVF_RETURN_IF_ERROR(options.Validate());
  auto core = std::make_shared<Core>(options);
  KVF_RETURN_IF_ERROR(core->Start());
  return std::make_unique<TcpTransport>(std::move(core));
}

}  // namespace kvfabric::tcp
