// `kvfabric-placement`: the placement service. Reads flags (or a YAML file
// with the same keys) once, builds PlacementNode over a membership store (in
// process by default; etcd with --etcd-endpoint), serves the Placement gRPC
// service and /metrics, and stops on SIGTERM or SIGINT (exit 0).
//
// The block directory lives in this process's memory only: after a restart it
// is rebuilt from the daemons' full reports (they re-register when their
// heartbeat answers NOT_FOUND, and report in full after every registration).
// With etcd, membership survives the restart: the daemons' leases are in
// etcd, and a new placement process lists them at start.
//
// Exit status: 0 after a clean shutdown, 1 when start-up failed, 2 on a usage
// error.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "core/bus_calibration.h"
#include "core/config/logging_flags.h"
#include "core/config/unit_flags.h"
#include "core/config/yaml_config.h"
#include "core/env.h"
#include "core/logging.h"
#include "core/units.h"
#include "metrics/exposition.h"
#include "metrics/rpc_metrics.h"
#include "security/grpc_authorizer.h"
#include "security/grpc_security.h"
#include "security/security_flags.h"
#include "security/tenant_policy.h"
#include "server/cache_host/cache_host_metrics.h"
#include "server/grpc_server_limits.h"
#include "server/health_reporter.h"
#include "server/placement/etcd_client.h"
#include "server/placement/etcd_membership_store.h"
#include "server/placement/membership_store.h"
#include "server/placement/placement_metrics.h"
#include "server/placement/placement_node.h"
#include "server/placement_convert.h"
#include "server/placement_service.h"
#include "spdlog/spdlog.h"

