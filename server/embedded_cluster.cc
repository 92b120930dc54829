#include "server/embedded_cluster.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "core/env.h"
#include "metrics/exposition.h"
#include "metrics/rpc_metrics.h"
#include "security/grpc_authorizer.h"
#include "server/cache_host/cache_host_metrics.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/compact_converter.h"
#include "server/cache_host/placement_reporter.h"
#include "server/cache_host_service.h"
#include "server/grpc_server_limits.h"
#include "server/health_reporter.h"
#include "server/placement/membership_store.h"
#include "server/placement/placement_metrics.h"
#include "server/placement/placement_node.h"
#include "server/placement_convert.h"
#include "server/placement_service.h"
#include "spdlog/spdlog.h"
#include "transport/data_transport.h"

namespace kvfabric::server {
namespace {

constexpr char kVersion[] = "kvfabric-embedded";

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// A gRPC server on 127.0.0.1 with a picked port, bounded as the mains' are
// by default (server/grpc_server_limits.h).
// Unavailable naming `what` when it cannot listen.
// Its calls are counted in `rpc_metrics`.
StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(grpc::Service* service, const std::string& what,
                                                  const GrpcSecurityOptions& security,
                                                  metrics::RpcServerMetrics* rpc_metrics,
                                                  std::string* bound) {
  grpc::ServerBuilder builder;
  int port = 0;
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                       MakeServerCredentials(security, "127.0.0.1:0"));
  builder.AddListeningPort("127.0.0.1:0", creds, &port);
  ApplyGrpcServerLimits(GrpcServerLimits(), what, &builder);
  rpc_metrics->Instrument(&builder);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Status::Unavailable(what + ": cannot listen for gRPC on 127.0.0.1:0");
  }
  *bound = "127.0.0.1:" + std::to_string(port);
  return server;
}

std::chrono::system_clock::time_point FromNow(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// Stops several MetricsServers at once (each stop is quick since the server
// is kvfabric's own; with civetweb it took ~2 s apiece).
void StopTogether(std::vector<std::unique_ptr<cache_host::MetricsServer>> servers) {
  std::vector<std::thread> threads;
  for (auto& s : servers) threads.emplace_back([s = std::move(s)]() mutable { s.reset(); });
  for (std::thread& t : threads) t.join();
}

// cached_main's BuildOptions with the embedded choices made explicit.
StatusOr<cache_host::CacheHostOptions> NodeOptions(const EmbeddedDaemonOptions& d) {
  if (d.host_pool_bytes == 0 || d.host_page_bytes == 0) {
    return Status::InvalidArgument("host_pool_bytes " + std::to_string(d.host_pool_bytes) +
                                   " and host_page_bytes " + std::to_string(d.host_page_bytes) +
                                   ": both are required (> 0)");
  }
  cache_host::CacheHostOptions o;
  o.host_id = d.host_id;
  o.pool.pool_bytes = d.host_pool_bytes;
  o.pool.page_bytes = d.host_page_bytes;
  // Development machines allow 8 MiB of locked memory: do not try.
  o.pool.lock_mode = cache_host::LockMode::kOff;
  o.transport_allocates_pool = true;
  if (d.compact_threads > 0) {
    // As kvfabric-cached's default with --compact-threads > 0.
    o.leases.compact_keep.budget_bytes = d.host_pool_bytes / 4;
    o.leases.compact_keep.codec = kCompactInt8Codec;
    o.leases.compact_keep.codec_version = kCompactInt8Version;
  }
  o.policy = cache_host::EvictionPolicyKind::kCostAware;
  // The figures cached_main uses without --calibration (core/cost_defaults.h).
  o.cost_aware = cache_host::DefaultCostAwareOptions();
  o.transport_address = "127.0.0.1:0";
  if (!d.nvme_dir.empty()) {
    if (d.nvme_capacity_bytes == 0) {
      return Status::InvalidArgument("nvme_capacity_bytes is 0: required with nvme_dir \"" +
                                     d.nvme_dir + "\"");
    }
    o.nvme.dir = d.nvme_dir;
    o.nvme.capacity_bytes = d.nvme_capacity_bytes;
    if (d.nvme_segment_bytes != 0) o.nvme.segment_bytes = d.nvme_segment_bytes;
  }
  if (!d.model.model_id.empty()) o.models.push_back({d.model, d.history_tokens});
  return o;
}

}  // namespace

