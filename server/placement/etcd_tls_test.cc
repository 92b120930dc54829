// The etcd client reaching a real etcd over https with client-certificate
// authentication (kvfabric-placement --etcd-endpoint=https://...
// --etcd-ca/--etcd-cert/--etcd-key): with the right CA and certificate it
// works; without a certificate, with another CA's, or trusting another CA it
// does not; an https member without --etcd-ca is refused at start naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "security/testing/test_pki.h"
#include "server/placement/etcd_client.h"
#include "server/placement/testing/etcd_process.h"

namespace kvfabric::placement {
namespace {

using std::chrono_literals::operator""ms;

TEST(EtcdTlsTest, HttpsMemberServesOnlyClientsWithItsCaAndACertificate) {
  if (const std::string why = testing::EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
  char tmpl[] = "/tmp/kvf_etcd_tls_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  kvfabric::testing::TestPki pki(dir, "etcd test CA");
  kvfabric::testing::TestPki other(dir, "other CA");
  const auto server = pki.Issue("etcd-0", {"IP:127.0.0.1"});
  const auto placement = pki.Issue("placement", {"DNS:placement.kvfabric.svc"});
  const auto stranger = other.Issue("placement", {"DNS:placement.kvfabric.svc"});

  testing::EtcdTls tls;
  tls.cert_file = server.cert;
  tls.key_file = server.key;
  tls.client_ca = pki.ca_file();
  tls.client.ca_file = pki.ca_file();
  tls.client.cert_file = placement.cert;
  tls.client.key_file = placement.key;
  auto etcd = testing::EtcdProcess::Start(std::chrono::seconds(20), tls);
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  ASSERT_EQ((*etcd)->endpoint().rfind("https://", 0), 0u) << (*etcd)->endpoint();

  auto client_with = [&](const GrpcSecurityOptions& t) {
    EtcdClientOptions o;
    o.endpoint = (*etcd)->endpoint();
    o.request_timeout = 2000ms;
    o.tls = t;
    return EtcdClient::Create(o);
  };
  auto good = client_with(tls.client);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_TRUE((*good)->Put("/kvf/tls", "ok").ok());
  auto read = (*good)->Range("/kvf/tls");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->kvs.size(), 1u);
  EXPECT_EQ(read->kvs[0].value, "ok");

  // No client certificate; another CA's; a client that trusts another CA.
  GrpcSecurityOptions anonymous;
  anonymous.ca_file = pki.ca_file();
  GrpcSecurityOptions foreign = tls.client;
  foreign.cert_file = stranger.cert;
  foreign.key_file = stranger.key;
  GrpcSecurityOptions distrust = tls.client;
  distrust.ca_file = other.ca_file();
  for (const GrpcSecurityOptions& t : {anonymous, foreign, distrust}) {
    auto c = client_with(t);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_FALSE((*c)->Range("/kvf/tls").ok());
  }

  // https without a CA to check etcd with is refused up front, naming the flag.
  auto none = client_with(GrpcSecurityOptions());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--etcd-ca"), std::string::npos)
      << none.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfabric::placement