namespace kvfabric {
namespace {

int Run(int argc, char** argv) {
  CLI::App app{"kvfabric-placement: the kvfabric placement service", "kvfabric-placement"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "validate the flags (and --config YAML) and the calibration file, print what "
               "would run and exit without starting: 0 when it would start, 2 otherwise");
  AddYamlConfigOption(&app);
  LogOptions log_options;
  AddLoggingFlags(app, &log_options);
  std::string grpc_address = "127.0.0.1:7450";
  std::string metrics_address = "127.0.0.1:0";
  std::string ready_file;
  std::string etcd_endpoint;
  std::string etcd_prefix = "/kvfabric/v1/";
  std::string calibration_path;
  placement::PlacementOptions o;
  GrpcServerLimits grpc_limits;
  GrpcSecurityOptions security;
  GrpcSecurityOptions etcd_tls;
  std::string tenants_file;
  app.add_option("--grpc-address", grpc_address, "gRPC listen address HOST:PORT (:0 picks)");
  AddServerSecurityFlags(app, &security);
  app.add_option("--tenants-file", tenants_file,
                 "YAML mapping authenticated identities to namespaces, admin and daemon roles "
                 "(docs/security.md); default: one open tenant");
  app.add_option("--etcd-ca", etcd_tls.ca_file, "PEM CA bundle verifying https:// etcd members");
  app.add_option("--etcd-cert", etcd_tls.cert_file,
                 "PEM client certificate for etcd (--client-cert-auth); with --etcd-key");
  app.add_option("--etcd-key", etcd_tls.key_file, "PEM key of --etcd-cert");
  AddGrpcServerLimitFlags(app, &grpc_limits);
  app.add_option("--metrics-address", metrics_address,
                 "Prometheus /metrics listen address HOST:PORT, or \"off\"");
  app.add_option("--ready-file", ready_file,
                 "write the listen addresses here once serving (for scripts and tests)");
  app.add_option("--etcd-endpoint", etcd_endpoint,
                 "etcd members' client URLs for membership, comma-separated "
                 "(http://HOST:PORT,...; reached through etcd's gRPC API, the next member "
                 "when one fails); empty: in-process store");
  app.add_option("--etcd-prefix", etcd_prefix, "key prefix in etcd; must end with '/'");
  app.add_option("--calibration", calibration_path,
                 "bus calibration file written by `kvfabric calibrate`; read again on SIGHUP and "
                 "on the ReloadCalibration RPC");
  app.add_option("--max-directory-entries", o.max_directory_entries,
                 "blocks the directory remembers (least recently accessed dropped first)");
  app.add_option("--hot-threshold", o.hot_threshold,
                 "accesses after which Place gives a key --hot-replicas copies");
  app.add_option("--hot-replicas", o.hot_replicas, "replicas of a hot key");
  app.add_option("--plan-history", o.plan_history, "plans kept for `kvfabric explain plan`");
  app.add_option("--plan-history-bytes", o.plan_history_bytes,
                 "bytes of plan explanations kept, whichever of this and --plan-history is hit "
                 "first");
  app.add_option("--max-admitted-plans", o.max_admitted_plans,
                 "plans whose bytes the path load holds at once (a plan made past it is "
                 "answered but not charged)");
  app.add_option("--max-models", o.max_models,
                 "models whose prefill constants are learned online (observations of more are "
                 "not scored)");
  std::chrono::microseconds retrial_interval = o.retrial_interval;
  std::chrono::microseconds retrial_max_interval = o.retrial_max_interval;
  AddDurationOption(app, "--retrial-interval", &retrial_interval,
                    "how long a daemon's slowed path goes without a transfer before a plan tries "
                    "it on its figures from before the slowdown (0: never)");
  AddDurationOption(app, "--retrial-max-interval", &retrial_max_interval,
                    "the most that interval doubles to while retrials find the path still slow");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (Status s = InitLogging(log_options); !s.ok()) {
    std::fprintf(stderr, "kvfabric-placement: %s\n", s.ToString().c_str());
    return 2;
  }
  if (Status s = grpc_limits.Validate(); !s.ok()) {
    spdlog::error("kvfabric-placement: {}", s.message());
    return 2;
  }
  o.retrial_interval = std::chrono::duration_cast<std::chrono::milliseconds>(retrial_interval);
  o.retrial_max_interval =
      std::chrono::duration_cast<std::chrono::milliseconds>(retrial_max_interval);
  if (Status s = placement::PlacementNode::ValidateOptions(o); !s.ok()) {
    spdlog::error(
        "kvfabric-placement: {} (--plan-history, --max-directory-entries, "
        "--max-admitted-plans, --hot-replicas, --retrial-interval, --retrial-max-interval)",
        s.message());
    return 2;
  }
  if (Status s = ValidateServerSecurity(security, grpc_address); !s.ok()) {
    spdlog::error("kvfabric-placement: --grpc-address {}: {}", grpc_address, s.ToString());
    return 2;
  }
  std::shared_ptr<const TenantPolicy> tenants = TenantPolicy::Open();
  if (!tenants_file.empty()) {
    auto loaded = TenantPolicy::LoadFile(tenants_file);
    if (!loaded.ok()) {
      spdlog::error("kvfabric-placement: {}", loaded.status().ToString());
      return 2;
    }
    tenants = *loaded;
  }
  if (check_config) {
    auto fail = [](const std::string& what) {
      std::fprintf(stderr, "kvfabric-placement: --check-config: %s\n", what.c_str());
      return 2;
    };
    if (!metrics_address.empty() && metrics_address != "off") {
      if (Status s = metrics::ValidateMetricsAddress(metrics_address); !s.ok()) {
        return fail(s.ToString());
      }
    }
    if (etcd_prefix.empty() || etcd_prefix.back() != '/') {
      return fail("--etcd-prefix \"" + etcd_prefix + "\" must end with '/'");
    }
    if (!etcd_endpoint.empty()) {
      placement::EtcdClientOptions eo;
      eo.endpoint = etcd_endpoint;
      eo.tls = etcd_tls;
      const Status s = placement::EtcdClient::Create(eo).status();
      if (!s.ok()) return fail("--etcd-endpoint: " + s.ToString());
    }
    std::string calibration = "none (placeholder figures until observations refit them)";
    if (!calibration_path.empty()) {
      auto c = LoadBusCalibration(Env::Default(), calibration_path);
      if (!c.ok()) return fail("--calibration " + calibration_path + ": " + c.status().ToString());
      calibration = calibration_path + ": " + std::to_string(c->paths.size()) + " paths, " +
                    std::to_string(c->recompute.size()) + " recompute models";
    }
    std::printf("grpc %s (%s), metrics %s\n", grpc_address.c_str(), grpc_limits.ToString().c_str(),
                metrics_address.c_str());
    std::printf("membership: %s\n",
                etcd_endpoint.empty()
                    ? "in this process (lost on restart; daemons re-register)"
                    : ("etcd at " + etcd_endpoint + ", prefix " + etcd_prefix).c_str());
    std::printf("calibration: %s\n", calibration.c_str());
    std::printf("directory: up to %llu blocks; hot keys after %llu accesses get %u replicas\n",
                static_cast<unsigned long long>(o.max_directory_entries),
                static_cast<unsigned long long>(o.hot_threshold), o.hot_replicas);
    std::printf(
        "plans: %zu kept for explain (at most %zu bytes); at most %zu admitted to the path "
        "load at once; prefill constants learned for up to %zu models\n",
        o.plan_history, o.plan_history_bytes, o.max_admitted_plans, o.max_models);
    if (o.retrial_interval.count() == 0) {
      std::printf("retrials of slowed paths: off (--retrial-interval 0)\n");
    } else {
      std::printf(
          "retrials of slowed paths: after %s without a transfer, doubling to at most %s while "
          "they find the path still slow\n",
          FormatDuration(retrial_interval).c_str(), FormatDuration(retrial_max_interval).c_str());
    }
    std::printf("kvfabric-placement: configuration OK (--check-config: nothing was started)\n");
    return 0;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Env* env = Env::Default();
  if (!calibration_path.empty()) {
    auto calibration = LoadBusCalibration(env, calibration_path);
    if (!calibration.ok()) {
      spdlog::error("kvfabric-placement: --calibration {}: {}", calibration_path,
                    calibration.status().ToString());
      return 1;
    }
    o.calibration = std::move(*calibration);
    spdlog::info("calibration {}: {} paths, {} models", calibration_path,
                 o.calibration.paths.size(), o.calibration.recompute.size());
  } else {
    spdlog::warn("no --calibration: the cost model uses placeholder figures until observations "
                 "refit it; run `kvfabric calibrate`");
  }

  std::unique_ptr<placement::MembershipStore> store;
  if (etcd_endpoint.empty()) {
    store = std::make_unique<placement::MemoryMembershipStore>(env);
  } else {
    placement::EtcdMembershipStoreOptions eo;
    eo.endpoint = etcd_endpoint;
    eo.tls = etcd_tls;
    eo.prefix = etcd_prefix;
    auto etcd = placement::EtcdMembershipStore::Create(eo);
    if (!etcd.ok()) {
      spdlog::error("kvfabric-placement: etcd at {} (--etcd-endpoint): {}", etcd_endpoint,
                    etcd.status().ToString());
      return 1;
    }
    store = std::move(*etcd);
  }
  // The node refuses at the same numbers the service advertises.
  PlacementServiceOptions service_options;
  o.limits = PlacementLimitsFromProto(service_options.limits);
  auto node = placement::PlacementNode::Create(o, store.get(), env);
  if (!node.ok()) {
    spdlog::error("kvfabric-placement: cannot start: {}", node.status().ToString());
    return 1;
  }
  auto metrics = std::make_shared<placement::PlacementMetrics>(
      [n = node->get()] { return n->Snapshot(); });
  auto rpc_metrics = metrics::RpcServerMetrics::Create("placement");
  auto build_info = metrics::NewBuildInfo("placement");
  auto authorizer = std::make_shared<GrpcAuthorizer>(tenants, "placement");
  service_options.authorizer = authorizer;
  std::unique_ptr<cache_host::MetricsServer> metrics_server;
  if (!metrics_address.empty() && metrics_address != "off") {
    auto started = cache_host::MetricsServer::Start(metrics_address,
                                                    {metrics, rpc_metrics, build_info, authorizer});
    if (!started.ok()) {
      spdlog::error("kvfabric-placement: {}", started.status().ToString());
      return 1;
    }
    metrics_server = std::move(*started);
  }

  if (!calibration_path.empty()) {
    service_options.reload_calibration =
        [env, calibration_path, n = node->get()]() -> StatusOr<v1::ReloadCalibrationResponse> {
      auto calibration = LoadBusCalibration(env, calibration_path);
      if (!calibration.ok()) {
        spdlog::warn(
            "kvfabric-placement: reloading --calibration {}: {}; the cost model is "
            "unchanged",
            calibration_path, calibration.status().ToString());
        return calibration.status();
      }
      KVF_ASSIGN_OR_RETURN(const CalibratedCostModel::ReloadCounts counts,
                           n->ReloadCalibration(*calibration));
      v1::ReloadCalibrationResponse r;
      r.set_path(calibration_path);
      r.set_paths(static_cast<std::uint32_t>(counts.paths));
      r.set_models(static_cast<std::uint32_t>(counts.models));
      r.set_kept(static_cast<std::uint32_t>(counts.kept));
      return r;
    };
  }
  HealthReporter health(env, "placement", "kvfabric-placement");
  health.SetMaxRequestBytes(grpc_limits.max_request_bytes);
  PlacementService service(node->get(), &health, service_options);
  grpc::ServerBuilder builder;
  int port = 0;
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(security, grpc_address);
  if (!creds.ok()) {
    spdlog::error("kvfabric-placement: {}", creds.status().ToString());
    return 2;
  }
  builder.AddListeningPort(grpc_address, *creds, &port);
  ApplyGrpcServerLimits(grpc_limits, "kvfabric-placement", &builder);
  rpc_metrics->Instrument(&builder);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("kvfabric-placement: cannot listen for gRPC on {} (--grpc-address)",
                  grpc_address);
    return 1;
  }
  const std::string bound = grpc_address.substr(0, grpc_address.rfind(':')) + ":" +
                            std::to_string(port);
  if (security.insecure) {
    spdlog::warn("kvfabric-placement: gRPC security: {}",
                 DescribeSecurity(security, bound, /*server=*/true));
  } else {
    spdlog::info("kvfabric-placement: gRPC security: {}",
                 DescribeSecurity(security, bound, /*server=*/true));
  }
  spdlog::info("kvfabric-placement: tenants: {}", tenants->Summary());
  health.SetState(v1::SERVING_STATUS_SERVING, "");
  const std::string metrics_url = metrics_server ? metrics_server->url() : std::string("off");
  spdlog::info("kvfabric-placement: gRPC on {} ({}), membership {}, metrics {}", bound,
               grpc_limits.ToString(), store->name(), metrics_url);
  if (!ready_file.empty()) {
    const std::string tmp = ready_file + ".tmp";
    std::ofstream out(tmp);
    out << "grpc=" << bound << "\nmetrics=" << metrics_url << "\npid=" << getpid() << "\n";
    out.close();
    std::rename(tmp.c_str(), ready_file.c_str());
  }

  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    if (!service_options.reload_calibration) {
      spdlog::warn("kvfabric-placement: SIGHUP: no --calibration to reload");
    } else {
      service.options().reload_calibration().status().IgnoreError();  // logs either way
    }
  }
  spdlog::info("kvfabric-placement: signal {}: stopping", sig);
  health.SetState(v1::SERVING_STATUS_NOT_SERVING, "shutting down");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  metrics_server.reset();
  node->reset();
  store.reset();
  spdlog::info("kvfabric-placement: exit 0");
  return 0;
}

}  // namespace
}  // namespace kvfabric

int main(int argc, char** argv) { return kvfabric::Run(argc, argv); }
