#include "security/grpc_authorizer.h"

#include <grpc/grpc_security_constants.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "metrics/exposition.h"

namespace kvfabric {
namespace {

constexpr std::array<const char*, 4> kReasonNames = {"unauthenticated", "namespace", "admin",
                                                     "daemon"};
constexpr std::string_view kBearer = "Bearer ";

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

GrpcAuthorizer::GrpcAuthorizer(std::shared_ptr<const TenantPolicy> policy, std::string process)
    : policy_(policy ? std::move(policy) : TenantPolicy::Open()), process_(std::move(process)) {}

PeerIdentity GrpcAuthorizer::IdentityOf(const grpc::ServerContext& context) {
  PeerIdentity id;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth) {
    for (const grpc::string_ref& v :
         auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      // "ssl" from SslCredentials, "tls" from the TLS credentials kvfabric uses.
      const std::string_view type(v.data(), v.size());
      if (type == GRPC_SSL_TRANSPORT_SECURITY_TYPE || type == "tls") {
        id.secure = true;
      }
    }
    // Names only from a certificate the handshake verified.
    if (id.secure && auth->IsPeerAuthenticated()) {
      for (const char* prop : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(prop)) {
          id.names.emplace_back(v.data(), v.size());
        }
      }
    }
  }
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    std::string_view value(it->second.data(), it->second.size());
    if (value.substr(0, kBearer.size()) == kBearer) {
      id.token = std::string(value.substr(kBearer.size()));
    }
  }
  return id;
}

grpc::Status GrpcAuthorizer::Deny(Reason reason, grpc::StatusCode code,
                                  const std::string& message) const {
  denied_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  const std::int64_t now = NowUs();
  std::int64_t last = last_log_us_.load(std::memory_order_relaxed);
  if (now - last >= 1000000 && last_log_us_.compare_exchange_strong(last, now)) {
    spdlog::warn("kvfabric-{}: refused: {}", process_, message);
  }
  return grpc::Status(code, message);
}

grpc::Status GrpcAuthorizer::Authenticate(const grpc::ServerContext& context,
                                          std::string_view method,
                                          const TenantSpec** tenant) const {
  const PeerIdentity id = IdentityOf(context);
  *tenant = policy_->Resolve(id);
  if (*tenant == nullptr) {
    return Deny(Reason::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED,
                std::string(method) + ": " + id.Describe() +
                    " is not a tenant in the tenants file (--tenants-file)");
  }
  return grpc::Status::OK;
}

grpc::Status GrpcAuthorizer::AuthorizeNamespace(const grpc::ServerContext& context,
                                                std::string_view method,
                                                std::string_view ns) const {
  const TenantSpec* t = nullptr;
  if (grpc::Status s = Authenticate(context, method, &t); !s.ok()) return s;
  if (!t->HoldsNamespace(ns)) {
    return Deny(Reason::kNamespace, grpc::StatusCode::PERMISSION_DENIED,
                std::string(method) + ": tenant \"" + t->name + "\" may not use namespace \"" +
                    std::string(ns.substr(0, 64)) + "\" (its namespaces are in the tenants file)");
  }
  return grpc::Status::OK;
}

grpc::Status GrpcAuthorizer::AuthorizeAdmin(const grpc::ServerContext& context,
                                            std::string_view method) const {
  const TenantSpec* t = nullptr;
  if (grpc::Status s = Authenticate(context, method, &t); !s.ok()) return s;
  if (policy_->open() || !t->admin) {
    return Deny(
        Reason::kAdmin, grpc::StatusCode::PERMISSION_DENIED,
        std::string(method) +
            " acts on every tenant: it needs an admin identity (admin: "
            "true in the tenants file" +
            std::string(policy_->open() ? ", or the daemon's --admin-address listener)" : ")") +
            "; tenant \"" + t->name + "\" is not admin");
  }
  return grpc::Status::OK;
}

grpc::Status GrpcAuthorizer::AuthorizeDaemon(const grpc::ServerContext& context,
                                             std::string_view method) const {
  const TenantSpec* t = nullptr;
  if (grpc::Status s = Authenticate(context, method, &t); !s.ok()) return s;
  if (!t->daemon) {
    return Deny(Reason::kDaemon, grpc::StatusCode::PERMISSION_DENIED,
                std::string(method) +
                    ": only a cache-host daemon's identity (daemon: true in the "
                    "tenants file) may announce hosts and blocks; tenant \"" +
                    t->name + "\" is not one");
  }
  return grpc::Status::OK;
}

std::vector<prometheus::MetricFamily> GrpcAuthorizer::Collect() const {
  std::vector<metrics::MetricSample> samples;
  for (std::size_t i = 0; i < kReasonNames.size(); ++i) {
    samples.push_back({static_cast<double>(denied_[i].load(std::memory_order_relaxed)),
                       {{"process", process_}, {"reason", kReasonNames[i]}}});
  }
  std::vector<prometheus::MetricFamily> out;
  metrics::AppendFamily(out, "kvfabric_", prometheus::MetricType::Counter, "auth_denied_total",
                        "gRPC calls refused by authentication or tenant authorization, by reason",
                        std::move(samples));
  return out;
}

}  // namespace kvfabric
