#include "server/cache_host_service.h"

namespace kvfabric {

grpc::Status CacheHostService::Health(grpc::ServerContext* /*context*/,
                                      const v1::HealthRequest* /*request*/,
                                      v1::HealthResponse* response) {
  health_->Fill(response);
  return grpc::Status::OK;
}

}  // namespace kvfabric
