#include "metrics/rpc_metrics.h"

#include <chrono>
#include <utility>

#include "metrics/exposition.h"

namespace kvfabric::metrics {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::Interceptor;
using grpc::experimental::InterceptorBatchMethods;
using grpc::experimental::ServerInterceptorFactoryInterface;
using grpc::experimental::ServerRpcInfo;

constexpr std::array<std::string_view, 17> kCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

std::size_t CodeIndex(grpc::StatusCode code) {
  const int c = static_cast<int>(code);
  return c >= 0 && c < static_cast<int>(kCodeNames.size()) ? static_cast<std::size_t>(c) : 2;
}

// One per call: created when the call starts, observes when its status is
// about to be sent.
class CallInterceptor final : public Interceptor {
 public:
  CallInterceptor(std::shared_ptr<RpcServerMetrics> metrics, const char* method)
      : metrics_(std::move(metrics)),
        method_(method != nullptr ? method : ""),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->Observe(method_, methods->GetSendStatus().error_code(), seconds);
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<RpcServerMetrics> metrics_;
  const std::string_view method_;  // gRPC's registered name: lives as long as the server
  const std::chrono::steady_clock::time_point start_;
};

class Factory final : public ServerInterceptorFactoryInterface {
 public:
  explicit Factory(std::shared_ptr<RpcServerMetrics> metrics) : metrics_(std::move(metrics)) {}
  Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    return new CallInterceptor(metrics_, info->method());
  }

 private:
  const std::shared_ptr<RpcServerMetrics> metrics_;
};

}  // namespace

std::shared_ptr<RpcServerMetrics> RpcServerMetrics::Create(std::string process) {
  return std::shared_ptr<RpcServerMetrics>(new RpcServerMetrics(std::move(process)));
}

// The Build*().Register() calls throw only for invalid or duplicate names,
// which are constants here.
RpcServerMetrics::RpcServerMetrics(std::string process)
    : process_(std::move(process)), registry_(std::make_shared<prometheus::Registry>()) {
  handled_ = &prometheus::BuildCounter()
                  .Name("kvfabric_rpc_server_handled_total")
                  .Help("gRPC calls this server finished, by method and status code.")
                  .Register(*registry_);
  seconds_ = &prometheus::BuildHistogram()
                  .Name("kvfabric_rpc_server_handling_seconds")
                  .Help("Time from a gRPC call's start to its status, by method, in seconds.")
                  .Register(*registry_);
}

std::unique_ptr<ServerInterceptorFactoryInterface> RpcServerMetrics::NewInterceptorFactory() {
  return std::make_unique<Factory>(shared_from_this());
}

void RpcServerMetrics::Instrument(grpc::ServerBuilder* builder) {
  std::vector<std::unique_ptr<ServerInterceptorFactoryInterface>> creators;
  creators.push_back(NewInterceptorFactory());
  builder->experimental().SetInterceptorCreators(std::move(creators));
}

std::string RpcServerMetrics::MethodLabel(std::string_view full_method) {
  // "/package.Service/Method" -> "Service/Method".
  if (full_method.size() < 4 || full_method.front() != '/') return "other";
  const std::size_t slash = full_method.find('/', 1);
  if (slash == std::string_view::npos || slash + 1 >= full_method.size()) return "other";
  std::string_view service = full_method.substr(1, slash - 1);
  const std::size_t dot = service.rfind('.');
  if (dot != std::string_view::npos) service.remove_prefix(dot + 1);
  if (service.empty()) return "other";
  return std::string(service) + "/" + std::string(full_method.substr(slash + 1));
}

std::string_view RpcServerMetrics::CodeName(grpc::StatusCode code) {
  return kCodeNames[CodeIndex(code)];
}

RpcServerMetrics::Method* RpcServerMetrics::Find(std::string_view full_method) {
  MutexLock l(&mu_);
  for (const auto& m : methods_) {
    if (m->full_name == full_method) return m.get();
  }
  std::string label = methods_.size() < kMaxMethods ? MethodLabel(full_method) : "other";
  for (const auto& m : methods_) {
    // Names of another shape, and methods past the bound, share "other".
    if (label == "other" && m->full_name == "other") return m.get();
  }
  return Add(label == "other" ? std::string_view("other") : full_method, label);
}

RpcServerMetrics::Method* RpcServerMetrics::Add(std::string_view full_method,
                                                const std::string& label) {
  auto m = std::make_unique<Method>();
  m->full_name = std::string(full_method);
  m->seconds = &seconds_->Add({{"process", process_}, {"method", label}}, LatencySecondsBuckets());
  for (std::size_t c = 0; c < kCodeNames.size(); ++c) {
    // Series for OK and the codes a call has returned: created on first use.
    m->handled[c] = nullptr;
  }
  m->handled[0] =
      &handled_->Add({{"process", process_}, {"method", label}, {"code", std::string("OK")}});
  methods_.push_back(std::move(m));
  return methods_.back().get();
}

void RpcServerMetrics::Observe(std::string_view full_method, grpc::StatusCode code,
                               double seconds) {
  Method* m = Find(full_method);
  const std::size_t c = CodeIndex(code);
  prometheus::Counter* counter = nullptr;
  {
    MutexLock l(&mu_);
    if (m->handled[c] == nullptr) {
      const std::string label = m->full_name == "other" ? "other" : MethodLabel(m->full_name);
      m->handled[c] = &handled_->Add(
          {{"process", process_}, {"method", label}, {"code", std::string(kCodeNames[c])}});
    }
    counter = m->handled[c];
  }
  counter->Increment();
  m->seconds->Observe(seconds);
}

std::vector<prometheus::MetricFamily> RpcServerMetrics::Collect() const {
  return registry_->Collect();
}

}  // namespace kvfabric::metrics
