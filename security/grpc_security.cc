#include "security/grpc_security.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace kvfabric {
namespace {

constexpr std::uint32_t kMinReloadSeconds = 1;
constexpr std::uint32_t kMaxReloadSeconds = 86400;

std::string ReadFile(const std::string& path, Status* status) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *status = Status::InvalidArgument("cannot read " + path);
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

// Every certificate in a PEM bundle, in order; empty when none parses.
std::vector<X509Ptr> ParseCertificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    out.emplace_back(x);
  }
  return out;
}

std::string CommonName(X509* x) {
  char cn[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn)) < 0) {
    return "";
  }
  return cn;
}

std::string NotAfter(X509* x) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || ASN1_TIME_print(bio.get(), X509_get0_notAfter(x)) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

// The first certificate of `path`, checked to be valid now; `what` names the
// flag in errors.
Status LoadLeaf(const std::string& path, const std::string& what, X509Ptr* leaf) {
  Status s;
  const std::string pem = ReadFile(path, &s);
  if (!s.ok()) return Status::InvalidArgument(what + ": " + std::string(s.message()));
  std::vector<X509Ptr> certs = ParseCertificates(pem);
  if (certs.empty()) {
    return Status::InvalidArgument(what + ": " + path + " holds no PEM certificate");
  }
  X509* x = certs.front().get();
  if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    return Status::InvalidArgument(what + ": " + path + " (CN=" + CommonName(x) +
                                   ") is not valid yet");
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
    return Status::InvalidArgument(what + ": " + path + " (CN=" + CommonName(x) + ") expired on " +
                                   NotAfter(x));
  }
  *leaf = std::move(certs.front());
  return Status::OK();
}

Status CheckCertAndKey(const GrpcSecurityOptions& o) {
  if (o.cert_file.empty() != o.key_file.empty()) {
    return Status::InvalidArgument(
        "--tls-cert and --tls-key come together: one names the certificate, the other its key");
  }
  if (o.cert_file.empty()) return Status::OK();
  X509Ptr leaf;
  if (Status s = LoadLeaf(o.cert_file, "--tls-cert", &leaf); !s.ok()) return s;
  Status s;
  const std::string key_pem = ReadFile(o.key_file, &s);
  if (!s.ok()) return Status::InvalidArgument("--tls-key: " + std::string(s.message()));
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key) {
    return Status::InvalidArgument("--tls-key: " + o.key_file +
                                   " holds no unencrypted PEM private key");
  }
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    return Status::InvalidArgument("--tls-key: " + o.key_file + " is not the key of " +
                                   o.cert_file);
  }
  return Status::OK();
}

Status CheckCa(const std::string& path) {
  Status s;
  const std::string pem = ReadFile(path, &s);
  if (!s.ok()) return Status::InvalidArgument("--tls-ca: " + std::string(s.message()));
  if (ParseCertificates(pem).empty()) {
    return Status::InvalidArgument("--tls-ca: " + path + " holds no PEM certificate");
  }
  return Status::OK();
}

Status CheckInsecure(const GrpcSecurityOptions& o, std::string_view address) {
  if (o.tls()) {
    return Status::InvalidArgument(
        "--insecure with --tls-cert/--tls-ca: choose one (plaintext or TLS)");
  }
  if (!o.allow_insecure_remote && !IsLoopbackAddress(address)) {
    return Status::InvalidArgument(
        "--insecure on " + std::string(address) +
        ", which is not a loopback address: anyone who reaches it would be trusted; configure "
        "--tls-cert/--tls-key/--tls-ca, or add --allow-insecure-remote to accept that");
  }
  return Status::OK();
}

bool RequireClientCert(const GrpcSecurityOptions& o) {
  return !o.ca_file.empty() && o.client_auth != "none";
}

