// PlacementService: the gRPC adapter of the placement service
// (kvfabric.v1.Placement, docs/protocol.md).
//
// A thin `final` adapter over the membership, directory and planner classes.
// Health is served here; Register, Heartbeat, Deregister, ReportBlocks,
// Locate, Plan, ReportObservations, Explain, Place and ListHosts answer
// UNIMPLEMENTED from the generated base class until the placement issue
// fills them.
//
// Thread safety: gRPC calls the handlers from its own threads, concurrently.
#ifndef KVFABRIC_SERVER_PLACEMENT_SERVICE_H_
#define KVFABRIC_SERVER_PLACEMENT_SERVICE_H_

#include "kvfabric/v1/placement.grpc.pb.h"
#include "server/health_reporter.h"

namespace kvfabric {

class PlacementService final : public v1::Placement::Service {
 public:
  // `health` is borrowed and must outlive the service.
  explicit PlacementService(HealthReporter* health) : health_(health) {}

  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

 private:
  HealthReporter* const health_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_PLACEMENT_SERVICE_H_
