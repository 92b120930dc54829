// TenantPolicy: who a gRPC peer is and what it may do (docs/security.md).
//
// A tenant is an authenticated identity, never a name the client chooses to
// send: the verified client certificate's subject alternative names (DNS,
// URI, e-mail, IP) and common name, or a bearer token (TLS without client
// certificates). The tenants file (--tenants-file, the same for
// kvfabric-cached and kvfabric-placement) maps identities to what they may
// use:
//
//   tenants:
//     - name: alpha
//       identities: [alpha.engines.example]   # a certificate SAN or CN
//       token-files: [alpha.token]            # relative to this file
//       namespaces: [alpha, alpha-eval]       # "*": every namespace
//       quota: 64GiB                          # each namespace, on each daemon
//     - name: operators
//       identities: [ops.example]
//       admin: true                           # Drain, Delete, all-tenant views
//     - name: cache-hosts
//       identities: [cached.example]
//       daemon: true                          # may register with placement
//
// A request naming a namespace its tenant does not hold is refused with
// PERMISSION_DENIED before any key is looked at, so the answer is the same
// whether B's key exists or not. A peer that matches no tenant gets
// UNAUTHENTICATED. Tokens are kept as SHA-256 digests, compared in constant
// time, and never logged.
//
// Without a tenants file the policy is "open": every peer the transport let
// in is the one default tenant, with every namespace (the demo's and a
// single-tenant deployment's configuration); administrative RPCs are then
// served only on the daemon's admin listener, as before identities existed.
//
// Thread safety: immutable after Load; shared by gRPC handler threads.
#ifndef KVFABRIC_SECURITY_TENANT_POLICY_H_
#define KVFABRIC_SECURITY_TENANT_POLICY_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Who a peer proved to be, as the transport reports it.
struct PeerIdentity {
  // The verified client certificate's SANs and CN (empty without one).
  std::vector<std::string> names;
  // The bearer token presented ("" when none). Never logged.
  std::string token;
  // Whether the connection was TLS (a token is ignored on plaintext).
  bool secure = false;
  // For messages and logs: "certificate CN=alpha-1", "a bearer token",
  // "a plaintext peer".
  std::string Describe() const;
};

struct TenantSpec {
  std::string name;
  std::vector<std::string> identities;
  std::vector<std::array<std::uint8_t, 32>> token_digests;
  std::vector<std::string> namespaces;  // "*": all
  std::uint64_t quota_bytes = 0;        // per namespace per daemon; 0: none
  bool admin = false;
  bool daemon = false;

  bool HoldsNamespace(std::string_view ns) const;
};

class TenantPolicy {
 public:
  // The open policy (see the file comment).
  static std::shared_ptr<const TenantPolicy> Open();
  // Reads and checks a tenants file: InvalidArgument naming the file, the
  // tenant and the key for an unknown key, a duplicate tenant name, an
  // identity or token claimed by two tenants, an unreadable or empty token
  // file, a namespace longer than 256 bytes, a bad quota.
  static StatusOr<std::shared_ptr<const TenantPolicy>> LoadFile(const std::string& path);
  // The same from text; token files relative to `base_dir`.
  static StatusOr<std::shared_ptr<const TenantPolicy>> Parse(std::string_view yaml,
                                                             const std::string& base_dir,
                                                             const std::string& origin);

  bool open() const { return open_; }
  const std::vector<TenantSpec>& tenants() const { return tenants_; }

  // The tenant `peer` authenticates as, or null. Under the open policy, the
  // default tenant (every namespace, not admin, daemon).
  const TenantSpec* Resolve(const PeerIdentity& peer) const;

  // (namespace, quota) for every namespace a tenant names with a quota: the
  // daemon's per-namespace quotas.
  std::vector<std::pair<std::string, std::uint64_t>> NamespaceQuotas() const;

  // "3 tenants (alpha: 2 namespaces; operators: admin; cache-hosts: daemon)".
  std::string Summary() const;

 private:
  bool open_ = false;
  std::vector<TenantSpec> tenants_;
  TenantSpec default_tenant_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SECURITY_TENANT_POLICY_H_
