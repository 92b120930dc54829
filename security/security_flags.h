// The flags of GrpcSecurityOptions (security/grpc_security.h), for binaries:
// library code takes the options struct and never links this (CLI11).
//
// Thread safety: used by CLI11 from the thread that parses.
#ifndef KVFABRIC_SECURITY_SECURITY_FLAGS_H_
#define KVFABRIC_SECURITY_SECURITY_FLAGS_H_

#include "security/grpc_security.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvfabric {

// Adds --tls-cert, --tls-key, --tls-ca, --tls-client-auth (servers only),
// --tls-token-file (clients only), --tls-server-name (clients only),
// --tls-reload-interval, --insecure and --allow-insecure-remote.
// REQUIRES: `options` outlives parsing.
void AddServerSecurityFlags(CLI::App& app, GrpcSecurityOptions* options);
void AddClientSecurityFlags(CLI::App& app, GrpcSecurityOptions* options);

}  // namespace kvfabric

#endif  // KVFABRIC_SECURITY_SECURITY_FLAGS_H_
