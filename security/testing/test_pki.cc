#include "security/testing/test_pki.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace kvfabric::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "TestPki: OpenSSL failed: %s\n", what);
  std::abort();
}

EVP_PKEY* NewKey() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) Die("EVP_EC_gen");
  return key;
}

void AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) Die(value.c_str());
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

X509* NewCert(const std::string& cn, EVP_PKEY* key, std::int64_t from_s, std::int64_t until_s) {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  std::uint8_t serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert), static_cast<long>(from_s));
  X509_gmtime_adj(X509_getm_notAfter(cert), static_cast<long>(until_s));
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

void WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) Die(path.c_str());
  const bool ok = cert != nullptr
                      ? PEM_write_X509(f, cert) == 1
                      : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  if (!ok) Die(path.c_str());
}

std::string Stem(const std::string& name) {
  std::string out;
  for (char c : name) out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  return out;
}

}  // namespace

struct TestPki::State {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  ~State() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

TestPki::TestPki(std::string dir, const std::string& ca_name)
    : dir_(std::move(dir)), stem_(Stem(ca_name)), state_(std::make_unique<State>()) {
  state_->key = NewKey();
  state_->cert = NewCert(ca_name, state_->key, -3600, 7 * 86400);
  X509_set_issuer_name(state_->cert, X509_get_subject_name(state_->cert));
  AddExt(state_->cert, state_->cert, NID_basic_constraints, "critical,CA:TRUE");
  AddExt(state_->cert, state_->cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  AddExt(state_->cert, state_->cert, NID_subject_key_identifier, "hash");
  if (X509_sign(state_->cert, state_->key, EVP_sha256()) == 0) Die("X509_sign CA");
  ca_file_ = dir_ + "/" + stem_ + "-ca.pem";
  WritePem(ca_file_, state_->cert, nullptr);
}

TestPki::~TestPki() = default;

TestPki::Files TestPki::Issue(const std::string& name, const std::vector<std::string>& sans,
                              std::int64_t valid_from_s, std::int64_t valid_until_s) {
  EVP_PKEY* key = NewKey();
  X509* cert = NewCert(name, key, valid_from_s, valid_until_s);
  X509_set_issuer_name(cert, X509_get_subject_name(state_->cert));
  AddExt(cert, state_->cert, NID_basic_constraints, "critical,CA:FALSE");
  AddExt(cert, state_->cert, NID_key_usage, "critical,digitalSignature,keyAgreement");
  AddExt(cert, state_->cert, NID_ext_key_usage, "serverAuth,clientAuth");
  AddExt(cert, state_->cert, NID_authority_key_identifier, "keyid:always");
  if (!sans.empty()) {
    std::string value;
    for (const std::string& s : sans) value += (value.empty() ? "" : ",") + s;
    AddExt(cert, state_->cert, NID_subject_alt_name, value);
  }
  if (X509_sign(cert, state_->key, EVP_sha256()) == 0) Die("X509_sign");
  Files files;
  files.cert = dir_ + "/" + stem_ + "-" + Stem(name) + ".pem";
  files.key = dir_ + "/" + stem_ + "-" + Stem(name) + ".key";
  WritePem(files.cert, cert, nullptr);
  WritePem(files.key, nullptr, key);
  X509_free(cert);
  EVP_PKEY_free(key);
  return files;
}

}  // namespace kvfabric::testing
