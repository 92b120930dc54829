// Two tenants on one real kvfabric-placement and kvfabric-cached, both with
// mutual TLS and a tenants file (docs/security.md): tenant beta stores a
// chain; tenant alpha, with a valid certificate of the same CA, is refused
// every operation on beta's namespace with PERMISSION_DENIED (counted in
// kvfabric_auth_denied_total), and the refusal is the same for beta's
// existing keys and for keys that do not exist. A peer without a
// certificate, or with another CA's, does not get past the handshake; one
// whose certificate names no tenant is UNAUTHENTICATED; administrative
// RPCs need the operator's identity; only the daemon's identity may announce
// hosts to placement.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/status_command.h"
#include "core/mutex.h"
#include "core/secure_random.h"
#include "core/sha256.h"
#include "core/testing/wait_for.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "proto/transfer_wire.h"
#include "security/grpc_security.h"
#include "security/testing/test_pki.h"
#include "tests/cache_host_test_client.h"
#include "tests/http_client.h"
#include "tests/server_process.h"
#include "transport/data_transport.h"

namespace kvfabric {
namespace {

using std::chrono_literals::operator""s;

constexpr int kBlocks = 4;

class TenantIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvf_tenants_e2e_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    pki_ = std::make_unique<testing::TestPki>(dir_, "tenant test CA");
    foreign_ = std::make_unique<testing::TestPki>(dir_, "foreign CA");
    const auto placement = pki_->Issue("placement", {"IP:127.0.0.1"});
    const auto cached = pki_->Issue("cached-1", {"IP:127.0.0.1", "DNS:cached.example"});
    alpha_ = pki_->Issue("alpha-engine", {"DNS:alpha.example"});
    beta_ = pki_->Issue("beta-engine", {"DNS:beta.example"});
    ops_ = pki_->Issue("operator", {"DNS:ops.example"});
    stranger_ = pki_->Issue("stranger", {"DNS:stranger.example"});
    std::ofstream(dir_ + "/tenants.yaml") << "tenants:\n"
                                             "  - {name: alpha, identities: [alpha.example], "
                                             "namespaces: [alpha]}\n"
                                             "  - {name: beta, identities: [beta.example], "
                                             "namespaces: [beta], quota: 16MiB}\n"
                                             "  - {name: ops, identities: [ops.example], "
                                             "admin: true}\n"
                                             "  - {name: hosts, identities: [cached.example], "
                                             "daemon: true}\n";
    auto tls = [&](const testing::TestPki::Files& f) {
      return std::vector<std::string>{"--tls-cert=" + f.cert, "--tls-key=" + f.key,
                                      "--tls-ca=" + pki_->ca_file(),
                                      "--tenants-file=" + dir_ + "/tenants.yaml"};
    };
    std::vector<std::string> pflags = {"--grpc-address=127.0.0.1:0",
                                       "--metrics-address=127.0.0.1:0", "--log-level=warn"};
    for (std::string& f : tls(placement)) pflags.push_back(std::move(f));
    auto p = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"), "placement", dir_, pflags);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    placement_ = std::move(*p);
    std::vector<std::string> dflags = {"--host-id=tls-host",
                                       "--grpc-address=127.0.0.1:0",
                                       "--transport-address=127.0.0.1:0",
                                       "--data-transport=tcp",
                                       "--metrics-address=127.0.0.1:0",
                                       "--lock-memory=off",
                                       "--log-level=warn",
                                       "--host-pool-bytes=32MiB",
                                       "--host-page-bytes=32KiB",
                                       "--placement-address=" + placement_->grpc(),
                                       "--membership-ttl=60s"};
    for (std::string& f : tls(cached)) dflags.push_back(std::move(f));
    auto d = testing::ServerProcess::Start(testing::ServerBinary("KVF_CACHED", "kvfabric-cached"),
                                           "cached", dir_, dflags);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }

  void TearDown() override {
    daemon_.reset();
    placement_.reset();
    std::filesystem::remove_all(dir_);
  }

