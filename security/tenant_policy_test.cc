#include "security/tenant_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvfabric {
namespace {

class TenantPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvf_tenants_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Write("alpha.token", "alpha-secret-0123456789\n");
    Write("beta.token", "beta-secret-9876543210");
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  StatusOr<std::shared_ptr<const TenantPolicy>> Parse(const std::string& yaml) {
    return TenantPolicy::Parse(yaml, dir_, "tenants.yaml");
  }

  std::string dir_;
};

constexpr char kTwoTenants[] = R"(tenants:
  - name: alpha
    identities: [alpha.example]
    token-files: [alpha.token]
    namespaces: [alpha, alpha-eval]
    quota: 64MiB
  - name: beta
    identities: [beta.example, "spiffe://kvf/beta"]
    token-files: [beta.token]
    namespaces: [beta]
  - name: ops
    identities: [ops.example]
    admin: true
  - name: hosts
    identities: [cached.example]
    daemon: true
)";

TEST_F(TenantPolicyTest, ResolvesCertificateNamesAndTokens) {
  auto p = Parse(kTwoTenants);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const TenantPolicy& policy = **p;
  EXPECT_FALSE(policy.open());

  PeerIdentity cert;
  cert.secure = true;
  cert.names = {"beta-7", "spiffe://kvf/beta"};
  ASSERT_NE(policy.Resolve(cert), nullptr);
  EXPECT_EQ(policy.Resolve(cert)->name, "beta");

  PeerIdentity token;
  token.secure = true;
  token.token = "alpha-secret-0123456789";  // the file's trailing newline is not part of it
  ASSERT_NE(policy.Resolve(token), nullptr);
  EXPECT_EQ(policy.Resolve(token)->name, "alpha");
  EXPECT_TRUE(policy.Resolve(token)->HoldsNamespace("alpha-eval"));
  EXPECT_FALSE(policy.Resolve(token)->HoldsNamespace("beta"));
  EXPECT_FALSE(policy.Resolve(token)->HoldsNamespace(""));

  // A token over plaintext, a wrong token, a prefix of a token, no identity: nobody.
  token.secure = false;
  EXPECT_EQ(policy.Resolve(token), nullptr);
  token.secure = true;
  token.token = "alpha-secret-012345678";
  EXPECT_EQ(policy.Resolve(token), nullptr);
  EXPECT_EQ(policy.Resolve(PeerIdentity{}), nullptr);

  ASSERT_EQ(policy.NamespaceQuotas().size(), 2u);
  EXPECT_EQ(policy.NamespaceQuotas()[0],
            std::make_pair(std::string("alpha"), std::uint64_t{64} << 20));
  EXPECT_NE(policy.Summary().find("4 tenants"), std::string::npos) << policy.Summary();
}

TEST_F(TenantPolicyTest, OpenPolicyIsOneTenantWithEveryNamespace) {
  auto p = TenantPolicy::Open();
  const TenantSpec* t = p->Resolve(PeerIdentity{});
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->HoldsNamespace("anything"));
  EXPECT_FALSE(t->admin);
}

TEST_F(TenantPolicyTest, RefusesBadFilesNamingWhatIsWrong) {
  struct Case {
    const char* yaml;
    const char* error;
  };
  const Case cases[] = {
      {"tenants: [", "malformed YAML"},
      {"tenant: []", "unknown key \"tenant\""},
      {"tenants: []", "non-empty list"},
      {"tenants:\n  - identities: [a]\n", "without a name"},
      {"tenants:\n  - name: a\n    identites: [a]\n", "unknown key \"identites\""},
      {"tenants:\n  - name: a\n", "neither identities nor token-files"},
      {"tenants:\n  - {name: a, identities: [x]}\n  - {name: a, identities: [y]}\n", "named twice"},
      {"tenants:\n  - {name: a, identities: [x]}\n  - {name: b, identities: [x]}\n",
       "identity \"x\" belongs to two tenants"},
      {"tenants:\n  - {name: a, identities: [x], namespaces: [n]}\n"
       "  - {name: b, identities: [y], namespaces: [n]}\n",
       "namespace \"n\" belongs to two tenants"},
      {"tenants:\n  - {name: a, token-files: [missing.token]}\n", "cannot read token file"},
      {"tenants:\n  - {name: a, token-files: [alpha.token]}\n"
       "  - {name: b, token-files: [alpha.token]}\n",
       "is also tenant \"a\"'s"},
      {"tenants:\n  - {name: a, identities: [x], quota: lots}\n", "quota:"},
      {"tenants:\n  - {name: a, identities: [x], admin: yes}\n", "expected true or false"},
      {"tenants:\n  - {name: a, identities: [\"\"]}\n", "non-empty string"},
  };
  for (const Case& c : cases) {
    auto p = Parse(c.yaml);
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_NE(p.status().message().find(c.error), std::string::npos)
        << c.yaml << "\n -> " << p.status().ToString();
    EXPECT_NE(p.status().message().find("tenants.yaml"), std::string::npos)
        << p.status().ToString();
  }
}

TEST_F(TenantPolicyTest, LoadFileReadsTokensBesideIt) {
  Write("tenants.yaml", kTwoTenants);
  auto p = TenantPolicy::LoadFile(dir_ + "/tenants.yaml");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  PeerIdentity token;
  token.secure = true;
  token.token = "beta-secret-9876543210";
  ASSERT_NE((*p)->Resolve(token), nullptr);
  EXPECT_EQ((*p)->Resolve(token)->name, "beta");
  EXPECT_FALSE(TenantPolicy::LoadFile(dir_ + "/nope.yaml").ok());
}

}  // namespace
}  // namespace kvfabric
