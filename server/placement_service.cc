#include "server/placement_service.h"

namespace kvfabric {

grpc::Status PlacementService::Health(grpc::ServerContext* /*context*/,
                                      const v1::HealthRequest* /*request*/,
                                      v1::HealthResponse* response) {
  health_->Fill(response);
  return grpc::Status::OK;
}

}  // namespace kvfabric
