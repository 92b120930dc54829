#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
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
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errno_status.h"
#include "core/mutex.h"
#include "core/secure_random.h"
#include "core/socket_address.h"
#include "transport/tcp/tcp_internal.h"

namespace kvfabric::tcp::internal {

// --- core ----------------------------------------------------------------

Core::Core(const TcpTransportOptions& options) : options_(options) {
  pacing_rate.store(options.max_pacing_rate_bytes_per_s);
  while (instance_ == 0) instance_ = SecureRandomU64();
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
  MutexLock lock(&mu);
  if (listen_fd >= 0) ::close(listen_fd);
  listen_fd = -1;
}

std::shared_ptr<Worker> Core::NextWorker() {
  return workers[next_worker_.fetch_add(1, std::memory_order_relaxed) % workers.size()];
}

std::uint64_t Core::NewGrant(std::shared_ptr<RegionState> region, std::uint64_t offset,
                             std::uint64_t length) {
  MutexLock lock(&mu);
  // A grant id is a capability: from the kernel's CSPRNG, so ids a peer sees say nothing of
  // the ids granted to others (a Mersenne Twister gives its state away in 312 outputs).
  std::uint64_t id = 0;
  while (id == 0 || grants_.count(id) != 0) id = SecureRandomU64();
  grants_[id] = Grant{std::move(region), offset, length};
  return id;
}

StatusCode Core::Resolve(std::uint64_t grant, std::uint64_t offset, std::uint64_t length,
                         PinRef* pin, std::byte** where) {
  std::shared_ptr<RegionState> region;
  std::uint64_t base = 0;
  {
    MutexLock lock(&mu);
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
    MutexLock lock(&mu);
    for (auto it = grants_.begin(); it != grants_.end();) {
      it = it->second.region == region ? grants_.erase(it) : std::next(it);
    }
  }
  {
    MutexLock lock(&region->mu);
    region->revoked = true;
    if (region->pins == 0) return;
  }
  // Connections moving its bytes are failed: their frames cannot be cut short.
  for (const auto& w : workers) {
    w->RunAndWait([w = w.get(), r = region.get()] { w->FailConnsPinning(r); });
  }
  MutexLock lock(&region->mu);
  region->cv.Wait(&region->mu, [&]() KVF_REQUIRES(region->mu) { return region->pins == 0; });
}

void Core::ApplySocketOptions(int fd) const {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Before connect(): the receive buffer sets the window scale offered.
  if (options_.receive_buffer_bytes > 0) {
    const int b = options_.receive_buffer_bytes;
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
  }
}

void Core::ApplyPacingRate(int fd) const {
  // The kernel takes 64 bits since Linux 4.20; ~0 is "no cap".
  const std::uint64_t rate = pacing_rate.load();
  const std::uint64_t value = rate == 0 ? ~std::uint64_t{0} : rate;
  (void)::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &value, sizeof(value));
}

void Core::ApplySendBuffer(int fd) const {
  const int b = SendBufferFor(options_.send_buffer_bytes, PeerOnThisHost(fd));
  if (b > 0) (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
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
    MutexLock lock(&mu_);
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
  Mutex m;
  CondVar cv;
  bool done = false;
  const bool posted = Post([&] {
    fn();
    MutexLock lock(&m);
    done = true;
    cv.NotifyAll();
  });
  if (!posted) {
    // Stopped (or stopping: Stop joins the thread before returning, so this
    // waits for it): nothing runs there any more.
    Stop();
    fn();
    return;
  }
  MutexLock lock(&m);
  cv.Wait(&m, [&] { return done; });
}

void Worker::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopping_ = true;
  }
  if (OnThread()) return;  // the loop sees stopping_ after this task
  const std::uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  MutexLock lock(&mu_);
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

void Worker::ApplyPacingRate() {
  for (auto& [raw, c] : conns_) core_->ApplyPacingRate(c->fd());
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
    if (core_->handshaking->load(std::memory_order_relaxed) >= core_->options().max_handshakes) {
      // Too many strangers in their handshake: shed this one at once.
      ::close(fd);
      core_->handshakes_shed.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    core_->handshaking->fetch_add(1, std::memory_order_relaxed);
    core_->ApplySocketOptions(fd);
    core_->ApplySendBuffer(fd);
    if (core_->pacing_rate.load() != 0) core_->ApplyPacingRate(fd);
    std::shared_ptr<Worker> w = core_->NextWorker();
    auto conn = std::make_shared<Conn>(fd, w, FormatSocketAddress(sa), /*accepted=*/true, 0);
    conn->HoldHandshakeSlot(core_->handshaking);
    if (const std::shared_ptr<const TcpTls>& tls = core_->options().tls; tls != nullptr) {
      SSL* ssl = tls->NewServer(fd);
      if (ssl == nullptr) continue;  // no certificate: the conn closes its fd
      conn->SetTls(ssl, /*accepting=*/true);
    }
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
          MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
}

}  // namespace kvfabric::tcp::internal
