// The kernel-TCP transport: the conformance suite with 1 and 3 workers, and
// what only this backend promises (hostile peers, revocation under load).
#include "transport/tcp/tcp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/socket_address.h"
#include "core/testing/wait_for.h"
#include "security/testing/test_pki.h"
#include "transport/tcp/tcp_tls.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/testing/transport_conformance.h"

namespace kvfabric::tcp {
namespace {

using transport::conformance::ConformanceParamName;
using transport::conformance::TransportConformanceParam;
using transport::conformance::TransportConformanceTest;
using transport::conformance::TransportPair;

TransportPair MakeTcpPair(int workers) {
  TcpTransportOptions options;
  options.workers = workers;
  TransportPair pair;
  StatusOr<std::unique_ptr<TcpTransport>> server = CreateTcpTransport(options);
  StatusOr<std::unique_ptr<TcpTransport>> client = CreateTcpTransport(options);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(client.ok()) << client.status();
  if (!server.ok() || !client.ok()) return pair;
  TcpTransport* raw = server->get();
  pair.server = std::move(server).value();
  pair.client = std::move(client).value();
  pair.listen_address = "127.0.0.1:0";
  pair.stall_server = [raw](bool stalled) { raw->TEST_StallPeerWork(stalled); };
  return pair;
}

// Certificates for the TLS runs, issued once per test binary.
struct TestCerts {
  std::string dir;
  std::unique_ptr<kvfabric::testing::TestPki> pki, other;
  kvfabric::testing::TestPki::Files server;
  TestCerts() {
    char tmpl[] = "/tmp/kvf_tcp_tls_XXXXXX";
    dir = mkdtemp(tmpl);
    pki = std::make_unique<kvfabric::testing::TestPki>(dir, "tcp test CA");
    other = std::make_unique<kvfabric::testing::TestPki>(dir, "other CA");
    server = pki->Issue("daemon", {"IP:127.0.0.1"});
  }
};
const TestCerts& Certs() {
  static const TestCerts* certs = new TestCerts();
  return *certs;
}

// TLS on both ends: the listener presents its certificate, the client
// checks it against the CA and 127.0.0.1.
std::shared_ptr<const TcpTls> Tls(const std::string& ca, bool with_cert = true) {
  TcpTlsOptions o;
  if (with_cert) {
    o.cert_file = Certs().server.cert;
    o.key_file = Certs().server.key;
  }
  o.ca_file = ca;
  auto t = TcpTls::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

TransportPair MakeTcpTlsPair(int workers) {
  TcpTransportOptions options;
  options.workers = workers;
  options.tls = Tls(Certs().pki->ca_file());
  TransportPair pair;
  StatusOr<std::unique_ptr<TcpTransport>> server = CreateTcpTransport(options);
  StatusOr<std::unique_ptr<TcpTransport>> client = CreateTcpTransport(options);
  EXPECT_TRUE(server.ok() && client.ok());
  if (!server.ok() || !client.ok()) return pair;
  TcpTransport* raw = server->get();
  pair.server = std::move(server).value();
  pair.client = std::move(client).value();
  pair.listen_address = "127.0.0.1:0";
  pair.stall_server = [raw](bool stalled) { raw->TEST_StallPeerWork(stalled); };
  return pair;
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, TransportConformanceTest,
    ::testing::Values(TransportConformanceParam{"one_worker", [] { return MakeTcpPair(1); }},
                      TransportConformanceParam{"three_workers", [] { return MakeTcpPair(3); }},
                      TransportConformanceParam{"tls_one_worker", [] { return MakeTcpTlsPair(1); }},
                      TransportConformanceParam{"tls_three_workers",
                                                [] { return MakeTcpTlsPair(3); }}),
    ConformanceParamName);

using transport::Clock;
using transport::Endpoint;
using transport::MemoryKind;
using transport::MemoryRegion;
using transport::RemoteRegion;
using transport::Transfer;
using transport::TransferBatch;
using transport::TransferOp;

transport::Deadline Soon() { return Clock::now() + std::chrono::seconds(5); }

std::unique_ptr<TcpTransport> NewTransport(int workers = 1, TcpTransportOptions o = {}) {
  o.workers = workers;
  StatusOr<std::unique_ptr<TcpTransport>> t = CreateTcpTransport(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A server transport whose accepted endpoints the test can see.
struct Server {
  std::unique_ptr<TcpTransport> t;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Endpoint>> accepted;

  explicit Server(TcpTransportOptions o = {}) : t(NewTransport(1, o)) {
    EXPECT_TRUE(t->Listen("127.0.0.1:0",
                          [this](std::unique_ptr<Endpoint> ep) {
                            std::lock_guard<std::mutex> lock(mu);
                            accepted.push_back(std::move(ep));
                            cv.notify_all();
                          })
                    .ok());
  }
  // The transport goes first: its accept handler may still be running
  // (a client's Connect returns once the hellos are exchanged, before the
  // server hands over its endpoint), and stopping joins its threads.
  ~Server() { t.reset(); }

  Endpoint* WaitAccepted(std::size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_until(lock, Soon(), [&] { return accepted.size() >= n; })) return nullptr;
    return accepted[n - 1].get();
  }
};

// A plain socket speaking the wire format by hand: what a hostile or broken
// peer can send.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address) {
    sockaddr_storage sa{};
    socklen_t len = 0;
    EXPECT_TRUE(ParseSocketAddress(address, &sa, &len).ok());
    fd_ = ::socket(sa.ss_family, SOCK_STREAM, 0);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&sa), len), 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawPeer() { ::close(fd_); }
  int fd() const { return fd_; }
  void Send(std::span<const std::byte> bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void SendFrame(const wire::FrameHeader& h) {
    std::array<std::byte, wire::kFrameHeaderBytes> b{};
    wire::EncodeFrameHeader(h, b);
    Send(b);
  }
  // Reads exactly n bytes (empty on EOF or timeout).
  std::vector<std::byte> Read(std::size_t n) {
    std::vector<std::byte> out(n);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t k = ::recv(fd_, out.data() + got, n - got, 0);
      if (k <= 0) return {};
      got += static_cast<std::size_t>(k);
    }
    return out;
  }
  void Handshake() {
    ASSERT_EQ(Read(wire::kHelloBytes).size(), wire::kHelloBytes);
    Send(wire::EncodeHello(42));
  }