  GrpcSecurityOptions As(const testing::TestPki::Files& who) const {
    GrpcSecurityOptions o;
    o.cert_file = who.cert;
    o.key_file = who.key;
    o.ca_file = pki_->ca_file();
    return o;
  }
  template <typename Service>
  std::unique_ptr<typename Service::Stub> Stub(const std::string& address,
                                               const GrpcSecurityOptions& o) {
    auto channel = OpenSecureChannel(address, o, grpc::ChannelArguments());
    EXPECT_TRUE(channel.ok()) << channel.status().ToString();
    return Service::NewStub(*channel);
  }
  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + 10s);
    return c;
  }
  // The value of `series` in `metrics` text, or -1.
  static double Sample(const std::string& text, const std::string& series) {
    const std::size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::atof(text.c_str() + at + series.size() + 2);
  }

  std::string dir_;
  std::unique_ptr<testing::TestPki> pki_;
  std::unique_ptr<testing::TestPki> foreign_;
  testing::TestPki::Files alpha_, beta_, ops_, stranger_;
  std::unique_ptr<testing::ServerProcess> placement_;
  std::unique_ptr<testing::ServerProcess> daemon_;
};

TEST_F(TenantIsolationTest, TenantsAreIdentitiesAndCannotReachEachOther) {
  auto beta_placement = Stub<v1::Placement>(placement_->grpc(), As(beta_));
  // The daemon registered with placement over mutual TLS as a daemon.
  ASSERT_TRUE(WaitFor(
      [&] {
        v1::ListHostsResponse r;
        return beta_placement->ListHosts(Ctx().get(), v1::ListHostsRequest(), &r).ok() &&
               r.hosts_size() == 1;
      },
      30s, "placement to list the daemon"));

  // Beta stores a chain through the daemon (gRPC over mutual TLS, data over TCP).
  auto beta = testing::CacheHostTestClient::Create(/*seed=*/7, testing::kKernelTcp);
  ASSERT_TRUE(beta.ok()) << beta.status().ToString();
  (*beta)->set_security(As(beta_));
  ASSERT_TRUE((*beta)->Attach(daemon_->grpc(), daemon_->transport()).ok());
  ASSERT_TRUE((*beta)->PutBatch(0, kBlocks, "beta").ok());
  ASSERT_TRUE((*beta)->GetBatch({0, 1, 2, 3}, "beta").ok());

  // Alpha, on beta's namespace: every data RPC is refused before any key is
  // looked at, identically for beta's keys and for keys that exist nowhere.
  auto alpha = Stub<v1::CacheHost>(daemon_->grpc(), As(alpha_));
  std::vector<std::string> messages;
  for (bool existing : {true, false}) {
    SCOPED_TRACE(existing ? "beta's keys" : "missing keys");
    auto key = [&](int i) {
      return existing ? (*beta)->Key(i) : std::string(32, static_cast<char>('a' + i));
    };
    std::vector<grpc::Status> refusals;
    {
      v1::LookupRequest req;
      req.set_namespace_("beta");
      for (int i = 0; i < kBlocks; ++i) req.add_keys(key(i));
      v1::LookupResponse resp;
      refusals.push_back(alpha->Lookup(Ctx().get(), req, &resp));
      EXPECT_EQ(resp.results_size(), 0);
    }
    {
      v1::LeaseRequest req;
      req.set_namespace_("beta");
      for (int i = 0; i < kBlocks; ++i) req.add_keys(key(i));
      v1::LeaseResponse resp;
      refusals.push_back(alpha->Lease(Ctx().get(), req, &resp));
    }
    {
      v1::DeleteRequest req;
      req.set_namespace_("beta");
      req.add_keys(key(0));
      v1::DeleteResponse resp;
      refusals.push_back(alpha->Delete(Ctx().get(), req, &resp));
    }
    {
      v1::ReserveRequest req;  // an overwrite
      req.set_namespace_("beta");
      v1::BlockDescriptor* b = req.add_blocks();
      b->set_key(key(0));
      b->set_payload_bytes(testing::kTestBlockBytes);
      *req.mutable_fingerprint() = testing::CacheHostTestClient::Fingerprint();
      v1::ReserveResponse resp;
      refusals.push_back(alpha->Reserve(Ctx().get(), req, &resp));
    }
    {
      v1::ExplainEvictionRequest req;
      req.set_namespace_("beta");
      req.set_key(key(0));
      v1::ExplainEvictionResponse resp;
      refusals.push_back(alpha->ExplainEviction(Ctx().get(), req, &resp));
    }
    for (const grpc::Status& s : refusals) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      messages.push_back(s.error_message());
    }
  }
  for (std::size_t i = 0; i < messages.size() / 2; ++i) {
    EXPECT_EQ(messages[i], messages[i + messages.size() / 2]) << "the refusal tells keys apart";
  }
  // Commit, Renew and Release name a grant, but the namespace is checked first.
  {
    v1::ReleaseRequest req;
    req.set_namespace_("beta");
    v1::ReleaseResponse resp;
    EXPECT_EQ(alpha->Release(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // Placement: Locate, Plan, Place, ListPlans of beta's namespace are refused
  // too; beta's own Locate finds its blocks.
  auto alpha_placement = Stub<v1::Placement>(placement_->grpc(), As(alpha_));
  {
    v1::LocateRequest req;
    req.set_namespace_("beta");
    for (int i = 0; i < kBlocks; ++i) req.add_keys((*beta)->Key(i));
    v1::LocateResponse resp;
    EXPECT_EQ(alpha_placement->Locate(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    ASSERT_TRUE(WaitFor(
        [&] {
          v1::LocateResponse mine;
          return beta_placement->Locate(Ctx().get(), req, &mine).ok() &&
                 mine.locations().cached_prefix_blocks() == kBlocks;
        },
        30s, "beta to locate its chain"));
  }
  {
    v1::PlaceRequest req;
    req.set_namespace_("beta");
    req.add_keys((*beta)->Key(0));
    v1::PlaceResponse resp;
    EXPECT_EQ(alpha_placement->Place(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::PlanRequest req;
    req.set_namespace_("beta");
    req.add_keys((*beta)->Key(0));
    v1::PlanResponse resp;
    EXPECT_EQ(alpha_placement->Plan(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::ListPlansRequest req;
    req.set_namespace_("beta");
    v1::ListPlansResponse resp;
    EXPECT_EQ(alpha_placement->ListPlans(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    req.clear_namespace_();  // every namespace: operators only
    EXPECT_EQ(alpha_placement->ListPlans(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // Only a daemon's identity announces hosts.
  {
    v1::RegisterRequest req;
    req.set_host_id("fake-host");
    v1::RegisterResponse resp;
    EXPECT_EQ(alpha_placement->Register(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // Administrative RPCs: refused to a tenant, served to the operator.
  {
    v1::DrainRequest req;
    req.set_resume(true);
    v1::DrainResponse resp;
    EXPECT_EQ(alpha->Drain(Ctx().get(), req, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    v1::StatsRequest sreq;
    sreq.set_include_namespaces(true);
    v1::StatsResponse sresp;
    EXPECT_EQ(alpha->Stats(Ctx().get(), sreq, &sresp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    auto ops = Stub<v1::CacheHost>(daemon_->grpc(), As(ops_));
    grpc::Status s = ops->Stats(Ctx().get(), sreq, &sresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    bool saw_beta = false;
    for (const auto& n : sresp.namespaces()) {
      if (n.namespace_() != "beta") continue;
      saw_beta = true;
      // The tenants file's quota became the namespace's quota on the daemon.
      EXPECT_EQ(n.quota_bytes(), std::uint64_t{16} << 20);
    }
    EXPECT_TRUE(saw_beta);
    s = ops->Drain(Ctx().get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  // Beta's blocks are untouched.
  ASSERT_TRUE((*beta)->GetBatch({0, 1, 2, 3}, "beta").ok());

  // Who is not a tenant: a certificate of the CA naming nobody, no
  // certificate, another CA's certificate.
  {
    v1::LookupRequest req;
    req.set_namespace_("alpha");
    req.add_keys(std::string(32, 'z'));
    v1::LookupResponse resp;
    grpc::Status s =
        Stub<v1::CacheHost>(daemon_->grpc(), As(stranger_))->Lookup(Ctx().get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    GrpcSecurityOptions anonymous;
    anonymous.ca_file = pki_->ca_file();
    EXPECT_EQ(Stub<v1::CacheHost>(daemon_->grpc(), anonymous)
                  ->Lookup(Ctx().get(), req, &resp)
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
    const testing::TestPki::Files forged = foreign_->Issue("alpha-forged", {"DNS:alpha.example"});
    GrpcSecurityOptions foreign = As(forged);
    EXPECT_EQ(
        Stub<v1::CacheHost>(daemon_->grpc(), foreign)->Lookup(Ctx().get(), req, &resp).error_code(),
        grpc::StatusCode::UNAVAILABLE);
    // Alpha's own namespace works.
    grpc::Status own = alpha->Lookup(Ctx().get(), req, &resp);
    EXPECT_TRUE(own.ok()) << own.error_message();
  }

  // `kvfabric status` over mutual TLS, as the operator; without a client
  // certificate it fails.
  cli::StatusArgs status;
  status.placement = placement_->grpc();
  status.security = As(ops_);
  Status listed = cli::RunStatus(status);
  EXPECT_TRUE(listed.ok()) << listed.ToString();
  status.security = GrpcSecurityOptions();
  status.security.ca_file = pki_->ca_file();
  EXPECT_FALSE(cli::RunStatus(status).ok());

  // Every refusal was counted, by reason.
  auto scrape = [](const std::string& url) {
    auto r = testing::HttpRequest(testing::HostPort(url), "GET", "/metrics");
    return r.ok() ? r->body : std::string();
  };
  const std::string cached_metrics = scrape(daemon_->metrics());
  EXPECT_GE(
      Sample(cached_metrics, "kvfabric_auth_denied_total{process=\"cached\",reason=\"namespace\"}"),
      11)
      << cached_metrics;
  EXPECT_GE(
      Sample(cached_metrics, "kvfabric_auth_denied_total{process=\"cached\",reason=\"admin\"}"), 2);
  EXPECT_GE(Sample(cached_metrics,
                   "kvfabric_auth_denied_total{process=\"cached\",reason=\"unauthenticated\"}"),
            1);
  const std::string placement_metrics = scrape(placement_->metrics());
  EXPECT_GE(Sample(placement_metrics,
                   "kvfabric_auth_denied_total{process=\"placement\",reason=\"daemon\"}"),
            1)
      << placement_metrics;
}

// A data-plane peer that speaks the wire by hand over kernel TCP: what an
// attacker who reached the daemon's data port could send.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address) {
    transport::DataTransportOptions o;
    o.kind = "tcp";
    auto t = transport::CreateDataTransport(o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    transport_ = std::move(*t);
    transport_->SetMessageHandler([this](transport::IncomingMessage& msg) {
      if (msg.payload_length() > 0) msg.Drop();
      auto m = wire::DecodeTransferMessage(msg.header());
      if (!m.ok()) return;
      MutexLock l(&mu_);
      inbox_.push_back(std::move(*m));
    });
    auto ep = transport_->Connect(address, transport::PeerFailureMode::kFailInFlight,
                                  transport::Clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    ep_ = std::move(*ep);
  }
  ~RawPeer() {
    ep_->Close(transport::CloseMode::kForce, transport::Clock::now()).IgnoreError();
    sends_.clear();
    ep_.reset();
  }

  // The daemon's kChallenge nonce (waits for it).
  std::array<std::uint8_t, wire::kHelloBytes> Challenge() {
    std::array<std::uint8_t, wire::kHelloBytes> nonce{};
    EXPECT_TRUE(WaitFor([&] { return Find(wire::TransferOpCode::kChallenge, &nonce); }, 10s,
                        "the daemon's challenge"));
    return nonce;
  }
  void Send(const wire::TransferMessage& m) {
    auto encoded = wire::EncodeTransferMessage(m);
    ASSERT_TRUE(encoded.ok());
    wire_.push_back(*encoded);
    transport::Transfer t;
    t.op = transport::TransferOp::kSend;
    t.header = std::as_bytes(std::span<const char>(wire_.back().data(), wire_.back().size()));
    auto batch = ep_->Submit(std::span<const transport::Transfer>(&t, 1));
    if (batch.ok()) sends_.push_back(std::move(*batch));
  }
  void Hello(std::uint64_t session, const std::array<std::uint8_t, 32>& secret,
             const std::array<std::uint8_t, wire::kHelloBytes>& nonce) {
    wire::TransferMessage h;
    h.op = wire::TransferOpCode::kHello;
    h.request_id = 1;
    h.lease_id = session;
    h.hello = *HmacSha256(secret, wire::HelloProofInput(nonce, session));
    Send(h);
  }
  bool Replied() {
    std::array<std::uint8_t, wire::kHelloBytes> unused{};
    return Find(wire::TransferOpCode::kReply, &unused);
  }
  bool Closed() const { return !ep_->health().ok(); }

 private:
  bool Find(wire::TransferOpCode op, std::array<std::uint8_t, wire::kHelloBytes>* hello) {
    MutexLock l(&mu_);
    for (const wire::TransferMessage& m : inbox_) {
      if (m.op != op) continue;
      *hello = m.hello;
      return true;
    }
    return false;
  }

  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<transport::Endpoint> ep_;
  std::deque<std::string> wire_;
  std::vector<std::unique_ptr<transport::TransferBatch>> sends_;
  Mutex mu_;
  std::vector<wire::TransferMessage> inbox_;
};

TEST_F(TenantIsolationTest, DataPlaneConnectionsProveTheirSessionBeforeAnythingIsRead) {
  auto alpha = Stub<v1::CacheHost>(daemon_->grpc(), As(alpha_));
  v1::OpenDataSessionResponse session;
  grpc::Status g = alpha->OpenDataSession(Ctx().get(), v1::OpenDataSessionRequest(), &session);
  ASSERT_TRUE(g.ok()) << g.error_message();
  ASSERT_EQ(session.secret().size(), 32u);
  EXPECT_TRUE(session.required());
  std::array<std::uint8_t, 32> secret{};
  std::memcpy(secret.data(), session.secret().data(), 32);

  // A request before any hello: closed, unanswered.
  RawPeer silent(daemon_->transport());
  silent.Challenge();
  wire::TransferMessage import;
  import.op = wire::TransferOpCode::kImportRegion;
  import.request_id = 5;
  import.region_id = 1;
  import.import_total_bytes = 8;
  import.import_chunk = "12345678";
  silent.Send(import);
  ASSERT_TRUE(WaitFor([&] { return silent.Closed(); }, 15s, "the daemon to close it"));
  EXPECT_FALSE(silent.Replied());

  // The right proof opens a connection.
  RawPeer good(daemon_->transport());
  const auto nonce = good.Challenge();
  good.Hello(session.session_id(), secret, nonce);
  ASSERT_TRUE(WaitFor([&] { return good.Replied(); }, 10s, "the hello's reply"));
  EXPECT_FALSE(good.Closed());

  // That proof replayed on another connection (another nonce), and a proof
  // made with a guessed secret: closed, unanswered.
  RawPeer replay(daemon_->transport());
  replay.Challenge();
  replay.Hello(session.session_id(), secret, nonce);
  RawPeer forged(daemon_->transport());
  std::array<std::uint8_t, 32> guess{};
  SecureRandomBytes(guess);
  forged.Hello(session.session_id(), guess, forged.Challenge());
  ASSERT_TRUE(
      WaitFor([&] { return replay.Closed() && forged.Closed(); }, 15s, "the daemon to close both"));
  EXPECT_FALSE(replay.Replied());
  EXPECT_FALSE(forged.Replied());

  // A verified connection acts for its tenant only: beta's grant, presented
  // on alpha's connection, is refused as unknown; on beta's own it works.
  auto beta = testing::CacheHostTestClient::Create(/*seed=*/11, testing::kKernelTcp);
  ASSERT_TRUE(beta.ok());
  (*beta)->set_security(As(beta_));
  ASSERT_TRUE((*beta)->Attach(daemon_->grpc(), daemon_->transport()).ok());
  ASSERT_TRUE((*beta)->PutBatch(0, 1, "beta").ok());
  v1::LeaseRequest lreq;
  lreq.set_namespace_("beta");
  lreq.add_keys((*beta)->Key(0));
  v1::LeaseResponse lease;
  ASSERT_TRUE((*beta)->stub()->Lease(Ctx().get(), lreq, &lease).ok());
  ASSERT_EQ(lease.results_size(), 1);
  std::array<std::uint8_t, 16> token{};
  std::memcpy(token.data(), lease.grant().access_token().data(), 16);
  std::vector<wire::TransferRange> ranges;
  std::uint64_t at = 0;
  for (const v1::Extent& e : lease.results(0).extents()) {
    ranges.push_back({e.offset_bytes(), e.length_bytes(), at});
    at += e.length_bytes();
  }
  auto alpha_client = testing::CacheHostTestClient::Create(/*seed=*/12, testing::kKernelTcp);
  ASSERT_TRUE(alpha_client.ok());
  (*alpha_client)->set_security(As(alpha_));
  ASSERT_TRUE((*alpha_client)->Attach(daemon_->grpc(), daemon_->transport()).ok());
  const auto deadline = transport::Clock::now() + std::chrono::seconds(10);
  Status stolen = (*alpha_client)
                      ->data()
                      ->Transfer((*alpha_client)->connection(), client::DataOp::kGet,
                                 lease.lease_id(), token, /*region_id=*/1, ranges, deadline);
  EXPECT_TRUE(stolen.IsNotFound()) << stolen.ToString();
  Status own =
      (*beta)->data()->Transfer((*beta)->connection(), client::DataOp::kGet, lease.lease_id(),
                                token, /*region_id=*/1, ranges, deadline);
  EXPECT_TRUE(own.ok()) << own.ToString();

  // By key, too: alpha's connection may neither fetch from nor store into
  // beta's namespace (kFetch, kStore), and its kStore leaves nothing there.
  wire::FetchKey beta_key{};
  std::memcpy(beta_key.data(), (*beta)->Key(0).data(), beta_key.size());
  client::DataPlaneClient::FetchRequest fetch;
  fetch.ns = "beta";
  fetch.keys = std::span<const wire::FetchKey>(&beta_key, 1);
  fetch.region_id = 1;
  fetch.slot_bytes = at;
  auto fetched = (*alpha_client)->data()->Fetch((*alpha_client)->connection(), fetch, deadline);
  EXPECT_EQ(fetched.status().code(), StatusCode::kPermissionDenied) << fetched.status().ToString();
  wire::StoreEntry entry;
  entry.key.fill(0x5a);
  entry.payload_bytes = at;
  client::DataPlaneClient::StoreRequest store;
  store.ns = "beta";
  store.region_id = 1;
  store.shape.tokens_per_block = 16;
  store.shape.layers = 1;
  store.shape.kv_heads = 1;
  store.shape.head_dim = 1;
  store.entries = std::span<const wire::StoreEntry>(&entry, 1);
  auto stored = (*alpha_client)->data()->Store((*alpha_client)->connection(), store, deadline);
  EXPECT_EQ(stored.status().code(), StatusCode::kPermissionDenied) << stored.status().ToString();
  v1::LookupRequest look;
  look.set_namespace_("beta");
  look.add_keys(std::string(32, '\x5a'));
  v1::LookupResponse found;
  ASSERT_TRUE((*beta)->stub()->Lookup(Ctx().get(), look, &found).ok());
  ASSERT_EQ(found.results_size(), 1);
  EXPECT_EQ(found.results(0).status().code(), static_cast<int>(StatusCode::kNotFound));

  auto r = testing::HttpRequest(testing::HostPort(daemon_->metrics()), "GET", "/metrics");
  ASSERT_TRUE(r.ok());
  EXPECT_GE(Sample(r->body,
                   "kvfabric_cache_host_data_connections_closed_total{reason=\"unauthenticated\"}"),
            3)
      << r->body;
}

}  // namespace
}  // namespace kvfabric
