#include "transport/tcp/tcp_tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

namespace kvfabric::tcp {
namespace {

// OpenSSL's read buffer with read-ahead: several 16 KiB records per recv.
constexpr std::size_t kReadBufferBytes = 256 << 10;

int SocketOf(BIO* b) { return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(b))); }

// A socket BIO that sends with MSG_NOSIGNAL: OpenSSL's own writes with
// write(2), and a peer that closed first would kill the process with SIGPIPE
// (a library must not change the process's signal dispositions).
int BioWrite(BIO* b, const char* data, int n) {
  BIO_clear_retry_flags(b);
  const ssize_t k = ::send(SocketOf(b), data, static_cast<std::size_t>(n), MSG_NOSIGNAL);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(b);
  }
  return static_cast<int>(k);
}

int BioRead(BIO* b, char* data, int n) {
  BIO_clear_retry_flags(b);
  const ssize_t k = ::recv(SocketOf(b), data, static_cast<std::size_t>(n), 0);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(b);
  }
  return static_cast<int>(k);
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kvfabric socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

// Attaches `fd` to `ssl` through SocketMethod; false if OpenSSL fails.
bool Attach(SSL* ssl, int fd) {
  BIO* bio = BIO_new(SocketMethod());
  if (bio == nullptr) return false;
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);  // one reference, owned by ssl for both directions
  return true;
}

}  // namespace

std::string TcpTls::LastError() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

StatusOr<std::shared_ptr<const TcpTls>> TcpTls::Create(const TcpTlsOptions& o) {
  std::shared_ptr<TcpTls> t(new TcpTls());
  if (o.cert_file.empty() != o.key_file.empty()) {
    return Status::InvalidArgument("data-plane TLS: a certificate and its key come together");
  }
  if (!o.cert_file.empty()) {
    t->server_ = SSL_CTX_new(TLS_server_method());
    if (t->server_ == nullptr) return Status::Internal("SSL_CTX_new: " + LastError());
    SSL_CTX_set_min_proto_version(t->server_, TLS1_3_VERSION);
    SSL_CTX_set_mode(t->server_,
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // Read whole socket buffers, not a record header and then its body.
    SSL_CTX_set_read_ahead(t->server_, 1);
    SSL_CTX_set_default_read_buffer_len(t->server_, kReadBufferBytes);
    if (SSL_CTX_use_certificate_chain_file(t->server_, o.cert_file.c_str()) != 1) {
      return Status::InvalidArgument("data-plane TLS: certificate " + o.cert_file + ": " +
                                     LastError());
    }
    if (SSL_CTX_use_PrivateKey_file(t->server_, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(t->server_) != 1) {
      return Status::InvalidArgument("data-plane TLS: key " + o.key_file + ": " + LastError());
    }
  }
  if (!o.ca_file.empty()) {
    t->client_ = SSL_CTX_new(TLS_client_method());
    if (t->client_ == nullptr) return Status::Internal("SSL_CTX_new: " + LastError());
    SSL_CTX_set_min_proto_version(t->client_, TLS1_3_VERSION);
    SSL_CTX_set_mode(t->client_,
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(t->client_, 1);
    SSL_CTX_set_default_read_buffer_len(t->client_, kReadBufferBytes);
    SSL_CTX_set_verify(t->client_, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(t->client_, o.ca_file.c_str(), nullptr) != 1) {
      return Status::InvalidArgument("data-plane TLS: CA " + o.ca_file + ": " + LastError());
    }
  }
  return std::shared_ptr<const TcpTls>(std::move(t));
}

TcpTls::~TcpTls() {
  SSL_CTX_free(server_);
  SSL_CTX_free(client_);
}

SSL* TcpTls::NewServer(int fd) const {
  if (server_ == nullptr) return nullptr;
  SSL* ssl = SSL_new(server_);
  if (ssl != nullptr && !Attach(ssl, fd)) {
    SSL_free(ssl);
    return nullptr;
  }
  if (ssl != nullptr) SSL_set_accept_state(ssl);  // the worker drives SSL_do_handshake
  return ssl;
}

SSL* TcpTls::NewClient(int fd, const std::string& host) const {
  if (client_ == nullptr) return nullptr;
  SSL* ssl = SSL_new(client_);
  if (ssl == nullptr) return nullptr;
  in6_addr a6{};
  in_addr a4{};
  const bool ip =
      inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  const bool named = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1
                        : SSL_set1_host(ssl, host.c_str()) == 1 &&
                              SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
  if (!named || !Attach(ssl, fd)) {
    SSL_free(ssl);
    return nullptr;
  }
  SSL_set_connect_state(ssl);
  return ssl;
}

}  // namespace kvfabric::tcp