std::string HostOf(std::string_view address) {
  if (address.rfind("unix:", 0) == 0) return "";
  if (address.rfind("dns:", 0) == 0) address.remove_prefix(4);
  if (address.rfind("ipv4:", 0) == 0) address.remove_prefix(5);
  if (address.rfind("ipv6:", 0) == 0) address.remove_prefix(5);
  if (!address.empty() && address.front() == '[') {
    const std::size_t end = address.find(']');
    return std::string(address.substr(1, end == std::string_view::npos ? end : end - 1));
  }
  const std::size_t colon = address.rfind(':');
  return std::string(colon == std::string_view::npos ? address : address.substr(0, colon));
}

class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::string token) : header_("Bearer " + std::move(token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "kvfabric-bearer-token"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace("authorization", header_);
    return grpc::Status::OK;
  }
  grpc::string DebugString() override { return "kvfabric bearer token (not shown)"; }

 private:
  const std::string header_;
};

}  // namespace

bool IsLoopbackAddress(std::string_view address) {
  if (address.empty()) return false;
  std::size_t start = 0;
  while (start <= address.size()) {
    std::size_t end = address.find(',', start);
    if (end == std::string_view::npos) end = address.size();
    const std::string_view one = address.substr(start, end - start);
    if (one.rfind("unix:", 0) != 0) {
      const std::string host = HostOf(one);
      const bool loopback = host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
      if (!loopback) return false;
    }
    start = end + 1;
  }
  return true;
}

Status ValidateServerSecurity(const GrpcSecurityOptions& o, std::string_view address) {
  if (o.insecure) return CheckInsecure(o, address);
  if (!o.tls()) {
    return Status::InvalidArgument(
        "no transport security configured for " + std::string(address) +
        ": give --tls-cert and --tls-key (and --tls-ca for mutual TLS), or --insecure for "
        "plaintext on a loopback address");
  }
  if (o.cert_file.empty()) {
    return Status::InvalidArgument(
        "--tls-ca without --tls-cert/--tls-key: a TLS server needs "
        "its own certificate and key");
  }
  if (!o.token_file.empty()) {
    return Status::InvalidArgument("--tls-token-file is a client setting");
  }
  if (!o.client_auth.empty() && o.client_auth != "require" && o.client_auth != "none") {
    return Status::InvalidArgument("--tls-client-auth \"" + o.client_auth +
                                   "\": expected require or none");
  }
  if (o.client_auth == "require" && o.ca_file.empty()) {
    return Status::InvalidArgument(
        "--tls-client-auth=require needs --tls-ca, the CA that signs "
        "clients' certificates");
  }
  if (o.reload_interval_s < kMinReloadSeconds || o.reload_interval_s > kMaxReloadSeconds) {
    return Status::InvalidArgument("--tls-reload-interval: expected 1..86400 seconds");
  }
  if (Status s = CheckCertAndKey(o); !s.ok()) return s;
  if (!o.ca_file.empty()) return CheckCa(o.ca_file);
  return Status::OK();
}

Status ValidateClientSecurity(const GrpcSecurityOptions& o, std::string_view target) {
  if (o.insecure) {
    if (!o.token_file.empty()) {
      return Status::InvalidArgument(
          "--tls-token-file with --insecure: a bearer token is only sent over TLS");
    }
    return CheckInsecure(o, target);
  }
  if (o.ca_file.empty()) {
    return Status::InvalidArgument(
        "no transport security configured for " + std::string(target) +
        ": give --tls-ca (the CA that signs the servers' certificates; with --tls-cert/--tls-key "
        "for mutual TLS), or --insecure for plaintext to a loopback address");
  }
  if (o.reload_interval_s < kMinReloadSeconds || o.reload_interval_s > kMaxReloadSeconds) {
    return Status::InvalidArgument("--tls-reload-interval: expected 1..86400 seconds");
  }
  if (Status s = CheckCertAndKey(o); !s.ok()) return s;
  if (Status s = CheckCa(o.ca_file); !s.ok()) return s;
  if (!o.token_file.empty()) {
    Status s;
    const std::string token = ReadFile(o.token_file, &s);
    if (!s.ok()) return Status::InvalidArgument("--tls-token-file: " + std::string(s.message()));
    if (token.find_first_not_of(" \t\r\n") == std::string::npos) {
      return Status::InvalidArgument("--tls-token-file: " + o.token_file + " is empty");
    }
  }
  return Status::OK();
}

