// CacheHostService: the gRPC adapter of the cache-host daemon
// (kvfabric.v1.CacheHost, docs/protocol.md).
//
// A thin `final` adapter over cache_host::CacheHostNode, which is tested
// without gRPC. Every data RPC
//   1. checks the whole request against the Limits in force (batch sizes, key
//      lengths, distinct keys, namespace length, TTL, block and batch payload
//      sizes, a complete fingerprint) and refuses it with INVALID_ARGUMENT
//      naming the limit and both numbers ("keys: 5000 > max_keys_per_batch
//      4096"); Reserve also checks each descriptor and answers a bad one in
//      that entry's EntryStatus;
//   2. answers CANCELLED or DEADLINE_EXCEEDED, without doing the work, if the
//      client cancelled the call or its deadline already passed;
//   3. converts to core types (server/cache_host_convert.h), calls the node's
//      method of the same name, and converts back: per-entry outcomes become
//      EntryStatus, a whole-call failure of the node (e.g. UNAVAILABLE while
//      draining) becomes the RPC's status (proto/grpc_status.h).
// Grants are owner-driven: one region spanning the pool, the daemon's
// transport address, and the grant's 16-byte access token; the node's data
// plane checks every transfer against the lease.
//
// Health is served from the HealthReporter, with the limits this service
// enforces. Drain also updates the reporter's state, so Health and the
// placement heartbeat see it. Without a node (the daemon is still starting)
// every RPC but Health answers UNAVAILABLE.
//
// Thread safety: gRPC calls the handlers from its own threads, concurrently;
// the node and the reporter are thread-safe.
#ifndef KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_
#define KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_

#include <memory>
#include <string>

#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "proto/wire_limits.h"
#include "security/grpc_authorizer.h"
#include "server/cache_host/cache_host_node.h"
#include "server/health_reporter.h"

namespace kvfabric {

struct CacheHostServiceOptions {
  // The transport listener address put in every TransportGrant: the node's
  // transport_address(). At most limits.max_address_bytes.
  std::string transport_address;
  // The limits enforced and reported by Health. Default: DefaultLimits(). A
  // daemon lowers them to what its node accepts (e.g. max_ttl_ms to the lease
  // table's max_ttl_us, max_keys_per_batch to its max_keys_per_lease), so that
  // a request within them is never refused further down.
  v1::Limits limits = DefaultLimits();
  // Whether this instance serves the administrative RPCs: Drain, Delete and
  // Stats with include_namespaces. Until clients have identities these act on
  // every tenant, so the daemon serves them only on its admin listener
  // (--admin-address: a Unix socket or a loopback port that only operators
  // reach); elsewhere they answer PERMISSION_DENIED naming the flag.
  bool admin = false;
  // The admin listener's address, for that message ("" when there is none).
  std::string admin_address;
  // Who may do what (security/grpc_authorizer.h). Null: the open policy,
  // nothing checked beyond the admin listener. With a tenants file every
  // data RPC is authenticated and its namespace authorized before anything
  // else, so existing and missing keys of another tenant get the same
  // PERMISSION_DENIED; Stats needs any tenant; Health is open (probes);
  // Drain, Stats with namespaces and ListEvictions of all namespaces need an
  // admin identity (or the admin listener); Delete needs the namespace.
  std::shared_ptr<const GrpcAuthorizer> authorizer;
  // Data-plane sessions (server/cache_host/data_sessions.h), shared with the
  // node's data plane; null: OpenDataSession answers UNIMPLEMENTED.
  std::shared_ptr<cache_host::DataSessions> data_sessions;
  bool data_sessions_required = false;
};

class CacheHostService final : public v1::CacheHost::Service {
 public:
  // `node` and `health` are borrowed and must outlive the service. `node` may
  // be null while the daemon starts (see the class comment).
  CacheHostService(cache_host::CacheHostNode* node, HealthReporter* health,
                   CacheHostServiceOptions options);

  CacheHostService(const CacheHostService&) = delete;
  CacheHostService& operator=(const CacheHostService&) = delete;

  grpc::Status Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                       v1::ReserveResponse* response) override;
  grpc::Status Commit(grpc::ServerContext* context, const v1::CommitRequest* request,
                      v1::CommitResponse* response) override;
  grpc::Status Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                     v1::LeaseResponse* response) override;
  grpc::Status Renew(grpc::ServerContext* context, const v1::RenewRequest* request,
                     v1::RenewResponse* response) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status ExplainEviction(grpc::ServerContext* context,
                               const v1::ExplainEvictionRequest* request,
                               v1::ExplainEvictionResponse* response) override;
  grpc::Status ListEvictions(grpc::ServerContext* context, const v1::ListEvictionsRequest* request,
                             v1::ListEvictionsResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const v1::DeleteRequest* request,
                      v1::DeleteResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                     v1::DrainResponse* response) override;
  grpc::Status OpenDataSession(grpc::ServerContext* context,
                               const v1::OpenDataSessionRequest* request,
                               v1::OpenDataSessionResponse* response) override;

  const CacheHostServiceOptions& options() const { return options_; }

 private:
  // OK if the node may be called for this call now: UNAVAILABLE without a
  // node, CANCELLED / DEADLINE_EXCEEDED for a call that is already over.
  Status Admit(grpc::ServerContext* context) const;
  // OK on the admin instance; PERMISSION_DENIED naming `what` and where it is
  // served otherwise.
  Status CheckAdmin(const grpc::ServerContext& context, const char* what) const;
  // The tenant check of a data RPC on `ns` (see CacheHostServiceOptions::authorizer).
  grpc::Status Authorize(const grpc::ServerContext& context, const char* method,
                         const std::string& ns) const;

  cache_host::CacheHostNode* const node_;
  HealthReporter* const health_;
  const CacheHostServiceOptions options_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_
