// GrpcSecurity: how every kvfabric gRPC endpoint (kvfabric-cached,
// kvfabric-placement, libkvfabric, the CLI) secures its connections, from one
// options struct that each binary fills from flags or YAML and the client from
// ClientOptions (docs/security.md).
//
//   mode            server                              client
//   TLS             --tls-cert/--tls-key: its identity  --tls-ca: verifies the server
//   mutual TLS      + --tls-ca: requires and verifies   + --tls-cert/--tls-key: its
//                   every client's certificate          identity
//   bearer token    TLS, --tls-client-auth=none; the    + --tls-token-file: sent as
//                   token maps to a tenant              "authorization: Bearer ..."
//   plaintext       --insecure: loopback addresses only, unless --allow-insecure-remote
//
// Nothing is plaintext by default: with neither certificates nor --insecure a
// server refuses to start and a client refuses to connect, naming the flags.
// Plaintext on an address that is not loopback (127.0.0.0/8, ::1, localhost,
// unix:) is refused unless --allow-insecure-remote is also set; start-up then
// prints one warning line.
//
// Certificates are re-read when their files change (checked every
// reload_interval_s, default 10 s): gRPC's file-watching provider swaps them for
// new handshakes, and connections already established keep theirs, so
// in-flight work is not dropped. A pair whose key does not match the
// certificate is not taken (the previous pair stays in use).
//
// Thread safety: plain values and functions; the credentials returned are
// gRPC's and thread-safe.
#ifndef KVFABRIC_SECURITY_GRPC_SECURITY_H_
#define KVFABRIC_SECURITY_GRPC_SECURITY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace kvfabric {

struct GrpcSecurityOptions {
  // PEM certificate chain and private key of this process: a server's
  // identity, and the client certificate a client presents (mutual TLS). Both
  // or neither.
  std::string cert_file;
  std::string key_file;
  // PEM bundle of the CAs trusted to sign peers' certificates: on a server,
  // the clients' (mutual TLS, unless client_auth is "none"); on a client, the
  // server's (required for TLS).
  std::string ca_file;
  // Server: "require" (default when ca_file is set: every client presents a
  // certificate signed by ca_file) or "none" (clients authenticate by bearer
  // token, see security/tenant_policy.h).
  std::string client_auth;
  // Client: a file holding a bearer token, sent with every call as
  // "authorization: Bearer <token>"; only over TLS. Never logged.
  std::string token_file;
  // Client: the name the server's certificate must carry, when it is not the
  // host of the address dialled (e.g. a daemon reached by IP whose
  // certificate names its DNS name). Empty: the dialled host.
  std::string server_name;
  // Plaintext, explicitly (see the file comment).
  bool insecure = false;
  // Allows insecure on an address that is not loopback.
  bool allow_insecure_remote = false;
  // How often changed certificate files are picked up (1 s..1 day).
  std::uint32_t reload_interval_s = 10;

  // True when TLS is configured (cert_file or ca_file set).
  bool tls() const { return !cert_file.empty() || !ca_file.empty(); }
};

// Whether `address` (HOST:PORT, [V6]:PORT, unix:PATH, or a comma-separated
// list of these) reaches this machine only: every host is 127.0.0.0/8, ::1 or
// "localhost", or it is a Unix socket.
bool IsLoopbackAddress(std::string_view address);

// Checks `options` for a server listening on `address`: InvalidArgument
// naming the flag when nothing is configured, plaintext is asked for a
// remote address without allow_insecure_remote, both TLS and insecure are
// set, only one of cert/key is given, a file cannot be read, a PEM does not
// parse, the key does not match the certificate, or the certificate is not
// valid now.
Status ValidateServerSecurity(const GrpcSecurityOptions& options, std::string_view address);
// The same for a client dialling `target`: TLS needs ca_file; a token needs
// TLS; cert and key come together.
Status ValidateClientSecurity(const GrpcSecurityOptions& options, std::string_view target);

// One line for the start-up log: "mutual TLS (cert CN=kvfabric-cached-1,
// valid until 2027-12-03, clients verified by ca.pem, reloaded every 10 s)" or
// "PLAINTEXT (--insecure): anyone who reaches 127.0.0.1:7440 is trusted".
std::string DescribeSecurity(const GrpcSecurityOptions& options, std::string_view address,
                             bool server);

// The credentials for a server listening on `address`, after
// ValidateServerSecurity.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const GrpcSecurityOptions& options, std::string_view address);

// The credentials for a channel to `target`, after ValidateClientSecurity
// (with the token attached to every call when token_file is set).
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const GrpcSecurityOptions& options, std::string_view target);

// Sets the channel arguments security needs on `args` (the server name to
// check when server_name is set). Call before creating the channel.
void ApplyChannelSecurityArgs(const GrpcSecurityOptions& options, grpc::ChannelArguments* args);

// A channel to `target` with `args`, secured by `options`; a unix: target
// (a daemon's admin socket, whose file permissions decide who may connect)
// is plaintext whatever `options` say. InvalidArgument as
// ValidateClientSecurity.
StatusOr<std::shared_ptr<grpc::Channel>> OpenSecureChannel(const std::string& target,
                                                           const GrpcSecurityOptions& options,
                                                           grpc::ChannelArguments args);

}  // namespace kvfabric

#endif  // KVFABRIC_SECURITY_GRPC_SECURITY_H_
