// TestPki: a throw-away certificate authority for tests, generated at run
// time with OpenSSL's libcrypto (nothing is committed): P-256 keys, X.509 v3
// certificates with the SANs and validity a test asks for, written as PEM
// files into a directory.
//
//   TestPki pki(dir, "kvfabric test CA");
//   TestPki::Files server = pki.Issue("cached", {"DNS:localhost", "IP:127.0.0.1"});
//   TestPki::Files expired = pki.Issue("old", {"DNS:old"}, /*valid_from_s=*/-7200,
//                                      /*valid_until_s=*/-3600);
//
// Thread safety: not thread-safe; one per test.
#ifndef KVFABRIC_SECURITY_TESTING_TEST_PKI_H_
#define KVFABRIC_SECURITY_TESTING_TEST_PKI_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvfabric::testing {

class TestPki {
 public:
  struct Files {
    std::string cert;  // PEM certificate path
    std::string key;   // PEM private key path
  };

  // Creates a CA named `ca_name` under `dir` (which must exist): dir/<file
  // stem>-ca.pem is its certificate. Aborts the test binary if OpenSSL fails.
  TestPki(std::string dir, const std::string& ca_name);
  ~TestPki();
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  const std::string& ca_file() const { return ca_file_; }

  // A certificate for CN=`name` with subject alternative names `sans`
  // ("DNS:x", "IP:127.0.0.1", "URI:spiffe://..."), usable for both TLS server
  // and client authentication, valid from now+valid_from_s to
  // now+valid_until_s, signed by this CA.
  Files Issue(const std::string& name, const std::vector<std::string>& sans,
              std::int64_t valid_from_s = -60, std::int64_t valid_until_s = 86400);

 private:
  struct State;
  std::string dir_;
  std::string stem_;
  std::string ca_file_;
  std::unique_ptr<State> state_;
};

}  // namespace kvfabric::testing

#endif  // KVFABRIC_SECURITY_TESTING_TEST_PKI_H_