 private:
  int fd_ = -1;
};

TEST(TcpTransportTest, OptionsRefuseWhatCannotWorkNamingTheField) {
  for (int workers : {0, -1, kMaxTcpWorkers + 1}) {
    TcpTransportOptions o;
    o.workers = workers;
    const Status s = o.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("workers"), std::string::npos) << s;
  }
  for (int bytes : {-2, 1, 4095, (64 << 20) + 1}) {
    TcpTransportOptions o;
    o.send_buffer_bytes = bytes;
    EXPECT_NE(o.Validate().message().find("send buffer"), std::string::npos) << bytes;
    o = TcpTransportOptions();
    o.receive_buffer_bytes = bytes;
    EXPECT_NE(o.Validate().message().find("receive buffer"), std::string::npos) << bytes;
  }
  for (int bytes : {kSendBufferAuto, kKernelAutotuning, 4096, 256 << 10, 64 << 20}) {
    TcpTransportOptions o;
    o.send_buffer_bytes = bytes;
    EXPECT_TRUE(o.Validate().ok()) << bytes;
  }
  TcpTransportOptions autotuned;
  autotuned.receive_buffer_bytes = 0;
  EXPECT_TRUE(autotuned.Validate().ok());
  auto t = NewTransport(3);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "tcp(kernel sockets, 3 workers)");
}

