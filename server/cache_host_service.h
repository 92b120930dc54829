// CacheHostService: the gRPC adapter of the cache-host daemon
// (kvfabric.v1.CacheHost, docs/protocol.md).
//
// A thin `final` adapter: requests are checked and handed to the daemon's core
// classes, which are tested without gRPC. Health is served here; the data
// RPCs (Reserve, Commit, Lease, Renew, Release, Lookup, Delete, Stats, Drain)
// answer UNIMPLEMENTED from the generated base class until the cache-host
// daemon issue fills them.
//
// Thread safety: gRPC calls the handlers from its own threads, concurrently.
#ifndef KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_
#define KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_

#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "server/health_reporter.h"

namespace kvfabric {

class CacheHostService final : public v1::CacheHost::Service {
 public:
  // `health` is borrowed and must outlive the service.
  explicit CacheHostService(HealthReporter* health) : health_(health) {}

  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

 private:
  HealthReporter* const health_;
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_CACHE_HOST_SERVICE_H_
