// TcpTls: optional TLS on the kernel-TCP transport's connections (OpenSSL,
// TLS 1.3 only), for a data plane that crosses networks nobody vouches for
// (kvfabric-cached --data-plane-tls; docs/security.md, "Data plane").
//
// A listener presents cert_file/key_file; a connecting side verifies it
// against ca_file and the host or IP it dialled. Client certificates are not
// asked for: the data-plane session proof (server/cache_host/data_sessions.h)
// authenticates the client, TLS adds confidentiality and the server's
// identity. Every byte of a connection, the transport's own hello included,
// runs inside TLS.
//
// Thread safety: the contexts are immutable after Create and shared by every
// connection; an SSL object belongs to one connection, whose calls into it
// are serialised by the connection.
#ifndef KVFABRIC_TRANSPORT_TCP_TCP_TLS_H_
#define KVFABRIC_TRANSPORT_TCP_TCP_TLS_H_

#include <memory>
#include <string>

#include "core/status.h"
#include "core/statusor.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace kvfabric::tcp {

struct TcpTlsOptions {
  // A listener's certificate chain and key (PEM); both or neither.
  std::string cert_file;
  std::string key_file;
  // The CA bundle that signs listeners' certificates (PEM); required to
  // connect.
  std::string ca_file;
};

class TcpTls {
 public:
  // InvalidArgument naming the file that cannot be read or parsed.
  static StatusOr<std::shared_ptr<const TcpTls>> Create(const TcpTlsOptions& options);
  ~TcpTls();
  TcpTls(const TcpTls&) = delete;
  TcpTls& operator=(const TcpTls&) = delete;

  bool can_accept() const { return server_ != nullptr; }
  bool can_connect() const { return client_ != nullptr; }

  // A new SSL object on `fd` for the accepting side, or null when this
  // context has no certificate (the caller fails the connection).
  SSL* NewServer(int fd) const;
  // A new SSL object on `fd` for the connecting side, checking the peer's
  // certificate names `host` (a DNS name or an IP address); null without a
  // CA.
  SSL* NewClient(int fd, const std::string& host) const;

  // OpenSSL's error queue, drained, as one line ("" when empty).
  static std::string LastError();

 private:
  TcpTls() = default;
  SSL_CTX* server_ = nullptr;
  SSL_CTX* client_ = nullptr;
};

}  // namespace kvfabric::tcp

#endif  // KVFABRIC_TRANSPORT_TCP_TCP_TLS_H_