TEST(TcpTransportTest, SendBufferSettingsParseAndApplyByWhereThePeerIs) {
  EXPECT_EQ(*ParseSendBuffer("auto", "--x"), kSendBufferAuto);
  EXPECT_EQ(*ParseSendBuffer("kernel", "--x"), kKernelAutotuning);
  EXPECT_EQ(*ParseSendBuffer("256KiB", "--x"), 256 << 10);
  EXPECT_EQ(*ParseSendBuffer("4096", "--x"), 4096);
  for (const char* bad : {"", "fast", "4095", "65MiB", "-1"}) {
    const Status s = ParseSendBuffer(bad, "--tcp-send-buffer").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--tcp-send-buffer"), std::string::npos) << s;
  }
  EXPECT_EQ(SendBufferName(kSendBufferAuto), "auto");
  EXPECT_EQ(SendBufferName(kKernelAutotuning), "kernel");
  EXPECT_EQ(SendBufferName(256 << 10), "256 KiB");
  // Auto: 256 KiB on this host, the kernel's autotuning (0: nothing set)
  // across a network; explicit settings apply everywhere.
  EXPECT_EQ(SendBufferFor(kSendBufferAuto, true), kSameHostSendBufferBytes);
  EXPECT_EQ(SendBufferFor(kSendBufferAuto, false), 0);
  EXPECT_EQ(SendBufferFor(kKernelAutotuning, true), 0);
  EXPECT_EQ(SendBufferFor(1 << 20, false), 1 << 20);
}

TEST(TcpTransportTest, APeerOnLoopbackIsOnThisHost) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  EXPECT_FALSE(PeerOnThisHost(client)) << "not connected yet";
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  const int server = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  EXPECT_TRUE(PeerOnThisHost(client));
  EXPECT_TRUE(PeerOnThisHost(server));
  EXPECT_FALSE(PeerOnThisHost(listener));
  for (int fd : {client, server, listener}) ::close(fd);
}

// The send buffers of this process's TCP sockets whose local or peer port
// is `port`.
std::vector<int> SendBuffersOnPort(int port) {
  std::vector<int> out;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0;
    socklen_t len = sizeof(type);
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 ||
        local.ss_family != AF_INET) {
      continue;  // not connected (the listener) or not IPv4
    }
    const int lport = ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port);
    const int pport = ntohs(reinterpret_cast<sockaddr_in&>(peer).sin_port);
    if (lport != port && pport != port) continue;
    int sndbuf = 0;
    len = sizeof(sndbuf);
    ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);
    out.push_back(sndbuf);
  }
  return out;
}

