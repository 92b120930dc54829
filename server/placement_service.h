// PlacementService: the gRPC adapter of the placement service
// (kvfabric.v1.Placement, docs/protocol.md).
//
// A thin `final` adapter over placement::PlacementNode (server/placement/placement_node.h),
// which is tested without gRPC. Every RPC but Health
//   1. checks the whole request against the Limits in force (chain and batch sizes, key
//      lengths, namespace, host_id and address lengths, TTL, payload sizes, replicas, a complete
//      fingerprint, known enum values, host indices inside their table) and refuses it with
//      INVALID_ARGUMENT naming the limit and both numbers ("keys: 70000 > max_chain_blocks
//      65536");
//   2. answers UNAVAILABLE without a node (placement is starting), and CANCELLED or
//      DEADLINE_EXCEEDED, without doing the work, if the client cancelled the call or its
//      deadline already passed;
//   3. converts to core types (server/placement_convert.h), calls the node's method of the same
//      name, and converts back: Place's per-key outcomes become EntryStatus, a whole-call failure
//      of the node (NOT_FOUND for an unknown membership lease, INVALID_ARGUMENT) becomes the
//      RPC's status (proto/grpc_status.h).
//
// Membership. Register's tier list sets the member's capacity and free bytes per tier; a
// Heartbeat that lists tiers or a serving status updates them (STARTING, DRAINING and
// NOT_SERVING count as draining: no new placements, no fetch source of new plans). A heartbeat
// carries no addresses, so the adapter reads the member's current record (ListHosts, O(members))
// and changes only those fields; a heartbeat with neither renews the lease alone. Deregister
// of a lease that now belongs to another incarnation of the host is ignored (OK), as the proto
// says of an older incarnation.
//
// Plan. The chain's block sizes come from the fingerprint (tokens_per_block tokens and
// BlockBytes() bytes per block); the client's host->device link is charged in the path load
// under the call's peer address (context->peer()), or client_node when gRPC gives no peer.
//
// Explain answers plans from the node's bounded history. Eviction and demotion decisions are
// the daemons' (placement keeps none): those targets get UNIMPLEMENTED, pointing at
// `kvfabric explain eviction` on the daemon.
//
// Health is served from the HealthReporter with the limits this service enforces, and so is
// RegisterResponse.limits.
//
// Thread safety: gRPC calls the handlers from its own threads, concurrently; the node and the
// reporter are thread-safe.
#ifndef KVFABRIC_SERVER_PLACEMENT_SERVICE_H_
#define KVFABRIC_SERVER_PLACEMENT_SERVICE_H_

#include <functional>
#include <memory>

#include "core/status.h"
#include "core/statusor.h"
#include "kvfabric/v1/common.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "proto/wire_limits.h"
#include "security/grpc_authorizer.h"
#include "server/health_reporter.h"

namespace kvfabric {

namespace placement {
class PlacementNode;
}  // namespace placement

struct PlacementServiceOptions {
  // The limits enforced and reported by Health and Register. Default: DefaultLimits(). The
  // binary gives the node the same numbers (PlacementLimitsFromProto in placement_convert.h),
  // so that a request within them is never refused further down.
  v1::Limits limits = DefaultLimits();
  // Re-reads and applies the calibration file (ReloadCalibration RPC, SIGHUP); unset: placement
  // runs without --calibration and the RPC answers FAILED_PRECONDITION.
  std::function<StatusOr<v1::ReloadCalibrationResponse>()> reload_calibration;
  // Who may do what (security/grpc_authorizer.h). Null: the open policy, nothing checked. With
  // a tenants file: Register, Heartbeat, Deregister and ReportBlocks need a daemon identity (a
  // tenant must not announce a fake cache host that would attract others' saves); Locate,
  // Plan, ReportObservations and Place need the request's namespace; Explain answers a plan of
  // another tenant's namespace as NOT_FOUND, like a plan that does not exist; ListPlans of
  // every namespace and ReloadCalibration need an admin identity; ListHosts any tenant;
  // Health is open.
  std::shared_ptr<const GrpcAuthorizer> authorizer;
};

class PlacementService final : public v1::Placement::Service {
 public:
  // `node` and `health` are borrowed and must outlive the service. `node` may be null while
  // placement starts (see the class comment).
  PlacementService(placement::PlacementNode* node, HealthReporter* health,
                   PlacementServiceOptions options);

  PlacementService(const PlacementService&) = delete;
  PlacementService& operator=(const PlacementService&) = delete;

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse* response) override;
  grpc::Status ReportBlocks(grpc::ServerContext* context, const v1::ReportBlocksRequest* request,
                            v1::ReportBlocksResponse* response) override;
  grpc::Status Locate(grpc::ServerContext* context, const v1::LocateRequest* request,
                      v1::LocateResponse* response) override;
  grpc::Status Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                    v1::PlanResponse* response) override;
  grpc::Status ReportObservations(grpc::ServerContext* context,
                                  const v1::ReportObservationsRequest* request,
                                  v1::ReportObservationsResponse* response) override;
  grpc::Status Explain(grpc::ServerContext* context, const v1::ExplainRequest* request,
                       v1::ExplainResponse* response) override;
  grpc::Status ListPlans(grpc::ServerContext* context, const v1::ListPlansRequest* request,
                         v1::ListPlansResponse* response) override;
  grpc::Status Place(grpc::ServerContext* context, const v1::PlaceRequest* request,
                     v1::PlaceResponse* response) override;
  grpc::Status ListHosts(grpc::ServerContext* context, const v1::ListHostsRequest* request,
                         v1::ListHostsResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status ReloadCalibration(grpc::ServerContext* context,
                                 const v1::ReloadCalibrationRequest* request,
                                 v1::ReloadCalibrationResponse* response) override;

  const PlacementServiceOptions& options() const { return options_; }

 private:
  // OK if the node may be called for this call now: UNAVAILABLE without a node, CANCELLED /
  // DEADLINE_EXCEEDED for a call that is already over.
  Status Admit(grpc::ServerContext* context) const;
  // The checks of PlacementServiceOptions::authorizer; OK without one.
  grpc::Status Authorize(const grpc::ServerContext& context, const char* method,
                         const std::string& ns) const;
  grpc::Status AuthorizeDaemon(const grpc::ServerContext& context, const char* method) const;
  grpc::Status AuthorizeAdmin(const grpc::ServerContext& context, const char* method) const;

  placement::PlacementNode* const node_;
  HealthReporter* const health_;
  const PlacementServiceOptions options_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_SERVICE_H_
