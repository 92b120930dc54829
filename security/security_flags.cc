#include "security/security_flags.h"

#include <CLI/CLI.hpp>
#include <cstdint>

namespace kvfabric {
namespace {

constexpr std::uint32_t kMinReloadSeconds = 1;
constexpr std::uint32_t kMaxReloadSeconds = 86400;

void AddCommonFlags(CLI::App& app, GrpcSecurityOptions* o) {
  app.add_option("--tls-cert", o->cert_file,
                 "PEM certificate chain of this process (its TLS identity); with --tls-key");
  app.add_option("--tls-key", o->key_file, "PEM private key of --tls-cert");
  app.add_flag("--insecure", o->insecure,
               "plaintext gRPC, no authentication: loopback addresses only (see "
               "--allow-insecure-remote); without it, TLS flags are required");
  app.add_flag("--allow-insecure-remote", o->allow_insecure_remote,
               "with --insecure: also on an address that is not loopback (anyone who reaches "
               "it is trusted)");
  app.add_option("--tls-reload-interval", o->reload_interval_s,
                 "seconds between checks for changed certificate files (1..86400)")
      ->check(CLI::Range(kMinReloadSeconds, kMaxReloadSeconds));
}

}  // namespace

void AddServerSecurityFlags(CLI::App& app, GrpcSecurityOptions* options) {
  AddCommonFlags(app, options);
  app.add_option("--tls-ca", options->ca_file,
                 "PEM CA bundle that signs clients' certificates: mutual TLS, every client "
                 "presents one (see --tls-client-auth)");
  app.add_option("--tls-client-auth", options->client_auth,
                 "with --tls-ca: require (clients present a certificate) or none (clients "
                 "authenticate with bearer tokens, --tenants-file)")
      ->check(CLI::IsMember({"", "require", "none"}));
}

void AddClientSecurityFlags(CLI::App& app, GrpcSecurityOptions* options) {
  AddCommonFlags(app, options);
  app.add_option("--tls-ca", options->ca_file,
                 "PEM CA bundle that signs the servers' certificates");
  app.add_option("--tls-token-file", options->token_file,
                 "file holding a bearer token sent with every call (TLS only; never logged)");
  app.add_option("--tls-server-name", options->server_name,
                 "name the server's certificate must carry (default: the host dialled)");
}

}  // namespace kvfabric
