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
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/testing/wait_for.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "security/grpc_security.h"
#include "security/testing/test_pki.h"
#include "tests/cache_host_test_client.h"
#include "tests/http_client.h"
#include "tests/server_process.h"

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
    for (const auto& n : sresp.namespaces()) saw_beta = saw_beta || n.namespace_() == "beta";
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

}  // namespace
}  // namespace kvfabric