TEST(TcpTransportTest, AutoSendBuffersAreSetOnBothEndsOfALoopbackConnection) {
  for (int setting : {kSendBufferAuto, kKernelAutotuning}) {
    TcpTransportOptions o;
    o.send_buffer_bytes = setting;
    Server server(o);
    auto client = NewTransport(1, o);
    StatusOr<std::unique_ptr<Endpoint>> ep = client->Connect(
        server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
    ASSERT_TRUE(ep.ok()) << ep.status();
    ASSERT_NE(server.WaitAccepted(1), nullptr);
    const std::string addr = server.t->listen_address();
    const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
    const std::vector<int> buffers = SendBuffersOnPort(port);
    ASSERT_EQ(buffers.size(), 2u) << "the client's and the server's end";
    for (int b : buffers) {
      // Linux reports twice what was set (the doubling covers bookkeeping).
      if (setting == kSendBufferAuto) {
        EXPECT_EQ(b, 2 * kSameHostSendBufferBytes);
      } else {
        EXPECT_NE(b, 2 * kSameHostSendBufferBytes);
      }
    }
  }
}

TEST(TcpTransportTest, APacingCapIsCheckedAndAppliesToOpenConnections) {
  TcpTransportOptions o;
  o.max_pacing_rate_bytes_per_s = kMaxPacingRate + 1;
  EXPECT_TRUE(o.Validate().IsInvalidArgument());
  o.max_pacing_rate_bytes_per_s = 50'000'000;
  Server server(o);
  auto client = NewTransport(1);
  StatusOr<std::unique_ptr<Endpoint>> ep = client->Connect(
      server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_NE(server.WaitAccepted(1), nullptr);
  EXPECT_TRUE(server.t->SetMaxPacingRate(kMaxPacingRate + 1).IsInvalidArgument());
  EXPECT_TRUE(server.t->SetMaxPacingRate(10'000'000).ok());
  EXPECT_TRUE(server.t->SetMaxPacingRate(0).ok());  // lifted
}

TEST(TcpTransportTest, AGuessedGrantReadsNothingAndABrokenFrameFailsOnlyItsConnection) {
  Server server;
  std::unique_ptr<MemoryRegion> secret = *server.t->AllocateMemory(4096, MemoryKind::kHost);
  std::memset(secret->bytes().data(), 0x77, 4096);
  ASSERT_TRUE(secret->Export(0, 4096).ok());  // a grant exists; the raw peer does not know it

  RawPeer raw(server.t->listen_address());
  raw.Handshake();
  Endpoint* raw_ep = server.WaitAccepted(1);
  ASSERT_NE(raw_ep, nullptr);
  for (std::uint64_t grant : {std::uint64_t{1}, std::uint64_t{0xdeadbeef}, ~std::uint64_t{0}}) {
    raw.SendFrame({wire::FrameType::kRead, 0, 0, 9, grant, 0, 4096});
    std::vector<std::byte> reply = raw.Read(wire::kFrameHeaderBytes);
    ASSERT_EQ(reply.size(), wire::kFrameHeaderBytes);
    StatusOr<wire::FrameHeader> h = wire::DecodeFrameHeader(
        std::span<const std::byte, wire::kFrameHeaderBytes>(reply.data(), reply.size()));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->type, wire::FrameType::kReadData);
    EXPECT_EQ(h->status, static_cast<std::uint8_t>(StatusCode::kUnavailable));
    EXPECT_EQ(h->length, 0u) << "bytes of an ungranted range were sent";
  }
  // A header whose length is over the limit: the connection fails, naming it.
  std::array<std::byte, wire::kFrameHeaderBytes> evil{};
  wire::EncodeFrameHeader({wire::FrameType::kSend, 0, 0, 0, 0, 0, 0}, evil);
  evil[39] = std::byte{0x7f};
  raw.Send(evil);
  ASSERT_TRUE(WaitFor([&] { return !raw_ep->health().ok(); }, std::chrono::seconds(30),
                      "the endpoint of the peer that sent the broken frame to fail"));
  EXPECT_EQ(raw_ep->health().code(), StatusCode::kUnavailable);
  EXPECT_NE(raw_ep->health().message().find("protocol error"), std::string::npos)
      << raw_ep->health();
  EXPECT_TRUE(raw.Read(1).empty()) << "the broken connection stays open";

  // The transport goes on serving a well-behaved peer, bytes intact.
  auto client = NewTransport();
  StatusOr<std::unique_ptr<Endpoint>> ep =
      client->Connect(server.t->listen_address(), transport::PeerFailureMode::kFailInFlight,
                      Soon());
  ASSERT_TRUE(ep.ok()) << ep.status();
  std::unique_ptr<RemoteRegion> remote = *(*ep)->ImportRegion(*secret->Export(0, 4096));
  std::unique_ptr<MemoryRegion> local = *client->AllocateMemory(4096, MemoryKind::kHost);
  std::vector<Transfer> read = {{.op = TransferOp::kRead,
                                 .local = local.get(),
                                 .length = 4096,
                                 .remote = remote.get(),
                                 .header = {}}};
  std::unique_ptr<TransferBatch> b = *(*ep)->Submit(read);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  ASSERT_TRUE(b->FirstError().ok()) << b->FirstError();
  EXPECT_EQ(local->bytes()[4095], std::byte{0x77});
}

TEST(TcpTransportTest, APeerThatNeverReadsRepliesIsNoLongerReadFrom) {
  // Requests a peer sends without reading the replies queue replies; past
  // 4,096 of them the server stops reading that peer, so its sends block
  // (here: fail with EAGAIN) instead of the server's memory growing.
  TcpTransportOptions small;
  small.send_buffer_bytes = 64 << 10;
  small.receive_buffer_bytes = 64 << 10;
  Server server(small);
  std::unique_ptr<MemoryRegion> region = *server.t->AllocateMemory(4096, MemoryKind::kHost);
  RawPeer raw(server.t->listen_address());
  raw.Handshake();
  ASSERT_NE(server.WaitAccepted(1), nullptr);
  // The grant is unknown: each READ is answered by a 40-byte refusal.
  std::array<std::byte, wire::kFrameHeaderBytes> read{};
  wire::EncodeFrameHeader({wire::FrameType::kRead, 0, 0, 1, 12345, 0, 4096}, read);
  const int rcv = 16 << 10;
  ::setsockopt(raw.fd(), SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  ::setsockopt(raw.fd(), SOL_SOCKET, SO_SNDBUF, &rcv, sizeof(rcv));
  // A stream of requests, sent as far as the socket takes them.
  constexpr std::size_t kCap = 500'000;  // 20 MB of requests
  std::vector<std::byte> stream(kCap * read.size());
  for (std::size_t i = 0; i < kCap; ++i) {
    std::memcpy(stream.data() + i * read.size(), read.data(), read.size());
  }
  std::size_t sent_bytes = 0;
  bool stopped = false;  // the server took nothing more for 300 ms
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (sent_bytes < stream.size() && Clock::now() < give_up) {
    const ssize_t k = ::send(raw.fd(), stream.data() + sent_bytes, stream.size() - sent_bytes,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      sent_bytes += static_cast<std::size_t>(k);
      continue;
    }
    ASSERT_TRUE(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
    // Full. Give the server time to read what it still would, then check
    // that it has stopped: nothing more goes in. This sleep stays: "stopped
    // reading" is an absence, observed over a quiet period; the state that
    // would say it (the connection's read_paused_) is not visible from here.
    // Too short a period could let a server that never stops pass; it
    // cannot fail one that does.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const ssize_t again = ::send(raw.fd(), stream.data() + sent_bytes,
                                 stream.size() - sent_bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (again <= 0) {
      stopped = true;
      break;
    }
    sent_bytes += static_cast<std::size_t>(again);
  }
  const std::size_t sent = sent_bytes / read.size();
  std::printf("requests sent before the server stopped reading: %zu\n", sent);
  EXPECT_TRUE(stopped) << "the server kept reading requests whose replies nobody reads";
  EXPECT_LT(sent, std::size_t{50'000});
  // Reading the replies lets it go on: the first replies are refusals.
  std::vector<std::byte> reply = raw.Read(wire::kFrameHeaderBytes);
  ASSERT_EQ(reply.size(), wire::kFrameHeaderBytes);
  EXPECT_EQ(std::to_integer<int>(reply[0]), static_cast<int>(wire::FrameType::kReadData));
}

TEST(TcpTransportTest, AnAcceptedPeerThatNeverSaysHelloIsClosed) {
  TcpTransportOptions quick;
  quick.handshake_timeout = std::chrono::milliseconds(200);
  Server server(quick);
  RawPeer silent(server.t->listen_address());
  // The server's own hello comes first; then, with none from us, the close.
  ASSERT_EQ(silent.Read(wire::kHelloBytes).size(), wire::kHelloBytes);
  const auto start = Clock::now();
  EXPECT_TRUE(silent.Read(1).empty());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  TcpTransportOptions bad;
  bad.handshake_timeout = std::chrono::milliseconds(0);
  EXPECT_NE(bad.Validate().message().find("handshake timeout"), std::string::npos);
}

TEST(TcpTransportTest, ConnectRefusesAPeerThatIsNotAKvfabricTransport) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  std::thread http([fd] {
    const int c = ::accept(fd, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    (void)!::send(c, reply, sizeof(reply) - 1, MSG_NOSIGNAL);
    char sink[64];
    (void)!::recv(c, sink, sizeof(sink), 0);
    ::close(c);
  });
  auto t = NewTransport();
  StatusOr<std::unique_ptr<Endpoint>> ep =
      t->Connect("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)),
                 transport::PeerFailureMode::kFailInFlight, Soon());
  EXPECT_EQ(ep.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(ep.status().message().find("not a kvfabric TCP transport"), std::string::npos)
      << ep.status();
  http.join();
  ::close(fd);
  // Nothing listens on a closed port: refused, not hung.
  StatusOr<std::unique_ptr<Endpoint>> refused =
      t->Connect("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)),
                 transport::PeerFailureMode::kFailInFlight, Soon());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status();
}

TEST(TcpTransportTest, AnExportImportsOnlyOnAnEndpointToItsOwner) {
  Server a, b;
  auto client = NewTransport();
  StatusOr<std::unique_ptr<Endpoint>> to_a = client->Connect(
      a.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_TRUE(to_a.ok()) << to_a.status();
  std::unique_ptr<MemoryRegion> in_b = *b.t->AllocateMemory(4096, MemoryKind::kHost);
  StatusOr<std::unique_ptr<RemoteRegion>> wrong = (*to_a)->ImportRegion(*in_b->Export(0, 4096));
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("another transport"), std::string::npos);
}

TEST(TcpTransportTest, TlsRefusesAPlaintextPeerAndAServerItCannotVerify) {
  TcpTransportOptions tls;
  tls.tls = Tls(Certs().pki->ca_file());
  Server server(tls);
  // A plaintext client: the TLS listener reads its hello as a bad ClientHello.
  auto plain = NewTransport();
  StatusOr<std::unique_ptr<Endpoint>> ep =
      plain->Connect(server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_FALSE(ep.ok());
  // A TLS client trusting another CA refuses the listener's certificate.
  TcpTransportOptions distrust;
  distrust.tls = Tls(Certs().other->ca_file(), /*with_cert=*/false);
  auto wary = NewTransport(1, distrust);
  ep = wary->Connect(server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("certificate verify failed"), std::string::npos)
      << ep.status();
  // The right CA connects, and 8 MiB written arrive intact.
  auto good = NewTransport(1, tls);
  ep = good->Connect(server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_TRUE(ep.ok()) << ep.status();
  constexpr std::uint64_t kBig = 8 << 20;
  std::unique_ptr<MemoryRegion> target = *server.t->AllocateMemory(kBig, MemoryKind::kHost);
  std::unique_ptr<RemoteRegion> remote = *(*ep)->ImportRegion(*target->Export(0, kBig));
  std::unique_ptr<MemoryRegion> source = *good->AllocateMemory(kBig, MemoryKind::kHost);
  for (std::uint64_t i = 0; i < kBig; ++i) source->bytes()[i] = std::byte(i * 31 % 251);
  std::vector<Transfer> batch = {{.op = TransferOp::kWrite,
                                  .local = source.get(),
                                  .length = kBig,
                                  .remote = remote.get(),
                                  .header = {}}};
  std::unique_ptr<TransferBatch> b = *(*ep)->Submit(batch);
  ASSERT_TRUE(b->Wait(Soon()).ok());
  ASSERT_TRUE(b->FirstError().ok()) << b->FirstError();
  EXPECT_EQ(std::memcmp(source->bytes().data(), target->bytes().data(), kBig), 0);
}

TEST(TcpTransportTest, UnderTlsAMessageSentAtAcceptReachesTheConnectingSide) {
  // The listener greets each connection as soon as it is accepted (as a
  // daemon's data plane sends its challenge). Under TLS the greeting may
  // arrive inside the read-ahead of the connecting side's handshake, where
  // epoll never reports it: it must still be delivered.
  TcpTransportOptions tls;
  tls.tls = Tls(Certs().pki->ca_file());
  for (int round = 0; round < 20; ++round) {
    auto server = NewTransport(1, tls);
    std::mutex mu;
    std::vector<std::unique_ptr<Endpoint>> accepted;
    std::vector<std::unique_ptr<TransferBatch>> greetings;
    const std::byte greeting[4] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
    ASSERT_TRUE(server
                    ->Listen("127.0.0.1:0",
                             [&](std::unique_ptr<Endpoint> ep) {
                               std::lock_guard<std::mutex> lock(mu);
                               Transfer t{.op = TransferOp::kSend, .header = greeting};
                               auto b = ep->Submit(std::span<const Transfer>(&t, 1));
                               if (b.ok()) greetings.push_back(std::move(*b));
                               accepted.push_back(std::move(ep));
                             })
                    .ok());
    auto client = NewTransport(1, tls);
    std::atomic<int> received{0};
    client->SetMessageHandler([&](transport::IncomingMessage& m) {
      if (m.header().size() == sizeof(greeting)) received.fetch_add(1);
    });
    StatusOr<std::unique_ptr<Endpoint>> ep = client->Connect(
        server->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
    ASSERT_TRUE(ep.ok()) << ep.status();
    ASSERT_TRUE(WaitFor([&] { return received.load() == 1; }, std::chrono::seconds(5),
                        "the greeting sent at accept"))
        << "round " << round;
    ep->reset();
    client.reset();
    server.reset();
  }
}

TEST(TcpTransportTest, EntriesWrittenBeforeAFullSocketStillComplete) {
  // One batch: a message, then a write far larger than the socket buffers.
  // The message leaves in the same pass that finds the socket full; its
  // completion must not be lost with that pass.
  Server server;
  constexpr std::uint64_t kBig = 8 << 20;
  std::unique_ptr<MemoryRegion> target = *server.t->AllocateMemory(kBig, MemoryKind::kHost);
  auto client = NewTransport();
  StatusOr<std::unique_ptr<Endpoint>> ep = client->Connect(
      server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
  ASSERT_TRUE(ep.ok()) << ep.status();
  std::unique_ptr<RemoteRegion> remote = *(*ep)->ImportRegion(*target->Export(0, kBig));
  std::unique_ptr<MemoryRegion> source = *client->AllocateMemory(kBig, MemoryKind::kHost);
  std::memset(source->bytes().data(), 0x3c, kBig);
  const std::byte header[8] = {};
  for (int round = 0; round < 8; ++round) {
    std::vector<Transfer> batch = {
        {.op = TransferOp::kSend, .header = header},
        {.op = TransferOp::kWrite,
         .local = source.get(),
         .length = kBig,
         .remote = remote.get(),
         .header = {}},
    };
    std::unique_ptr<TransferBatch> b = *(*ep)->Submit(batch);
    ASSERT_TRUE(b->Wait(Soon()).ok()) << "round " << round << ": an entry never completed";
    ASSERT_TRUE(b->FirstError().ok()) << b->FirstError();
  }
  EXPECT_EQ(target->bytes()[kBig - 1], std::byte{0x3c});
}

TEST(TcpTransportTest, RegionDestroyedUnderConcurrentReadsAndWritesIsNeverTouchedAfter) {
  Server server;
  constexpr std::uint64_t kBlock = 1 << 20;
  constexpr int kClients = 3;
  std::unique_ptr<MemoryRegion> region =
      *server.t->AllocateMemory(kClients * kBlock, MemoryKind::kHost);
  const std::string exported = *region->Export(0, kClients * kBlock);
  std::atomic<bool> stop{false};
  std::atomic<int> ok_entries{0}, failed_entries{0}, finished_clients{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      struct Finished {
        std::atomic<int>& n;
        ~Finished() { n.fetch_add(1); }
      } finished{finished_clients};  // also when an ASSERT returns early
      auto t = NewTransport();
      StatusOr<std::unique_ptr<Endpoint>> ep = t->Connect(
          server.t->listen_address(), transport::PeerFailureMode::kFailInFlight, Soon());
      ASSERT_TRUE(ep.ok()) << ep.status();
      std::unique_ptr<RemoteRegion> remote = *(*ep)->ImportRegion(exported);
      std::unique_ptr<MemoryRegion> local = *t->AllocateMemory(kBlock, MemoryKind::kHost);
      while (!stop.load()) {
        std::vector<Transfer> batch;
        for (TransferOp op : {TransferOp::kWrite, TransferOp::kRead}) {
          batch.push_back({.op = op,
                           .local = local.get(),
                           .length = kBlock,
                           .remote = remote.get(),
                           .remote_offset = c * kBlock,
                           .header = {}});
        }
        StatusOr<std::unique_ptr<TransferBatch>> b = (*ep)->Submit(batch);
        if (!b.ok()) break;
        ASSERT_TRUE((*b)->Wait(Soon()).ok()) << "an entry hung";
        for (const auto& r : (*b)->results()) {
          if (r.status.ok()) {
            ok_entries.fetch_add(1);
          } else {
            EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status;
            failed_entries.fetch_add(1);
          }
        }
        if (!(*ep)->health().ok()) break;
      }
    });
  }
  EXPECT_TRUE(
      WaitFor([&] { return ok_entries.load() >= 3 * kClients || finished_clients.load() > 0; },
              std::chrono::seconds(60), "the clients to complete 3 entries each on average"));
  region.reset();  // revokes the grant; connections moving its bytes fail first
  // Clients go on submitting until one sees the region go (or all stop).
  EXPECT_TRUE(
      WaitFor([&] { return failed_entries.load() >= 1 || finished_clients.load() == kClients; },
              std::chrono::seconds(60), "a client to see the revoked region fail an entry"));
  stop.store(true);
  for (auto& t : clients) t.join();
  EXPECT_GE(failed_entries.load(), 1) << "no entry saw the region go";
}

}  // namespace
}  // namespace kvfabric::tcp