struct EmbeddedCluster::Daemon {
  DaemonInfo info;
  std::string node_name;
  // Declared in construction order; Stop/Kill tear down in reverse, explicitly.
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<cache_host::CacheHostNode> node;
  std::shared_ptr<cache_host::CompactConverter> converter;  // goes before the node
  std::shared_ptr<cache_host::CacheHostMetrics> metrics;
  std::shared_ptr<metrics::RpcServerMetrics> rpc_metrics;
  std::shared_ptr<prometheus::Collectable> build_info;
  std::unique_ptr<cache_host::MetricsServer> metrics_server;
  std::unique_ptr<HealthReporter> health;
  std::unique_ptr<CacheHostService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<CacheHostService> admin_service;  // as cached_main's --admin-address
  std::unique_ptr<grpc::Server> admin_server;
  // This daemon's way into placement (see the file comment), then its reporter.
  std::unique_ptr<PlacementService> uplink_service;
  std::unique_ptr<grpc::Server> uplink_server;
  std::unique_ptr<cache_host::PlacementReporter> reporter;
};

struct EmbeddedCluster::Placement {
  std::string address;
  std::string metrics_url;
  std::unique_ptr<placement::MemoryMembershipStore> store;
  std::unique_ptr<placement::PlacementNode> node;
  std::shared_ptr<placement::PlacementMetrics> metrics;
  std::shared_ptr<metrics::RpcServerMetrics> rpc_metrics;
  std::shared_ptr<prometheus::Collectable> build_info;
  std::unique_ptr<cache_host::MetricsServer> metrics_server;
  std::unique_ptr<HealthReporter> health;
  PlacementServiceOptions service_options;
  std::unique_ptr<PlacementService> service;
  std::unique_ptr<grpc::Server> server;
};

