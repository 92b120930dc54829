// RpcServerMetrics: latency and outcome of every gRPC call a kvfabric server
// handles, by method and status code, measured by a server interceptor.
//
//   kvfabric_rpc_server_handled_total{process,method,code}  counter
//   kvfabric_rpc_server_handling_seconds{process,method}    histogram
//
// `method` is the call's method without its package ("CacheHost/Lease",
// "Placement/Plan"); `code` gRPC's status name ("OK", "NOT_FOUND", ...).
// Both label sets are bounded: codes are gRPC's 17, and at most kMaxMethods
// distinct methods get series (gRPC runs interceptors only for registered
// methods; any beyond the bound are counted as method="other").
//
// Ownership and threads: hold it in a std::shared_ptr; the interceptor
// factories hold it too, so it outlives every server built with them. Calls
// are observed from gRPC's handler threads concurrently; Collect() may run
// at the same time from the /metrics thread.
#ifndef KVFABRIC_METRICS_RPC_METRICS_H_
#define KVFABRIC_METRICS_RPC_METRICS_H_

#include <grpcpp/server_builder.h>
#include <grpcpp/support/server_interceptor.h>
#include <grpcpp/support/status.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mutex.h"

namespace kvfabric::metrics {

class RpcServerMetrics final : public prometheus::Collectable,
                               public std::enable_shared_from_this<RpcServerMetrics> {
 public:
  // Distinct methods with series of their own.
  static constexpr std::size_t kMaxMethods = 64;

  // `process`: the process label ("cached", "placement").
  static std::shared_ptr<RpcServerMetrics> Create(std::string process);

  // A factory for grpc::ServerBuilder::experimental().SetInterceptorCreators:
  // every call on that server is observed here.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // Installs NewInterceptorFactory() on `builder` (replacing any
  // interceptors set there before).
  void Instrument(grpc::ServerBuilder* builder);

  // Records one finished call: `full_method` as gRPC names it
  // ("/kvfabric.v1.CacheHost/Lease"), its status code and duration.
  void Observe(std::string_view full_method, grpc::StatusCode code, double seconds);

  std::vector<prometheus::MetricFamily> Collect() const override;

  // "CacheHost/Lease" for "/kvfabric.v1.CacheHost/Lease"; "other" for a
  // name of another shape. Exposed for tests.
  static std::string MethodLabel(std::string_view full_method);
  // "OK", "NOT_FOUND", ..., "UNKNOWN" for codes outside gRPC's range.
  static std::string_view CodeName(grpc::StatusCode code);

 private:
  explicit RpcServerMetrics(std::string process);

  struct Method {
    std::string full_name;
    prometheus::Histogram* seconds = nullptr;
    std::array<prometheus::Counter*, 17> handled{};
  };
  Method* Find(std::string_view full_method);
  Method* Add(std::string_view full_method, const std::string& label);

  const std::string process_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* handled_ = nullptr;
  prometheus::Family<prometheus::Histogram>* seconds_ = nullptr;

  mutable Mutex mu_;
  // Append-only (pointers stay valid), at most kMaxMethods + 1 ("other").
  std::vector<std::unique_ptr<Method>> methods_ KVF_GUARDED_BY(mu_);
};

}  // namespace kvfabric::metrics

#endif  // KVFABRIC_METRICS_RPC_METRICS_H_
