// GrpcAuthorizer: the check every kvfabric gRPC handler makes before it
// touches a key (security/tenant_policy.h says who may do what).
//
//   Authenticate  the peer is a tenant of the policy, else UNAUTHENTICATED
//                 ("... is not a tenant in the tenants file")
//   Namespace     the tenant holds the request's namespace, else
//                 PERMISSION_DENIED, before any lookup: existing and missing
//                 keys of another tenant get the same answer
//   Admin         the tenant is admin: Drain, Delete of any namespace,
//                 all-tenant Stats and Explain, ReloadCalibration
//   Daemon        the tenant is daemon: Register, Heartbeat, Deregister,
//                 ReportBlocks at placement (a tenant must not be able to
//                 announce a fake cache host and attract others' saves)
//
// Every refusal is counted, by reason, in
//   kvfabric_auth_denied_total{process,reason}   counter
// (reason: unauthenticated, namespace, admin, daemon), and logged at most
// once per second with the peer's description (never its token).
//
// Thread safety: const methods, called from gRPC's handler threads
// concurrently; counters are atomic.
#ifndef KVFABRIC_SECURITY_GRPC_AUTHORIZER_H_
#define KVFABRIC_SECURITY_GRPC_AUTHORIZER_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <prometheus/collectable.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "security/tenant_policy.h"

namespace kvfabric {

class GrpcAuthorizer final : public prometheus::Collectable {
 public:
  enum class Reason { kUnauthenticated = 0, kNamespace = 1, kAdmin = 2, kDaemon = 3 };

  // `process`: the metric's process label ("cached", "placement").
  GrpcAuthorizer(std::shared_ptr<const TenantPolicy> policy, std::string process);

  // The identity the transport established for this call.
  static PeerIdentity IdentityOf(const grpc::ServerContext& context);

  const TenantPolicy& policy() const { return *policy_; }

  // OK with *tenant set, or UNAUTHENTICATED.
  grpc::Status Authenticate(const grpc::ServerContext& context, std::string_view method,
                            const TenantSpec** tenant) const;
  // Authenticate, then the namespace (see the file comment).
  grpc::Status AuthorizeNamespace(const grpc::ServerContext& context, std::string_view method,
                                  std::string_view ns) const;
  // Authenticate, then admin. Under the open policy nobody is admin by
  // identity (the daemon's admin listener is).
  grpc::Status AuthorizeAdmin(const grpc::ServerContext& context, std::string_view method) const;
  // Authenticate, then daemon.
  grpc::Status AuthorizeDaemon(const grpc::ServerContext& context, std::string_view method) const;

  std::uint64_t denied(Reason reason) const {
    return denied_[static_cast<int>(reason)].load(std::memory_order_relaxed);
  }

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  grpc::Status Deny(Reason reason, grpc::StatusCode code, const std::string& message) const;

  const std::shared_ptr<const TenantPolicy> policy_;
  const std::string process_;
  mutable std::array<std::atomic<std::uint64_t>, 4> denied_{};
  mutable std::atomic<std::int64_t> last_log_us_{0};
};

}  // namespace kvfabric

#endif  // KVFABRIC_SECURITY_GRPC_AUTHORIZER_H_