EmbeddedCluster::EmbeddedCluster(EmbeddedClusterOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::StartDaemons(
    const EmbeddedClusterOptions& options) {
  if (options.daemons.empty()) {
    return Status::InvalidArgument("embedded cluster: daemons is empty (at least one)");
  }
  std::set<std::string> ids;
  for (const EmbeddedDaemonOptions& d : options.daemons) {
    if (d.host_id.empty()) {
      return Status::InvalidArgument("embedded cluster: a daemon's host_id is empty");
    }
    if (!ids.insert(d.host_id).second) {
      return Status::InvalidArgument("embedded cluster: host_id \"" + d.host_id +
                                     "\" is given to two daemons (must be unique)");
    }
  }
  std::unique_ptr<EmbeddedCluster> cluster(new EmbeddedCluster(options));
  for (const EmbeddedDaemonOptions& d : options.daemons) {
    cluster->daemons_.push_back(std::make_unique<Daemon>());
    // On error the cluster's destructor stops the daemons already started.
    KVF_RETURN_IF_ERROR(cluster->StartDaemon(d, cluster->daemons_.back().get())
                            .WithContext("embedded daemon \"" + d.host_id + "\""));
  }
  return cluster;
}

Status EmbeddedCluster::StartDaemon(const EmbeddedDaemonOptions& options, Daemon* d) {
  Env* env = Env::Default();
  d->info.host_id = options.host_id;
  d->node_name = options.node_name.empty() ? Hostname() : options.node_name;
  KVF_ASSIGN_OR_RETURN(cache_host::CacheHostOptions node_options, NodeOptions(options));
  if (!options_.security.insecure) {
    // As kvfabric-cached --data-plane-auth=auto: with TLS, connections prove a session.
    node_options.data_plane.sessions =
        std::make_shared<cache_host::DataSessions>(cache_host::DataSessionOptions{});
    node_options.data_plane.require_session = true;
  }
  transport::DataTransportOptions topts;
  topts.kind = options.data_transport;
  topts.ucx_tls = options.ucx_tls;
  topts.copy_threads = options.copy_threads;
  topts.streaming_copy_min_bytes = options.streaming_copy_min_bytes;
  topts.populate_imported_mappings = options.populate_imports;
  topts.workers = options.data_workers;
  if (options_.data_plane_tls) {
    topts.tcp_tls_enabled = true;
    topts.tcp_tls.cert_file = options_.security.cert_file;
    topts.tcp_tls.key_file = options_.security.key_file;
  }
  KVF_ASSIGN_OR_RETURN(d->transport, transport::CreateDataTransport(topts));
  if (options.wrap_transport) d->transport = options.wrap_transport(std::move(d->transport));
  KVF_ASSIGN_OR_RETURN(
      d->node, cache_host::CacheHostNode::Create(std::move(node_options), d->transport.get(), env));
  if (options.compact_threads > 0) {
    cache_host::CompactConverterOptions co;
    co.threads = options.compact_threads;
    KVF_ASSIGN_OR_RETURN(d->converter, cache_host::CompactConverter::Create(co, d->node.get()));
  }
  d->metrics = std::make_shared<cache_host::CacheHostMetrics>(
      [n = d->node.get(), c = std::weak_ptr<cache_host::CompactConverter>(d->converter)] {
        cache_host::CacheHostSnapshot s = n->Snapshot();
        if (auto live = c.lock()) s.compact = live->Stats();
        return s;
      });
  d->node->set_transfer_observer(cache_host::CacheHostMetrics::ObserverFor(d->metrics));
  d->rpc_metrics = metrics::RpcServerMetrics::Create("cached");
  d->build_info = metrics::NewBuildInfo("cached");
  if (options.metrics) {
    KVF_ASSIGN_OR_RETURN(d->metrics_server,
                         cache_host::MetricsServer::Start(
                             "127.0.0.1:0", {d->metrics, d->rpc_metrics, d->build_info}));
    d->info.metrics_url = d->metrics_server->url();
  }

  d->health = std::make_unique<HealthReporter>(env, options.host_id, kVersion);
  CacheHostServiceOptions sopts;
  sopts.transport_address = d->node->transport_address();
  sopts.authorizer = std::make_shared<GrpcAuthorizer>(options_.tenants, "cached");
  sopts.data_sessions = d->node->options().data_plane.sessions;
  sopts.data_sessions_required = d->node->options().data_plane.require_session;
  // As cached_main: advertise (and enforce at the door) what the node accepts.
  const cache_host::CacheHostOptions& no = d->node->options();
  sopts.limits.set_max_ttl_ms(static_cast<std::uint32_t>(
      std::min<std::uint64_t>(sopts.limits.max_ttl_ms(), no.leases.max_ttl_us / 1000)));
  sopts.limits.set_default_ttl_ms(static_cast<std::uint32_t>(no.default_ttl_us / 1000));
  sopts.limits.set_max_keys_per_batch(
      std::min(sopts.limits.max_keys_per_batch(), no.leases.max_keys_per_lease));
  CacheHostServiceOptions aopts = sopts;
  aopts.admin = true;
  d->admin_service = std::make_unique<CacheHostService>(d->node.get(), d->health.get(), aopts);
  KVF_ASSIGN_OR_RETURN(d->admin_server,
                       StartGrpc(d->admin_service.get(), "CacheHost admin", options_.security,
                                 d->rpc_metrics.get(), &d->info.admin_address));
  sopts.admin_address = d->info.admin_address;
  d->service = std::make_unique<CacheHostService>(d->node.get(), d->health.get(), sopts);
  KVF_ASSIGN_OR_RETURN(d->server,
                       StartGrpc(d->service.get(), "CacheHost service", options_.security,
                                 d->rpc_metrics.get(), &d->info.grpc_address));
  d->info.transport_address = d->node->transport_address();
  d->health->SetState(v1::SERVING_STATUS_SERVING, "");
  spdlog::info("embedded daemon {}: gRPC on {}, data plane on {}, metrics {}", options.host_id,
               d->info.grpc_address, d->info.transport_address,
               d->info.metrics_url.empty() ? std::string("off") : d->info.metrics_url);
  return Status::OK();
}

Status EmbeddedCluster::StartPlacement(const BusCalibration& calibration) {
  if (placement_) return Status::FailedPrecondition("embedded cluster: placement already started");
  Env* env = Env::Default();
  placement_ = std::make_unique<Placement>();
  Placement& p = *placement_;
  placement::PlacementOptions o;
  o.calibration = calibration;
  o.cost_model.learn_split_overlap = options_.placement_learns_split_overlap;
  o.retrial_interval = options_.placement_retrial_interval;
  o.retrial_max_interval = options_.placement_retrial_max_interval;
  // The node refuses at the same numbers the service advertises.
  o.limits = PlacementLimitsFromProto(p.service_options.limits);
  if (calibration.paths.empty() && calibration.recompute.empty()) {
    spdlog::warn(
        "embedded placement: no calibration: the cost model uses placeholder figures "
        "until observations refit it; run `kvfabric calibrate`");
  }
  p.store = std::make_unique<placement::MemoryMembershipStore>(env);
  KVF_ASSIGN_OR_RETURN(p.node, placement::PlacementNode::Create(std::move(o), p.store.get(), env));
  p.metrics =
      std::make_shared<placement::PlacementMetrics>([n = p.node.get()] { return n->Snapshot(); });
  p.rpc_metrics = metrics::RpcServerMetrics::Create("placement");
  p.build_info = metrics::NewBuildInfo("placement");
  if (options_.placement_metrics) {
    KVF_ASSIGN_OR_RETURN(
        p.metrics_server,
        cache_host::MetricsServer::Start("127.0.0.1:0", {p.metrics, p.rpc_metrics, p.build_info}));
    p.metrics_url = p.metrics_server->url();
  }
  p.health = std::make_unique<HealthReporter>(env, "placement", kVersion);
  p.service_options.authorizer = std::make_shared<GrpcAuthorizer>(options_.tenants, "placement");
  p.service = std::make_unique<PlacementService>(p.node.get(), p.health.get(), p.service_options);
  KVF_ASSIGN_OR_RETURN(p.server, StartGrpc(p.service.get(), "placement", options_.security,
                                           p.rpc_metrics.get(), &p.address));
  p.health->SetState(v1::SERVING_STATUS_SERVING, "");
  spdlog::info("embedded placement: gRPC on {}, membership {}, metrics {}", p.address,
               p.store->name(), p.metrics_url.empty() ? std::string("off") : p.metrics_url);
  for (const auto& d : daemons_) {
    if (d->info.killed) continue;
    KVF_RETURN_IF_ERROR(
        Register(d.get()).WithContext("embedded daemon \"" + d->info.host_id + "\""));
  }
  return WaitForHosts();
}

Status EmbeddedCluster::Register(Daemon* d) {
  Placement& p = *placement_;
  d->uplink_service =
      std::make_unique<PlacementService>(p.node.get(), p.health.get(), p.service_options);
  std::string uplink;
  KVF_ASSIGN_OR_RETURN(d->uplink_server,
                       StartGrpc(d->uplink_service.get(), "placement uplink", options_.security,
                                 p.rpc_metrics.get(), &uplink));
  cache_host::PlacementReporterOptions ro;
  ro.placement_address = uplink;
  ro.host_id = d->info.host_id;
  ro.grpc_address = d->info.grpc_address;
  ro.transport_address = d->info.transport_address;
  ro.node_name = d->node_name;
  ro.version = kVersion;
  ro.ttl = options_.membership_ttl;
  ro.security = options_.security;
  ro.security.client_auth.clear();
  KVF_ASSIGN_OR_RETURN(d->reporter, cache_host::PlacementReporter::Start(d->node.get(), ro));
  return Status::OK();
}

Status EmbeddedCluster::WaitForHosts() {
  Env* env = Env::Default();
  const std::uint64_t deadline =
      env->NowMicros() + static_cast<std::uint64_t>(options_.registration_timeout.count()) * 1000;
  for (;;) {
    std::set<std::string> listed;
    for (const placement::HostStatus& h : placement_->node->ListHosts()) {
      listed.insert(h.record.host_id);
    }
    std::string missing;
    for (const auto& d : daemons_) {
      if (d->info.killed || listed.count(d->info.host_id) > 0) continue;
      missing += (missing.empty() ? "" : ", ") + d->info.host_id;
    }
    if (missing.empty()) {
      spdlog::info("embedded placement: {} daemons registered", listed.size());
      return Status::OK();
    }
    if (env->NowMicros() >= deadline) {
      return Status::DeadlineExceeded("embedded placement: not registered after " +
                                      std::to_string(options_.registration_timeout.count()) +
                                      " ms (registration_timeout): " + missing +
                                      " (see the reporters' log lines)");
    }
    env->SleepForMicros(20'000);
  }
}

void EmbeddedCluster::StopDaemon(Daemon* d) {
  // cached_main's order after SIGTERM.
  if (d->health) d->health->SetState(v1::SERVING_STATUS_DRAINING, "shutting down");
  if (d->node) d->node->Drain(false);
  if (d->reporter) d->reporter->Stop();  // deregisters: placement stops planning here
  d->reporter.reset();
  if (d->node) d->node->Shutdown(options_.shutdown_grace);
  if (d->server) d->server->Shutdown(FromNow(std::chrono::seconds(2)));
  d->server.reset();
  if (d->admin_server) d->admin_server->Shutdown(FromNow(std::chrono::seconds(2)));
  d->admin_server.reset();
  d->admin_service.reset();
  if (d->uplink_server) d->uplink_server->Shutdown(FromNow(std::chrono::seconds(2)));
  d->uplink_server.reset();
  d->uplink_service.reset();
  d->service.reset();
  d->metrics_server.reset();
  d->converter.reset();
  d->node.reset();
  d->metrics.reset();
  d->transport.reset();
}

bool EmbeddedCluster::WaitForCompactConversions(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (const auto& d : daemons_) {
    if (d->info.killed || !d->converter) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !d->converter->TEST_WaitIdle(left)) return false;
  }
  return true;
}

Status EmbeddedCluster::KillDaemon(std::size_t i) {
  if (i >= daemons_.size()) {
    return Status::InvalidArgument("KillDaemon(" + std::to_string(i) + "): the cluster has " +
                                   std::to_string(daemons_.size()) + " daemons");
  }
  Daemon& d = *daemons_[i];
  if (d.info.killed) {
    return Status::FailedPrecondition("KillDaemon(" + std::to_string(i) + "): daemon \"" +
                                      d.info.host_id + "\" is already killed");
  }
  d.info.killed = true;
  const auto now = std::chrono::system_clock::now();
  d.server->Shutdown(now);  // cancels calls in flight
  d.server.reset();
  d.admin_server->Shutdown(now);
  d.admin_server.reset();
  d.admin_service.reset();
  // Cut the way to placement first, so that stopping the reporter cannot
  // deregister (its Deregister fails at once: connection refused).
  if (d.uplink_server) d.uplink_server->Shutdown(now);
  d.uplink_server.reset();
  d.reporter.reset();
  d.uplink_service.reset();
  d.node->Shutdown(std::chrono::milliseconds(0));
  d.service.reset();
  d.metrics_server.reset();
  d.converter.reset();
  d.node.reset();
  d.metrics.reset();
  d.transport.reset();  // force-closes every endpoint: peers see the daemon gone
  spdlog::info(
      "embedded daemon {}: killed (not deregistered: placement drops it when its {} ms "
      "membership lease expires)",
      d.info.host_id, options_.membership_ttl.count());
  return Status::OK();
}

EmbeddedCluster::~EmbeddedCluster() {
  // /metrics first, all together; the rest in cached_main's and
  // placement_main's order.
  std::vector<std::unique_ptr<cache_host::MetricsServer>> metrics_servers;
  for (auto& d : daemons_) {
    if (d->metrics_server) metrics_servers.push_back(std::move(d->metrics_server));
  }
  if (placement_ && placement_->metrics_server) {
    metrics_servers.push_back(std::move(placement_->metrics_server));
  }
  StopTogether(std::move(metrics_servers));
  for (auto& d : daemons_) {
    if (!d->info.killed) StopDaemon(d.get());
  }
  if (placement_) {
    Placement& p = *placement_;
    if (p.health) p.health->SetState(v1::SERVING_STATUS_NOT_SERVING, "shutting down");
    if (p.server) p.server->Shutdown(FromNow(std::chrono::seconds(2)));
    p.server.reset();
    p.service.reset();
    p.metrics_server.reset();
    p.node.reset();
    p.store.reset();
  }
  spdlog::info("embedded cluster: stopped");
}

Status EmbeddedCluster::SetDaemonSendRate(std::size_t i, std::uint64_t bytes_per_s) {
  if (i >= daemons_.size()) {
    return Status::InvalidArgument("daemon " + std::to_string(i) + " of " +
                                   std::to_string(daemons_.size()));
  }
  if (daemons_[i]->transport == nullptr) {
    return Status::FailedPrecondition("daemon " + daemons_[i]->info.host_id + " was killed");
  }
  return transport::SetDataTransportPacingRate(daemons_[i]->transport.get(), bytes_per_s);
}

placement::PlacementNode* EmbeddedCluster::placement_node() const {
  return placement_ == nullptr ? nullptr : placement_->node.get();
}

std::string EmbeddedCluster::placement_address() const {
  return placement_ ? placement_->address : std::string();
}

std::string EmbeddedCluster::placement_metrics_url() const {
  return placement_ ? placement_->metrics_url : std::string();
}

std::vector<EmbeddedCluster::DaemonInfo> EmbeddedCluster::daemons() const {
  std::vector<DaemonInfo> out;
  out.reserve(daemons_.size());
  for (const auto& d : daemons_) out.push_back(d->info);
  return out;
}

}  // namespace kvfabric::server
