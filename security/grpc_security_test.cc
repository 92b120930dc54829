#include "security/grpc_security.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "core/testing/wait_for.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "security/grpc_authorizer.h"
#include "security/tenant_policy.h"
#include "security/testing/test_pki.h"

namespace kvfabric {
namespace {

using std::chrono_literals::operator""s;

// Health answers with the tenant the caller authenticated as, in
// HealthResponse.message, or the authorizer's refusal.
class WhoAmI final : public v1::CacheHost::Service {
 public:
  explicit WhoAmI(const GrpcAuthorizer* auth) : auth_(auth) {}
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest*,
                      v1::HealthResponse* response) override {
    const TenantSpec* t = nullptr;
    if (grpc::Status s = auth_->Authenticate(*context, "Health", &t); !s.ok()) return s;
    response->set_detail(t->name);
    return grpc::Status::OK;
  }

 private:
  const GrpcAuthorizer* auth_;
};

class GrpcSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvf_tls_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    pki_ = std::make_unique<testing::TestPki>(dir_, "kvfabric test CA");
    other_ = std::make_unique<testing::TestPki>(dir_, "another CA");
    server_ = pki_->Issue("cached-1", {"DNS:localhost", "IP:127.0.0.1"});
  }
  void TearDown() override {
    if (server_process_) server_process_->Shutdown();
    std::system(("rm -rf " + dir_).c_str());
  }

  void Start(const GrpcSecurityOptions& o, std::shared_ptr<const TenantPolicy> policy) {
    auth_ = std::make_unique<GrpcAuthorizer>(std::move(policy), "test");
    service_ = std::make_unique<WhoAmI>(auth_.get());
    auto creds = MakeServerCredentials(o, "127.0.0.1:0");
    ASSERT_TRUE(creds.ok()) << creds.status().ToString();
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", *creds, &port);
    b.RegisterService(service_.get());
    server_process_ = b.BuildAndStart();
    ASSERT_NE(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  // Health through a fresh channel with `o`: the status, and in *who the
  // tenant the server saw.
  grpc::Status Call(const GrpcSecurityOptions& o, std::string* who = nullptr,
                    std::string target = "") {
    if (target.empty()) target = address_;
    auto creds = MakeChannelCredentials(o, target);
    if (!creds.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad options");
    grpc::ChannelArguments args;
    ApplyChannelSecurityArgs(o, &args);
    auto stub = v1::CacheHost::NewStub(grpc::CreateCustomChannel(target, *creds, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::HealthResponse r;
    grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &r);
    if (who != nullptr) *who = r.detail();
    return s;
  }

  GrpcSecurityOptions MutualServer() const {
    GrpcSecurityOptions o;
    o.cert_file = server_.cert;
    o.key_file = server_.key;
    o.ca_file = pki_->ca_file();
    return o;
  }
  GrpcSecurityOptions Client(const testing::TestPki::Files* cert) const {
    GrpcSecurityOptions o;
    o.ca_file = pki_->ca_file();
    if (cert != nullptr) {
      o.cert_file = cert->cert;
      o.key_file = cert->key;
    }
    return o;
  }

  std::string dir_;
  std::unique_ptr<testing::TestPki> pki_;
  std::unique_ptr<testing::TestPki> other_;
  testing::TestPki::Files server_;
  std::unique_ptr<GrpcAuthorizer> auth_;
  std::unique_ptr<WhoAmI> service_;
  std::unique_ptr<grpc::Server> server_process_;
  std::string address_;
};

TEST_F(GrpcSecurityTest, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7440"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:7440"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7440"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/run/kvfabric/admin.sock"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:1,localhost:2"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:7440"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7440"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.5:7440"));
  EXPECT_FALSE(IsLoopbackAddress("cache-1.example:7440"));
  EXPECT_FALSE(IsLoopbackAddress("127.0.0.1:1,10.0.0.5:2"));
  EXPECT_FALSE(IsLoopbackAddress(""));
}

TEST_F(GrpcSecurityTest, RefusesWhatCannotBeSafeNamingTheFlag) {
  GrpcSecurityOptions none;
  Status s = ValidateServerSecurity(none, "127.0.0.1:7440");
  EXPECT_NE(s.message().find("--tls-cert"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("--insecure"), std::string::npos) << s.ToString();
  s = ValidateClientSecurity(none, "127.0.0.1:7440");
  EXPECT_NE(s.message().find("--tls-ca"), std::string::npos) << s.ToString();

  GrpcSecurityOptions insecure;
  insecure.insecure = true;
  EXPECT_TRUE(ValidateServerSecurity(insecure, "127.0.0.1:7440").ok());
  s = ValidateServerSecurity(insecure, "0.0.0.0:7440");
  EXPECT_NE(s.message().find("--allow-insecure-remote"), std::string::npos) << s.ToString();
  insecure.allow_insecure_remote = true;
  EXPECT_TRUE(ValidateServerSecurity(insecure, "0.0.0.0:7440").ok());
  EXPECT_NE(DescribeSecurity(insecure, "0.0.0.0:7440", true).find("PLAINTEXT"), std::string::npos);

  GrpcSecurityOptions both = MutualServer();
  both.insecure = true;
  EXPECT_FALSE(ValidateServerSecurity(both, "127.0.0.1:1").ok());

  GrpcSecurityOptions half = MutualServer();
  half.key_file.clear();
  s = ValidateServerSecurity(half, "127.0.0.1:1");
  EXPECT_NE(s.message().find("--tls-key"), std::string::npos) << s.ToString();

  testing::TestPki::Files other = pki_->Issue("other", {"DNS:other"});
  GrpcSecurityOptions mismatched = MutualServer();
  mismatched.key_file = other.key;
  s = ValidateServerSecurity(mismatched, "127.0.0.1:1");
  EXPECT_NE(s.message().find("is not the key of"), std::string::npos) << s.ToString();

  testing::TestPki::Files expired = pki_->Issue("old", {"DNS:localhost"}, -7200, -3600);
  GrpcSecurityOptions old = MutualServer();
  old.cert_file = expired.cert;
  old.key_file = expired.key;
  s = ValidateServerSecurity(old, "127.0.0.1:1");
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s.ToString();

  GrpcSecurityOptions garbage = MutualServer();
  std::ofstream(dir_ + "/garbage.pem") << "not a certificate";
  garbage.ca_file = dir_ + "/garbage.pem";
  s = ValidateServerSecurity(garbage, "127.0.0.1:1");
  EXPECT_NE(s.message().find("holds no PEM certificate"), std::string::npos) << s.ToString();

  GrpcSecurityOptions token_plain;
  token_plain.insecure = true;
  token_plain.token_file = dir_ + "/garbage.pem";
  s = ValidateClientSecurity(token_plain, "127.0.0.1:1");
  EXPECT_NE(s.message().find("only sent over TLS"), std::string::npos) << s.ToString();
}

TEST_F(GrpcSecurityTest, MutualTlsAdmitsOnlyAClientCertificateOfTheTrustedCa) {
  auto policy = TenantPolicy::Parse(
      "tenants:\n  - {name: alpha, identities: [alpha.example], namespaces: [alpha]}\n", dir_,
      "tenants.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  Start(MutualServer(), *policy);

  const testing::TestPki::Files alpha = pki_->Issue("alpha-1", {"DNS:alpha.example"});
  std::string who;
  grpc::Status ok = Call(Client(&alpha), &who);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(who, "alpha");

  // No certificate, another CA's, an expired one: the handshake fails.
  EXPECT_EQ(Call(Client(nullptr)).error_code(), grpc::StatusCode::UNAVAILABLE);
  const testing::TestPki::Files foreign = other_->Issue("alpha-2", {"DNS:alpha.example"});
  EXPECT_EQ(Call(Client(&foreign)).error_code(), grpc::StatusCode::UNAVAILABLE);
  const testing::TestPki::Files expired =
      pki_->Issue("alpha-3", {"DNS:alpha.example"}, -7200, -3600);
  GrpcSecurityOptions old_client = Client(nullptr);
  old_client.cert_file = expired.cert;  // the client's own check would refuse it first
  old_client.key_file = expired.key;
  EXPECT_FALSE(ValidateClientSecurity(old_client, address_).ok());

  // A valid certificate of the trusted CA that names no tenant.
  const testing::TestPki::Files stranger = pki_->Issue("stranger", {"DNS:stranger.example"});
  grpc::Status s = Call(Client(&stranger));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_NE(s.error_message().find("not a tenant"), std::string::npos) << s.error_message();
  EXPECT_EQ(auth_->denied(GrpcAuthorizer::Reason::kUnauthenticated), 1u);

  // The server's certificate must name the host dialled: it names localhost
  // and 127.0.0.1, not cache-9.example.
  GrpcSecurityOptions wrong_name = Client(&alpha);
  wrong_name.server_name = "cache-9.example";
  EXPECT_EQ(Call(wrong_name).error_code(), grpc::StatusCode::UNAVAILABLE);
  // By its DNS name (dialled by address: no resolver, whose c-ares
  // allocations LeakSanitizer reports as leaks).
  GrpcSecurityOptions by_name = Client(&alpha);
  by_name.server_name = "localhost";
  EXPECT_TRUE(Call(by_name).ok());

  // A client that trusts another CA does not accept this server.
  GrpcSecurityOptions distrust = Client(&alpha);
  distrust.ca_file = other_->ca_file();
  EXPECT_EQ(Call(distrust).error_code(), grpc::StatusCode::UNAVAILABLE);

  // Plaintext to a TLS server does not get through either.
  GrpcSecurityOptions plain;
  plain.insecure = true;
  EXPECT_EQ(Call(plain).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcSecurityTest, BearerTokenOverTlsWithoutClientCertificates) {
  std::ofstream(dir_ + "/alpha.token") << "0123456789abcdef0123456789abcdef\n";
  std::ofstream(dir_ + "/forged.token") << "0123456789abcdef0123456789abcdeX\n";
  auto policy = TenantPolicy::Parse(
      "tenants:\n  - {name: alpha, token-files: [alpha.token], namespaces: [alpha]}\n", dir_,
      "tenants.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  GrpcSecurityOptions server = MutualServer();
  server.client_auth = "none";
  Start(server, *policy);

  GrpcSecurityOptions client = Client(nullptr);
  client.token_file = dir_ + "/alpha.token";
  std::string who;
  grpc::Status s = Call(client, &who);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(who, "alpha");

  client.token_file = dir_ + "/forged.token";
  s = Call(client);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The refusal never repeats the token.
  EXPECT_EQ(s.error_message().find("0123456789abcdef"), std::string::npos) << s.error_message();
  EXPECT_EQ(Call(Client(nullptr)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(GrpcSecurityTest, ServerPicksUpARenewedCertificateWithoutRestarting) {
  GrpcSecurityOptions server = MutualServer();
  server.reload_interval_s = 1;
  // The server reads its pair from files the test replaces.
  const std::string cert = dir_ + "/live.pem";
  const std::string key = dir_ + "/live.key";
  std::system(("cp " + server_.cert + " " + cert + " && cp " + server_.key + " " + key).c_str());
  server.cert_file = cert;
  server.key_file = key;
  Start(server, nullptr);
  const testing::TestPki::Files alpha = pki_->Issue("alpha-1", {"DNS:alpha.example"});

  auto server_cn = [&](const GrpcSecurityOptions& o) {
    auto creds = MakeChannelCredentials(o, address_);
    auto channel = grpc::CreateChannel(address_, *creds);
    auto stub = v1::CacheHost::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    v1::HealthResponse r;
    if (!stub->Health(&ctx, v1::HealthRequest(), &r).ok()) return std::string("failed");
    auto values = ctx.auth_context()->FindPropertyValues("x509_common_name");
    return values.empty() ? std::string("none") : std::string(values[0].data(), values[0].size());
  };
  EXPECT_EQ(server_cn(Client(&alpha)), "cached-1");

  // A channel kept open across the renewal keeps working.
  auto creds = MakeChannelCredentials(Client(&alpha), address_);
  auto kept = v1::CacheHost::NewStub(grpc::CreateChannel(address_, *creds));
  {
    grpc::ClientContext ctx;
    v1::HealthResponse r;
    ASSERT_TRUE(kept->Health(&ctx, v1::HealthRequest(), &r).ok());
  }

  const testing::TestPki::Files renewed = pki_->Issue("cached-1-renewed", {"IP:127.0.0.1"});
  std::system(("cp " + renewed.key + " " + key + ".new && cp " + renewed.cert + " " + cert +
               ".new && mv " + key + ".new " + key + " && mv " + cert + ".new " + cert)
                  .c_str());
  ASSERT_TRUE(WaitFor([&] { return server_cn(Client(&alpha)) == "cached-1-renewed"; }, 20s,
                      "new handshakes to present the renewed certificate"));
  grpc::ClientContext ctx;
  v1::HealthResponse r;
  EXPECT_TRUE(kept->Health(&ctx, v1::HealthRequest(), &r).ok());
}

}  // namespace
}  // namespace kvfabric