std::string DescribeSecurity(const GrpcSecurityOptions& o, std::string_view address, bool server) {
  if (o.insecure) {
    return "PLAINTEXT (--insecure): no encryption, no authentication; anyone who reaches " +
           std::string(address) + " is trusted";
  }
  std::string out;
  const bool mutual = server ? RequireClientCert(o) : !o.cert_file.empty();
  out = mutual ? "mutual TLS" : "TLS";
  X509Ptr leaf;
  if (!o.cert_file.empty() && LoadLeaf(o.cert_file, "--tls-cert", &leaf).ok()) {
    out += " (certificate CN=" + CommonName(leaf.get()) + ", valid until " + NotAfter(leaf.get());
  } else {
    out += " (no certificate of its own";
  }
  if (server) {
    out += RequireClientCert(o) ? ", clients verified by " + o.ca_file
                                : ", clients authenticate by bearer token";
  } else {
    out += ", servers verified by " + o.ca_file;
    if (!o.token_file.empty()) out += ", bearer token from " + o.token_file;
  }
  out += ", certificates re-read every " + std::to_string(o.reload_interval_s) + " s)";
  return out;
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const GrpcSecurityOptions& o, std::string_view address) {
  if (Status s = ValidateServerSecurity(o, address); !s.ok()) return s;
  if (o.insecure) return grpc::InsecureServerCredentials();
  const auto interval = static_cast<unsigned>(o.reload_interval_s);
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      o.ca_file.empty() ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                              o.key_file, o.cert_file, interval)
                        : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                              o.key_file, o.cert_file, o.ca_file, interval);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!o.ca_file.empty()) tls.watch_root_certs();
  tls.set_cert_request_type(RequireClientCert(o)
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::experimental::TlsServerCredentials(tls);
  if (!creds) return Status::Internal("gRPC refused the TLS server options");
  return creds;
}

StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const GrpcSecurityOptions& o, std::string_view target) {
  if (Status s = ValidateClientSecurity(o, target); !s.ok()) return s;
  if (o.insecure) return grpc::InsecureChannelCredentials();
  const auto interval = static_cast<unsigned>(o.reload_interval_s);
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      o.cert_file.empty() ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                                o.ca_file, interval)
                          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                                o.key_file, o.cert_file, o.ca_file, interval);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!o.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(tls);
  if (!creds) return Status::Internal("gRPC refused the TLS channel options");
  if (o.token_file.empty()) return creds;
  Status s;
  std::string token = ReadFile(o.token_file, &s);
  if (!s.ok()) return Status::InvalidArgument("--tls-token-file: " + std::string(s.message()));
  const std::size_t last = token.find_last_not_of(" \t\r\n");
  token.resize(last == std::string::npos ? 0 : last + 1);
  token.erase(0, token.find_first_not_of(" \t\r\n"));
  return grpc::CompositeChannelCredentials(
      creds,
      grpc::MetadataCredentialsFromPlugin(std::make_unique<BearerTokenPlugin>(std::move(token))));
}

void ApplyChannelSecurityArgs(const GrpcSecurityOptions& o, grpc::ChannelArguments* args) {
  if (!o.insecure && !o.server_name.empty()) {
    args->SetSslTargetNameOverride(o.server_name);
  }
}

StatusOr<std::shared_ptr<grpc::Channel>> OpenSecureChannel(const std::string& target,
                                                           const GrpcSecurityOptions& options,
                                                           grpc::ChannelArguments args) {
  GrpcSecurityOptions o = options;
  if (target.rfind("unix:", 0) == 0) {
    o = GrpcSecurityOptions();
    o.insecure = true;
  }
  ApplyChannelSecurityArgs(o, &args);
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                       MakeChannelCredentials(o, target));
  return grpc::CreateCustomChannel(target, creds, args);
}

}  // namespace kvfabric
