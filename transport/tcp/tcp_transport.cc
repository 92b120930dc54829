#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
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
#include "core/socket_address.h"
#include "core/units.h"
#include "transport/tcp/tcp_internal.h"

namespace kvfabric::tcp {

namespace {
constexpr int kMinSocketBuffer = 4 << 10;
constexpr int kMaxSocketBuffer = 64 << 20;
}  // namespace

using transport::Deadline;
using transport::Endpoint;
using transport::MemoryKind;
using transport::MemoryRegion;

namespace internal {

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
  if (max_handshakes < 1 || max_handshakes > (1u << 20)) {
    return Status::InvalidArgument("TCP max_handshakes = " + std::to_string(max_handshakes) +
                                   ": must be 1..1048576");
  }
  if (handshake_timeout < std::chrono::milliseconds(1) || handshake_timeout > std::chrono::hours(1)) {
    return Status::InvalidArgument("TCP handshake timeout of " +
                                   std::to_string(handshake_timeout.count()) +
                                   " ms: must be 1 ms..1 h");
  }
  if (send_buffer_bytes != kSendBufferAuto && send_buffer_bytes != kKernelAutotuning &&
      (send_buffer_bytes < kMinSocketBuffer || send_buffer_bytes > kMaxSocketBuffer)) {
    return Status::InvalidArgument("TCP send buffer of " + std::to_string(send_buffer_bytes) +
                                   " bytes: must be auto, kernel or 4 KiB..64 MiB");
  }
  if (max_pacing_rate_bytes_per_s > kMaxPacingRate) {
    return Status::InvalidArgument("TCP max pacing rate of " +
                                   std::to_string(max_pacing_rate_bytes_per_s) +
                                   " bytes/s: must be 0 (no cap) .. 2^40");
  }
  if (receive_buffer_bytes != 0 &&
      (receive_buffer_bytes < kMinSocketBuffer || receive_buffer_bytes > kMaxSocketBuffer)) {
    return Status::InvalidArgument("TCP receive buffer of " + std::to_string(receive_buffer_bytes) +
                                   " bytes: must be 0 (kernel autotuning) or 4 KiB..64 MiB");
  }
  return Status::OK();
}

StatusOr<int> ParseSendBuffer(std::string_view text, std::string_view setting) {
  if (text == "auto") return kSendBufferAuto;
  if (text == "kernel") return kKernelAutotuning;
  StatusOr<std::uint64_t> bytes = ParseBytes(text);
  if (!bytes.ok() || *bytes < kMinSocketBuffer || *bytes > kMaxSocketBuffer) {
    return Status::InvalidArgument(std::string(setting) + "=\"" + std::string(text) +
                                   "\": expected auto, kernel or a size of 4KiB..64MiB");
  }
  return static_cast<int>(*bytes);
}

std::string SendBufferName(int send_buffer_bytes) {
  if (send_buffer_bytes == kSendBufferAuto) return "auto";
  if (send_buffer_bytes == kKernelAutotuning) return "kernel";
  return FormatBytes(static_cast<std::uint64_t>(send_buffer_bytes));
}

int SendBufferFor(int send_buffer_bytes, bool peer_on_this_host) {
  if (send_buffer_bytes == kSendBufferAuto) return peer_on_this_host ? kSameHostSendBufferBytes : 0;
  return send_buffer_bytes == kKernelAutotuning ? 0 : send_buffer_bytes;
}

bool PeerOnThisHost(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof(local), plen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
      local.ss_family != peer.ss_family) {
    return false;
  }
  if (peer.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local);
    const auto& p = reinterpret_cast<const sockaddr_in&>(peer);
    const std::uint32_t addr = ntohl(p.sin_addr.s_addr);
    return (addr >> 24) == 127 || l.sin_addr.s_addr == p.sin_addr.s_addr;
  }
  if (peer.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& p = reinterpret_cast<const sockaddr_in6&>(peer);
    if (IN6_IS_ADDR_LOOPBACK(&p.sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&p.sin6_addr) && p.sin6_addr.s6_addr[12] == 127) return true;
    return std::memcmp(&l.sin6_addr, &p.sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
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
  MutexLock lock(&core_->mu);
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
  MutexLock lock(&core_->mu);
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
  core_->ApplySendBuffer(fd);
  if (core_->pacing_rate.load() != 0) core_->ApplyPacingRate(fd);
  // With TLS, the handshake first; then the hello travels inside TLS.
  SSL* ssl = nullptr;
  auto fail_tls = [&](Status s) {
    if (ssl != nullptr) SSL_free(ssl);
    ssl = nullptr;
    return fail(std::move(s));
  };
  if (const std::shared_ptr<const TcpTls>& tls = core_->options().tls; tls != nullptr) {
    std::string host = address.substr(0, address.rfind(':'));
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    ssl = tls->NewClient(fd, host);
    if (ssl == nullptr) {
      return fail(Status::FailedPrecondition(
          what + ": data-plane TLS needs the CA that signs the daemons' certificates"));
    }
    for (;;) {
      const int r = SSL_connect(ssl);
      if (r == 1) break;
      const int err = SSL_get_error(ssl, r);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Status s = WaitFd(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline,
                          what + " (TLS handshake)");
        if (!s.ok()) return fail_tls(s);
        continue;
      }
      std::string why = TcpTls::LastError();
      const long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK)
        why += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
      return fail_tls(Status::Unavailable(
          what + ": TLS handshake failed: " + why +
          "; both ends must run the data plane with TLS, and the daemon's certificate must name " +
          host));
    }
  }
  // Non-blocking I/O of the hello, plain or inside TLS.
  auto io = [&](bool write, std::byte* p, std::size_t n, ssize_t* k) -> int {
    if (ssl == nullptr) {
      *k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
      if (*k >= 0) return 0;
      return errno == EAGAIN || errno == EINTR ? (write ? POLLOUT : POLLIN) : -1;
    }
    const int r =
        write ? SSL_write(ssl, p, static_cast<int>(n)) : SSL_read(ssl, p, static_cast<int>(n));
    if (r > 0) {
      *k = r;
      return 0;
    }
    const int err = SSL_get_error(ssl, r);
    if (err == SSL_ERROR_WANT_READ) return POLLIN;
    if (err == SSL_ERROR_WANT_WRITE) return POLLOUT;
    *k = err == SSL_ERROR_ZERO_RETURN ? 0 : -1;
    if (*k == 0) return 0;
    errno = ECONNRESET;
    return -1;
  };
  auto hello = wire::EncodeHello(core_->instance());
  std::size_t sent = 0;
  while (sent < hello.size()) {
    ssize_t k = 0;
    const int wait = io(true, hello.data() + sent, hello.size() - sent, &k);
    if (wait == 0 && k > 0) {
      sent += static_cast<std::size_t>(k);
    } else if (wait > 0) {
      Status s = WaitFd(fd, static_cast<short>(wait), deadline, what);
      if (!s.ok()) return fail_tls(s);
    } else {
      return fail_tls(Status::Unavailable(StatusFromErrno(errno, what).message()));
    }
  }
  // A kvfabric TCP peer sends its hello as soon as it accepts; a listener
  // that accepts and stays silent (a UCX data plane) is not one.
  const Deadline hello_deadline = std::min(deadline, transport::Clock::now() + kHelloTimeout);
  std::array<std::byte, wire::kHelloBytes> peer_hello{};
  std::size_t got = 0;
  while (got < peer_hello.size()) {
    ssize_t k = 0;
    const int wait = io(false, peer_hello.data() + got, peer_hello.size() - got, &k);
    if (wait == 0 && k > 0) {
      got += static_cast<std::size_t>(k);
    } else if (wait == 0 && k == 0) {
      return fail_tls(Status::Unavailable(
          what + ": the peer closed before its hello" +
          (ssl == nullptr ? " (does it run its data plane with TLS? then so must this side)"
                          : "")));
    } else if (wait > 0) {
      Status s = WaitFd(fd, static_cast<short>(wait), hello_deadline,
                        what + " (waiting for the peer's hello)");
      if (s.code() == StatusCode::kDeadlineExceeded && hello_deadline < deadline) {
        return fail_tls(Status::Unavailable(
            what + ": the peer accepted but sent no kvfabric TCP hello within " +
            std::to_string(kHelloTimeout.count()) +
            " s; is it a UCX data plane? Both ends must use the same data transport "
            "(--data-transport)"));
      }
      if (!s.ok()) return fail_tls(s);
    } else {
      return fail_tls(Status::Unavailable(StatusFromErrno(errno, what).message()));
    }
  }
  StatusOr<std::uint64_t> instance = wire::DecodeHello(peer_hello);
  if (!instance.ok()) return fail_tls(instance.status().WithContext(what));
  std::shared_ptr<internal::Worker> w = core_->NextWorker();
  auto conn = std::make_shared<Conn>(fd, w, FormatSocketAddress(sa), /*accepted=*/false, *instance);
  if (ssl != nullptr) conn->SetTls(ssl, /*accepting=*/false);
  auto ep = internal::NewEndpoint(conn);
  conn->SetEndpoint(ep.get());
  // Under TLS, OpenSSL's read-ahead may already hold what the peer sent
  // right after its hello (a daemon's data-plane challenge): epoll will not
  // report those bytes again, so read them now.
  const bool drain = ssl != nullptr;
  if (!w->Post([conn, drain] {
        conn->worker()->Adopt(conn);
        conn->Started(false);
        if (drain) conn->OnReadable();
      })) {
    return Status::Unavailable("the TCP transport is shutting down");
  }
  return ep;
}

Status TcpTransport::SetMaxPacingRate(std::uint64_t bytes_per_s) {
  if (bytes_per_s > kMaxPacingRate) {
    return Status::InvalidArgument("TCP max pacing rate of " + std::to_string(bytes_per_s) +
                                   " bytes/s: must be 0 (no cap) .. 2^40");
  }
  core_->pacing_rate.store(bytes_per_s);
  for (const auto& w : core_->workers) {
    w->RunAndWait([w = w.get()] { w->ApplyPacingRate(); });
  }
  return Status::OK();
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
